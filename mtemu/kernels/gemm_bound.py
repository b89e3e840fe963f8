"""Closed-form bounds for the emulated GEMM: DDR server time and VMAC issue time, no emulation.

The GEMM of :mod:`mtemu.kernels.gemm` moves, per (m-block, panel, k-block) step, ``A_g`` rows
DDR -> GSM and the ``B_2`` tile DDR -> AM (one broadcast read), and per (m-block, panel) the
``C_2`` rows AM -> DDR. The machine holds the DDR server for ``bytes / (bandwidth / clock) +
rows x dma_row_overhead_cycles`` per transfer, so the server's busy time over the whole GEMM is a
sum we can write down exactly. The busiest DSP issues ``rows x k x ceil(width / lanes)`` VMACs.
The larger of the two is a lower bound on the emulated cycles (it ignores DMA latency, barrier
waits and pipeline fill), so :attr:`GemmBound.utilization` is an upper bound on the emulated
utilization; where the kernel is DDR-bound the two agree to a few tenths of a point (tests).

The closed forms that need no plan of the kernel (``vmac_cycles``, ``a_resident_bound``) live with the
tiles in :mod:`mtemu.kernels.gemm_tiles`, importable without the generators; they are re-exported here.

What it is for: ranking tile sets or platform variants in microseconds instead of seconds
(:mod:`mtemu.calibrate` fits a DMA constant against the paper's Table 5 with it, and emulates
only the winners).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..platform import DEFAULT, Platform
from .gemm import plan_gemm
from .gemm_tiles import DEFAULT_TILES, GemmTiles, _pieces, a_resident_bound, vmac_cycles


@dataclass(frozen=True)
class GemmBound:
    """DDR and compute lower bounds of one emulated GEMM (cycles of the platform's clock)."""

    m: int
    k: int
    n: int
    macs: int
    ddr_bytes: int          # bytes through the DDR server: A (per panel), B (per m-block), C once
    ddr_rows: int           # strided rows those bytes travel in (each pays the row overhead)
    ddr_cycles: float       # DDR server busy time
    compute_cycles: int     # VMAC issues of the busiest DSP
    peak_macs_per_cycle: int

    @property
    def cycles(self) -> float:
        return max(self.ddr_cycles, float(self.compute_cycles))

    @property
    def bound(self) -> str:
        return "ddr" if self.ddr_cycles >= self.compute_cycles else "compute"

    @property
    def utilization(self) -> float:
        return self.macs / (self.peak_macs_per_cycle * self.cycles)


def gemm_bound(m: int, k: int, n: int, tiles: GemmTiles = DEFAULT_TILES,
               platform: Platform = DEFAULT) -> GemmBound:
    """Bounds for ``C[m,n] = A[m,k] B[k,n]`` with ``tiles``; refuses what :func:`plan_gemm` refuses."""
    plan = plan_gemm(m, k, n, tiles, platform)
    t = plan.tiles
    ddr_bytes = ddr_rows = 0
    for mrows, mcount in _pieces(m, t.mg):
        for nw, ncount in _pieces(n, t.n2):
            steps = mcount * ncount
            for kw, kcount in _pieces(k, t.k2):
                # A_g: every DSP moves its rows (kw wide); B_2: one broadcast read of kw rows
                ddr_bytes += steps * kcount * (mrows * kw * 2 + kw * nw * 2)
                ddr_rows += steps * kcount * (mrows + kw)
            # C_2 written back once per panel, each DSP its own rows
            ddr_bytes += steps * mrows * nw * 2
            ddr_rows += steps * mrows
    return GemmBound(m, k, n, m * k * n, ddr_bytes, ddr_rows,
                     _ddr_cycles(ddr_bytes, ddr_rows, platform, platform.dma_row_overhead_cycles),
                     vmac_cycles(m, k, n, t.mg, t.n2, platform), platform.peak_macs_per_cycle)


def _ddr_cycles(ddr_bytes: int, ddr_rows: int, platform: Platform, row_overhead: float) -> float:
    bytes_per_cycle = platform.ddr_bandwidth / platform.clock_hz
    return ddr_bytes / bytes_per_cycle + ddr_rows * row_overhead


def with_row_overhead(bound: GemmBound, platform: Platform, row_overhead: float) -> GemmBound:
    """``bound`` (of ``platform``) on the same platform with ``dma_row_overhead_cycles = row_overhead``:
    what :func:`gemm_bound` gives there, bit for bit, without planning the kernel again (a calibration
    tries tens of overheads per tile set)."""
    return GemmBound(bound.m, bound.k, bound.n, bound.macs, bound.ddr_bytes, bound.ddr_rows,
                     _ddr_cycles(bound.ddr_bytes, bound.ddr_rows, platform, row_overhead), bound.compute_cycles,
                     bound.peak_macs_per_cycle)


__all__ = ["GemmBound", "a_resident_bound", "gemm_bound", "vmac_cycles", "with_row_overhead"]

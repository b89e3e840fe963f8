"""Closed-form bounds for the emulated GEMM: DDR server time and VMAC issue time, no emulation.

The GEMM of :mod:`mtemu.kernels.gemm` moves, per (m-block, panel, k-block) step, ``A_g`` rows
DDR -> GSM and the ``B_2`` tile DDR -> AM (one broadcast read), and per (m-block, panel) the
``C_2`` rows AM -> DDR. The machine holds the DDR server for ``bytes / (bandwidth / clock) +
rows x dma_row_overhead_cycles`` per transfer, so the server's busy time over the whole GEMM is a
sum we can write down exactly. The busiest DSP issues ``rows x k x ceil(width / lanes)`` VMACs.
The larger of the two is a lower bound on the emulated cycles (it ignores DMA latency, barrier
waits and pipeline fill), so :attr:`GemmBound.utilization` is an upper bound on the emulated
utilization; where the kernel is DDR-bound the two agree to a few tenths of a point (tests).

What it is for: ranking tile sets or platform variants in microseconds instead of seconds
(:mod:`mtemu.calibrate` fits a DMA constant against the paper's Table 5 with it, and emulates
only the winners).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import CapacityError, MtemuError
from ..platform import DEFAULT, Platform
from .gemm import DEFAULT_TILES, GemmTiles, plan_gemm


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


def _pieces(total: int, block: int) -> list[tuple[int, int]]:
    """(block size, count) pairs covering ``total``: the full blocks and the short last one."""
    full, rest = divmod(total, block)
    return [(size, cnt) for size, cnt in ((block, full), (rest, 1 if rest else 0)) if cnt]


def vmac_cycles(m: int, k: int, n: int, mg: int, n2: int, platform: Platform = DEFAULT) -> int:
    """VMAC issues of the busiest DSP: per m-block of ``mrows`` rows it holds ``ceil(mrows / dsps)``
    of them and issues ``k x ceil(width / lanes)`` VMACs per row and ``n2``-wide panel (both loop
    orders share the micro-kernel and the row partition)."""
    return sum(mcount * ncount * math.ceil(mrows / platform.dsps) * k * math.ceil(nw / platform.vector_lanes)
               for mrows, mcount in _pieces(m, mg) for nw, ncount in _pieces(n, n2))


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
    bytes_per_cycle = platform.ddr_bandwidth / platform.clock_hz
    ddr_cycles = ddr_bytes / bytes_per_cycle + ddr_rows * platform.dma_row_overhead_cycles
    return GemmBound(m, k, n, m * k * n, ddr_bytes, ddr_rows, ddr_cycles, vmac_cycles(m, k, n, t.mg, t.n2, platform),
                     platform.peak_macs_per_cycle)


def a_resident_bound(m: int, k: int, n: int, mg: int, kg: int, n2: int, platform: Platform = DEFAULT,
                     partial_bytes: int = 2) -> float:
    """Utilization bound of Fig. 4's literal loop order, which mtemu does not emulate.

    ``A_g[mg, kg]`` moves DDR -> GSM once (double-buffered) and serves every N panel; ``B`` rows
    of the k-block are broadcast per panel; ``C`` lives in AM only within a k-block, so it goes
    through DDR between k-blocks (``partial_bytes`` per element each way: 2 rounds partial sums
    to FP16, 4 keeps FP32) and is written as FP16 after the last. DDR time only (with the row
    overhead) against the ideal VMAC time: an upper bound on what such a kernel could reach.
    """
    for name, v in (("m", m), ("k", k), ("n", n), ("mg", mg), ("kg", kg), ("n2", n2)):
        if not isinstance(v, int) or v <= 0:
            raise MtemuError(f"a_resident_bound: {name} must be a positive integer, got {v!r}")
    if partial_bytes not in (2, 4):
        raise MtemuError(f"a_resident_bound: partial_bytes must be 2 or 4, got {partial_bytes!r}")
    gsm = 2 * min(mg, m) * min(kg, k) * 2
    if gsm > platform.gsm_bytes:
        raise CapacityError(f"GSM: two A_g tiles of mg={mg} x kg={kg} FP16 need {gsm} bytes, "
                            f"{gsm - platform.gsm_bytes} more than the {platform.gsm_bytes}-byte GSM")
    kblocks = _pieces(k, kg)
    nk = sum(cnt for _, cnt in kblocks)
    nbytes = nrows = 0
    for mrows, mcount in _pieces(m, mg):
        for kw, kcount in kblocks:
            nbytes += mcount * kcount * mrows * kw * 2                 # A_g once
            nrows += mcount * kcount * mrows
            for nw, ncount in _pieces(n, n2):
                nbytes += mcount * kcount * ncount * kw * nw * 2       # B per panel
                nrows += mcount * kcount * ncount * kw
        for nw, ncount in _pieces(n, n2):
            nbytes += mcount * ncount * mrows * nw * ((nk - 1) * 2 * partial_bytes + 2)
            nrows += mcount * ncount * mrows * (2 * (nk - 1) + 1)
    ddr = nbytes / (platform.ddr_bandwidth / platform.clock_hz) + nrows * platform.dma_row_overhead_cycles
    ideal = m * k * n / platform.peak_macs_per_cycle
    return ideal / max(ddr, ideal)

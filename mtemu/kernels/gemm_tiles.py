"""GEMM tile sets of the registered loop orders, their defaults, and the closed forms that read only tiles
and a platform: importable without the kernel generators (and so without the machine and Numba).

A training profile's key names its loop order's default tiles, and the planner's fast kernel model ranks
GEMMs on the A-resident loop order's utilization bound; both come from here, so a plan whose profiles are
shipped or cached never loads the emulator. The generators (:mod:`mtemu.kernels.gemm`,
:mod:`mtemu.kernels.gemm_a_resident`) and the variants (:mod:`mtemu.kernels.registry`) import these, and
``mtemu.kernels.gemm.DEFAULT_TILES`` etc. stay where they were.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import CapacityError, MtemuError
from ..platform import DEFAULT, Platform
from .names import GEMM_LOOP_ORDERS, format_tiles


@dataclass(frozen=True)
class GemmTiles:
    """Tile sizes. ``mg`` rows per m-block (over all DSPs), ``k2`` x ``n2`` B tile,
    ``mr`` x ``nv`` micro-kernel (rows x vectors), ``rotation`` register sets for operands."""

    mg: int = 1024
    k2: int = 128
    n2: int = 768
    mr: int = 6
    nv: int = 4
    rotation: int = 2
    pipelined: bool = True

    def describe(self) -> str:
        return format_tiles(self, "c-stationary")


DEFAULT_TILES = GemmTiles()


@dataclass(frozen=True)
class AResidentGemmTiles:
    """``mg`` rows per m-block, ``kg`` columns per resident A_g block, ``k2`` x ``n2`` B tile,
    ``mr`` x ``nv`` micro-kernel, ``rotation`` register sets (as in :class:`GemmTiles`).

    Defaults: the Table 5 setting (docs/CHOICES.md): mg, kg chosen on the two fit rows with the
    closed form; k2 the largest multiple of 64 dividing kg that fits SM and AM with three B tiles."""

    mg: int = 512
    kg: int = 768
    k2: int = 256
    n2: int = 384
    mr: int = 6
    nv: int = 4
    rotation: int = 2
    b_slots: int = 3                 # B tiles in AM: 3 lets the broadcast run two steps ahead
    pipelined: bool = True           # the micro-kernel's software pipeline (always on here)

    def describe(self) -> str:
        return format_tiles(self, "a-resident")


DEFAULT_A_RESIDENT_TILES = AResidentGemmTiles()

# loop order -> its default tiles (mtemu.kernels.registry checks its variants carry these)
DEFAULT_TILES_OF: dict[str, Any] = {"a-resident": DEFAULT_A_RESIDENT_TILES, "c-stationary": DEFAULT_TILES}
if tuple(DEFAULT_TILES_OF) != GEMM_LOOP_ORDERS:
    raise MtemuError(f"mtemu.kernels.gemm_tiles.DEFAULT_TILES_OF must name the loop orders {GEMM_LOOP_ORDERS}")


def default_tiles(loop_order: str) -> Any:
    """The default tiles of a registered GEMM loop order (an error lists the known ones)."""
    tiles = DEFAULT_TILES_OF.get(loop_order) if isinstance(loop_order, str) else None
    if tiles is None:
        raise MtemuError(f"unknown GEMM loop order {loop_order!r} (known: {', '.join(GEMM_LOOP_ORDERS)})")
    return tiles


# ------------------------------------------------------------------- closed forms on tiles alone

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


def a_resident_bound(m: int, k: int, n: int, mg: int, kg: int, n2: int, platform: Platform = DEFAULT,
                     partial_bytes: int = 2) -> float:
    """Utilization bound of Fig. 4's literal loop order, which mtemu does not emulate.

    ``A_g[mg, kg]`` moves DDR -> GSM once (double-buffered) and serves every N panel; ``B`` rows
    of the k-block are broadcast per panel; ``C`` lives in AM only within a k-block, so it goes
    through DDR between k-blocks (``partial_bytes`` per element each way: 2 rounds partial sums
    to FP16, 4 keeps FP32) and is written as FP16 after the last. DDR time only (with the row
    overhead) against the ideal VMAC time: an upper bound on what such a kernel could reach.
    """
    nbytes, nrows = a_resident_traffic(m, k, n, mg, kg, n2, platform, partial_bytes)
    return a_resident_bound_of(m, k, n, nbytes, nrows, platform, platform.dma_row_overhead_cycles)


def a_resident_traffic(m: int, k: int, n: int, mg: int, kg: int, n2: int, platform: Platform = DEFAULT,
                       partial_bytes: int = 2) -> tuple[int, int]:
    """(bytes, strided rows) through the DDR server in :func:`a_resident_bound`'s loop order: they do not
    depend on the DDR rate or the row overhead, which a calibration varies."""
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
    return nbytes, nrows


def a_resident_bound_of(m: int, k: int, n: int, nbytes: int, nrows: int, platform: Platform,
                        row_overhead: float) -> float:
    """:func:`a_resident_bound` from its :func:`a_resident_traffic`, with ``row_overhead`` cycles per row."""
    ddr = nbytes / (platform.ddr_bandwidth / platform.clock_hz) + nrows * row_overhead
    ideal = m * k * n / platform.peak_macs_per_cycle
    return ideal / max(ddr, ideal)


def a_resident_utilization_bound(m: int, k: int, n: int, tiles: AResidentGemmTiles, platform: Platform) -> float:
    """The A-resident variant's bound (``GemmVariant.bound``): the DDR bound of Fig. 4's loop order, capped
    by the busiest DSP's VMAC issues. Without the cap every compute-bound tile set ties at 1.0 on the
    51 GB/s platform, and a panel narrower than a vector multiple (n2 = 256 uses 2 x 192 lanes) or an
    uneven row split ranks as if it were free."""
    compute = m * k * n / (platform.peak_macs_per_cycle * vmac_cycles(m, k, n, tiles.mg, tiles.n2, platform))
    return min(a_resident_bound(m, k, n, tiles.mg, tiles.kg, tiles.n2, platform), compute)


# loop order -> its utilization bound, where that needs no plan of the kernel (c-stationary's clips its
# tiles with mtemu.kernels.gemm.plan_gemm: its bound is the registry's alone)
PLANLESS_BOUNDS = {"a-resident": a_resident_utilization_bound}

__all__ = ["DEFAULT_A_RESIDENT_TILES", "DEFAULT_TILES", "DEFAULT_TILES_OF", "PLANLESS_BOUNDS", "AResidentGemmTiles",
           "GemmTiles", "a_resident_bound", "a_resident_utilization_bound", "default_tiles", "vmac_cycles"]

"""GEMM kernel variants by name: what the CLI, the tuner and the training profiles can ask for.

A variant bundles a loop order's tile type and defaults, its timing and functional runners and
its closed-form bound (used to rank candidates without emulating them). ``DEFAULT_GEMM`` is the
project default: Fig. 4's loop order (A_g resident in GSM, FP16 partial sums between k-blocks),
which meets Table 5 on the raw per-cluster DDR rate (docs/CHOICES.md, "one platform").

Registering another loop order: write its generator (see docs/KERNELS.md), then add a
``GemmVariant`` to ``GEMM_VARIANTS``, its name to ``mtemu.kernels.names.GEMM_LOOP_ORDERS`` and its
a reference build to ``mtemu.version._gemm_programs``;
``mtemu gemm --loop-order NAME``, ``mtemu tune gemm --loop-order NAME`` and a training platform
with ``gemm_loop_order = "NAME"`` then use it.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable

from ..errors import AssemblyError, CapacityError, MtemuError
from ..platform import Platform
from .gemm import DEFAULT_TILES, GemmResult, GemmTiles, gemm_timing, plan_gemm, run_gemm
from .gemm_a_resident import AResidentGemmTiles, a_resident_timing, plan_a_resident, run_a_resident
from .gemm_bound import a_resident_bound, gemm_bound
from .names import DEFAULT_GEMM, GEMM_LOOP_ORDERS


def _c_stationary_bound(m: int, k: int, n: int, tiles: GemmTiles, platform: Platform) -> float:
    return gemm_bound(m, k, n, tiles, platform).utilization


def _a_resident_bound(m: int, k: int, n: int, tiles: AResidentGemmTiles, platform: Platform) -> float:
    return a_resident_bound(m, k, n, tiles.mg, tiles.kg, tiles.n2, platform)


@dataclass(frozen=True)
class GemmVariant:
    name: str
    description: str
    tiles_type: type
    default_tiles: Any
    timing: Callable[..., GemmResult]          # (m, k, n, *, tiles, platform)
    run: Callable[..., GemmResult]             # (a, b, *, platform, tiles): functional, result.c
    bound: Callable[..., float]                # (m, k, n, tiles, platform) -> utilization upper bound
    plan: Callable[..., Any]                   # (m, k, n, tiles, platform): raises if the tiles do not fit
    grid: dict[str, tuple]                     # tile values the tile chooser tries (others: defaults)

    def tiles(self, values: dict[str, Any] | None = None) -> Any:
        """The variant's tiles from a dict of fields (missing fields keep the defaults)."""
        values = dict(values or {})
        known = {f.name for f in fields(self.tiles_type)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise MtemuError(f"GEMM loop order {self.name!r}: unknown tile field(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        return self.tiles_type(**{**asdict(self.default_tiles), **values})


GEMM_VARIANTS: dict[str, GemmVariant] = {
    "a-resident": GemmVariant(
        "a-resident", "Fig. 4's loop order: A_g resident in GSM, B broadcast per panel, FP16 C partial sums "
        "through DDR between k-blocks", AResidentGemmTiles, AResidentGemmTiles(), a_resident_timing,
        run_a_resident, _a_resident_bound, plan_a_resident,
        {"mg": (256, 512, 1024), "kg": (512, 768, 1024, 1536), "k2": (128, 256), "n2": (256, 384, 512, 768)}),
    "c-stationary": GemmVariant(
        "c-stationary", "C accumulated in AM in FP32 over all of K; A and B tiles streamed from DDR",
        GemmTiles, DEFAULT_TILES, gemm_timing, run_gemm, _c_stationary_bound, plan_gemm,
        {"mg": (512, 1024, 2048), "k2": (64, 128, 256), "n2": (384, 576, 768, 960, 1152)}),
}
if tuple(GEMM_VARIANTS) != GEMM_LOOP_ORDERS:     # a new variant is named in names.py too
    raise MtemuError(f"mtemu.kernels.names.GEMM_LOOP_ORDERS {GEMM_LOOP_ORDERS} must list the registered "
                     f"variants {tuple(GEMM_VARIANTS)} in the same order")


def gemm_variant(name: str) -> GemmVariant:
    """The registered GEMM variant ``name`` (an error lists the known ones)."""
    variant = GEMM_VARIANTS.get(name) if isinstance(name, str) else None
    if variant is None:
        raise MtemuError(f"unknown GEMM loop order {name!r} (known: {', '.join(GEMM_VARIANTS)})")
    return variant


def variant_of(tiles: Any) -> GemmVariant:
    """The variant whose tile type ``tiles`` is."""
    for variant in GEMM_VARIANTS.values():
        if isinstance(tiles, variant.tiles_type):
            return variant
    raise MtemuError(f"not a GEMM tile set: {tiles!r}")

def tile_candidates(name: str, m: int, k: int, n: int, platform: Platform) -> list[tuple[float, Any]]:
    """(closed-form utilization bound, tiles) of every grid point that fits, best bound first;
    tiles that clip to the same effective tiles for this shape appear once."""
    variant = gemm_variant(name)
    keys = sorted(variant.grid)
    out, seen = [], set()
    for values in itertools.product(*(variant.grid[key] for key in keys)):
        tiles = variant.tiles(dict(zip(keys, values, strict=True)))
        try:
            eff = variant.plan(m, k, n, tiles, platform).tiles
            bound = variant.bound(m, k, n, eff, platform)
        except (CapacityError, AssemblyError):
            continue
        if eff not in seen:
            seen.add(eff)
            out.append((bound, eff))
    out.sort(key=lambda bt: -bt[0])          # stable: grid order breaks ties
    return out


@functools.lru_cache(maxsize=4096)
def choose_tiles(name: str, m: int, k: int, n: int, platform: Platform, emulate_top: int = 2) -> Any:
    """The best tiles of loop order ``name`` for one GEMM shape on ``platform``: rank the grid by the
    closed-form bound and emulate the ``emulate_top`` best (0: trust the bound). Deterministic."""
    variant = gemm_variant(name)
    ranked = tile_candidates(name, m, k, n, platform)
    if not ranked:
        return variant.default_tiles
    if emulate_top <= 0:
        return ranked[0][1]
    timed = [(variant.timing(m, k, n, tiles=t, platform=platform).cycles, i, t)
             for i, (_, t) in enumerate(ranked[:emulate_top])]
    return min(timed, key=lambda c: (c[0], c[1]))[2]


__all__ = ["DEFAULT_GEMM", "GEMM_LOOP_ORDERS", "GEMM_VARIANTS", "GemmVariant", "choose_tiles", "gemm_variant",
           "tile_candidates", "variant_of"]

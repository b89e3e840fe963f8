"""GEMM kernel variants by name: what the CLI, the tuner and the training profiles can ask for.

A variant bundles a loop order's tile type and defaults, its timing and functional runners and
its closed-form bound (used to rank candidates without emulating them); ``choose_tiles_measured``
(``GemmVariant.choose``) picks a shape's tiles and returns the timing run that picked them.
``DEFAULT_GEMM`` is the project default: Fig. 4's loop order (A_g resident in GSM, FP16 partial sums between k-blocks),
which meets Table 5 on the raw per-cluster DDR rate (docs/CHOICES.md, "one platform").

Registering another loop order: write its generator (see docs/KERNELS.md), then add a
``GemmVariant`` to ``GEMM_VARIANTS``, its name to ``mtemu.kernels.names.GEMM_LOOP_ORDERS``, its tile
type and defaults to ``mtemu.kernels.gemm_tiles`` (``DEFAULT_TILES_OF``) and a reference build to
``mtemu.version_programs.gemm_programs``;
``mtemu gemm --loop-order NAME``, ``mtemu tune gemm --loop-order NAME`` and a training platform
with ``gemm_loop_order = "NAME"`` then use it.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable

from ..errors import AssemblyError, CapacityError, MtemuError
from ..platform import Platform
from .gemm import GemmResult, gemm_timing, plan_gemm, run_gemm
from .gemm_a_resident import a_resident_timing, plan_a_resident, run_a_resident
from .gemm_bound import gemm_bound
from .gemm_tiles import DEFAULT_TILES_OF, AResidentGemmTiles, GemmTiles, a_resident_utilization_bound
from .names import CHOOSE_EMULATE_TOP, DEFAULT_GEMM, GEMM_LOOP_ORDERS, TILE_CHOICE_VERSION


def _c_stationary_bound(m: int, k: int, n: int, tiles: GemmTiles, platform: Platform) -> float:
    return gemm_bound(m, k, n, tiles, platform).utilization


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

    def choose(self, m: int, k: int, n: int, platform: Platform, emulate_top: int = CHOOSE_EMULATE_TOP
               ) -> TileChoice:
        """``choose_tiles_measured`` for this loop order: the best tiles and their timing run."""
        return choose_tiles_measured(self.name, m, k, n, platform, emulate_top)


GEMM_VARIANTS: dict[str, GemmVariant] = {
    "a-resident": GemmVariant(
        "a-resident", "Fig. 4's loop order: A_g resident in GSM, B broadcast per panel, FP16 C partial sums "
        "through DDR between k-blocks", AResidentGemmTiles, DEFAULT_TILES_OF["a-resident"], a_resident_timing,
        run_a_resident, a_resident_utilization_bound, plan_a_resident,
        {"mg": (256, 512, 1024), "kg": (512, 768, 1024, 1536), "k2": (128, 256), "n2": (256, 384, 512, 768)}),
    "c-stationary": GemmVariant(
        "c-stationary", "C accumulated in AM in FP32 over all of K; A and B tiles streamed from DDR",
        GemmTiles, DEFAULT_TILES_OF["c-stationary"], gemm_timing, run_gemm, _c_stationary_bound, plan_gemm,
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

def _grid_points(variant: GemmVariant, grid: dict[str, tuple] | None) -> list[Any]:
    """Every tile set of the variant's grid (``grid`` replaces some of its lists; ``mr_nv`` gives
    (mr, nv) pairs), in grid order: keys sorted, the last varying fastest."""
    axes = {**variant.grid, **(grid or {})}
    keys = sorted(axes)
    points = []
    for values in itertools.product(*(axes[key] for key in keys)):
        fields_ = {}
        for key, value in zip(keys, values, strict=True):
            fields_.update(dict(zip(("mr", "nv"), value, strict=True)) if key == "mr_nv" else {key: value})
        points.append(variant.tiles(fields_))
    return points


def screen_tiles(name: str, m: int, k: int, n: int, platform: Platform, grid: dict[str, tuple] | None = None
                 ) -> tuple[list[tuple[float, Any]], list[tuple[Any, str]]]:
    """((closed-form utilization bound, effective tiles) of every grid point that fits, best bound
    first, grid order breaking ties; (tiles, reason) of every point a capacity refuses). Tiles that
    clip to the same effective tiles for this shape appear once."""
    variant = gemm_variant(name)
    out, pruned, seen = [], [], set()
    for tiles in _grid_points(variant, grid):
        try:
            eff = variant.plan(m, k, n, tiles, platform).tiles
            bound = variant.bound(m, k, n, eff, platform)
        except (CapacityError, AssemblyError) as exc:
            pruned.append((tiles, str(exc)))
            continue
        if eff not in seen:
            seen.add(eff)
            out.append((bound, eff))
    out.sort(key=lambda bt: -bt[0])          # stable: grid order breaks ties
    return out, pruned


def tile_candidates(name: str, m: int, k: int, n: int, platform: Platform) -> list[tuple[float, Any]]:
    """(closed-form utilization bound, tiles) of every grid point that fits, best bound first;
    tiles that clip to the same effective tiles for this shape appear once."""
    return screen_tiles(name, m, k, n, platform)[0]


def emulation_set(ranked: list[Any], default: Any, top: int) -> list[tuple[int, Any]]:
    """(rank, tiles) to emulate: the ``top`` best-ranked and the default tiles (rank: position in
    ``ranked``, or after all of them). The fastest wins, the lower rank breaking a tie (the tuner
    ranks the same way, so its best equals ``choose_tiles``' pick on the same set)."""
    chosen = list(enumerate(ranked[:top]))
    if default is not None and default not in ranked[:top]:
        chosen.append((ranked.index(default) if default in ranked else len(ranked), default))
    return chosen


@dataclass(frozen=True)
class TileChoice:
    """The tiles ``choose_tiles`` picks for one shape and the timing run it measured them with
    (``result``; None when the bound alone chose, ``emulate_top`` 0, or when nothing fits and the
    defaults are returned unrun). The result carries no run counters (``stats``)."""

    tiles: Any
    result: GemmResult | None = None


@functools.lru_cache(maxsize=4096)
def choose_tiles_measured(name: str, m: int, k: int, n: int, platform: Platform,
                          emulate_top: int = CHOOSE_EMULATE_TOP) -> TileChoice:
    """The best tiles of loop order ``name`` for one GEMM shape on ``platform``: rank the grid by the
    closed-form bound, emulate the ``emulate_top`` best and the default tiles, keep the fastest
    (0: trust the bound, no emulation). Deterministic; never slower than the defaults when emulated.
    The winner's timing run comes back with it, so a caller that needs its cycles runs nothing again."""
    variant = gemm_variant(name)
    ranked = [t for _, t in tile_candidates(name, m, k, n, platform)]
    if emulate_top <= 0:
        return TileChoice(ranked[0] if ranked else variant.default_tiles)
    try:
        default = variant.plan(m, k, n, variant.default_tiles, platform).tiles
    except (CapacityError, AssemblyError):
        default = None                       # the defaults do not fit: only the grid competes
    if not ranked and default is None:
        return TileChoice(variant.default_tiles)   # its timing names the capacity that refuses it
    timed = [(variant.timing(m, k, n, tiles=t, platform=platform), rank, t)
             for rank, t in emulation_set(ranked, default, emulate_top)]
    best, _, tiles = min(timed, key=lambda c: (c[0].cycles, c[1]))
    return TileChoice(tiles, replace(best, stats=None))


def choose_tiles(name: str, m: int, k: int, n: int, platform: Platform, emulate_top: int = CHOOSE_EMULATE_TOP
                 ) -> Any:
    """The tiles of ``choose_tiles_measured`` (the same cached choice)."""
    return choose_tiles_measured(name, m, k, n, platform, emulate_top).tiles


__all__ = ["CHOOSE_EMULATE_TOP", "DEFAULT_GEMM", "GEMM_LOOP_ORDERS", "GEMM_VARIANTS", "TILE_CHOICE_VERSION",
           "GemmVariant", "TileChoice", "choose_tiles", "choose_tiles_measured", "emulation_set", "gemm_variant",
           "screen_tiles", "tile_candidates", "variant_of"]

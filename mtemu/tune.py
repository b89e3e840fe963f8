"""Tile-size tuner: enumerate tiles, prune by capacity, emulate the rest, rank by utilization.

Candidates that do not fit SM/AM/GSM or the register file are pruned before anything is
emulated. Every emulated candidate is cached as its own small JSON file keyed by
(kernel, shape, tiles, platform hash, emulator version), written atomically as soon as that
candidate finishes, so a rerun is instant, a sweep killed by Ctrl-C or SIGKILL resumes where it
stopped, and a crash mid-write loses nothing. Entries are validated when read (a corrupt or
impossible entry is re-emulated with a warning); an unwritable cache folder only costs the cache.
Sweeps run on local processes, or on an existing Dask distributed cluster (``scheduler``), which
is contacted before any work starts.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import itertools
import json
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import as_completed as done_order
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numba
import numpy as np

from rtcommon import caches
from rtcommon.cache import check_fields, read_json_cache, write_json_cache
from rtcommon.fileio import atomic_write_figure, atomic_write_json

from .errors import MtemuError
from .kernels.attention import attention_backward_timing, attention_forward_timing, default_tiles, plan_attention
from .kernels.capacity import AttentionTiles
from .kernels.gemm_bound import gemm_bound, vmac_cycles
from .kernels.names import DEFAULT_GEMM, format_tiles
from .kernels.registry import GEMM_VARIANTS, emulation_set, gemm_variant, screen_tiles
from .platform import DEFAULT, Platform, as_platform
from .version import emulator_version

# Seconds to reach a Dask scheduler before giving up (an unreachable address fails fast).
SCHEDULER_TIMEOUT_S = 5


def tune_cache_dir() -> Path:
    return caches.path("tune")


@dataclass
class Candidate:
    tiles: dict
    feasible: bool
    reason: str = ""
    utilization: float | None = None
    cycles: int | None = None
    latency_ms: float | None = None
    stalls: dict | None = None
    cached: bool = False
    bound_utilization: float | None = None    # closed-form upper bound (GEMM)
    bound: str | None = None                  # what the closed form says bounds it: "ddr" or "compute" (GEMM)
    top_stall: str | None = None              # the stall reason with the most DSP-cycles (emulated candidates)

    def to_json(self) -> dict:
        return asdict(self)


def gemm_candidates(m: int, k: int, n: int, grid: dict | None = None, platform: Platform = DEFAULT,
                    loop_order: str = DEFAULT_GEMM) -> tuple[list, list[Candidate]]:
    """(feasible tiles of the loop order's grid, best closed-form bound first, as ``--tiles tuned``
    ranks them; pruned candidates with the capacity they exceed). ``grid`` replaces some of the
    variant's tile lists (``mr_nv``: (mr, nv) pairs)."""
    variant = gemm_variant(loop_order)
    ranked, pruned = screen_tiles(loop_order, m, k, n, platform, check_grid(grid, _grid_names(variant)))
    return [t for _, t in ranked], [Candidate(asdict(t), False, reason) for t, reason in pruned]


def _grid_names(variant) -> dict:
    """The tile lists a user may give for a loop order: its grid's, and the micro-kernel pairs."""
    return {**variant.grid, "mr_nv": ()}


def _emulate(args: tuple) -> dict:
    m, k, n, loop_order, tiles_dict, platform = args
    variant = gemm_variant(loop_order)
    r = variant.timing(m, k, n, tiles=variant.tiles_type(**tiles_dict), platform=platform)
    return {"utilization": r.utilization, "cycles": r.cycles, "latency_ms": r.latency_ms, "stalls": r.stalls}


class _Bar:
    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.time()

    def close(self) -> None:
        """End an unfinished bar's line (so an error or "interrupted" starts on a new line)."""
        if self.enabled and 0 < self.done < self.total:
            print(file=sys.stderr, flush=True)
            self.enabled = False

    def step(self, note: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        fill = int(width * self.done / max(self.total, 1))
        el = time.time() - self.t0
        eta = el / self.done * (self.total - self.done) if self.done else 0
        print(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {el:5.0f}s eta {eta:4.0f}s "
              f"{note:30.30s}",
              end="" if self.done < self.total else "\n", file=sys.stderr, flush=True)


@dataclass
class TuneResult:
    kernel: str
    shape: tuple
    default: Candidate
    candidates: list[Candidate]          # emulated, best first
    pruned: list[Candidate]
    heatmap: str | None = None
    table: str | None = None
    screened: list[Candidate] = field(default_factory=list)   # feasible, not emulated (bound too low)
    loop_order: str | None = None        # GEMM: the variant tuned

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "loop_order": self.loop_order, "shape": list(self.shape),
                "default": self.default.to_json(),
                "best": self.best.to_json(), "candidates": [c.to_json() for c in self.candidates],
                "pruned": len(self.pruned), "pruned_reasons": [c.to_json() for c in self.pruned],
                "screened": [c.to_json() for c in self.screened],
                "heatmap": self.heatmap, "table": self.table,
                "gain_pp": 100 * (self.best.utilization - self.default.utilization)}


def _sweep(kernel: str, shape: tuple, feasible: list, default, pruned: list[Candidate], platform: Platform,
           emulate, workers: int | None, scheduler: str | None, progress: bool, cache: bool,
           job: tuple = (), order: dict | None = None) -> TuneResult:
    """Emulate every feasible tile set not already cached (in parallel), rank by utilization; ties go
    to the lower ``order`` (GEMM: the bound's rank, as in ``choose_tiles``), else to the tile values.
    ``job``: what the emulation needs between the shape and the tiles (GEMM: the loop order)."""
    if default not in feasible:
        feasible.append(default)
    version = emulator_version("gemm" if kernel == "gemm" else "attention")
    cdir = tune_cache_dir()
    results, todo = {}, []
    for t in feasible:
        raw = json.dumps([kernel, *job, list(shape), asdict(t), platform.digest(), version], sort_keys=True)
        path = cdir / f"{hashlib.sha256(raw.encode()).hexdigest()[:24]}.json"
        hit = _read(path) if cache else None
        if hit is not None:
            results[t] = Candidate(asdict(t), True, **hit, cached=True)
        else:
            todo.append((t, path))
    bar = _Bar(len(feasible), progress)
    for _ in results:
        bar.step("cached")
    args = [(*shape, *job, asdict(t), platform) for t, _ in todo]
    if len(args) > 1 and (scheduler is not None or (workers or os.cpu_count() or 1) > 1):
        warm_numba_cache(platform)       # before any worker compiles: one writer for numba's cache
    try:
        # each entry is written the moment its candidate finishes: a killed sweep resumes there
        for i, res in map_jobs(args, workers, scheduler, bar.step, emulate):
            t, path = todo[i]
            results[t] = Candidate(asdict(t), True, **res)
            if cache and not write_json_cache(path, res):
                cache = False
    finally:
        bar.close()
    order = order or {}
    ranked = sorted(results, key=lambda t: (-results[t].utilization, order.get(t, len(order)),
                                            json.dumps(asdict(t), sort_keys=True)))
    return TuneResult(kernel, shape, results[default], [results[t] for t in ranked], pruned)


def _write_outputs(result: TuneResult, out_dir: str | Path | None, stem: str, grid: dict | None,
                   axes: tuple[str, str], base_grid: dict) -> TuneResult:
    if out_dir is not None:
        out = Path(out_dir)
        result.heatmap = str(out / f"{stem}_heatmap.png")
        result.table = str(out / f"{stem}.json")
        _heatmap(result, Path(result.heatmap), grid, axes, base_grid)
        atomic_write_json(result.table, result.to_json())
    return result


def tune_gemm(m: int, k: int, n: int, *, platform: Platform = DEFAULT, grid: dict | None = None,
              workers: int | None = None, scheduler: str | None = None, out_dir: str | Path | None = None,
              progress: bool = True, cache: bool = True, emulate_top: int | None = None,
              loop_order: str = DEFAULT_GEMM) -> TuneResult:
    """Tile sweep of the FP16 GEMM in ``loop_order`` (``mtemu.kernels.registry``), ranked by
    emulated utilization. The candidates are the registry's grid for that loop order (``grid``
    replaces some of its lists), so with ``emulate_top=CHOOSE_EMULATE_TOP`` the best is the tile
    set ``choose_tiles`` (training's ``--tiles tuned``) picks.

    ``emulate_top``: emulate only the candidates with the highest closed-form bound plus the
    defaults; the rest are reported as screened. The bound is an upper bound, so a screened
    candidate can only be missed if the bound's optimism reorders it past the cut.
    """
    platform = as_platform(platform)
    variant = gemm_variant(loop_order)
    _check_common(workers, top=None)
    feasible, pruned = gemm_candidates(m, k, n, grid, platform, loop_order)
    _refuse_unusable_grid(grid, feasible, pruned)
    default = variant.plan(m, k, n, variant.default_tiles, platform).tiles   # raises with the reason if it does not fit
    order = {t: i for i, t in enumerate(feasible)}
    feasible, screened = _screen(feasible, default, emulate_top, lambda t: variant.bound(m, k, n, t, platform))
    scheduler = connect_scheduler(scheduler)
    result = _sweep("gemm", (m, k, n), feasible, default, pruned, platform, _emulate, workers, scheduler,
                    progress, cache, job=(loop_order,), order=order)
    result.screened, result.loop_order = screened, loop_order
    _annotate(result, lambda t: _gemm_bound(loop_order, m, k, n, variant.tiles_type(**t), platform))
    return _write_outputs(result, out_dir, f"gemm_{loop_order}_{m}x{k}x{n}", grid, ("mg", "n2"), variant.grid)


def _gemm_bound(loop_order: str, m: int, k: int, n: int, tiles, platform: Platform) -> tuple[str, float]:
    """(what bounds it, "ddr" or "compute"; the closed-form utilization bound) of one tile set."""
    if loop_order == "c-stationary":
        b = gemm_bound(m, k, n, tiles, platform)
        return b.bound, b.utilization
    util = gemm_variant(loop_order).bound(m, k, n, tiles, platform)
    compute = m * k * n / (platform.peak_macs_per_cycle * vmac_cycles(m, k, n, tiles.mg, tiles.n2, platform))
    return ("compute" if util >= compute else "ddr"), util


def _annotate(result: TuneResult, bound=None) -> None:
    """Name each emulated candidate's top stall and, given ``bound`` (tiles -> GemmBound), its closed-form
    bound; derived after the sweep, so cache entries and keys are unchanged."""
    for c in [result.default, *result.candidates, *result.screened]:
        if c.stalls:
            c.top_stall = max(c.stalls, key=lambda k: (c.stalls[k], k))
        if bound is not None:
            c.bound, c.bound_utilization = bound(c.tiles)


def _screen(ranked: list, default, top: int | None, bound) -> tuple[list, list[Candidate]]:
    """(tiles to emulate, screened-out candidates) of ``ranked`` (best closed-form bound first): the
    ``top`` best and the defaults, as ``choose_tiles`` emulates them."""
    if top is None:
        return ranked, []
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise MtemuError(f"emulate_top must be a positive integer, got {top!r}")
    keep = [t for _, t in emulation_set(ranked, default, top)]
    screened = [Candidate(asdict(t), True, "screened out by the closed-form bound", bound_utilization=bound(t))
                for t in ranked if t not in keep]
    return keep, screened


def _valid_entry(data: dict) -> str | None:
    """None if a cached candidate is possible: utilization in (0, 1], whole positive cycles, a positive
    finite latency, non-negative whole stall counts."""
    reason = check_fields(data, {"utilization": (1e-12, 1.0), "cycles": (1, 2 ** 62, True),
                                 "latency_ms": (1e-15, 1e15)})
    if reason:
        return reason
    stalls = data.get("stalls")
    if not isinstance(stalls, dict) or not stalls:
        return "field 'stalls' is not a table of counts"
    return check_fields(stalls, {k: (0, 2 ** 62, True) for k in stalls})


def _read(path: Path) -> dict | None:
    data = read_json_cache(path, _valid_entry)
    if data is None:
        return None
    return {k: data[k] for k in ("utilization", "cycles", "latency_ms", "stalls")}


def check_grid(grid: dict | None, base: dict) -> dict:
    """A user's tile lists: known names, non-empty lists of positive integers (``mr_nv``: pairs)."""
    if grid is None:
        return {}
    if not isinstance(grid, dict):
        raise MtemuError(f"grid must be a dict of tile lists, got {type(grid).__name__}")
    out = {}
    for name, values in grid.items():
        if name not in base:
            raise MtemuError(f"grid: unknown tile {name!r} (known: {', '.join(base)})")
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise MtemuError(f"grid {name!r}: expected a list of values, got {values!r}")
        values = tuple(values)
        width = 2 if name == "mr_nv" else 1
        flat = [v for pair in values for v in pair] if width == 2 and all(
            isinstance(p, (tuple, list)) and len(p) == 2 for p in values) else values
        if not values or (width == 2 and len(flat) != 2 * len(values)) or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in flat):
            kind = "(mr, nv) pairs of positive integers" if width == 2 else "positive integers"
            raise MtemuError(f"grid {name!r}: expected a non-empty list of {kind}, got {values!r}")
        out[name] = tuple(tuple(p) for p in values) if width == 2 else values
    return out


def _refuse_unusable_grid(grid: dict | None, feasible: list, pruned: list[Candidate]) -> None:
    """A grid the user gave that yields no feasible candidate would silently emulate the defaults only."""
    if grid and not feasible:
        reasons = sorted({c.reason for c in pruned})
        why = (f"{len(pruned)} pruned, e.g. {reasons[0]}" if reasons
               else "no combination with Br' <= Br and Bc' <= Bc")
        raise MtemuError(f"no tile set from the given lists {grid} is usable for this shape and platform ({why})")


def warm_numba_cache(platform: Platform = DEFAULT) -> None:
    """Compile (or load) the machine's jitted code in this process before parallel workers start:
    numba's on-disk cache is not safe for concurrent writers, so one process fills it and the
    workers (local processes, or Dask workers sharing the cache folder) only read it."""
    for name in GEMM_VARIANTS:
        gemm_variant(name).timing(64, 64, 192, platform=platform)
    attention_forward_timing(1, 1, 64, 64, causal=True, platform=platform)
    attention_backward_timing(1, 1, 64, 64, causal=True, platform=platform)


def _distributed():
    """``dask.distributed``, loaded only when a scheduler is asked for (optional, ~1 s to import)."""
    try:
        return importlib.import_module("dask.distributed")
    except ImportError:
        raise MtemuError("--scheduler needs dask.distributed: pip install 'ratrain-emu[distributed]'") from None


def connect_scheduler(scheduler):
    """A Dask client for ``scheduler`` (an address or a Client), reached before any work starts."""
    if scheduler is None or not isinstance(scheduler, str):
        return scheduler
    try:
        return _distributed().Client(scheduler, timeout=SCHEDULER_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        raise MtemuError(f"cannot reach the Dask scheduler at {scheduler!r} within {SCHEDULER_TIMEOUT_S} s "
                         f"({type(exc).__name__}: {exc})") from None


class LocalPool:
    """Local worker processes for several :func:`map_jobs` calls in a row (a plan's reference profile, then
    its finalists'): started on the first call that needs them, so they fork from a process whose machine
    is compiled, and kept, with what they built (micro-kernels, schedules), until :meth:`close` or the
    end of a ``with`` block."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=_pool_context(),
                                             initializer=end_with_parent)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def map_jobs(args: list, workers: int | None, scheduler, step: Callable[[str], None], fn=None,
             pool: LocalPool | None = None) -> Iterable[tuple[int, dict]]:
    """(index into ``args``, result) as each completes, calling ``step(note)`` after each: on a Dask
    cluster (``scheduler``: an address or a Client), else on ``workers`` local processes (those of
    ``pool`` where given: its worker count wins)."""
    fn = fn or _emulate
    if not args:
        return
    if scheduler is not None:
        client = connect_scheduler(scheduler)
        futures = client.map(fn, args, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        for f in _distributed().as_completed(futures):
            res = f.result()
            step("dask")
            yield index[f.key], res
        return
    workers = pool.workers if pool is not None else workers or os.cpu_count() or 1
    if workers == 1 or len(args) == 1:
        for i, a in enumerate(args):
            res = fn(a)
            step("")
            yield i, res
        return
    # without a pool, one for this call alone
    with contextlib.nullcontext(pool) if pool is not None else LocalPool(workers) as local:
        futures = {local.executor().submit(fn, a): i for i, a in enumerate(args)}
        try:
            for f in done_order(futures):
                res = f.result()
                step("")
                yield futures[f], res
        finally:
            for f in futures:
                f.cancel()


_PR_SET_PDEATHSIG = 1      # Linux prctl option: the signal a process gets when its parent ends


def end_with_parent() -> None:
    """A worker's initializer: the worker ends when its parent does, on any signal (SIGTERM and
    SIGKILL too, which give the parent no chance to stop its pool). Linux only; elsewhere nothing."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)      # a forked worker inherits the parent's handler
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:          # the parent ended before the request took effect
        os._exit(1)


def _pool_context() -> multiprocessing.context.BaseContext:
    """Forked workers, unless this process has launched GNU OpenMP threads (a functional emulation
    did, mtemu.fast.queues): a forked child could not launch them again, so the workers are spawned."""
    try:
        layer = numba.threading_layer()
    except ValueError:              # no parallel launch yet in this process
        layer = ""
    return multiprocessing.get_context("spawn" if layer == "omp" else None)


def _heatmap(result: TuneResult, path: Path, grid: dict | None, axes: tuple[str, str], base_grid: dict) -> None:
    """Best utilization over two tile dimensions (GEMM: mg x n2, which set DDR traffic); X = infeasible."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = {**base_grid, **(grid or {})}
    ya, xa = axes
    mgs, n2s = list(g[ya]), list(g[xa])
    z = np.full((len(mgs), len(n2s)), np.nan)
    for c in result.candidates:
        t = c.tiles
        if t[ya] in mgs and t[xa] in n2s:
            i, j = mgs.index(t[ya]), n2s.index(t[xa])
            z[i, j] = np.nanmax([z[i, j], 100 * c.utilization])
    # cells only screened candidates reached: their bound, in brackets (not emulated, not infeasible)
    zb = np.full_like(z, np.nan)
    for c in result.screened:
        t = c.tiles
        if t[ya] in mgs and t[xa] in n2s:
            i, j = mgs.index(t[ya]), n2s.index(t[xa])
            zb[i, j] = np.nanmax([zb[i, j], 100 * c.bound_utilization])
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(n2s) + 2), max(3.5, 0.8 * len(mgs) + 1.8)))
    # one colour scale over emulated cells and the screened ones' bounds (faded): with the bound's top
    # few emulated, a scale over those alone would span a few points and say nothing of the grid
    both = np.concatenate([z[~np.isnan(z)], zb[~np.isnan(zb)]])
    lo, hi = (float(both.min()), float(both.max())) if both.size else (0.0, 100.0)
    if not np.isnan(zb).all():
        ax.imshow(zb, cmap="viridis", aspect="auto", origin="lower", vmin=lo, vmax=hi, alpha=0.35)
    im = ax.imshow(z, cmap="viridis", aspect="auto", origin="lower", vmin=lo, vmax=max(hi, lo + 1e-9))
    for i in range(len(mgs)):
        for j in range(len(n2s)):
            if not np.isnan(z[i, j]):
                ax.text(j, i, f"{z[i, j]:.1f}", ha="center", va="center", color="white", fontsize=9)
            elif not np.isnan(zb[i, j]):
                ax.text(j, i, f"({zb[i, j]:.1f})", ha="center", va="center", color="gray", fontsize=8)
            else:
                ax.text(j, i, "X", ha="center", va="center", color="red", fontsize=9)
    d = result.default.tiles
    if d[ya] in mgs and d[xa] in n2s:
        ax.add_patch(plt.Rectangle((n2s.index(d[xa]) - 0.5, mgs.index(d[ya]) - 0.5), 1, 1, fill=False,
                                   edgecolor="orange", linewidth=2.5, label="default"))
    ax.set_xticks(range(len(n2s)), n2s)
    ax.set_yticks(range(len(mgs)), mgs)
    labels = {"n2": "n2 (B panel width)", "mg": "mg (rows per m-block)", "br": "Br (query rows per tile)",
              "bc": "Bc (keys per tile)"}
    ax.set_xlabel(labels.get(xa, xa))
    ax.set_ylabel(labels.get(ya, ya))
    shape = "x".join(map(str, result.shape))
    # the key in the title: a legend inside the axes would hide cells
    keys = ["(v) = bound, screened out"] * bool(result.screened) \
        + ["orange frame = default tiles"] * (d[ya] in mgs and d[xa] in n2s)
    kernel = f"{result.kernel} ({result.loop_order})" if result.loop_order else result.kernel
    title = f"{kernel} {shape}: best utilization (%) per ({ya}, {xa})\nX = infeasible (pruned by capacity)"
    ax.set_title(title + (f"\n{'; '.join(keys)}" if keys else ""))
    fig.colorbar(im, ax=ax, label="MAC utilization (%)")
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=100)


def _check_common(workers: int | None, top: int | None) -> None:
    for name, value in (("workers", workers), ("top", top)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise MtemuError(f"{name} must be a positive integer, got {value!r}")


def format_tune(result: TuneResult, top: int = 5) -> str:
    _check_common(None, top)
    d = result.default
    kernel = f"{result.kernel} ({result.loop_order})" if result.loop_order else result.kernel
    lines = [f"{kernel} {'x'.join(map(str, result.shape))}: {len(result.candidates)} emulated, "
             f"{len(result.pruned)} pruned by capacity"
             + (f", {len(result.screened)} screened out by the closed-form bound" if result.screened else ""),
             f"  default  {_desc(d.tiles, result.loop_order):52s} {100 * d.utilization:6.2f}%"]
    for i, c in enumerate(result.candidates[:top]):
        lines.append(f"  #{i + 1:<6} {_desc(c.tiles, result.loop_order):52s} {100 * c.utilization:6.2f}%"
                     + ("  (cached)" if c.cached else ""))
    gain = 100 * (result.best.utilization - d.utilization)
    lines.append(f"  best is {gain:+.2f} pp over the defaults (the defaults stay the paper-matching validation tiles)")
    if result.heatmap:
        lines.append(f"  heatmap: {result.heatmap}\n  table:   {result.table}")
    return "\n".join(lines)


def _desc(t: dict, loop_order: str | None) -> str:
    if "mg" in t:
        return format_tiles(t, loop_order)
    return " ".join(f"{k}={t[k]}" for k in ("br", "bc", "br_prime", "bc_prime") if k in t)


# ------------------------------------------------------------------------------------------
# attention backward (Algorithm 1)
# ------------------------------------------------------------------------------------------
ATTENTION_GRID = {"br": (64, 96, 128, 192), "bc": (64, 128, 192, 256, 384), "br_prime": (16, 32, 64),
                  "bc_prime": (16, 32, 64)}


def _emulate_attention(args: tuple) -> dict:
    heads, kv_heads, seq, d, tiles_dict, platform = args
    r = attention_backward_timing(heads, kv_heads, seq, d, tiles=AttentionTiles(**tiles_dict), platform=platform)
    return {"utilization": r.utilization, "cycles": r.cycles, "latency_ms": r.latency_ms, "stalls": r.stalls}


def attention_candidates(heads: int, kv_heads: int, seq: int, d: int, grid: dict | None = None,
                         platform: Platform = DEFAULT) -> tuple[list, list[Candidate]]:
    grid = {**ATTENTION_GRID, **check_grid(grid, ATTENTION_GRID)}
    feasible, pruned = [], []
    for br, bc, brp, bcp in itertools.product(grid["br"], grid["bc"], grid["br_prime"], grid["bc_prime"]):
        if brp > br or bcp > bc:
            continue
        t = AttentionTiles(br=br, bc=bc, d=d, br_prime=brp, bc_prime=bcp)
        try:
            plan_attention(heads, kv_heads, seq, d, tiles=t, platform=platform)
        except MtemuError as exc:
            pruned.append(Candidate(asdict(t), False, str(exc)))
            continue
        feasible.append(t)
    return feasible, pruned


def tune_attention(seq: int, heads: int, kv_heads: int, head_dim: int, *, platform: Platform = DEFAULT,
                   grid: dict | None = None, workers: int | None = None, scheduler: str | None = None,
                   out_dir: str | Path | None = None, progress: bool = True,
                   cache: bool = True) -> TuneResult:
    """Tile sweep of the resident Algorithm-1 backward (causal), ranked by emulated utilization."""
    platform = as_platform(platform)
    _check_common(workers, top=None)
    feasible, pruned = attention_candidates(heads, kv_heads, seq, head_dim, grid, platform)
    _refuse_unusable_grid(grid, feasible, pruned)
    default = default_tiles(head_dim, platform)
    plan_attention(heads, kv_heads, seq, head_dim, tiles=default, platform=platform)   # raises if it does not fit
    scheduler = connect_scheduler(scheduler)
    result = _sweep("attention", (heads, kv_heads, seq, head_dim), feasible, default, pruned, platform,
                    _emulate_attention, workers, scheduler, progress, cache)
    _annotate(result)
    return _write_outputs(result, out_dir, f"attention_h{heads}_kv{kv_heads}_s{seq}_d{head_dim}", grid,
                          ("br", "bc"), ATTENTION_GRID)

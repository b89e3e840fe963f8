"""Tile-size tuner: enumerate tiles, prune by capacity, emulate the rest, rank by utilization.

Candidates that do not fit SM/AM/GSM or the register file are pruned before anything is
emulated. Every emulated candidate is cached as its own small JSON file keyed by
(kernel, shape, tiles, platform hash, emulator version) and written atomically, so a rerun is
instant, an interrupted sweep resumes where it stopped, and a crash mid-write loses nothing.
Sweeps run on local processes, or on an existing Dask distributed cluster (``scheduler``).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import as_completed as done_order
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from rtcommon.fileio import atomic_write_figure, atomic_write_json

from .errors import AssemblyError, CapacityError, MtemuError
from .kernels.attention import attention_backward_timing, default_tiles, plan_attention
from .kernels.capacity import AttentionTiles
from .kernels.gemm import DEFAULT_TILES, GemmTiles, gemm_timing, plan_gemm
from .kernels.gemm_bound import gemm_bound
from .platform import DEFAULT, Platform
from .version import emulator_version

# Default GEMM grid: the dimensions that decide DDR traffic, plus two micro-kernel shapes.
GEMM_GRID = {
    "mg": (512, 1024, 2048),
    "k2": (64, 128, 256),
    "n2": (384, 576, 768, 960, 1152),
    "mr_nv": ((6, 4), (8, 3)),
}


def tune_cache_dir() -> Path:
    return Path(os.environ.get("MTEMU_CACHE_DIR", Path.home() / ".cache" / "mtemu")) / "tune"


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


def gemm_candidates(m: int, k: int, n: int, grid: dict | None = None, platform: Platform = DEFAULT
                    ) -> tuple[list[GemmTiles], list[Candidate]]:
    """(feasible tiles, pruned candidates with the capacity they exceed)."""
    grid = {**GEMM_GRID, **(grid or {})}
    feasible, pruned, seen = [], [], set()
    for mg, k2, n2, (mr, nv) in itertools.product(grid["mg"], grid["k2"], grid["n2"], grid["mr_nv"]):
        t = GemmTiles(mg=mg, k2=k2, n2=n2, mr=mr, nv=nv)
        try:
            plan = plan_gemm(m, k, n, t, platform)
        except (CapacityError, AssemblyError) as exc:
            pruned.append(Candidate(asdict(t), False, str(exc)))
            continue
        eff = plan.tiles               # clipped to the shape: identical candidates collapse
        if eff in seen:
            continue
        seen.add(eff)
        feasible.append(eff)
    return feasible, pruned


def _emulate(args: tuple) -> dict:
    m, k, n, tiles_dict, platform = args
    r = gemm_timing(m, k, n, tiles=GemmTiles(**tiles_dict), platform=platform)
    return {"utilization": r.utilization, "cycles": r.cycles, "latency_ms": r.latency_ms, "stalls": r.stalls}


class _Bar:
    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.time()

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

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "shape": list(self.shape), "default": self.default.to_json(),
                "best": self.best.to_json(), "candidates": [c.to_json() for c in self.candidates],
                "pruned": len(self.pruned), "pruned_reasons": [c.to_json() for c in self.pruned],
                "screened": [c.to_json() for c in self.screened],
                "heatmap": self.heatmap, "table": self.table,
                "gain_pp": 100 * (self.best.utilization - self.default.utilization)}


def _sweep(kernel: str, shape: tuple, feasible: list, default, pruned: list[Candidate], platform: Platform,
           emulate, workers: int | None, scheduler: str | None, progress: bool, cache: bool) -> TuneResult:
    """Emulate every feasible tile set not already cached (in parallel), rank by utilization."""
    if default not in feasible:
        feasible.append(default)
    version = emulator_version("gemm" if kernel == "gemm" else "attention")
    cdir = tune_cache_dir()
    results, todo = {}, []
    for t in feasible:
        raw = json.dumps([kernel, list(shape), asdict(t), platform.digest(), version], sort_keys=True)
        path = cdir / f"{hashlib.sha256(raw.encode()).hexdigest()[:24]}.json"
        hit = _read(path) if cache else None
        if hit is not None:
            results[t] = Candidate(asdict(t), True, **hit, cached=True)
        else:
            todo.append((t, path))
    bar = _Bar(len(feasible), progress)
    for _ in results:
        bar.step("cached")
    args = [(*shape, asdict(t), platform) for t, _ in todo]
    for (t, path), res in zip(todo, _map(args, workers, scheduler, bar, emulate), strict=False):
        results[t] = Candidate(asdict(t), True, **res)
        if cache:
            atomic_write_json(path, res)
    ranked = sorted(results.values(), key=lambda c: (-c.utilization, json.dumps(c.tiles, sort_keys=True)))
    return TuneResult(kernel, shape, results[default], ranked, pruned)


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
              workers: int | None = None, scheduler: str | None = None, out_dir: str | Path | None = "results/tune",
              progress: bool = True, cache: bool = True, emulate_top: int | None = None) -> TuneResult:
    """Tile sweep of the FP16 GEMM, ranked by emulated utilization.

    ``emulate_top``: emulate only the candidates with the highest closed-form bound
    (:mod:`mtemu.kernels.gemm_bound`) plus the defaults; the rest are reported as screened.
    The bound is an upper bound, so a screened candidate can only be missed if the bound's
    optimism (largest near the compute/DDR balance) reorders it past the cut.
    """
    feasible, pruned = gemm_candidates(m, k, n, grid, platform)
    default = plan_gemm(m, k, n, DEFAULT_TILES, platform).tiles   # raises with the reason if it does not fit
    feasible, screened = _screen(m, k, n, feasible, default, platform, emulate_top)
    result = _sweep("gemm", (m, k, n), feasible, default, pruned, platform, _emulate, workers, scheduler,
                    progress, cache)
    result.screened = screened
    _annotate(result, lambda t: gemm_bound(m, k, n, GemmTiles(**t), platform))
    return _write_outputs(result, out_dir, f"gemm_{m}x{k}x{n}", grid, ("mg", "n2"), GEMM_GRID)


def _annotate(result: TuneResult, bound=None) -> None:
    """Name each emulated candidate's top stall and, given ``bound`` (tiles -> GemmBound), its closed-form
    bound; derived after the sweep, so cache entries and keys are unchanged."""
    for c in [result.default, *result.candidates, *result.screened]:
        if c.stalls:
            c.top_stall = max(c.stalls, key=lambda k: (c.stalls[k], k))
        if bound is not None:
            b = bound(c.tiles)
            c.bound, c.bound_utilization = b.bound, b.utilization


def _screen(m: int, k: int, n: int, feasible: list[GemmTiles], default: GemmTiles, platform: Platform,
            top: int | None) -> tuple[list[GemmTiles], list[Candidate]]:
    """(tiles to emulate, screened-out candidates) ranked by the closed-form bound."""
    if top is None:
        return feasible, []
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise MtemuError(f"emulate_top must be a positive integer, got {top!r}")
    bound = {t: gemm_bound(m, k, n, t, platform).utilization for t in feasible}
    order = sorted(feasible, key=lambda t: (-bound[t], json.dumps(asdict(t), sort_keys=True)))
    screened = [Candidate(asdict(t), True, "screened out by the closed-form bound", bound_utilization=bound[t])
                for t in order[top:] if t != default]
    return order[:top], screened


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("utilization"), float):
        return None
    return {k: data[k] for k in ("utilization", "cycles", "latency_ms", "stalls") if k in data}


def _map(args: list, workers: int | None, scheduler: str | None, bar: _Bar, fn=None) -> Iterable[dict]:
    """Results in the order of ``args``; progress as they complete."""
    fn = fn or _emulate
    if not args:
        return []
    if scheduler:
        try:   # optional and slow to import (~1 s): only when a Dask scheduler is asked for
            from dask.distributed import Client, as_completed
        except ImportError:
            raise MtemuError("--scheduler needs dask.distributed: pip install 'ratrain-emu[distributed]'") from None
        client = Client(scheduler) if isinstance(scheduler, str) else scheduler
        futures = client.map(fn, args, pure=False)
        for _f in as_completed(futures):
            bar.step("dask")
        return client.gather(futures)
    workers = workers or os.cpu_count() or 1
    if workers == 1 or len(args) == 1:
        out = []
        for a in args:
            out.append(fn(a))
            bar.step()
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fn, a) for a in args]
        for _f in done_order(futures):
            bar.step()
        return [f.result() for f in futures]


def _heatmap(result: TuneResult, path: Path, grid: dict | None, axes: tuple[str, str] = ("mg", "n2"),
             base_grid: dict | None = None) -> None:
    """Best utilization over two tile dimensions (GEMM: mg x n2, which set DDR traffic); X = infeasible."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = {**(base_grid or GEMM_GRID), **(grid or {})}
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
    im = ax.imshow(z, cmap="viridis", aspect="auto", origin="lower")
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
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xticks(range(len(n2s)), n2s)
    ax.set_yticks(range(len(mgs)), mgs)
    labels = {"n2": "n2 (B panel width)", "mg": "mg (rows per m-block)", "br": "Br (query rows per tile)",
              "bc": "Bc (keys per tile)"}
    ax.set_xlabel(labels.get(xa, xa))
    ax.set_ylabel(labels.get(ya, ya))
    shape = "x".join(map(str, result.shape))
    screened = ", (v) = bound, screened out" if result.screened else ""
    ax.set_title(f"{result.kernel} {shape}: best utilization (%) per ({ya}, {xa})\n"
                 f"X = infeasible (pruned by capacity){screened}")
    fig.colorbar(im, ax=ax, label="MAC utilization (%)")
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=100)


def format_tune(result: TuneResult, top: int = 5) -> str:
    d = result.default
    lines = [f"{result.kernel} {'x'.join(map(str, result.shape))}: {len(result.candidates)} emulated, "
             f"{len(result.pruned)} pruned by capacity"
             + (f", {len(result.screened)} screened out by the closed-form bound" if result.screened else ""),
             f"  default  {_desc(d.tiles):40s} {100 * d.utilization:6.2f}%"]
    for i, c in enumerate(result.candidates[:top]):
        lines.append(f"  #{i + 1:<6} {_desc(c.tiles):40s} {100 * c.utilization:6.2f}%"
                     + ("  (cached)" if c.cached else ""))
    gain = 100 * (result.best.utilization - d.utilization)
    lines.append(f"  best is {gain:+.2f} pp over the defaults (the defaults stay the paper-matching validation tiles)")
    if result.heatmap:
        lines.append(f"  heatmap: {result.heatmap}\n  table:   {result.table}")
    return "\n".join(lines)


def _desc(t: dict) -> str:
    keys = ("mg", "k2", "n2", "mr", "nv") if "mg" in t else ("br", "bc", "br_prime", "bc_prime")
    return " ".join(f"{k}={t[k]}" for k in keys)


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
    grid = {**ATTENTION_GRID, **(grid or {})}
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
                   out_dir: str | Path | None = "results/tune", progress: bool = True,
                   cache: bool = True) -> TuneResult:
    """Tile sweep of the resident Algorithm-1 backward (causal), ranked by emulated utilization."""
    feasible, pruned = attention_candidates(heads, kv_heads, seq, head_dim, grid, platform)
    default = default_tiles(head_dim, platform)
    plan_attention(heads, kv_heads, seq, head_dim, tiles=default, platform=platform)   # raises if it does not fit
    result = _sweep("attention", (heads, kv_heads, seq, head_dim), feasible, default, pruned, platform,
                    _emulate_attention, workers, scheduler, progress, cache)
    _annotate(result)
    return _write_outputs(result, out_dir, f"attention_h{heads}_kv{kv_heads}_s{seq}_d{head_dim}", grid,
                          ("br", "bc"), ATTENTION_GRID)

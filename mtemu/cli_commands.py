"""`mtemu platform`, `mtemu gemm` and `mtemu validate`: thin layers over the library."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, fields

from .errors import MtemuError
from .kernels.gemm import DEFAULT_TILES, GemmTiles, gemm_timing, run_gemm
from .platform import Platform, load_platform

_PLATFORM_FLAGS = {f.name: f.type for f in fields(Platform) if f.name not in ("name", "latencies")}


def add_platform_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("platform", "override any platform field (see `mtemu platform --json`)")
    g.add_argument("--platform", metavar="FILE", help="TOML or JSON file of platform fields")
    for name in _PLATFORM_FLAGS:
        g.add_argument("--" + name.replace("_", "-"), dest="plat_" + name, type=float, default=None,
                       metavar="X", help=argparse.SUPPRESS)


def platform_from_args(args: argparse.Namespace) -> Platform:
    overrides = {}
    for name, typ in _PLATFORM_FLAGS.items():
        v = getattr(args, "plat_" + name, None)
        if v is not None:
            if typ in (int, "int"):
                if v != int(v):
                    raise MtemuError(f"--{name.replace('_', '-')} must be an integer, got {v}")
                v = int(v)
            overrides[name] = v
    return load_platform(args.platform, **overrides)


def add_tile_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tiles", f"GEMM tile sizes (defaults: {DEFAULT_TILES.describe()})")
    for f in fields(GemmTiles):
        if f.name == "pipelined":
            continue
        g.add_argument("--" + f.name, type=int, default=None)
    g.add_argument("--no-pipeline", action="store_true", help="variant without load/compute overlap")


def add_loop_order_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("loop order")
    g.add_argument("--loop-order", choices=("c-stationary", "a-resident"), default="c-stationary",
                   help="c-stationary (default): C in AM for all of K; a-resident: Fig. 4's A_g resident in GSM, "
                        "C through DDR between k-blocks as FP16 partial sums")
    g.add_argument("--kg", type=int, help="a-resident: columns of A per resident A_g block")
    g.add_argument("--b-slots", type=int, help="a-resident: B tiles in AM (2 or 3)")


def any_tiles_from_args(args: argparse.Namespace):
    """GemmTiles, or AResidentGemmTiles with --loop-order a-resident (its own defaults)."""
    if getattr(args, "loop_order", "c-stationary") != "a-resident":
        for flag in ("kg", "b_slots"):
            if getattr(args, flag, None) is not None:
                raise MtemuError(f"--{flag.replace('_', '-')} applies to --loop-order a-resident only")
        return tiles_from_args(args)
    from .kernels.gemm_a_resident import AResidentGemmTiles
    if getattr(args, "no_pipeline", False):
        raise MtemuError("--no-pipeline applies to the default loop order only")
    kw = {f.name: getattr(args, f.name) for f in fields(AResidentGemmTiles)
          if f.name != "pipelined" and getattr(args, f.name, None) is not None}
    return AResidentGemmTiles(**kw)


def tiles_from_args(args: argparse.Namespace) -> GemmTiles:
    kw = {f.name: getattr(args, f.name) for f in fields(GemmTiles) if f.name != "pipelined" and getattr(args, f.name, None) is not None}
    if getattr(args, "no_pipeline", False):
        kw["pipelined"] = False
    return GemmTiles(**{**asdict(DEFAULT_TILES), **kw})


# --- platform -------------------------------------------------------------------------------
def _platform(args):
    plat = platform_from_args(args)
    d = plat.to_dict()
    text = "\n".join(f"{k:24s} {v}" for k, v in d.items())
    return d, text


# --- gemm -----------------------------------------------------------------------------------
def _gemm(args):
    plat = platform_from_args(args)
    tiles = any_tiles_from_args(args)
    if args.loop_order == "a-resident":
        return _gemm_a_resident(args, plat, tiles)
    if args.mode == "timing":
        r = gemm_timing(args.m, args.k, args.n, tiles=tiles, platform=plat)
    else:
        r = run_gemm(*_random_operands(args), platform=plat, tiles=tiles, mode="functional")
    # what bounds it: the closed-form DDR and VMAC times beside the emulated cycles
    from .kernels.gemm_bound import gemm_bound
    bound = gemm_bound(args.m, args.k, args.n, tiles, plat)
    payload = r.to_json()
    payload["bound"] = {"bound_by": bound.bound, "ddr_cycles": bound.ddr_cycles,
                        "compute_cycles": bound.compute_cycles, "utilization": bound.utilization}
    total = sum(r.stalls.values())
    text = (f"GEMM {r.m}x{r.k}x{r.n} ({r.mode}), tiles {r.tiles.describe()}\n"
            f"  cycles       {r.cycles}\n  utilization  {100 * r.utilization:.2f}%\n"
            f"  throughput   {r.tmac_per_s:.3f} T MAC/s\n  latency      {r.latency_ms:.3f} ms\n"
            f"  DDR traffic  {r.ddr_bytes / 1e6:.1f} MB\n"
            f"  bound        {bound.bound}-bound: DDR {bound.ddr_cycles:.0f} / VMAC {bound.compute_cycles} cycles, "
            f"at most {100 * bound.utilization:.2f}%\n"
            f"  stalls (DSP-cycles): " + ", ".join(f"{k} {v}" for k, v in r.stalls.items()) + f" (total {total})")
    return payload, text


def _random_operands(args):
    import numpy as np
    rng = np.random.default_rng(args.seed)
    return (rng.standard_normal((args.m, args.k)).astype(np.float16),
            rng.standard_normal((args.k, args.n)).astype(np.float16))


def _gemm_a_resident(args, plat, tiles):
    from .kernels.gemm_a_resident import a_resident_timing, run_a_resident
    from .kernels.gemm_bound import a_resident_bound
    if args.mode == "timing":
        r = a_resident_timing(args.m, args.k, args.n, tiles=tiles, platform=plat)
    else:
        r = run_a_resident(*_random_operands(args), platform=plat, tiles=tiles)
    t = r.tiles
    bound = a_resident_bound(args.m, args.k, args.n, t.mg, t.kg, t.n2, plat)
    payload = r.to_json()
    payload["bound"] = {"utilization": bound}
    text = (f"GEMM {r.m}x{r.k}x{r.n} ({r.mode}), tiles {t.describe()}\n"
            f"  cycles       {r.cycles}\n  utilization  {100 * r.utilization:.2f}% (closed-form bound "
            f"{100 * bound:.2f}%)\n  throughput   {r.tmac_per_s:.3f} T MAC/s\n  latency      {r.latency_ms:.3f} ms\n"
            f"  DDR traffic  {r.ddr_bytes / 1e6:.1f} MB\n"
            f"  stalls (DSP-cycles): " + ", ".join(f"{k} {v}" for k, v in r.stalls.items()))
    return payload, text


# --- validate -------------------------------------------------------------------------------
def _validate(args):
    plat = platform_from_args(args)
    if args.what == "table5":
        from .validate import format_table5, format_variants, table5, table5_variants
        tiles = any_tiles_from_args(args)
        rows = table5(plat, tiles, progress=not args.json)
        variants = table5_variants(plat, tiles) if isinstance(tiles, GemmTiles) else []
        ok = sum(r.ok for r in rows)
        text = (f"tiles: {tiles.describe()}\n" + format_table5(rows) + f"\n{ok}/{len(rows)} rows within {1.5} pp of "
                f"the paper (fit rows: 4096x4096, 8192x8192; the others are held out)"
                + (f"\n\n{format_variants(variants)}" if variants else ""))
        return {"rows": [r.to_json() for r in rows], "variants": variants, "platform_hash": plat.digest()}, text
    if args.what == "table5-study":
        return _table5_study(args, plat)
    if args.what == "attention":
        from .cli_attention import _validate_attention
        return _validate_attention(args)
    raise MtemuError(f"unknown validation {args.what!r}")


def _table5_study(args, plat):
    from .calibrate import bandwidth_study, emulate_fit, format_study, plot_study
    rows = bandwidth_study([1e9 * x for x in _floats(args.bandwidths, "--bandwidths")], plat)
    note = None if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    emulated = [emulate_fit(getattr(r, strategy), plat, progress=note)
                for strategy in args.emulate or () if strategy != "a-resident" for r in rows]
    if "a-resident" in (args.emulate or ()):
        from .calibrate import emulate_a_resident
        emulated.append(emulate_a_resident(base=plat, progress=note))
    if args.plot:
        plot_study(rows, args.plot, emulated)
    text = format_study(rows, emulated) + (f"\nplot: {args.plot}" if args.plot else "")
    return {"rows": [r.to_json() for r in rows], "emulated": [e.to_json() for e in emulated],
            "platform_hash": plat.digest()}, text


def _floats(text: str, flag: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MtemuError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not v > 0 for v in vals):
        raise MtemuError(f"{flag}: expected positive numbers, got {text!r}")
    return vals


# --- tune -----------------------------------------------------------------------------------
def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise MtemuError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not vals or min(vals) <= 0:
        raise MtemuError(f"expected positive integers, got {text!r}")
    return vals


def _tune(args):
    from .tune import format_tune, tune_attention, tune_gemm
    plat = platform_from_args(args)
    if args.kernel == "attention":
        for name in ("seq", "heads", "head_dim"):
            if getattr(args, name) is None:
                raise MtemuError(f"mtemu tune attention needs --{name.replace('_', '-')}")
        grid = {}
        for name in ("br", "bc"):
            v = getattr(args, "grid_" + name)
            if v:
                grid[name] = _ints(v)
        r = tune_attention(args.seq, args.heads, args.kv_heads or args.heads, args.head_dim, platform=plat, grid=grid,
                           workers=args.workers, scheduler=args.scheduler, out_dir=args.out, progress=not args.json,
                           cache=not args.no_cache)
        return r.to_json(), format_tune(r, args.top)
    for name in ("m", "k", "n"):
        if getattr(args, name) is None:
            raise MtemuError(f"mtemu tune gemm needs --{name}")
    grid = {}
    for name in ("mg", "k2", "n2"):
        v = getattr(args, "grid_" + name)
        if v:
            grid[name] = _ints(v)
    r = tune_gemm(args.m, args.k, args.n, platform=plat, grid=grid, workers=args.workers, scheduler=args.scheduler,
                  out_dir=args.out, progress=not args.json, cache=not args.no_cache, emulate_top=args.emulate_top)
    return r.to_json(), format_tune(r, args.top)


def register(sub) -> None:
    p = sub.add_parser("platform", help="print the platform spec")
    add_platform_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_platform)

    p = sub.add_parser("gemm", help="emulate an FP16 GEMM C[M,N] = A[M,K] B[K,N]")
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--mode", choices=("timing", "functional"), default="timing")
    add_loop_order_args(p)
    p.add_argument("--seed", type=int, default=0, help="random inputs in functional mode")
    add_tile_args(p)
    add_platform_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_gemm)

    p = sub.add_parser("tune", help="search tile sizes: prune by capacity, emulate, rank by utilization")
    p.add_argument("kernel", choices=("gemm", "attention"))
    p.add_argument("--m", type=int, help="GEMM rows (tune gemm)")
    p.add_argument("--k", type=int, help="GEMM inner dimension (tune gemm)")
    p.add_argument("--n", type=int, help="GEMM columns (tune gemm)")
    p.add_argument("--seq", type=int, help="sequence length (tune attention)")
    p.add_argument("--heads", type=int, help="query heads (tune attention)")
    p.add_argument("--kv-heads", type=int, help="KV heads (tune attention; default --heads)")
    p.add_argument("--head-dim", type=int, help="head dimension (tune attention)")
    p.add_argument("--br", dest="grid_br", metavar="LIST", help="comma-separated Br values (attention)")
    p.add_argument("--bc", dest="grid_bc", metavar="LIST", help="comma-separated Bc values (attention)")
    p.add_argument("--mg", dest="grid_mg", metavar="LIST", help="comma-separated mg values to try")
    p.add_argument("--k2", dest="grid_k2", metavar="LIST")
    p.add_argument("--n2", dest="grid_n2", metavar="LIST")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: all cores)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run on an existing Dask distributed cluster")
    p.add_argument("--out", default="results/tune", help="folder for the heatmap and table")
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--emulate-top", type=int, metavar="N",
                   help="GEMM: emulate only the N candidates with the best closed-form bound (plus the defaults)")
    p.add_argument("--no-cache", action="store_true", help="re-emulate even if cached")
    add_platform_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_tune)

    p = sub.add_parser("validate", help="compare emulated kernels with the paper")
    p.add_argument("what", choices=("table5", "table5-study", "attention"),
                   help="table5: FP16 GEMM utilization; table5-study: which DDR rate and calibration could "
                        "meet Table 5 (closed-form, optionally emulated); attention: resident vs DDR-staged "
                        "backward (Fig. 10)")
    add_loop_order_args(p)
    study = p.add_argument_group("table5-study")
    study.add_argument("--bandwidths", default="30,35,40,45,51", metavar="GBS",
                       help="comma-separated DDR server rates in GB/s (default: 30,35,40,45,51)")
    study.add_argument("--emulate", action="append", choices=("fixed", "protocol", "oracle", "a-resident"),
                       help="also emulate this strategy's fit at every rate (repeatable; ~35 s per rate); "
                            "a-resident: the emulated Fig. 4 loop order at the raw 51 GB/s, no fitted constant")
    study.add_argument("--plot", metavar="FILE", help="write the study figure (PNG)")
    add_tile_args(p)
    add_platform_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_validate)

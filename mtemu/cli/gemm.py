"""`mtemu gemm`: emulate one FP16 GEMM (either loop order) beside its closed-form bound."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..platform import Platform
from .args import add_loop_order_args, add_platform_args, add_tile_args, any_tiles_from_args, platform_from_args
from .run import add_trace_args, report_extras, trace_options

if TYPE_CHECKING:
    import numpy as np

    from ..kernels.gemm_a_resident import AResidentGemmTiles
    from ..trace import TraceOptions


def _gemm(args: argparse.Namespace) -> tuple[dict, str]:
    from ..explain import gemm_tile_moves
    trace, window = trace_options(args)
    plat = platform_from_args(args)
    tiles = any_tiles_from_args(args)
    if args.loop_order == "a-resident":
        payload, text, r = _gemm_a_resident(args, plat, tiles, trace)
        gemm = None        # the closed form's tile moves describe the default loop order only
    else:
        payload, text, r = _gemm_c_stationary(args, plat, tiles, trace)
        gemm = gemm_tile_moves(args.m, args.k, args.n, tiles, plat) if (args.explain or args.roofline) else None
    extra, lines = report_extras(r.stats, args, window, args.m * args.k * args.n, gemm)
    payload.update(extra)
    return payload, "\n".join([text] + lines)


def _gemm_c_stationary(args: argparse.Namespace, plat: Platform, tiles, trace: TraceOptions | None):
    from ..kernels.gemm import gemm_timing, run_gemm
    from ..kernels.gemm_bound import gemm_bound
    if args.mode == "timing":
        r = gemm_timing(args.m, args.k, args.n, tiles=tiles, platform=plat, trace=trace)
    else:
        r = run_gemm(*_random_operands(args), platform=plat, tiles=tiles, mode="functional", trace=trace)
    # what bounds it: the closed-form DDR and VMAC times beside the emulated cycles
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
    return payload, text, r


def _random_operands(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np
    rng = np.random.default_rng(args.seed)
    return (rng.standard_normal((args.m, args.k)).astype(np.float16),
            rng.standard_normal((args.k, args.n)).astype(np.float16))


def _gemm_a_resident(args: argparse.Namespace, plat: Platform, tiles: AResidentGemmTiles,
                     trace: TraceOptions | None):
    from ..kernels.gemm_a_resident import a_resident_timing, run_a_resident
    from ..kernels.gemm_bound import a_resident_bound
    if args.mode == "timing":
        r = a_resident_timing(args.m, args.k, args.n, tiles=tiles, platform=plat, trace=trace)
    else:
        r = run_a_resident(*_random_operands(args), platform=plat, tiles=tiles, trace=trace)
    t = r.tiles
    bound = a_resident_bound(args.m, args.k, args.n, t.mg, t.kg, t.n2, plat)
    payload = r.to_json()
    # the closed form compares DDR time with the ideal VMAC time: below 1 the DDR binds
    payload["bound"] = {"bound_by": "ddr" if bound < 1 else "compute", "utilization": bound}
    text = (f"GEMM {r.m}x{r.k}x{r.n} ({r.mode}), tiles {t.describe()}\n"
            f"  cycles       {r.cycles}\n  utilization  {100 * r.utilization:.2f}% (closed-form bound "
            f"{100 * bound:.2f}%)\n  throughput   {r.tmac_per_s:.3f} T MAC/s\n  latency      {r.latency_ms:.3f} ms\n"
            f"  DDR traffic  {r.ddr_bytes / 1e6:.1f} MB\n"
            f"  stalls (DSP-cycles): " + ", ".join(f"{k} {v}" for k, v in r.stalls.items()))
    return payload, text, r


def register(sub) -> None:
    p = sub.add_parser("gemm", help="emulate an FP16 GEMM C[M,N] = A[M,K] B[K,N]")
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--mode", choices=("timing", "functional"), default="timing")
    add_loop_order_args(p)
    p.add_argument("--seed", type=int, default=0, help="random inputs in functional mode")
    add_tile_args(p)
    add_platform_args(p)
    add_trace_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_gemm)


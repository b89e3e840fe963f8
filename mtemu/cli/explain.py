"""`mtemu explain`: which resource bounds a kernel, with the numbers.

``mtemu explain gemm --m M --k K --n N [--loop-order NAME] [tiles]`` runs the GEMM (the default
loop order unless named) in timing mode and, for the c-stationary one, adds the closed form's tile
moves; ``mtemu explain program PROGRAM [run options]`` explains any program.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict

from ..errors import MtemuError
from ..platform import load_platform
from .args import add_loop_order_args, add_tile_args, any_tiles_from_args
from .run import add_program_args, add_trace_args, report_extras, trace_line, trace_options


def _gemm(args: argparse.Namespace):
    from ..explain import explain_gemm, plot_roofline
    from ..kernels.registry import gemm_variant
    from ..trace import write_chrome_trace
    trace, window = trace_options(args)
    plat = load_platform(args.platform)
    for name in ("m", "k", "n"):
        if getattr(args, name) <= 0:
            raise MtemuError(f"--{name} must be positive, got {getattr(args, name)}")
    tiles = any_tiles_from_args(args)
    ex, stats = explain_gemm(args.m, args.k, args.n, tiles, plat, trace)
    effective = gemm_variant(args.loop_order).plan(args.m, args.k, args.n, tiles, plat).tiles
    payload = {"kernel": "gemm", "loop_order": args.loop_order, "m": args.m, "k": args.k, "n": args.n,
               "tiles": asdict(effective), "explanation": ex.to_json()}
    lines = [f"GEMM {args.m}x{args.k}x{args.n}, tiles {effective.describe()}", ex.text()]
    if args.trace:
        info = write_chrome_trace(stats.trace, args.trace, window, args.trace_max_events)
        payload["trace"] = info
        lines.append(trace_line(info, window))
    if args.roofline:
        plot_roofline(ex, args.roofline, f"GEMM {args.m}x{args.k}x{args.n}: bound by {ex.binding}")
        payload["roofline"] = args.roofline
        lines.append(f"roofline: {args.roofline}")
    return payload, "\n".join(lines)


def _program(args: argparse.Namespace):
    from ..program_runner import run_program
    trace, window = trace_options(args)
    plat = load_platform(args.platform)
    result = run_program(args.program, plat, inputs=args.input, outputs=[], out_dir=None, mode=args.mode,
                         dsps=args.dsps, max_cycles=args.max_cycles, trace=trace, max_seconds=args.max_seconds,
                         build_seconds=args.build_seconds)
    args.explain = True
    extra, lines = report_extras(result.stats, args, window, result.report.macs)
    payload = {"kernel": "program", "program": args.program, "run": result.report.to_json(), **extra}
    return payload, "\n".join([f"{args.program}: {result.report.cycles} cycles"] + lines)


def register(subparsers) -> None:
    p = subparsers.add_parser("explain", help="which resource bounds a kernel (VMAC, DDR, GSM, DMA, latency, barriers)",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="target", required=True)
    g = sub.add_parser("gemm", help="the emulated FP16 GEMM, with the closed form's tile moves")
    g.add_argument("--m", type=int, required=True)
    g.add_argument("--k", type=int, required=True)
    g.add_argument("--n", type=int, required=True)
    add_loop_order_args(g)
    add_tile_args(g)
    g.add_argument("--platform", metavar="FILE", help="TOML or JSON file of platform fields")
    add_trace_args(g, explain_flag=False)
    g.add_argument("--json", action="store_true")
    g.set_defaults(handler=_gemm)
    q = sub.add_parser("program", help="a text or Python program (as for `mtemu run`; outputs are not written)")
    add_program_args(q)
    add_trace_args(q, explain_flag=False)
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=_program)

"""`mtemu run PROGRAM`: assemble or load a program, place its inputs, run it, write its outputs.

Also the trace and explain flags every kernel command can share: :func:`add_trace_args`,
:func:`trace_options` (before the run) and :func:`report_extras` (after it).
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..errors import MtemuError
from ..platform import load_platform
from .defaults import PROGRAM_BUILD_SECONDS, PROGRAM_MAX_SECONDS, TRACE_CAPACITY, TRACE_MAX_EVENTS

if TYPE_CHECKING:
    from ..machine import RunStats
    from ..trace import TraceOptions


def add_trace_args(p: argparse.ArgumentParser, explain_flag: bool = True) -> None:
    g = p.add_argument_group("where the cycles went")
    g.add_argument("--trace", metavar="FILE.json", help="write a Chrome/Perfetto trace of the run")
    g.add_argument("--trace-window", metavar="START:END",
                   help="cycles kept at full detail (outside: short spans merged per bin)")
    g.add_argument("--trace-max-events", type=int, default=TRACE_MAX_EVENTS, metavar="N",
                   help=f"merge short spans until the trace has at most N spans (default {TRACE_MAX_EVENTS})")
    g.add_argument("--trace-capacity", type=int, default=TRACE_CAPACITY, metavar="N",
                   help="state changes recorded per DSP (more are counted and reported as dropped)")
    if explain_flag:
        g.add_argument("--explain", action="store_true", help="which resource bounds the run, with the numbers")
    g.add_argument("--roofline", metavar="FILE.png", help="roofline plot of the run (implies --explain)")


def trace_options(args: argparse.Namespace) -> tuple[TraceOptions | None, tuple[int, int] | None]:
    """Check the trace flags before anything runs."""
    from ..trace import TraceOptions, parse_window
    window = parse_window(args.trace_window) if args.trace_window else None
    if window and not args.trace:
        raise MtemuError("--trace-window needs --trace FILE.json")
    if args.trace_max_events < 1:
        raise MtemuError(f"--trace-max-events must be positive, got {args.trace_max_events}")
    if args.trace_capacity < 1:
        raise MtemuError(f"--trace-capacity must be positive, got {args.trace_capacity}")
    return (TraceOptions(capacity=args.trace_capacity) if args.trace else None), window


def report_extras(stats: RunStats, args: argparse.Namespace, window: tuple[int, int] | None,
                  useful_macs: int | None = None, gemm: dict | None = None) -> tuple[dict, list[str]]:
    """Write the trace and roofline the flags ask for; (payload additions, text lines)."""
    from ..explain import explain, plot_roofline
    from ..trace import write_chrome_trace
    payload: dict = {}
    lines: list[str] = []
    if args.trace:
        info = write_chrome_trace(stats.trace, args.trace, window, args.trace_max_events)
        payload["trace"] = info
        lines.append(trace_line(info, window))
    if getattr(args, "explain", False) or args.roofline:
        ex = explain(stats, useful_macs=useful_macs, gemm=gemm)
        payload["explanation"] = ex.to_json()
        lines.append(ex.text())
        if args.roofline:
            plot_roofline(ex, args.roofline)
            payload["roofline"] = args.roofline
            lines.append(f"roofline: {args.roofline}")
    return payload, lines


def trace_line(info: dict, window: tuple[int, int] | None) -> str:
    """One line saying what the trace file holds."""
    res = info["resolution_cycles"]
    detail = "full detail" if res <= 1 else f"spans under {res} cycles merged per bin" + (
        f" outside {window[0]}:{window[1]}" if window else "")
    dropped = {k: v for k, v in info["dropped"].items() if v}
    return (f"trace: {info['path']} ({info['spans']} spans, {info['bytes'] / 1e6:.1f} MB, {detail})"
            + (f"; buffer full, dropped {dropped}" if dropped else ""))


def add_program_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="text program (assembler form) or Python file defining build(platform)")
    p.add_argument("--dsps", type=int, help="DSPs to run on (default: what the program declares, else the platform's)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy[@SPACE:ADDR]",
                   help="place an array (a declared input, or at SPACE:ADDR); repeatable")
    p.add_argument("--mode", choices=("functional", "timing"), default="functional",
                   help="timing: no data (inputs are checked, not placed; no outputs)")
    p.add_argument("--platform", metavar="FILE", help="TOML or JSON file of platform fields")
    p.add_argument("--max-cycles", type=int, metavar="N",
                   help="stop with an error past N cycles (default: derived from the program's size and data)")
    p.add_argument("--max-seconds", type=float, default=PROGRAM_MAX_SECONDS, metavar="S",
                   help=f"stop with an error past S seconds of host time, whatever the cycle limit "
                        f"(default {PROGRAM_MAX_SECONDS:g})")
    p.add_argument("--build-seconds", type=float, default=PROGRAM_BUILD_SECONDS, metavar="S",
                   help=f"a Python program: stop with an error when loading it and its build(platform) take "
                        f"more than S seconds of host time (default {PROGRAM_BUILD_SECONDS:g})")


def _run(args: argparse.Namespace):
    from ..program_runner import run_program
    trace, window = trace_options(args)
    plat = load_platform(args.platform)
    result = run_program(args.program, plat, inputs=args.input, outputs=args.output, out_dir=args.out_dir,
                         mode=args.mode, dsps=args.dsps, max_cycles=args.max_cycles, trace=trace,
                         max_seconds=args.max_seconds, build_seconds=args.build_seconds)
    payload = result.report.to_json()
    extra, lines = report_extras(result.stats, args, window, result.report.macs)
    payload.update(extra)
    return payload, "\n".join([result.report.text()] + lines)


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run a program: place inputs, run, write outputs, report cycles",
                              description=__doc__.splitlines()[0])
    add_program_args(p)
    p.add_argument("--output", action="append", default=[], metavar="NAME[=SPACE:ADDR:SHAPE:DTYPE]",
                   help="read back after the run into OUT_DIR/NAME.npy (default: every declared output)")
    p.add_argument("--out-dir", default=".", metavar="DIR", help="folder for the output .npy files")
    add_trace_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_run)

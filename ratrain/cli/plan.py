"""`ratrain plan`: resource-aware configuration search (Algorithm 2) over a cluster count.

Example::

    ratrain plan --model llama2-70b --clusters 96 --global-batch 32 --profile roofline --json
"""
from __future__ import annotations

import argparse

from ratrain.cli.args import add_platform_args, platform_from_args
from ratrain.cost.terms import PROFILE_SOURCES
from ratrain.errors import ConfigError
from ratrain.plan.planner import MAX_MICRO_BATCH, METHODS, Planner
from ratrain.spec.models import from_hf_config, get_model, list_models
from ratrain.spec.platform import GIB


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="search (P, D, Z, T, b, A, activation, prefetch) for the fastest "
                                           "memory-feasible configuration (Algorithm 2)")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--model", help=f"built-in model: {', '.join(list_models())}")
    group.add_argument("--hf-config", metavar="FILE", help="HuggingFace config.json")
    p.add_argument("--clusters", type=int, required=True, help="clusters N = P * D * T")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per step G = D * b * A")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--method", choices=METHODS, default="ratrain", help="RATrain or a baseline")
    p.add_argument("--top", type=int, default=10, help="how many ranked configurations to print")
    p.add_argument("--profile", choices=PROFILE_SOURCES, default="emulated",
                   help="latency profile source (roofline: analytic stand-in, fast)")
    p.add_argument("--micro-batches", type=_int_list, default=None, metavar="B1,B2,...",
                   help=f"micro-batch sizes to try (default: divisors of G/D up to {MAX_MICRO_BATCH})")
    p.add_argument("--tp-degrees", type=_int_list, default=None, metavar="T1,T2,...",
                   help="tensor-parallel degrees to try (default: valid divisors of N up to 8)")
    p.add_argument("--zero-stages", type=_int_list, default=None, metavar="Z1,Z2,...",
                   help="ZeRO stages to try (default: 0,1,2,3)")
    p.add_argument("--partition", choices=("balanced", "uniform"), default="balanced")
    add_platform_args(p)
    p.add_argument("--confirm", type=int, default=3, metavar="N",
                   help="finalists re-estimated on emulated kernels after ranking every candidate on the fast "
                        "kernel model (default 3; 0: the fast model's ranking alone, in seconds)")
    p.add_argument("--json", action="store_true", help="print the JSON payload")
    p.set_defaults(handler=run)


def _row(c) -> str:
    bd = c.breakdown
    mark = "" if c.kernels == "emulated" else f"  ({c.kernels} kernel model)"
    return (f"{c.config.describe():<28} b={c.config.micro_batch:<2} A={c.config.accum:<4} "
            f"{c.config.prefetch:<9} step {c.step_ms / 1e3:9.2f} s  peak {c.peak_bytes / GIB:5.2f} GB  "
            f"[1F1B {bd.t_1f1b_ms / 1e3:.2f} + comm {bd.e_comm_ms / 1e3:.2f} + upd {bd.e_upd_ms / 1e3:.2f} "
            f"+ pref {bd.e_pref_ms / 1e3:.2f} + rec {bd.e_rec_ms / 1e3:.2f}]{mark}")


def run(args: argparse.Namespace) -> tuple[dict, str]:
    model = get_model(args.model) if args.model else from_hf_config(args.hf_config)
    platform = platform_from_args(args)
    for name in ("clusters", "global_batch", "seq", "top"):
        value = getattr(args, name)
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.confirm < 0:
        raise ConfigError(f"--confirm must be 0 or more, got {args.confirm}")
    planner = Planner(model, platform, profile_source=args.profile, partition=args.partition,
                      progress=not args.json)
    result = planner.plan(args.clusters, args.global_batch, args.seq, args.method, args.top,
                          micro_batches=args.micro_batches, tp_degrees=args.tp_degrees,
                          zero_stages=args.zero_stages, confirm=args.confirm)
    payload = result.to_json()
    lines = [f"{model.name}: {args.clusters} clusters, global batch {args.global_batch} x {args.seq}, "
             f"method {args.method}, profile {args.profile}",
             f"enumerated {result.enumerated}, pruned by memory {result.pruned_by_memory}, timed {result.timed} "
             f"({result.configs_per_s:.0f} configurations/s; {result.profile_s:.1f} s building profiles)"]
    if result.confirmed:
        lines.append(f"ranked on the fast kernel model ({result.kernel_model}); the {result.confirmed} best confirmed "
                     f"on emulated kernels: fast model within {100 * result.fast_error:.2f}%, "
                     + ("emulation REORDERED them" if result.reordered else "same order"))
    if result.best is None:
        lines.append("no configuration fits the memory budget (OOM)")
    else:
        lines.append("best: " + _row(result.best))
        lines += [f"{i + 1:>3}. " + _row(c) for i, c in enumerate(result.ranked)]
    return payload, "\n".join(lines)

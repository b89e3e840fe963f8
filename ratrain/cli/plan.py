"""`ratrain plan`: resource-aware configuration search (Algorithm 2) over a cluster count.

Example::

    ratrain plan --model llama2-70b --clusters 96 --global-batch 32 --profile roofline --json
"""
from __future__ import annotations

import argparse
import os

from ratrain.cli.args import (
    add_model_choice,
    add_platform_args,
    add_run_choice_args,
    any_platform_from_args,
    model_from_args,
    run_choices_from_args,
)
from ratrain.cost.sources import PROFILE_SOURCES
from ratrain.errors import ConfigError
from ratrain.plan.choices import DEFAULT_VIRTUAL_STAGES, MAX_MICRO_BATCH, MAX_TP, METHODS
from ratrain.plan.space import DEFAULT_SPACE, SEARCH_SPACES, SearchSpace
from ratrain.spec.gpu import GpuPlatform
from ratrain.spec.models import ModelSpec, check_tp
from ratrain.spec.parallel import ZERO_STAGES
from ratrain.spec.platform import GIB

# Beyond these the enumeration (divisors of N and of G/D) is not a plan anyone can run, and
# trial division of a 30-digit N would not finish.
MAX_CLUSTERS = 1 << 20
MAX_GLOBAL_BATCH = 1 << 24
MAX_SEQ = 1 << 22


def _int_list(text: str, minimum: int = 1) -> tuple[int, ...]:
    kind = "positive" if minimum == 1 else f">= {minimum}"
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip() and len(v.strip()) <= 30)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {kind} integers, got {text!r}") from None
    if not values or len(values) != len([v for v in text.split(",") if v.strip()]) or any(v < minimum for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated {kind} integers, got {text!r}")
    return values


def _stage_list(text: str) -> tuple[int, ...]:
    """ZeRO stages: 0 is a stage."""
    return _int_list(text, minimum=0)


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="search (P, D, Z, T, b, A, activation, prefetch) for the fastest "
                                           "memory-feasible configuration (Algorithm 2)")
    add_model_choice(p)
    p.add_argument("--clusters", type=int, required=True, help="clusters N = P * D * T (* CP with --cp)")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per step G = D * b * A")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--method", choices=METHODS, default="ratrain", help="RATrain or a baseline")
    p.add_argument("--top", type=int, default=10, help="how many ranked configurations to print")
    p.add_argument("--profile", choices=PROFILE_SOURCES, default="emulated",
                   help="latency profile source (roofline: analytic stand-in, fast)")
    p.add_argument("--space", choices=tuple(SEARCH_SPACES), default=DEFAULT_SPACE,
                   help="search space: " + "; ".join(f"{s.name}{' (default)' if s.name == DEFAULT_SPACE else ''}: "
                                                     f"{s.description}" for s in SEARCH_SPACES.values())
                        + ". --micro-batches, --tp-degrees and --zero-stages replace its lists")
    p.add_argument("--micro-batches", type=_int_list, default=None, metavar="B1,B2,...",
                   help=f"micro-batch sizes to try (default: the space's; wide: divisors of G/D up to "
                        f"{MAX_MICRO_BATCH})")
    p.add_argument("--tp-degrees", type=_int_list, default=None, metavar="T1,T2,...",
                   help=f"tensor-parallel degrees to try (default: the space's; wide: valid divisors of N up to "
                        f"{MAX_TP})")
    p.add_argument("--zero-stages", type=_stage_list, default=None, metavar="Z1,Z2,...",
                   help="ZeRO stages to try (default: the space's; wide: 0,1,2,3)")
    p.add_argument("--partition", choices=("balanced", "uniform"), default="balanced")
    add_run_choice_args(p)
    add_platform_args(p)
    p.add_argument("--confirm", type=int, default=3, metavar="N",
                   help="finalists re-estimated on emulated kernels after ranking every candidate on the fast "
                        "kernel model (default 3; 0: the fast model's ranking alone, in seconds)")
    p.add_argument("--schedules", default="1f1b", metavar="S1,S2,...",
                   help="pipeline schedules to search: 1f1b, gpipe, interleaved, zb-h1, or 'all' (default 1f1b); "
                        "with more than 1f1b the --confirm finalists are also simulated under their schedule")
    p.add_argument("--virtual-stages", type=lambda t: _int_list(t, minimum=2), default=(DEFAULT_VIRTUAL_STAGES,),
                   metavar="V1,V2,...",
                   help=f"chunks per stage tried for interleaved (default {DEFAULT_VIRTUAL_STAGES})")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="local processes that emulate the kernels of latency profiles not built yet (a first run "
                        "on a new model or platform; default: the cores other jobs leave idle, at least 1)")
    p.add_argument("--json", action="store_true", help="print the JSON payload")
    p.set_defaults(handler=run)


def idle_cores() -> int:
    """The cores other jobs leave idle (cores minus the 1-minute load average, at least 1): on a busy
    machine more processes only share the same cores and add their start-up."""
    cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):        # no load average on this system
        return cores
    return max(1, cores - round(busy))


def _row(c, schedules: bool = False, gpu: bool = False) -> str:
    bd = c.breakdown
    mark = "" if c.kernels == "emulated" or gpu else f"  ({c.kernels} kernel model)"
    if c.simulated_step_ms is not None:
        mark += f"  simulated {c.simulated_step_ms / 1e3:.2f} s"
    sched = "" if c.schedule.name == "1f1b" and not schedules else f"{c.schedule.label():<16} "
    return (f"{sched}{c.config.describe():<28} b={c.config.micro_batch:<2} A={c.config.accum:<4} "
            f"{c.config.prefetch:<9} step {c.step_ms / 1e3:9.2f} s  peak {c.peak_bytes / GIB:5.2f} GB  "
            f"[1F1B {bd.t_1f1b_ms / 1e3:.2f} + comm {bd.e_comm_ms / 1e3:.2f} + upd {bd.e_upd_ms / 1e3:.2f} "
            f"+ pref {bd.e_pref_ms / 1e3:.2f} + rec {bd.e_rec_ms / 1e3:.2f}]{mark}")


def _space_line(space: SearchSpace, args: argparse.Namespace) -> str:
    """Which space was searched, what the flags replaced, and how to ask for the paper's."""
    given = [f"{flag} {','.join(map(str, getattr(args, name)))}" for name, flag in
             (("tp_degrees", "T"), ("zero_stages", "Z"), ("micro_batches", "b"))
             if getattr(args, name) is not None and getattr(args, name) != getattr(space, name)]
    hint = "" if space.name == "paper" else "; --space paper for the paper's (T=1, ZeRO 0-2, b=1)"
    return (f"search space: {space.name} ({space.description})" + (f", replaced by {' '.join(given)}" if given else "")
            + hint)


def check_search_space(model: ModelSpec, args: argparse.Namespace) -> None:
    """Refuse restrictions the planner cannot enumerate, so that an empty search is never reported
    as "no configuration fits the memory budget"."""
    for name, limit in (("clusters", MAX_CLUSTERS), ("global_batch", MAX_GLOBAL_BATCH), ("seq", MAX_SEQ)):
        if getattr(args, name) > limit:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(args, name)} is above the planner's limit {limit}")
    if args.zero_stages is not None:
        bad = [z for z in args.zero_stages if z not in ZERO_STAGES]
        if bad:
            raise ConfigError(f"--zero-stages {','.join(map(str, bad))}: ZeRO stages are "
                              f"{', '.join(map(str, ZERO_STAGES))}")
        if args.method == "zero3-heavy" and 3 not in args.zero_stages:
            raise ConfigError("--method zero3-heavy searches Z=3 only; --zero-stages leaves it out")
    if args.tp_degrees is not None:
        for t in args.tp_degrees:
            if t > MAX_TP:
                raise ConfigError(f"--tp-degrees {t}: the planner searches T up to {MAX_TP}")
            if args.clusters % t:
                raise ConfigError(f"--tp-degrees {t} does not divide --clusters {args.clusters}")
            try:
                check_tp(model, t)
            except ConfigError as exc:
                raise ConfigError(f"--tp-degrees {t}: {exc}") from None
            if model.vocab % t:
                raise ConfigError(f"--tp-degrees {t}: model {model.name}: vocab={model.vocab} not divisible "
                                  f"by tp={t}")
        if args.method == "tp-heavy" and 2 not in args.tp_degrees:
            raise ConfigError("--method tp-heavy searches T=2 only; --tp-degrees leaves it out")
    if args.micro_batches is not None:
        usable = [b for b in args.micro_batches if args.global_batch % b == 0]
        if not usable:
            raise ConfigError(f"--micro-batches {','.join(map(str, args.micro_batches))}: none divides "
                              f"--global-batch {args.global_batch}")


def run(args: argparse.Namespace) -> tuple[dict, str]:
    from ratrain.plan.planner import Planner
    from ratrain.plan.schedule_search import parse_schedules
    model = model_from_args(args)
    platform = any_platform_from_args(args)
    for name in ("clusters", "global_batch", "seq", "top"):
        value = getattr(args, name)
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.confirm < 0:
        raise ConfigError(f"--confirm must be 0 or more, got {args.confirm}")
    space = SEARCH_SPACES[args.space]
    for name in ("micro_batches", "tp_degrees", "zero_stages"):
        if getattr(args, name) is None:         # the space's list unless the flag gives one
            setattr(args, name, getattr(space, name))
    check_search_space(model, args)
    schedules = parse_schedules(args.schedules, args.virtual_stages)
    fields, lengths = run_choices_from_args(args)
    # EP, CP and the routing every candidate takes (ParallelConfig checks them); only the non-defaults
    moe_cp = {k: v for k, v in fields.items()
              if v != {"ep": 1, "cp": 1, "capacity_factor": None, "hot_share": 0.0, "hot_load": 1.0}[k]}
    planner = Planner(model, platform, profile_source=args.profile, partition=args.partition,
                      progress=not args.json, lengths=lengths, moe_cp=moe_cp,
                      workers=args.workers or idle_cores())
    result = planner.plan(args.clusters, args.global_batch, args.seq, args.method, args.top,
                          micro_batches=args.micro_batches, tp_degrees=args.tp_degrees,
                          zero_stages=args.zero_stages, confirm=args.confirm, schedules=schedules)
    payload = result.to_json()
    payload["search_space"] = {**space.to_json(), "tp_degrees": args.tp_degrees, "zero_stages": args.zero_stages,
                               "micro_batches": args.micro_batches}
    gpu = isinstance(platform, GpuPlatform)
    units = "GPUs" if gpu else "clusters"
    source = "the GPU kernel model" if gpu else args.profile
    lines = [f"{model.name}: {args.clusters} {units} of {platform.name}, global batch {args.global_batch} "
             f"x {args.seq}, method {args.method}, profile {source}",
             _space_line(space, args),
             f"enumerated {result.enumerated}, pruned by memory {result.pruned_by_memory}, timed {result.timed} "
             f"({result.configs_per_s:.0f} configurations/s, the analytic pass {result.analytic_configs_per_s:.0f}/s; "
             f"{result.profile_s:.1f} s building profiles)"]
    if result.confirmed and not gpu:
        lines.append(f"ranked on the fast kernel model ({result.kernel_model}); the {result.confirmed} best confirmed "
                     f"on emulated kernels: fast model within {100 * result.fast_error:.2f}%, "
                     + ("emulation REORDERED them" if result.reordered else "same order"))
    many = len(schedules) > 1 or schedules[0].name != "1f1b" or lengths is not None
    if lengths is not None:
        lines.append(f"length distribution: {len(lengths.lengths):,} documents, {lengths.packing}, attention cost "
                     f"{lengths.attention_cost}; the finalists simulated on it and ranked on the simulated step")
    if many:
        lines.append(f"schedules searched: {', '.join(result.schedules)}"
                     + (f"; the {result.simulated} best simulated under their schedule (estimate within "
                        f"{100 * result.sim_error:.2f}%), ranked on the simulated step" if result.simulated else ""))
    if result.enumerated == 0:
        raise ConfigError(f"{model.name}: nothing to search on {args.clusters} clusters with global batch "
                          f"{args.global_batch}: no P*D*T = N with P <= {model.layers} layers, T <= {MAX_TP} "
                          f"dividing the model, D dividing the global batch (and the --tp-degrees/"
                          f"--micro-batches/--zero-stages given)")
    if result.best is None:
        lines.append("no configuration fits the memory budget (OOM)")
    else:
        lines.append("best: " + _row(result.best, many, gpu))
        lines += [f"{i + 1:>3}. " + _row(c, many, gpu) for i, c in enumerate(result.ranked)]
    return payload, "\n".join(lines)

"""`ratrain time-to-train`: wall-clock hours for a token budget with failures, checkpoints and stragglers."""
from __future__ import annotations

import argparse
import math

from ratrain.cli.args import add_platform_args, any_platform_from_args
from ratrain.errors import ConfigError
from ratrain.spec.models import get_model, list_models
from ratrain.spec.parallel import ParallelConfig
from rtcommon.durations import format_s

# Cluster counts of the --plot sweep (powers of two, 8..1024).
PLOT_CLUSTER_COUNTS = [2 ** k for k in range(3, 11)]


def register(subparsers) -> None:
    p = subparsers.add_parser("time-to-train", help="wall-clock time to train with failures, checkpoints "
                                                    "and stragglers (Young interval, first-order overheads)")
    step = p.add_mutually_exclusive_group(required=True)
    step.add_argument("--step-s", type=float, help="fault-free step time in seconds (no stragglers)")
    step.add_argument("--model", choices=list_models(),
                      help="take the step from the simulator: the configuration given by --pp/--dp/..., or the "
                           "planner's pick for --clusters and --global-batch")
    length = p.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=int, help="optimizer steps to run")
    length.add_argument("--tokens", type=float, help="token budget (needs tokens per step)")
    p.add_argument("--tokens-per-step", type=float, help="tokens per optimizer step")
    p.add_argument("--global-batch", type=int, help="sequences per step (with --seq gives tokens per step)")
    p.add_argument("--seq", type=int, help="sequence length (with --global-batch)")
    p.add_argument("--clusters", type=int, required=True, help="clusters in the synchronous job")
    p.add_argument("--mtbf-hours", type=float, required=True,
                   help="one cluster's mean time between failures; any failure interrupts the job")
    p.add_argument("--checkpoint-s", type=float, help="seconds to write one checkpoint")
    p.add_argument("--checkpoint-bytes", type=float, help="checkpoint size in bytes (with --checkpoint-gbps)")
    p.add_argument("--checkpoint-gbps", type=float, help="checkpoint write bandwidth in GB/s (1e9 bytes/s)")
    p.add_argument("--restart-s", type=float, default=0.0, help="seconds to restart after a failure")
    p.add_argument("--interval-s", type=float, help="work seconds between checkpoints (default: the optimum)")
    p.add_argument("--compute-cv", type=float, default=0.0,
                   help="coefficient of variation of one cluster's step time")
    p.add_argument("--plot", metavar="FILE", help="PNG of time to train against cluster count (8..1024)")
    g = p.add_argument_group("configuration with --model (omit --pp to take the planner's pick)")
    g.add_argument("--pp", type=int, help="pipeline stages P")
    g.add_argument("--dp", type=int, default=1, help="data-parallel replicas D")
    g.add_argument("--zero", type=int, default=2, help="ZeRO stage")
    g.add_argument("--micro-batch", type=int, default=1)
    g.add_argument("--accum", type=int, default=8, help="micro-batches per step A")
    add_platform_args(p)
    p.add_argument("--json", action="store_true", help="print the JSON payload")
    p.set_defaults(handler=run_time_to_train)


def step_from_model(args: argparse.Namespace) -> tuple[float, ParallelConfig]:
    """--model mode: the simulated step (s) of the given configuration, or of the planner's pick."""
    from ratrain.plan.planner import plan, simulate_config
    model = get_model(args.model)
    platform = any_platform_from_args(args)
    seq = args.seq or 2048
    if args.pp is not None:
        cfg = ParallelConfig(pp=args.pp, dp=args.dp, zero=args.zero, micro_batch=args.micro_batch,
                             accum=args.accum, seq=seq)
        if cfg.clusters != args.clusters:
            raise ConfigError(f"--clusters={args.clusters} but the configuration {cfg.describe()} uses "
                              f"{cfg.clusters} clusters")
    else:
        if args.global_batch is None:
            raise ConfigError("--model without --pp: give --global-batch so the planner can pick a configuration")
        best = plan(model, args.clusters, args.global_batch, seq, platform=platform).best
        if best is None:
            raise ConfigError(f"{model.name}: no configuration on {args.clusters} clusters fits the memory budget")
        cfg = best.config
    return simulate_config(model, cfg, platform=platform).simulated_ms / 1e3, cfg


def _tokens_per_step(args: argparse.Namespace) -> float | None:
    if args.tokens_per_step is not None:
        if args.global_batch is not None or args.seq is not None:
            raise ConfigError("--tokens-per-step: give it or --global-batch with --seq, not both")
        return args.tokens_per_step
    if (args.global_batch is None) != (args.seq is None):
        raise ConfigError("--global-batch and --seq go together")
    if args.global_batch is None:
        return None
    for name, value in (("--global-batch", args.global_batch), ("--seq", args.seq)):
        if value <= 0:
            raise ConfigError(f"{name}={value}: must be positive")
    return float(args.global_batch * args.seq)


def _steps(args: argparse.Namespace, tokens_per_step: float | None) -> int:
    if args.steps is not None:
        return args.steps
    if not math.isfinite(args.tokens) or args.tokens <= 0:
        raise ConfigError(f"--tokens={args.tokens}: must be a positive finite number")
    if tokens_per_step is None or not math.isfinite(tokens_per_step) or tokens_per_step <= 0:
        raise ConfigError("--tokens: needs a positive --tokens-per-step (or --global-batch and --seq)")
    return math.ceil(args.tokens / tokens_per_step)


def _fmt_hours(hours: float | None) -> str:
    return "no progress" if hours is None else f"{hours:.2f} h"


def _text(payload: dict) -> str:
    ovh = payload["overhead"]
    lines = [f"step {format_s(payload['step_s'])}, with stragglers over {payload['clusters']} clusters "
             f"{format_s(payload['straggler_step_s'])} (x{payload['straggler_factor']:.3f})",
             f"job MTBF {payload['job_mtbf_s'] / 3600:.2f} h, checkpoint {format_s(payload['checkpoint_s'])}, "
             f"restart {format_s(payload['restart_s'])}",
             f"checkpoint interval: optimum ({payload['interval_rule']}) {payload['optimal_interval_s']:.0f} s, "
             f"chosen {payload['interval_s']:.0f} s",
             f"overhead: save {ovh['save']:.2%}, rework {ovh['rework']:.2%}, restart {ovh['restart']:.2%}, "
             f"total {ovh['total']:.2%} of useful time"]
    if payload["progress_possible"]:
        lines.append(f"time to train {_fmt_hours(payload['hours'])} ({payload['useful_hours']:.2f} h useful), "
                     f"{payload['expected_interruptions']:.1f} expected interruptions"
                     + ("" if payload["tokens_per_s"] is None else f", {payload['tokens_per_s']:,.0f} tokens/s"))
    else:
        lines.append("no progress: rework and restart after failures take all the time (MTBF too short)")
    lines.append("interval (s)   total overhead   time to train")
    for row in payload["interval_table"]:
        lines.append(f"{row['interval_s']:>12.0f}   {row['overhead']['total']:>14.2%}   {_fmt_hours(row['hours'])}")
    return "\n".join(lines)


def run_time_to_train(args: argparse.Namespace) -> tuple[dict, str]:
    from ratrain.plan.time_to_train import Reliability, plot_time_to_train_vs_clusters, sweep_clusters, time_to_train
    cfg = None
    if args.model is not None:
        step_s, cfg = step_from_model(args)
        if args.tokens_per_step is None and args.global_batch is None:
            args.tokens_per_step = float(cfg.global_batch * cfg.seq)
    else:
        step_s = args.step_s
    tokens_per_step = _tokens_per_step(args)
    steps = _steps(args, tokens_per_step)
    reliability = Reliability(mtbf_hours=args.mtbf_hours, checkpoint_s=args.checkpoint_s,
                              checkpoint_bytes=args.checkpoint_bytes, write_gbps=args.checkpoint_gbps,
                              restart_s=args.restart_s, compute_cv=args.compute_cv)
    result = time_to_train(step_s, steps, args.clusters, tokens_per_step, reliability, args.interval_s)
    payload = result.to_json()
    text = _text(payload)
    if cfg is not None:
        payload.update({"model": args.model, "parallel_config": cfg.to_json(), "label": cfg.describe()})
        text = f"{args.model} {cfg.describe()} (simulated step)\n" + text
    if args.plot:
        # Everything is computed and checked before the figure is written: a bad input leaves no file.
        sweep = sweep_clusters(step_s, steps, tokens_per_step, reliability, PLOT_CLUSTER_COUNTS, args.interval_s)
        points = [(row["clusters"], row["hours"]) for row in sweep if row["hours"] is not None]
        if not points:
            raise ConfigError(f"--plot: no cluster count in {PLOT_CLUSTER_COUNTS} lets the job make progress")
        payload["cluster_sweep"] = sweep
        plot_time_to_train_vs_clusters(points, args.plot)
        text += f"\nwrote {args.plot} ({len(points)} of {len(sweep)} cluster counts make progress)"
    return payload, text

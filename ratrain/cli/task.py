"""`ratrain task`: does a training task finish by its deadline, on which machine, with what margin,
and what decides it."""
from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ratrain.cli.args import add_model_choice, model_from_args
from ratrain.cost.sources import PROFILE_SOURCES
from ratrain.errors import ConfigError
from ratrain.spec.models import list_models
from ratrain.spec.platforms import load_platform
from rtcommon.durations import format_s
from rtcommon.progress import Progress

if TYPE_CHECKING:
    from ratrain.plan.input_pipeline import InputPipeline
    from ratrain.plan.task import Failures, Layout

# The keys of one scheme that a single-scheme payload also carries at its top level
SCHEME_KEYS = ("iterations", "step_time_s", "overhead_share", "completion_days", "margin_days", "meets_deadline")


def _device_list(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        try:
            n = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a whole number of devices") from None
        if n < 1 or n >= 2 ** 62:
            raise argparse.ArgumentTypeError(f"{n} devices: must be a positive integer")
        out.append(n)
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("task", help="a training task against its deadline: completion time, margin, "
                                           "which resource decides, batch size against the noise scale")
    add_model_choice(p, f"built-in model: {', '.join(list_models())} (or gpt-h<h>-l<l>-a<a>)")
    p.add_argument("--tokens", type=float, required=True, help="effective training tokens D")
    p.add_argument("--seq", type=int, required=True, help="sequence length S")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per step B")
    p.add_argument("--deadline-days", type=float, required=True, help="days from start to the deadline T")
    p.add_argument("--reserve-days", type=float, default=0.0,
                   help="planned stall T0: days reserved for start-up, evaluation and pauses")
    p.add_argument("--platform", action="append", metavar="FILE",
                   help="platform file (MT-3000 or GPU cluster); repeat with --devices for several schemes "
                        "(default: MT-3000)")
    p.add_argument("--devices", action="append", type=_device_list, required=True, metavar="N[,N...]",
                   help="devices (MT-3000 clusters or GPUs) of the scheme; a comma list searches several counts")
    g = p.add_argument_group("layout (omit to take the planner's pick per device count)")
    g.add_argument("--tp", type=int, help="tensor-parallel ranks T")
    g.add_argument("--pp", type=int, help="pipeline stages P")
    g.add_argument("--dp", type=int, help="data-parallel replicas D (default: devices / (T P))")
    g.add_argument("--zero", type=int, help="ZeRO stage (default 1)")
    g.add_argument("--micro-batch", type=int, help="sequences per micro-batch b (default 1)")
    g.add_argument("--activation", choices=("full", "ckpt", "fsr"),
                   help="activation policy (default: fsr on MT-3000, ckpt on GPU clusters)")
    s = p.add_argument_group("step time")
    s.add_argument("--mfu", type=float, help="take the step from this model FLOPs utilisation instead of the "
                                             "simulator: 6 N B S / (devices x peak x MFU)")
    s.add_argument("--profile", choices=PROFILE_SOURCES, default="emulated",
                   help="MT-3000 latency profile source of the simulated step (roofline: fast stand-in)")
    s.add_argument("--input-wait-s", type=float, help="fixed per-step input wait (s)")
    s.add_argument("--input-stage", action="append", metavar="STAGE=TOKENS_PER_S",
                   help="an input pipeline stage and its rate (read, tokenize, pack, h2d); repeat per stage")
    s.add_argument("--input-queue", type=int, default=2, help="prepared batches the input queue holds (0: none)")
    f = p.add_argument_group("failures and checkpoints (as time-to-train; per device)")
    f.add_argument("--mtbf-hours", type=float, help="one device's mean time between failures")
    f.add_argument("--checkpoint-s", type=float, help="seconds one synchronous save pauses training")
    f.add_argument("--checkpoint-bytes", type=float, help="checkpoint size in bytes (with --checkpoint-gbps)")
    f.add_argument("--checkpoint-gbps", type=float, help="checkpoint write bandwidth in GB/s (1e9 bytes/s)")
    f.add_argument("--restart-s", type=float, default=0.0, help="seconds to restart after a failure")
    f.add_argument("--interval-s", type=float, help="work seconds between saves (default: the optimum)")
    f.add_argument("--async-pause-s", type=float, help="asynchronous save: the foreground snapshot (s)")
    f.add_argument("--async-write-s", type=float, help="asynchronous save: the background write until committed (s)")
    f.add_argument("--async-slowdown", type=float, default=0.0,
                   help="asynchronous save: share of training speed lost while the write runs")
    a = p.add_argument_group("analyses")
    a.add_argument("--noise-scale", type=float, metavar="TOKENS",
                   help="gradient noise scale B_noise: weak against strong scaling from each scheme")
    a.add_argument("--resources", action="store_true",
                   help="which resource decides: shares, Amdahl and simulated T'/T at r = 0.5, 2, 10, "
                        "required efficiency")
    a.add_argument("--boundary-mfu", type=float,
                   help="deadline boundary (1 B to 1 T parameters) at this MFU (default: --mfu if given)")
    p.add_argument("--out-dir", metavar="DIR", help="write the figures here")
    p.add_argument("--json", action="store_true", help="print the JSON payload")
    p.set_defaults(handler=run_task)


def _schemes(args: argparse.Namespace) -> list[tuple[str | None, int]]:
    """(platform file, devices) pairs: the i-th --platform with the i-th --devices, or one side shared."""
    files = args.platform or [None]
    counts = args.devices
    if len(files) == len(counts):
        pairs = list(zip(files, counts, strict=True))
    elif len(files) == 1:
        pairs = [(files[0], c) for c in counts]
    elif len(counts) == 1:
        pairs = [(f, counts[0]) for f in files]
    else:
        raise ConfigError(f"{len(files)} --platform and {len(counts)} --devices: give one of each per scheme, "
                          f"or one platform, or one device list")
    return [(f, n) for f, group in pairs for n in group]


def _layout(args: argparse.Namespace) -> Layout | None:
    from ratrain.plan.task import Layout
    given = {k: getattr(args, k) for k in ("tp", "pp", "dp", "zero", "micro_batch", "activation")}
    if all(v is None for v in given.values()):
        return None
    for name in ("tp", "pp", "dp", "micro_batch"):
        if given[name] is not None and given[name] < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={given[name]}: must be a positive integer")
    return Layout(tp=given["tp"] or 1, pp=given["pp"] or 1, dp=given["dp"],
                  zero=1 if given["zero"] is None else given["zero"], micro_batch=given["micro_batch"] or 1,
                  activation=given["activation"])


def _failures(args: argparse.Namespace) -> Failures:
    from ratrain.plan.checkpoints import AsyncSave
    from ratrain.plan.task import Failures
    from ratrain.plan.time_to_train import Reliability
    save = None
    checkpoint_s = 0.0
    if args.checkpoint_s is not None or args.checkpoint_bytes is not None or args.checkpoint_gbps is not None:
        # the time-to-train rule: seconds, or bytes over a write bandwidth
        checkpoint_s = Reliability(mtbf_hours=1.0, checkpoint_s=args.checkpoint_s,
                                   checkpoint_bytes=args.checkpoint_bytes, write_gbps=args.checkpoint_gbps
                                   ).save_seconds()
    if args.async_pause_s is not None or args.async_write_s is not None:
        if args.mtbf_hours is None:
            raise ConfigError("--async-pause-s/--async-write-s: give --mtbf-hours (saves only matter with failures)")
        save = AsyncSave(args.async_pause_s or 0.0, args.async_write_s or 0.0, args.async_slowdown)
    elif args.mtbf_hours is None and (checkpoint_s or args.restart_s or args.interval_s is not None):
        raise ConfigError("--checkpoint-s/--restart-s/--interval-s: give --mtbf-hours too")
    return Failures(args.mtbf_hours, checkpoint_s, args.restart_s, args.interval_s, save)


def _pipeline(args: argparse.Namespace) -> InputPipeline | None:
    from ratrain.plan.input_pipeline import InputPipeline, parse_stage
    if not args.input_stage:
        return None
    if args.input_wait_s is not None:
        raise ConfigError("--input-wait-s and --input-stage: give a fixed wait or the pipeline's stages, not both")
    rates: dict[str, float] = {}
    for text in args.input_stage:
        name, rate = parse_stage(text)
        if name in rates:
            raise ConfigError(f"--input-stage {name}: given twice")
        rates[name] = rate
    return InputPipeline(rates, args.input_queue)


def _fmt_days(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _text(payload: dict) -> str:
    t = payload["task"]
    lines = [f"task: {t['model']} ({t['parameters'] / 1e9:.2f} B parameters), {t['tokens']:.4g} tokens, "
             f"{t['global_batch']} x {t['seq']} tokens per step, {t['iterations']} iterations, "
             f"deadline {t['deadline_days']:g} days with {t['reserve_days']:g} reserved",
             f"{'platform':<22} {'devices':>7} {'layout':<26} {'step':>9} {'L':>7} {'done (d)':>9} "
             f"{'margin (d)':>10} {'margin/step':>11}  verdict"]
    for s in payload["schemes"]:
        aff = s["affordable"]
        verdict = "meets" if s["meets_deadline"] else ("memory does not fit" if not s["memory_fits"] else "late")
        layout = s["label"] or f"MFU {s['achieved_mfu']:.2f}"
        lines.append(f"{s['platform']:<22} {s['devices']:>7} {layout:<26} {format_s(s['step_time_s']):>9} "
                     f"{s['overhead_share']:>7.2%} {_fmt_days(s['completion_days']):>9} "
                     f"{_fmt_days(s['margin_days']):>10} "
                     f"{'-' if aff is None else format_s(aff['margin_per_step_s']):>11}  {verdict}")
    for s in payload["schemes"]:
        head = f"{s['platform']} x {s['devices']}"
        parts = s.get("step_breakdown")
        if parts and parts["source"] == "simulated":
            lines.append(f"{head}: step = compute {format_s(parts['compute_s'])} "
                         f"+ memory {format_s(parts['memory_s'])} + exposed communication and bubbles "
                         f"{format_s(parts['exposed_other_s'])} + input wait {format_s(parts['input_wait_s'])} "
                         f"(stage {parts['critical_stage']})")
        aff = s.get("affordable")
        if aff and aff["margin_per_step_s"] >= 0:
            lines.append(f"{head}: each step could absorb {format_s(aff['margin_per_step_s'])} more exposed "
                         f"communication or input wait, or compute {aff['compute_slowdown']:.2f}x slower "
                         f"(MFU down to {aff['min_mfu']:.3f} from {s['achieved_mfu']:.3f})")
        elif aff:
            lines.append(f"{head}: each step is {format_s(-aff['margin_per_step_s'])} over its "
                         f"{format_s(aff['step_budget_s'])} budget (it would need MFU {aff['min_mfu']:.3f}, "
                         f"has {s['achieved_mfu']:.3f})")
        res = s.get("resources")
        if res:
            lines.append(f"{head}: resource shares of the {format_s(res['step_time_s'])} step "
                         f"(T'/T: Amdahl | simulated)"
                         f"; decides: {res['deciding']}")
            for row in res["rows"]:
                cells = "  ".join(f"r={q['r']:g}: {q['amdahl']:.3f} | "
                                  f"{'-' if q['simulated'] is None else format(q['simulated'], '.3f')}"
                                  for q in row["ratios"])
                lines.append(f"  {row['resource']:<11} f={row['share']:.3f}  {cells}")
            req = s["required_efficiency"]
            lines.append(f"  required MFU (has {req['achieved_mfu']:.3f}): " + ", ".join(
                f"{r['devices']} devices {'-' if r['required_mfu'] is None else format(r['required_mfu'], '.3f')}"
                for r in req["rows"]))
        ck = s.get("checkpoint_intervals")
        if ck:
            best = ck["exact_optimum_s"]
            lines.append(f"{head}: save interval: Young {ck['young_s']:.0f} s, Daly {ck['daly_s']:.0f} s, "
                         f"exact optimum {'-' if best is None else format(best, '.0f') + ' s'}"
                         + (f", asynchronous optimum {ck['async']['optimum_s']:.0f} s" if "async" in ck else ""))
            for row in ck["rows"]:
                sync = "-" if row["sync"] is None else \
                    f"{row['sync']['total']:.4%} (exact {row['sync_exact_total']:.4%})"
                asyn = "" if "async" not in row else \
                    ("  async -" if row["async"] is None else f"  async {row['async']['total']:.4%}")
                lines.append(f"  every {row['interval_s']:>10.0f} s: sync {sync}{asyn}")
        sc = s.get("scaling")
        if sc:
            lines.append(f"{head}: batch against B_noise = {sc['law']['noise_scale_tokens']:.4g} tokens "
                         f"(weak scaling speed-up at most {sc['weak_ceiling']:.2f}x)")
            lines.append(f"  {'devices':>8} {'weak: batch':>12} {'steps':>10} {'days':>8} {'x':>6}   "
                         f"{'strong: steps':>13} {'days':>8} {'x':>6}")
            for r in sc["rows"]:
                w, st = r["weak"], r["strong"]
                lines.append(f"  {r['devices']:>8} {w['batch_tokens']:>12.4g} {w['steps']:>10.0f} "
                             f"{w['completion_days']:>8.2f} {w['speedup']:>6.2f}   {st['steps']:>13.0f} "
                             f"{_fmt_days(st['completion_days']):>8} "
                             f"{'-' if st['speedup'] is None else format(st['speedup'], '.2f'):>6}")
    if payload.get("boundary"):
        b = payload["boundary"]
        names = list(b["rows"][0]["devices"])
        lines.append(f"deadline boundary at MFU {b['mfu']:g} (devices needed): "
                     + "; ".join(f"{r['parameters'] / 1e9:.3g} B: " + ", ".join(f"{n} {r['devices'][n]}" for n in names)
                                 for r in b["rows"]))
    for fig in payload.get("figures", []):
        lines.append(f"wrote {fig}")
    return "\n".join(lines)


def run_task(args: argparse.Namespace) -> tuple[dict, str]:
    from ratrain.plan import bottleneck, noise_scale, task_figures
    from ratrain.plan.checkpoints import interval_table
    from ratrain.plan.task import TrainingTask, evaluate_scheme
    model = model_from_args(args)
    task = TrainingTask(model, args.tokens, args.seq, args.global_batch, args.deadline_days, args.reserve_days)
    failures, layout, pipeline = _failures(args), _layout(args), _pipeline(args)
    if args.noise_scale is not None and args.noise_scale <= 0:
        raise ConfigError(f"--noise-scale={args.noise_scale:g}: must be a positive number of tokens")
    progress = Progress(not args.json)
    pairs = _schemes(args)
    platforms: dict[str | None, object] = {f: load_platform(f) for f, _ in pairs}
    results, payload_schemes = [], []
    for i, (file, devices) in enumerate(pairs):
        platform = platforms[file]
        progress(f"scheme {i + 1}/{len(pairs)}: {platform.name} x {devices}")
        result = evaluate_scheme(task, platform, devices, failures, layout=layout, mfu=args.mfu,
                                 input_wait_s=args.input_wait_s, pipeline=pipeline, kernels=args.profile,
                                 progress=not args.json)
        parts = bottleneck.step_breakdown(result, platform)
        result.extra["compute_s"] = parts["compute_s"]      # what a slower compute would stretch
        out = result.to_json()
        out["step_breakdown"] = parts
        if args.resources:
            out["resources"] = bottleneck.resource_table(result, platform, pipeline)
            out["required_efficiency"] = bottleneck.required_efficiency(result, failures)
        if failures.mtbf_hours is not None and out["job_mtbf_s"]:
            out["checkpoint_intervals"] = interval_table(failures.checkpoint_s, failures.restart_s,
                                                         out["job_mtbf_s"], failures.async_save,
                                                         chosen_s=failures.interval_s)
        if args.noise_scale is not None:
            law = noise_scale.fit_reference(args.noise_scale, task.tokens_per_step, task.tokens)
            out["scaling"] = {"law": law.to_json(),
                              "weak_ceiling": noise_scale.weak_scaling_ceiling(args.noise_scale, task.tokens_per_step),
                              "rows": noise_scale.scaling_table(law, devices, task.global_batch, task.seq,
                                                                result.step.total_s, task.reserve_days * 86400.0,
                                                                result.overhead.total)}
        results.append(result)
        payload_schemes.append(out)
    payload: dict = {"task": task.to_json(), "schemes": payload_schemes}
    if len(payload_schemes) == 1:
        payload.update({k: payload_schemes[0][k] for k in SCHEME_KEYS})
    meeting = [s for s in payload_schemes if s["meets_deadline"]]
    first = min(meeting, key=lambda s: s["completion_days"]) if meeting else None
    payload["best"] = None if first is None else {"platform": first["platform"], "devices": first["devices"]}
    boundary_mfu = args.boundary_mfu if args.boundary_mfu is not None else args.mfu
    if boundary_mfu is not None:
        if not 0 < boundary_mfu <= 1:
            raise ConfigError(f"--boundary-mfu={boundary_mfu:g}: an MFU is in (0, 1]")
        unique = list({p.name: p for p in platforms.values()}.values())
        payload["boundary"] = {"mfu": boundary_mfu, "tokens": task.tokens, "available_days": task.available_s / 86400.0,
                               "rows": bottleneck.deadline_boundary(task, unique, boundary_mfu)}
    if args.out_dir:
        # everything is computed and checked before any figure is written
        os.makedirs(args.out_dir, exist_ok=True)
        figures = [os.path.join(args.out_dir, "completion.png")]
        task_figures.completion_figure(payload_schemes, task.deadline_days, figures[0])
        for i, s in enumerate(payload_schemes):
            tag = f"{i + 1}-{s['platform']}-{s['devices']}"
            if "resources" in s:
                figures.append(os.path.join(args.out_dir, f"resources-{tag}.png"))
                task_figures.resource_figure(s["resources"], f"{s['platform']} x {s['devices']}", figures[-1])
            if "scaling" in s:
                figures.append(os.path.join(args.out_dir, f"scaling-{tag}.png"))
                task_figures.scaling_figure(s["scaling"]["rows"], s["scaling"]["weak_ceiling"], figures[-1])
            if "checkpoint_intervals" in s:
                figures.append(os.path.join(args.out_dir, f"intervals-{tag}.png"))
                task_figures.interval_figure(s["checkpoint_intervals"], figures[-1])
        if "boundary" in payload:
            b = payload["boundary"]
            figures.append(os.path.join(args.out_dir, "boundary.png"))
            task_figures.boundary_figure(b["rows"], task.tokens, b["mfu"], b["available_days"], figures[-1])
        payload["figures"] = figures
    return payload, _text(payload)

"""`ratrain simulate`: one simulated training step, from a model or from synthetic uniform costs.

Examples::

    ratrain simulate --model qwen2.5-32b --pp 8 --dp 32 --zero 2 --accum 128 --plot step.png --json
    ratrain simulate --uniform --stages 4 --microbatches 8 --t-forward 1 --t-backward 2 \
        --t-update 0.5 --t-recompute 1 --t-gradsync 1 --layers-per-stage 2 --json
    ratrain simulate --uniform --stages 4 --microbatches 8 --t-forward 1 --t-backward 2 \
        --layers-per-stage 4 --schedule interleaved --virtual-stages 2
    ratrain simulate --uniform --stages 4 --microbatches 8 --t-forward 1 --t-backward 2 \
        --schedule zb-h1 --t-backward-weight 0.8 --grid
    ratrain simulate --model llama2-7b --pp 4 --dp 8 --accum 8 --profile roofline --bucket-sweep
    ratrain simulate --model llama2-7b --pp 4 --dp 8 --accum 8 --profile roofline \
        --offload activations --host-adam --json
    ratrain simulate --hf-config mixtral.json --profile roofline --pp 2 --dp 4 --ep 4 \
        --capacity-factor 1.25 --hot-experts 0.25:2 --capacity-factors 1,1.5,2 --json
    ratrain simulate --model llama2-7b --seq 4096 --seq-lengths docs.txt --packing pack-masked \
        --attention-cost mask --cp 2 --json
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from ratrain.cli.args import (
    add_offload_args,
    add_platform_args,
    add_run_choice_args,
    any_platform_from_args,
    run_choices_from_args,
)
from ratrain.cost.tasks import PipelineCosts
from ratrain.errors import ConfigError
from ratrain.sim.buckets import GradBuckets
from ratrain.sim.grid import format_grid
from ratrain.sim.mechanisms import ABLATION_VARIANTS, ACTIVATIONS, Mechanisms
from ratrain.sim.offload import conversion_report, plan_for
from ratrain.sim.pipeline_order import SCHEDULES, PipelineSchedule, interleaved_chunk_sizes, interleaved_microbatches_ok
from ratrain.sim.plots import plot_timeline
from ratrain.sim.trace import write_chrome_trace
from ratrain.sim.weight_split import DEFAULT_WEIGHT_FRACTION, weight_fractions
from ratrain.spec.memory import FSR_BUFFER_LAYERS, max_peak, stage_memory
from ratrain.spec.models import from_hf_config, get_model
from ratrain.spec.offload import Offload
from ratrain.spec.parallel import ParallelConfig, in_flight_activation_sets, in_flight_microbatches
from rtcommon.durations import decimals_for, format_ms, time_unit

# (layer, micro-batch) pairs of one uniform step beyond which the event simulation would take
# minutes and gigabytes (the paper's largest layouts have about 10**4)
MAX_UNIFORM_WORK = 2_000_000

_TIMES = (("t_forward", "--t-forward", None), ("t_backward", "--t-backward", None),
          ("t_transfer", "--t-transfer", 0.0), ("t_update", "--t-update", 0.0),
          ("t_recompute", "--t-recompute", 0.0), ("t_gradsync", "--t-gradsync", 0.0),
          ("t_prefetch", "--t-prefetch", 0.0))


def _window(text: str) -> tuple[float, float]:
    """START:END in seconds, 0 <= START < END."""
    try:
        start, end = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END in seconds, got {text!r}") from None
    if not (0 <= start < end < float("inf")):
        raise argparse.ArgumentTypeError(f"expected 0 <= START < END (seconds), got {text!r}")
    return start, end


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate one 1F1B/GPipe/interleaved/ZB-H1 step with training-state lifecycle tasks",
        description="Simulate one training step. Per-stage times are in ms per micro-batch "
                    "(forward/backward/recompute) or per step (update/gradsync/prefetch) and are split "
                    "evenly over --layers-per-stage layers.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--uniform", action="store_true", help="identical stages from the --t-* times")
    src.add_argument("--model", help="a built-in model (see `ratrain model --help`); costs from its profile")
    src.add_argument("--hf-config", metavar="FILE", help="a HuggingFace config.json; costs from its profile")
    g = p.add_argument_group("model-driven configuration (with --model / --hf-config)")
    g.add_argument("--pp", type=int, default=1, help="pipeline stages P (default 1)")
    g.add_argument("--dp", type=int, default=1, help="data-parallel replicas D (default 1)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree T (default 1)")
    g.add_argument("--zero", type=int, default=2, help="ZeRO stage 0-3 (default 2)")
    g.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch b (default 1)")
    g.add_argument("--accum", type=int, default=8, help="micro-batches per step A (default 8)")
    g.add_argument("--seq", type=int, default=2048, help="sequence length in tokens (default 2048)")
    g.add_argument("--prefetch", choices=("layerwise", "bulk"), default="layerwise",
                   help="parameter prefetch: per layer, overlapped (layerwise, default) or in bulk")
    g.add_argument("--profile", choices=("emulated", "roofline"), default="emulated",
                   help="latency profile: emulated kernels (default) or the analytic roofline (fast)")
    add_run_choice_args(p, sweep=True)
    add_platform_args(p)
    p.add_argument("--stages", type=int, help="uniform mode: pipeline stages P")
    p.add_argument("--microbatches", type=int, help="uniform mode: micro-batches per step A")
    for dest, flag, _ in _TIMES:
        p.add_argument(flag, dest=dest, type=float, help="uniform mode: ms per stage")
    p.add_argument("--layers-per-stage", type=int, default=1,
                   help="uniform mode: layers each stage's times are split over (default 1)")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                   help="pipeline order: 1f1b, gpipe, interleaved (Megatron's interleaved 1F1B, see "
                        "--virtual-stages) or zb-h1 (zero-bubble H1: backward split into B and a deferred W)")
    p.add_argument("--virtual-stages", type=int, default=1, metavar="V",
                   help="interleaved: model chunks per stage; the layers are cut into P x V chunks as evenly "
                        "as possible (earlier chunks take the extra layers), chunk c on stage c mod P")
    p.add_argument("--t-backward-weight", dest="t_backward_weight", type=float, metavar="W",
                   help="zb-h1, uniform mode: ms of --t-backward that is the weight gradient W (default half); "
                        "model-driven runs take W from the profile's dW GEMMs")
    p.add_argument("--activation", choices=ACTIVATIONS, default="fsr",
                   help="activation policy (default fsr: forward-side recovery)")
    p.add_argument("--variant", choices=ABLATION_VARIANTS + ("all-off",),
                   help="start from a paper ablation variant (the --no-* flags still apply)")
    p.add_argument("--no-fsr", action="store_true", help="backward-time recovery instead of FSR")
    p.add_argument("--no-layerwise", action="store_true", help="bulk step-end GradSync/update/prefetch")
    p.add_argument("--no-update-prefetch", action="store_true", help="bulk update/prefetch after all GradSyncs")
    p.add_argument("--fsr-lookahead", type=int, default=1, help="micro-batches that may hold recovery buffers")
    p.add_argument("--fsr-buffer-layers", type=_buffer_layers, default=FSR_BUFFER_LAYERS, metavar="N|none",
                   help=f"layers FSR's recovery buffer holds (default {FSR_BUFFER_LAYERS}, Eq. 6's single M_rec; "
                        "'none': no cap)")
    p.add_argument("--recovery-resource", choices=("compute", "ddr"), default="compute",
                   help="what FSR recovery occupies (default compute: it fills pipeline bubbles)")
    p.add_argument("--update-resource", choices=("compute", "ddr", "link"), default="ddr",
                   help="uniform mode only: what the optimizer update occupies (default ddr)")
    p.add_argument("--prefetch-resource", choices=("compute", "ddr", "link"), default="ddr",
                   help="uniform mode only; model-driven runs take resources from the cost model")
    add_lifecycle_args(p)
    p.add_argument("--trace", metavar="FILE.json", help="write a Chrome trace (chrome://tracing)")
    p.add_argument("--plot", metavar="FILE.png", help="write a Fig. 6-style timeline")
    p.add_argument("--window", type=_window, metavar="START:END",
                   help="with --plot: draw only this time window of the step, in seconds (e.g. 900:963)")
    p.add_argument("--grid", action="store_true",
                   help="print the step's F/B/W ops per stage on a time grid (text; with --json: the 'grid' field)")
    p.add_argument("--json", action="store_true", help="print the result (with the timeline) as JSON")
    p.set_defaults(handler=run)


def add_lifecycle_args(p: argparse.ArgumentParser) -> None:
    """Gradient buckets and offloading to the host (docs/LIFECYCLE.md)."""
    g = p.add_argument_group("gradient buckets and offloading to the host")
    g.add_argument("--bucket-bytes", type=int, metavar="BYTES",
                   help="reduce gradients in buckets of at least BYTES (default: one GradSync per layer)")
    g.add_argument("--bucket-sweep", action="store_true",
                   help="also simulate a ladder of bucket sizes (one layer .. the whole stage) and report the "
                        "size that minimises the step")
    add_offload_args(g)
    g.add_argument("--host-link-bandwidth", type=float, metavar="BYTES_PER_S",
                   help="override the platform's host link (bytes/s per direction)")
    g.add_argument("--layer-grad-bytes", type=int, default=0, metavar="BYTES",
                   help="uniform mode: each layer's FP16 gradient (sizes buckets and offloaded state)")
    g.add_argument("--layer-act-bytes", type=int, default=0, metavar="BYTES",
                   help="uniform mode: each layer's saved activations per micro-batch (checkpoint and full set)")
    g.add_argument("--t-launch", dest="t_launch", type=float, default=0.0, metavar="MS",
                   help="uniform mode: the fixed cost of one GradSync collective, ms (what a bucket merge saves)")


def lifecycle_from_args(args: argparse.Namespace) -> tuple[GradBuckets | None, Offload | None]:
    """The --bucket-bytes and --offload/--host-adam choices (one-line errors for bad values)."""
    buckets = GradBuckets(args.bucket_bytes) if args.bucket_bytes is not None else None
    offload = None
    if args.offload or args.host_adam:
        offload = Offload.parse(args.offload, host_adam=args.host_adam, convert=args.grad_convert,
                                reload_lookahead=args.reload_lookahead)
    elif args.host_link_bandwidth is not None and args.host_link_bandwidth <= 0:
        raise ConfigError(f"--host-link-bandwidth must be > 0 bytes/s, got {args.host_link_bandwidth:g}")
    return buckets, offload


def mechanisms_from_args(args: argparse.Namespace) -> Mechanisms:
    base = Mechanisms.variant(args.variant) if args.variant else Mechanisms(activation=args.activation)
    activation = args.activation if not args.variant else base.activation
    return Mechanisms(layerwise=base.layerwise and not args.no_layerwise,
                      update_prefetch=base.update_prefetch and not args.no_update_prefetch,
                      fsr=base.fsr and not args.no_fsr, activation=activation,
                      fsr_lookahead=args.fsr_lookahead, fsr_buffer_layers=args.fsr_buffer_layers)


def _buffer_layers(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a layer count >= 1 or 'none', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a layer count >= 1 or 'none', got {text!r}")
    return value


def schedule_from_args(args: argparse.Namespace, costs: PipelineCosts | None = None, profile=None,
                       model=None, cfg: ParallelConfig | None = None) -> PipelineSchedule:
    """The PipelineSchedule the flags ask for; W's share from --t-backward-weight (uniform) or from
    the profile's dW GEMMs (model-driven, ``costs`` and ``profile`` given); model-driven interleaved
    chunks follow the layout's partition rule (``model`` and ``cfg`` given)."""
    v = args.virtual_stages
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"--virtual-stages must be an integer >= 1, got {v!r}")
    if v > 1 and args.schedule != "interleaved":
        raise ConfigError(f"--virtual-stages {v} needs --schedule interleaved (got --schedule {args.schedule})")
    if v > 1:
        P, A, flags = ((args.stages, args.microbatches, ("--stages", "--microbatches")) if args.uniform
                       else (args.pp, args.accum, ("--pp", "--accum")))
        # (a count below 1 is refused where the costs are built)
        if P is not None and A is not None and P >= 1 and A >= 1 and not interleaved_microbatches_ok(P, A):
            raise ConfigError(f"--schedule interleaved: {flags[1]} {A} must be a multiple of {flags[0]} {P} when "
                              "larger (Megatron's rule: a smaller last group of micro-batches can deadlock)")
    fraction: float | tuple[float, ...] = DEFAULT_WEIGHT_FRACTION
    if profile is not None:
        if args.t_backward_weight is not None:
            raise ConfigError("--t-backward-weight is for --uniform; model-driven runs take the weight gradient "
                              "from the profile's dW GEMMs")
        fraction = weight_fractions(costs, profile)
    elif args.t_backward_weight is not None:
        w, b = args.t_backward_weight, args.t_backward
        if not w >= 0:
            raise ConfigError(f"--t-backward-weight must be >= 0 ms, got {w}")
        if b is not None and w > b:
            raise ConfigError(f"--t-backward-weight {w} ms is larger than the backward it is part of "
                              f"(--t-backward {b} ms)")
        fraction = w / b if b else 0.0
    chunks = interleaved_chunk_sizes(model, cfg, v) if (v > 1 and model is not None) else None
    return PipelineSchedule(args.schedule, virtual_stages=v, weight_fraction=fraction, chunk_sizes=chunks)


def costs_from_args(args: argparse.Namespace) -> PipelineCosts:
    if not args.uniform:
        raise ConfigError("give --model NAME or --hf-config FILE for a model-driven step, or --uniform with "
                          "--stages/--microbatches/--t-forward/--t-backward")
    for name, flag in (("stages", "--stages"), ("microbatches", "--microbatches"),
                       ("t_forward", "--t-forward"), ("t_backward", "--t-backward")):
        if getattr(args, name) is None:
            raise ConfigError(f"{flag} is required with --uniform")
    for name, flag in (("stages", "--stages"), ("microbatches", "--microbatches"),
                       ("layers_per_stage", "--layers-per-stage")):
        if getattr(args, name) < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {getattr(args, name)}")
    work = args.stages * args.microbatches * args.layers_per_stage
    if work > MAX_UNIFORM_WORK:
        raise ConfigError(f"--stages x --microbatches x --layers-per-stage = {work:,} (layer, micro-batch) pairs "
                          f"would be about {3 * work:,} simulated tasks; at most {MAX_UNIFORM_WORK:,} pairs are "
                          "simulated (the step is periodic: fewer micro-batches show the same steady state)")
    times = {dest: (getattr(args, dest) if getattr(args, dest) is not None else default)
             for dest, _, default in _TIMES}
    for dest, flag, _ in _TIMES:
        if times[dest] < 0:
            raise ConfigError(f"{flag} must be >= 0 ms, got {times[dest]}")
    for name, flag in (("layer_grad_bytes", "--layer-grad-bytes"), ("layer_act_bytes", "--layer-act-bytes"),
                       ("t_launch", "--t-launch")):
        if getattr(args, name) < 0:
            raise ConfigError(f"{flag} must be >= 0, got {getattr(args, name)}")
    extra = {}
    if args.layer_grad_bytes or args.t_launch:
        extra = {"grad_bytes": args.layer_grad_bytes, "gradsync_launch_ms": args.t_launch}
    if args.layer_act_bytes:
        extra.update(act_full_bytes=args.layer_act_bytes, act_ckpt_bytes=args.layer_act_bytes)
    return PipelineCosts.uniform(args.stages, args.microbatches, layers_per_stage=args.layers_per_stage,
                                 recovery_resource=args.recovery_resource, update_resource=args.update_resource,
                                 prefetch_resource=args.prefetch_resource, **times, **extra)


def _model_step(args: argparse.Namespace, buckets: GradBuckets | None, offload: Offload | None):
    """Costs from the model's latency profile via the cost model; also the planner's prediction, the
    offload plan (None without offload) and the memory model's peaks with and without it."""
    from ratrain.cost.terms import load_profile, mechanism_report, pipeline_costs
    from ratrain.plan.planner import simulate_config
    model = from_hf_config(args.hf_config) if args.hf_config else get_model(args.model)
    mech = mechanisms_from_args(args)
    fields, lengths = run_choices_from_args(args)
    cfg = ParallelConfig(pp=args.pp, dp=args.dp, tp=args.tp, zero=args.zero, micro_batch=args.micro_batch,
                         accum=args.accum, seq=args.seq, activation=mech.activation, prefetch=args.prefetch, **fields)
    if args.capacity_factors is not None and model.moe is None:
        raise ConfigError(f"--capacity-factors is for MoE models; {model.name} is dense")
    platform = any_platform_from_args(args)
    profile = load_profile(model, cfg.micro_batch, cfg.seq, cfg.tp, source=args.profile, platform=platform)
    sched = schedule_from_args(args, model=model, cfg=cfg)      # flag errors before any costs are built
    if sched.splits_backward:         # W's share per layer: the costs alone, no simulation
        costs = pipeline_costs(model, cfg, profile, platform, recovery_resource=args.recovery_resource)
        sched = schedule_from_args(args, costs, profile)
    plan = None if offload is None else plan_for(offload, platform, dp=cfg.dp, zero=cfg.zero, profile=profile,
                                                 host_link_bandwidth=args.host_link_bandwidth)
    check = simulate_config(model, cfg, platform=platform, profile=profile, profile_source=args.profile,
                            recovery_resource=args.recovery_resource, mechanisms=mech, schedule=sched,
                            buckets=buckets, offload=plan, lengths=lengths)
    memory = None
    if offload is not None:
        host_path = conversion_report(plan, [lc.grad_bytes for s in check.costs.stages for lc in s]
                                      ).get("chosen") == "host"
        resident = stage_memory(model, cfg, platform)
        moved = stage_memory(model, cfg, platform, offload=offload, host_path_convert=host_path)
        memory = {"resident_peak_bytes": max_peak(resident), "offloaded_peak_bytes": max_peak(moved),
                  "stages": [{"stage": st.stage, "resident_peak_bytes": r.peak_bytes, "peak_bytes": st.peak_bytes,
                              "breakdown": st.breakdown, "host": st.host}
                             for st, r in zip(moved, resident, strict=True)]}
    length_plan = lengths.plan(cfg.seq, cfg.micro_batch, cfg.accum) if lengths is not None else None
    report = mechanism_report(model, cfg, profile, platform, length_plan, args.capacity_factors or ())
    if args.capacity_factors is not None:
        # the step at each capacity factor: the busiest device's rows, and so the step, follow c
        steps = []
        for c in args.capacity_factors:
            other = replace(cfg, capacity_factor=c)
            run_c = simulate_config(model, other, platform=platform, profile=profile, profile_source=args.profile,
                                    recovery_resource=args.recovery_resource, mechanisms=mech, schedule=sched,
                                    buckets=buckets, offload=plan, lengths=lengths)
            routing = mechanism_report(model, other, profile, platform)["moe"]["routing"]
            steps.append({"capacity_factor": c, "step_time_ms": run_c.result.step_time_ms, **{
                k: routing[k] for k in ("capacity", "dropped_fraction", "padding_fraction", "busiest_device_rows",
                                        "load_factor")}})
        report["moe"]["steps_per_capacity_factor"] = steps
    return model, cfg, check, plan, memory, report


def run(args: argparse.Namespace) -> tuple[dict, str]:
    # the simulator (and through it NumPy) loads when a step runs, not for --help or an argument error
    from ratrain.sim.bucket_sweep import bucket_sweep
    from ratrain.sim.simulator import simulate

    extra, report = {}, {}
    buckets, offload = lifecycle_from_args(args)
    memory = None
    if args.model or args.hf_config:
        model, cfg, check, plan, memory, report = _model_step(args, buckets, offload)
        costs, result, bd = check.costs, check.result, check.breakdown
        extra = {"model": model.name, "parallel_config": cfg.to_json(), "label": cfg.describe(verbose=True),
                 "predicted_step_ms": bd.step_ms, "prediction_basis": "analytic 1F1B (Eq. 11-13)",
                 "breakdown": bd.to_json()}
    else:
        _refuse_model_flags(args)
        sched = schedule_from_args(args)
        costs = costs_from_args(args)
        plan = None
        if offload is not None:
            plan = plan_for(offload, any_platform_from_args(args), dp=args.dp, zero=args.zero,
                            host_link_bandwidth=args.host_link_bandwidth)
        result = simulate(costs, schedule=sched, mechanisms=mechanisms_from_args(args), buckets=buckets, offload=plan)
    payload = result.to_json(timeline=True)
    payload.update(extra)
    if plan is not None:
        if plan.offload.host_adam:
            payload["offload"]["gradient_conversion"] = conversion_report(
                plan, [lc.grad_bytes for s in costs.stages for lc in s])
        if memory is not None:
            payload["offload"]["memory"] = memory
    if args.bucket_sweep:
        points, best = bucket_sweep(costs, schedule=result.pipeline, mechanisms=result.mechanisms, offload=plan)
        payload["bucket_sweep"] = {"points": [q.to_json() for q in points], "best": best.to_json()}
    payload.update(report)          # moe, context_parallel, lengths: only where they apply
    if "lengths" in report:
        # what a step of unequal documents achieves: real (unpadded) tokens over all replicas per second
        ln = report["lengths"]
        ln["real_tokens_per_s"] = ln["tokens_real"] * costs.dp / (result.step_time_ms / 1e3)
    P, A, v = costs.num_stages, costs.microbatches, result.virtual_stages
    # where the analytic memory model (Eq. 5: 1F1B's N_act = min(P - p, A)) departs from this schedule
    payload["in_flight"] = {
        "analytic_1f1b": [in_flight_microbatches(p, P, A) for p in range(P)],
        "schedule": [in_flight_activation_sets(result.schedule, p, P, A, v) for p in range(P)],
        "measured": result.peak_activation_sets,
        "note": "micro-batches' worth of a stage's activations; 'schedule' assumes equal chunks, 'measured' is "
                "the simulated timeline (zb-h1: activations live until W)"}
    payload["config"] = {"stages": costs.num_stages, "microbatches": costs.microbatches,
                         "layers_per_stage": len(costs.stages[0]), "schedule": args.schedule,
                         "virtual_stages": result.virtual_stages,
                         "transfer_ms": costs.transfer_ms, "layer_costs": costs.to_json()["stages"][0][0],
                         "recovery_resource": costs.recovery_resource,
                         "update_resource": costs.update_resource, "prefetch_resource": costs.prefetch_resource}
    if args.trace:
        write_chrome_trace(args.trace, result, costs=costs)
        payload["trace"] = args.trace
    if args.window and not args.plot:
        raise ConfigError("--window applies to --plot: give the PNG to draw the window into")
    if args.plot:
        plot_timeline(result, args.plot, t_range=None if args.window is None else
                      (args.window[0] * 1e3, args.window[1] * 1e3))
        payload["plot"] = args.plot
    if args.grid:
        payload["grid"] = format_grid(result)
    text = render_text(result, costs, payload) + render_mechanisms(report)
    if extra:
        basis = "" if result.schedule == "1f1b" else " (analytic 1F1B model)"
        text = (f"{extra['model']} {extra['label']}\nplanner prediction{basis} {format_ms(extra['predicted_step_ms'])} "
                f"({(extra['predicted_step_ms'] / result.step_time_ms - 1) * 100:+.2f}% vs simulated)\n") + text
    return payload, text


def _refuse_model_flags(args: argparse.Namespace) -> None:
    given = [flag for flag, value, default in (
        ("--ep", args.ep, 1), ("--cp", args.cp, 1), ("--capacity-factor", args.capacity_factor, None),
        ("--hot-experts", args.hot_experts, None), ("--capacity-factors", args.capacity_factors, None),
        ("--seq-lengths", args.seq_lengths, None)) if value != default]
    if given:
        raise ConfigError(f"{', '.join(given)} need a model (--model or --hf-config), not --uniform")


def render_mechanisms(report: dict) -> str:
    """Text lines of the MoE, context-parallel and length-distribution reports (empty without them)."""
    lines = []
    if "moe" in report:
        moe, r = report["moe"], report["moe"]["routing"]
        cap = "dropless" if r["capacity"] is None else f"capacity {r['capacity']} rows/expert"
        lines.append(f"MoE EP={moe['ep']}: {cap}, dropped {100 * r['dropped_fraction']:.2f}%, padding "
                     f"{100 * r['padding_fraction']:.2f}%, busiest device {r['busiest_device_rows']} rows "
                     f"({r['load_factor']:.3f} x mean); all-to-all {format_ms(moe['alltoall_ms'])} each, 2 per F and B")
        lines.append(f"  nothing dropped from capacity factor {moe['capacity']['no_drop_capacity_factor']:.4g}")
        for row in moe["capacity"]["per_capacity_factor"]:
            lines.append(f"  c={row['capacity_factor']:<5g} capacity {row['capacity']:>7} dropped "
                         f"{100 * row['dropped_fraction']:6.2f}%  padding {100 * row['padding_fraction']:6.2f}%  "
                         f"busiest {row['busiest_device_rows']} rows")
        for row in moe.get("steps_per_capacity_factor", []):
            lines.append(f"  step at c={row['capacity_factor']:g}: {format_ms(row['step_time_ms'])}")
    if "context_parallel" in report:
        cp = report["context_parallel"]
        lines.append(f"CP={cp['cp']}: K/V ring {cp['steps']} steps of {cp['chunk_bytes']:,} bytes; forward waits "
                     f"{format_ms(cp['forward_wait_ms'])}, backward {format_ms(cp['backward_wait_ms'])} per layer")
    if "lengths" in report:
        ln = report["lengths"]
        lines.append(f"lengths ({ln['packing']}, attention cost {ln['attention_cost']}): {ln['tokens_real']:,} real of "
                     f"{ln['tokens_executed']:,} executed tokens (padding {100 * ln['padding_fraction']:.2f}%), "
                     f"attention pairs {ln['pairs_executed']:,} vs {ln['pairs_uniform']:,} uniform; micro-batch "
                     f"time factors {min(ln['scales']):.4f}..{max(ln['scales']):.4f}; "
                     f"{ln['real_tokens_per_s']:,.0f} real tokens/s")
    return "".join("\n" + line for line in lines)


def render_text(result, costs: PipelineCosts, payload: dict) -> str:
    m = result.mechanisms
    onoff = lambda b: "on" if b else "off"  # noqa: E731
    vs = f" v={result.virtual_stages}" if result.virtual_stages > 1 else ""
    lines = [f"simulate {result.schedule}{vs}: P={costs.num_stages} A={costs.microbatches} "
             f"layers/stage={len(costs.stages[0])}; layer-wise {onoff(m.layerwise)}, update-prefetch "
             f"{onoff(m.deadline_aware)}, activation {m.policy}",
             f"step time       {format_ms(result.step_time_ms, 12)}",
             f"last backward   {format_ms(result.last_backward_end_ms, 12)}",
             f"exposed tail    {format_ms(result.exposed_tail_ms, 12)}"]
    # the stage table in the unit of the step, one precision per column
    unit, per = time_unit(result.step_time_ms)
    d = decimals_for(result.step_time_ms / per)
    lines.append(f"stage  compute busy  compute idle  ddr busy  link busy  in-flight  act sets  R hidden  R exposed"
                 f"   (times in {unit})")
    for s in result.stages:
        lines.append(f"{s.stage:5d}  {s.compute_busy_ms / per:12.{d}f}  {s.compute_idle_ms / per:12.{d}f}  "
                     f"{s.ddr_busy_ms / per:8.{d}f}  {s.link_busy_ms / per:9.{d}f}  {s.peak_inflight:9d}  "
                     f"{s.peak_activation_sets:8.3g}  {s.hidden_recovery_ms / per:8.{d}f}  "
                     f"{s.exposed_recovery_ms / per:9.{d}f}")
    lines += render_lifecycle(payload)
    if "grid" in payload:
        lines.append(payload["grid"])
    for key in ("trace", "plot"):
        if key in payload:
            lines.append(f"wrote {payload[key]}")
    return "\n".join(lines)


def render_lifecycle(payload: dict) -> list[str]:
    """Text lines for gradient buckets, offloading and the bucket sweep (none when not asked for)."""
    lines = []
    gb = payload.get("gradient_buckets")
    if gb:
        lines.append(f"gradient buckets of >= {gb['bucket_bytes']:,} B: exposed after the last backward "
                     f"{format_ms(gb['exposed_after_last_backward_ms'])}, link {format_ms(gb['link_ms'])} "
                     "(worst stage)")
        for st in gb["stages"]:
            lines.append(f"  stage {st['stage']}: {st['buckets']} buckets, link {format_ms(st['link_ms'])}, waited on "
                         f"data {format_ms(st['wait_data_ms'])}, on the link {format_ms(st['wait_link_ms'])}")
    off = payload.get("offload")
    if off:
        host = off["host"]
        lines.append(f"offload {','.join(off['targets']) or 'nothing'}{' (host Adam)' if off['host_adam'] else ''}: "
                     f"host link {host['link_bandwidth'] / 1e9:g} GB/s per direction")
        for what, t in off["transfers"].items():
            lines.append(f"  {what}: {t['tasks']} tasks, {t['bytes'] / 2 ** 20:,.1f} MiB, "
                         f"busy {format_ms(t['busy_ms'])}, consumers waited {format_ms(t['consumer_wait_ms'])}")
        conv = off.get("gradient_conversion")
        if conv:
            big = conv["largest_layer"]
            flip = big["flip_link_bandwidth"]
            lines.append(f"  gradient conversion per step: device path {format_ms(conv['step_device_path_ms'])}, "
                         f"host path {format_ms(conv['step_host_path_ms'])}; faster: {big['faster']} (chosen "
                         f"{conv['chosen']}); flips at "
                         + (f"{flip / 1e9:.4g} GB/s" if flip is not None else "no link bandwidth")
                         + f"; extra device buffer: device path {big['device_buffer_bytes']['device'] / 2 ** 20:,.1f} "
                           "MiB, host path 0")
        mem = off.get("memory")
        if mem:
            lines.append(f"  device peak {mem['offloaded_peak_bytes'] / 2 ** 30:.2f} GiB (resident "
                         f"{mem['resident_peak_bytes'] / 2 ** 30:.2f} GiB)")
    sweep = payload.get("bucket_sweep")
    if sweep:
        lines.append("bucket sweep:    bucket bytes     step time   exposed after last B   link time   buckets/stage")
        for q in sweep["points"]:
            lines.append(f"  {q['bucket_bytes']:>24,}  {format_ms(q['step_time_ms'], 12)}  "
                         f"{format_ms(q['exposed_after_last_backward_ms'], 20)}  {format_ms(q['link_ms'], 10)}   "
                         f"{q['buckets_per_stage']}")
        lines.append(f"  best: {sweep['best']['bucket_bytes']:,} B ({format_ms(sweep['best']['step_time_ms'])})")
    return lines

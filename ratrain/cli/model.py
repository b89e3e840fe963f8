"""`ratrain model` and `ratrain memory`: model facts, operator shapes and per-stage memory (Eq. 9)."""
from __future__ import annotations

import argparse
from dataclasses import replace

from ratrain.cli.args import (
    add_model_choice,
    add_moe_cp_args,
    add_offload_args,
    add_platform_args,
    any_platform_from_args,
    model_from_args,
    moe_cp_from_args,
)
from ratrain.spec.memory import MoeCpLayout, max_peak, stage_memory
from ratrain.spec.models import (
    embedding_and_head_operators,
    layer_device_parameter_count,
    layer_operators,
    layer_parameter_count,
    parameter_count,
)
from ratrain.spec.moe import capacity_factors, capacity_sweep
from ratrain.spec.offload import Offload
from ratrain.spec.parallel import (
    ACTIVATION_POLICIES,
    PARTITIONS,
    PREFETCH_POLICIES,
    ParallelConfig,
)
from ratrain.spec.platform import GIB


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    add_model_choice(parser)
    parser.add_argument("--json", action="store_true", help="print the JSON payload")


def _load_model(args):
    return model_from_args(args)


def register(subparsers) -> None:
    p = subparsers.add_parser("model", help="model size and one layer's operator shapes")
    _add_model_args(p)
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (b)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (T)")
    p.set_defaults(handler=run_model)

    p = subparsers.add_parser("memory", help="per-stage peak memory (paper Eq. 9) and the Eq. 10 check")
    _add_model_args(p)
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (P)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas (D)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (T)")
    p.add_argument("--zero", type=int, default=2, help="ZeRO stage over D (0-3)")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (b)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per step per replica (A)")
    p.add_argument("--activation", default="fsr", choices=ACTIVATION_POLICIES)
    p.add_argument("--prefetch", default="layerwise", choices=PREFETCH_POLICIES)
    p.add_argument("--partition", default="balanced", choices=PARTITIONS)
    add_offload_args(p)
    add_moe_cp_args(p)
    add_platform_args(p)
    p.set_defaults(handler=run_memory)


def run_model(args) -> tuple[dict, str]:
    spec = _load_model(args)
    ops = layer_operators(spec, args.micro_batch, args.seq, args.tp)
    edge = embedding_and_head_operators(spec, args.micro_batch, args.seq, args.tp)
    total = parameter_count(spec)
    payload = {
        "name": spec.name,
        "spec": spec.to_json(),
        "parameters": total,
        "layer_parameters": layer_parameter_count(spec),
        "layers": spec.layers,
        "micro_batch": args.micro_batch,
        "seq": args.seq,
        "tp": args.tp,
        "operators": [op.to_json() for op in ops],
        "first_stage_operators": [op.to_json() for op in edge["first"]],
        "last_stage_operators": [op.to_json() for op in edge["last"]],
    }
    lines = [f"{spec.name}: {total:,} parameters, {spec.layers} layers, hidden {spec.hidden}, "
             f"ffn {spec.ffn}, heads {spec.heads}/{spec.kv_heads} kv, vocab {spec.vocab}, {spec.position}",
             f"one layer (b={args.micro_batch}, seq={args.seq}, T={args.tp}):"]
    for op in ops + edge["first"] + edge["last"]:
        if op.kind == "gemm":
            shape = f"m={op.m} k={op.k} n={op.n}" + (" +bias" if op.bias else "")
        elif op.kind == "attention":
            shape = (f"batch={op.batch} heads={op.heads} kv_heads={op.kv_heads} seq={op.seq} "
                     f"head_dim={op.head_dim}" + (" causal" if op.causal else "") + (" alibi" if op.alibi else ""))
        else:
            shape = f"{op.bytes_moved:,} bytes"
        lines.append(f"  {op.name:<20} {op.kind:<12} {shape}")
    return payload, "\n".join(lines)


def run_memory(args) -> tuple[dict, str]:
    from ratrain.sim.offload import conversion_choice, plan_for
    spec = _load_model(args)
    cfg = ParallelConfig(pp=args.pp, dp=args.dp, tp=args.tp, zero=args.zero, micro_batch=args.micro_batch,
                         accum=args.accum, seq=args.seq, activation=args.activation,
                         prefetch=args.prefetch, partition=args.partition, **moe_cp_from_args(args))
    platform = any_platform_from_args(args)
    offload = None
    if args.offload or args.host_adam:
        offload = Offload.parse(args.offload, host_adam=args.host_adam, convert=args.grad_convert,
                                reload_lookahead=args.reload_lookahead)
    host_path = False
    if offload is not None and offload.host_adam:
        plan = plan_for(offload, platform, dp=cfg.dp, zero=cfg.zero)
        largest = max(layer_parameter_count(spec) // cfg.tp, 1) * 2
        host_path = conversion_choice(plan, plan.shard_params(largest)) == "host"
    stages = stage_memory(spec, cfg, platform, offload=offload, host_path_convert=host_path)
    peak = max_peak(stages)
    fits = peak <= platform.memory_budget_bytes
    payload = {
        "model": spec.name,
        "config": cfg.describe(verbose=True),
        "stages": [{"stage": st.stage, "layers": [st.layers.start, st.layers.stop], "n_act": st.n_act,
                    "state_bytes": st.state_bytes, "activation_bytes": st.activation_bytes,
                    "buffer_bytes": st.buffer_bytes, "peak_bytes": st.peak_bytes,
                    "breakdown": st.breakdown} for st in stages],
        "budget_bytes": platform.memory_budget_bytes,
        "max_peak_bytes": peak,
        "fits": fits,
    }
    if offload is not None:
        resident = max_peak(stage_memory(spec, cfg, platform))
        payload["offload"] = {**offload.to_json(), "gradient_conversion_path": "host" if host_path else "device",
                              "resident_max_peak_bytes": resident,
                              "host_bytes": [sum(st.host.values()) for st in stages]}
        for entry, st in zip(payload["stages"], stages, strict=True):
            entry["host"] = st.host
    payload.update(_moe_cp_memory(spec, cfg, platform, peak))
    lines = [f"{spec.name} {cfg.describe(verbose=True)}  (GiB = 2**30 bytes)",
             f"{'stage':>5} {'layers':>9} {'N_act':>5} {'state':>8} {'act':>8} {'buffers':>8} {'peak':>8}"]
    for st in stages:
        lines.append(f"{st.stage:>5} {st.layers.start:>4}-{st.layers.stop - 1:<4} {st.n_act:>5} "
                     f"{st.state_bytes / GIB:>8.2f} {st.activation_bytes / GIB:>8.2f} "
                     f"{st.buffer_bytes / GIB:>8.2f} {st.peak_bytes / GIB:>8.2f}")
    lines.append(f"max peak {peak / GIB:.2f} GiB vs budget {platform.memory_budget_bytes / GIB:.2f} GiB: "
                 + ("fits" if fits else "does NOT fit"))
    if offload is not None:
        off = payload["offload"]
        resident = off["resident_max_peak_bytes"] / GIB
        lines.append(f"offload {','.join(offload.targets)}: resident max peak {resident:.2f} GiB; host memory per "
                     "stage " + ", ".join(f"{b / GIB:.2f}" for b in off["host_bytes"]) + " GiB")
    if "moe" in payload:
        moe, r = payload["moe"], payload["moe"]["routing"]
        lines.append(f"MoE EP={cfg.ep}: {moe['experts_per_device']} of {spec.moe.experts} experts per device "
                     f"({moe['expert_parameters_per_layer']:,} parameters per layer); busiest device "
                     f"{r['busiest_device_rows']} routed rows per micro-batch, dropped "
                     f"{100 * r['dropped_fraction']:.2f}%, "
                     f"padding {100 * r['padding_fraction']:.2f}%; nothing dropped from c = "
                     f"{moe['capacity']['no_drop_capacity_factor']:.4g}")
    if "context_parallel" in payload:
        c = payload["context_parallel"]
        lines.append(f"CP={cfg.cp}: max peak {c['max_peak_bytes_without_cp'] / GIB:.2f} GiB at CP=1, saving "
                     f"{c['saving_bytes'] / GIB:.2f} GiB")
    return payload, "\n".join(lines)


def _moe_cp_memory(spec, cfg: ParallelConfig, platform, peak: int) -> dict:
    """The MoE (experts held, the busiest device's routing) and CP (the saving over CP = 1) sections."""
    out: dict = {}
    if spec.moe is not None:
        tokens = cfg.micro_batch * (cfg.seq // cfg.cp) * cfg.ep
        sweep = capacity_sweep(spec.moe, tokens, cfg.ep, cfg.routing, capacity_factors((), cfg.capacity_factor))
        layout = MoeCpLayout.of(spec, cfg)
        chosen = next((r for r in sweep["per_capacity_factor"] if r["capacity_factor"] == cfg.capacity_factor),
                      sweep["dropless"])
        out["moe"] = {"ep": cfg.ep, "experts_per_device": spec.moe.experts // cfg.ep,
                      "expert_parameters_per_layer": layer_device_parameter_count(spec, cfg.tp, cfg.ep)[1],
                      "expert_rows": layout.expert_rows, "group_tokens": tokens, "routing": chosen,
                      "capacity": sweep}
    if cfg.cp > 1:
        base = max_peak(stage_memory(spec, replace(cfg, cp=1), platform))
        out["context_parallel"] = {"cp": cfg.cp, "max_peak_bytes_without_cp": base, "saving_bytes": base - peak}
    return out

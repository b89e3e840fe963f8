"""`mtemu attention-bwd`: emulate the Algorithm-1 attention backward (or its DDR-staged baseline)."""
from __future__ import annotations

import argparse

from .args import (
    add_attention_shape_args,
    add_attention_tile_args,
    add_platform_args,
    attention_tiles_from_args,
    check_attention_shape,
    default_kv_heads,
    platform_from_args,
)
from .defaults import ATTENTION_SCHEDULES, ATTENTION_VARIANTS
from .run import add_trace_args, report_extras, trace_options


def _attention_bwd(args: argparse.Namespace) -> tuple[dict, str]:
    import numpy as np

    from ..kernels.attention import attention_backward_timing, run_attention_backward
    from ..kernels.attention_ref import attention_backward_ref, attention_forward_ref
    trace, window = trace_options(args)
    plat = platform_from_args(args)
    tiles = attention_tiles_from_args(args, plat)
    causal = not args.no_causal
    if args.mode == "timing":
        r = attention_backward_timing(args.heads, args.kv_heads, args.seq, args.head_dim, causal=causal,
                                      tiles=tiles, variant=args.variant, platform=plat, schedule=args.schedule,
                                      trace=trace)
        err = None
    else:
        check_attention_shape(args)
        rng = np.random.default_rng(args.seed)
        q = rng.standard_normal((args.heads, args.seq, args.head_dim)).astype(np.float16)
        k = rng.standard_normal((args.kv_heads, args.seq, args.head_dim)).astype(np.float16)
        v = rng.standard_normal((args.kv_heads, args.seq, args.head_dim)).astype(np.float16)
        do = rng.standard_normal((args.heads, args.seq, args.head_dim)).astype(np.float16)
        o, saved = attention_forward_ref(q, k, v, causal)
        r = run_attention_backward(q, k, v, o, do, saved, causal=causal, tiles=tiles, variant=args.variant,
                                   platform=plat, mode="functional", schedule=args.schedule, trace=trace)
        ref = attention_backward_ref(q, k, v, o, do, saved, causal=causal)
        err = {n: float(np.abs(x.astype(np.float64) - y).max() / max(np.abs(y).max(), 1e-30))
               for n, x, y in zip(("dq", "dk", "dv"), (r.dq, r.dk, r.dv), ref, strict=True)}
    payload = r.to_json()
    if err is not None:
        payload["max_rel_error_vs_float64"] = err
    text = (f"attention backward ({r.variant}, {r.mode}) heads={r.heads} kv_heads={r.kv_heads} seq={r.seq} "
            f"d={r.head_dim} {'causal' if r.causal else 'non-causal'}, tiles {r.tiles.describe()}, "
            f"K/V schedule {r.schedule}\n"
            f"  cycles       {r.cycles}\n  utilization  {100 * r.utilization:.2f}%\n"
            f"  latency      {r.latency_ms:.3f} ms\n  tile pairs   {r.tile_pairs}\n"
            f"  DDR traffic  {r.ddr_bytes / 1e6:.1f} MB, GSM traffic {r.gsm_bytes / 1e6:.1f} MB\n"
            f"  stalls (DSP-cycles): " + ", ".join(f"{k} {v}" for k, v in r.stalls.items()))
    if err is not None:
        text += "\n  max relative error vs float64: " + ", ".join(f"{k} {v:.2e}" for k, v in err.items())
    extra, lines = report_extras(r.stats, args, window, r.useful_macs)
    payload.update(extra)
    return payload, "\n".join([text] + lines)


def register(sub) -> None:
    p = sub.add_parser("attention-bwd", help="emulate the Algorithm-1 attention backward")
    add_attention_shape_args(p)
    p.add_argument("--variant", choices=ATTENTION_VARIANTS, default="resident")
    p.add_argument("--schedule", choices=ATTENTION_SCHEDULES, default="auto",
                   help="how K/V reach the DSPs: gsm (K/V resident in GSM), broadcast (lock-step "
                        "rounds, Algorithm 1 as written), own (per-DSP loads); auto picks")
    p.add_argument("--mode", choices=("timing", "functional"), default="timing")
    p.add_argument("--no-causal", action="store_true", help="full (non-causal) attention")
    p.add_argument("--seed", type=int, default=0, help="random inputs in functional mode")
    add_attention_tile_args(p, "Algorithm-1 tiles (default: Br = Bc = vector lanes, Br' = Bc' = 32)")
    add_platform_args(p)
    add_trace_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=lambda a: _attention_bwd(default_kv_heads(a)))

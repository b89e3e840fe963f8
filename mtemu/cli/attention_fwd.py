"""`mtemu attention-fwd`: emulate the attention forward (O, saved P and logsumexp)."""
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
from .defaults import ATTENTION_SCHEDULES
from .run import add_trace_args, report_extras, trace_options


def _attention_fwd(args: argparse.Namespace) -> tuple[dict, str]:
    import numpy as np

    from ..kernels.attention import run_attention
    from ..kernels.attention_ref import attention_forward_ref
    trace, window = trace_options(args)
    plat = platform_from_args(args)
    check_attention_shape(args)
    tiles = attention_tiles_from_args(args, plat)
    causal = not args.no_causal
    rng = np.random.default_rng(args.seed)
    shape_q = (args.heads, args.seq, args.head_dim)
    shape_k = (args.kv_heads, args.seq, args.head_dim)
    if args.mode == "timing":   # no data is touched: zeros of the right shape
        q, k, v = np.zeros(shape_q, np.float16), np.zeros(shape_k, np.float16), np.zeros(shape_k, np.float16)
    else:
        q, k, v = (rng.standard_normal(s).astype(np.float16) for s in (shape_q, shape_k, shape_k))
    r = run_attention(q, k, v, causal=causal, tiles=tiles, platform=plat, mode=args.mode, schedule=args.schedule,
                      trace=trace)
    payload = r.to_json()
    text = (f"attention forward ({r.mode}) heads={r.heads} kv_heads={r.kv_heads} seq={r.seq} d={r.head_dim} "
            f"{'causal' if r.causal else 'non-causal'}, tiles {r.tiles.describe()}, K/V schedule {r.schedule}\n"
            f"  cycles       {r.cycles}\n  utilization  {100 * r.utilization:.2f}%\n"
            f"  latency      {r.latency_ms:.3f} ms\n  DDR traffic  {r.ddr_bytes / 1e6:.1f} MB\n"
            f"  stalls (DSP-cycles): " + ", ".join(f"{k} {v}" for k, v in r.stalls.items()))
    if args.mode == "functional":
        o, _saved = attention_forward_ref(q, k, v, causal)
        err = float(np.abs(r.o.astype(np.float64) - o).max() / max(np.abs(o.astype(np.float64)).max(), 1e-30))
        payload["max_rel_error_o_vs_float64"] = err
        text += f"\n  max relative error of O vs float64: {err:.2e}"
    extra, lines = report_extras(r.stats, args, window, r.useful_macs)
    payload.update(extra)
    return payload, "\n".join([text] + lines)


def register(sub) -> None:
    p = sub.add_parser("attention-fwd", help="emulate the attention forward (O, saved P and logsumexp)")
    add_attention_shape_args(p)
    p.add_argument("--schedule", choices=ATTENTION_SCHEDULES, default="auto",
                   help="how K/V reach the DSPs (see attention-bwd)")
    p.add_argument("--mode", choices=("timing", "functional"), default="timing")
    p.add_argument("--no-causal", action="store_true", help="full (non-causal) attention")
    p.add_argument("--seed", type=int, default=0, help="random inputs in functional mode")
    add_attention_tile_args(p, "tiles (default: Br = Bc = vector lanes, Bc' = 32)")
    add_platform_args(p)
    add_trace_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=lambda a: _attention_fwd(default_kv_heads(a)))

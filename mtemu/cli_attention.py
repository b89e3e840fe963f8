"""`mtemu attention-bwd`, `mtemu attention-fwd` and `mtemu validate attention` (via cli_commands): thin layers over
mtemu.kernels.attention."""
from __future__ import annotations

import numpy as np

from .cli_commands import add_platform_args, platform_from_args
from .errors import MtemuError
from .kernels.attention import (SCHEDULES, VARIANTS, attention_backward_timing, default_tiles, run_attention,
                                run_attention_backward)
from .validate.attention import PAPER_SPEEDUP, validate_attention
from .kernels.attention_ref import attention_forward_ref
from .kernels.capacity import AttentionTiles


def _tiles(args, platform):
    base = default_tiles(args.head_dim, platform)
    kw = {name: getattr(args, name) for name in ("br", "bc", "br_prime", "bc_prime") if getattr(args, name) is not None}
    return AttentionTiles(**{"br": base.br, "bc": base.bc, "d": args.head_dim, "br_prime": base.br_prime,
                             "bc_prime": base.bc_prime, **kw})


def _attention_bwd(args):
    plat = platform_from_args(args)
    tiles = _tiles(args, plat)
    causal = not args.no_causal
    if args.mode == "timing":
        r = attention_backward_timing(args.heads, args.kv_heads, args.seq, args.head_dim, causal=causal,
                                      tiles=tiles, variant=args.variant, platform=plat, schedule=args.schedule)
        err = None
    else:
        _check_shape(args)
        rng = np.random.default_rng(args.seed)
        q = rng.standard_normal((args.heads, args.seq, args.head_dim)).astype(np.float16)
        k = rng.standard_normal((args.kv_heads, args.seq, args.head_dim)).astype(np.float16)
        v = rng.standard_normal((args.kv_heads, args.seq, args.head_dim)).astype(np.float16)
        do = rng.standard_normal((args.heads, args.seq, args.head_dim)).astype(np.float16)
        o, saved = attention_forward_ref(q, k, v, causal)
        r = run_attention_backward(q, k, v, o, do, saved, causal=causal, tiles=tiles, variant=args.variant,
                                   platform=plat, mode="functional", schedule=args.schedule)
        from .kernels.attention_ref import attention_backward_ref
        ref = attention_backward_ref(q, k, v, o, do, saved, causal=causal)
        err = {n: float(np.abs(x.astype(np.float64) - y).max() / max(np.abs(y).max(), 1e-30))
               for n, x, y in zip(("dq", "dk", "dv"), (r.dq, r.dk, r.dv), ref)}
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
    return payload, text


def _check_shape(args):
    if min(args.heads, args.kv_heads, args.seq, args.head_dim) <= 0:
        raise MtemuError("--heads, --kv-heads, --seq and --head-dim must be positive")
    if args.heads % args.kv_heads:
        raise MtemuError(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}")


def _attention_fwd(args):
    plat = platform_from_args(args)
    _check_shape(args)
    tiles = _tiles(args, plat)
    causal = not args.no_causal
    rng = np.random.default_rng(args.seed)
    shape_q = (args.heads, args.seq, args.head_dim)
    shape_k = (args.kv_heads, args.seq, args.head_dim)
    if args.mode == "timing":   # no data is touched: zeros of the right shape
        q, k, v = np.zeros(shape_q, np.float16), np.zeros(shape_k, np.float16), np.zeros(shape_k, np.float16)
    else:
        q, k, v = (rng.standard_normal(s).astype(np.float16) for s in (shape_q, shape_k, shape_k))
    r = run_attention(q, k, v, causal=causal, tiles=tiles, platform=plat, mode=args.mode, schedule=args.schedule)
    payload = r.to_json()
    text = (f"attention forward ({r.mode}) heads={r.heads} kv_heads={r.kv_heads} seq={r.seq} d={r.head_dim} "
            f"{'causal' if r.causal else 'non-causal'}, tiles {r.tiles.describe()}, K/V schedule {r.schedule}\n"
            f"  cycles       {r.cycles}\n  utilization  {100 * r.utilization:.2f}%\n"
            f"  latency      {r.latency_ms:.3f} ms\n  DDR traffic  {r.ddr_bytes / 1e6:.1f} MB\n"
            f"  stalls (DSP-cycles): " + ", ".join(f"{k} {v}" for k, v in r.stalls.items()))
    if args.mode == "functional":
        o, saved = attention_forward_ref(q, k, v, causal)
        err = float(np.abs(r.o.astype(np.float64) - o).max() / max(np.abs(o.astype(np.float64)).max(), 1e-30))
        payload["max_rel_error_o_vs_float64"] = err
        text += f"\n  max relative error of O vs float64: {err:.2e}"
    return payload, text


def _validate_attention(args):
    plat = platform_from_args(args)
    rows = validate_attention(plat)
    lo, hi = PAPER_SPEEDUP
    lines = [f"attention backward, resident (Algorithm 1) over DDR-staged; paper Fig. 10: {lo}x-{hi}x",
             f"{'seq':>6} {'heads':>5} {'resident ms':>12} {'staged ms':>10} {'speedup':>8} "
             f"{'util res':>9} {'util stg':>9} {'DDR MB res':>11} {'DDR MB stg':>11}"]
    for r in rows:
        lines.append(f"{r['seq']:>6} {r['heads']:>5} {r['resident_ms']:>12.3f} {r['staged_ms']:>10.3f} "
                     f"{r['speedup']:>7.2f}x {100 * r['resident_utilization']:>8.1f}% "
                     f"{100 * r['staged_utilization']:>8.1f}% {r['resident_ddr_bytes'] / 1e6:>11.1f} "
                     f"{r['staged_ddr_bytes'] / 1e6:>11.1f}")
    return {"rows": rows, "platform_hash": plat.digest()}, "\n".join(lines)


def _add_shape_args(p, tiles_help: str) -> None:
    g = p.add_argument_group("tiles", tiles_help)
    for name in ("br", "bc", "br_prime", "bc_prime"):
        g.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=None)


def register(sub) -> None:
    p = sub.add_parser("attention-bwd", help="emulate the Algorithm-1 attention backward")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, default=None, help="KV heads (GQA); default = --heads")
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--variant", choices=VARIANTS, default="resident")
    p.add_argument("--schedule", choices=SCHEDULES, default="auto",
                   help="how K/V reach the DSPs: gsm (K/V resident in GSM), broadcast (lock-step "
                        "rounds, Algorithm 1 as written), own (per-DSP loads); auto picks")
    p.add_argument("--mode", choices=("timing", "functional"), default="timing")
    p.add_argument("--no-causal", action="store_true", help="full (non-causal) attention")
    p.add_argument("--seed", type=int, default=0, help="random inputs in functional mode")
    _add_shape_args(p, "Algorithm-1 tiles (default: Br = Bc = vector lanes, Br' = Bc' = 32)")
    add_platform_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=lambda a: _attention_bwd(_default_kv(a)))

    p = sub.add_parser("attention-fwd", help="emulate the attention forward (O, saved P and logsumexp)")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, default=None, help="KV heads (GQA); default = --heads")
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--schedule", choices=SCHEDULES, default="auto", help="how K/V reach the DSPs (see attention-bwd)")
    p.add_argument("--mode", choices=("timing", "functional"), default="timing")
    p.add_argument("--no-causal", action="store_true", help="full (non-causal) attention")
    p.add_argument("--seed", type=int, default=0, help="random inputs in functional mode")
    _add_shape_args(p, "tiles (default: Br = Bc = vector lanes, Bc' = 32)")
    add_platform_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=lambda a: _attention_fwd(_default_kv(a)))



def _default_kv(args):
    if args.kv_heads is None:
        args.kv_heads = args.heads
    return args

"""`ratrain profile`: build (or load) the emulated latency profile of a model's layers."""
from __future__ import annotations

from ratrain.cli.args import add_platform_args, platform_from_args
from ratrain.cost.sources import PROFILE_SOURCES
from ratrain.spec.models import from_hf_config, get_model, list_models
from rtcommon.progress import Progress


def _model(args):
    if args.hf_config:
        return from_hf_config(args.hf_config)
    return get_model(args.model)


def _profile(args):
    from ratrain.cost.profile import build_profiles, layer_profile
    spec = _model(args)
    platform = platform_from_args(args)
    if args.scheduler and args.source != "roofline":
        # emulate the kernels on the cluster first (a bound profile needs its b=1, T=1 reference);
        # the profile below then only reads the filled caches
        b, tp = (args.micro_batch, args.tp) if args.source == "emulated" else (1, 1)
        build_profiles([(spec, b, args.seq, tp)], platform=platform, scheduler=args.scheduler,
                       progress=Progress(not args.json))
    prof = layer_profile(spec, args.micro_batch, args.seq, args.tp, source=args.source, platform=platform,
                         progress=not args.json)
    payload = prof.to_json()
    lines = [f"{spec.name}: b={args.micro_batch} seq={args.seq} tp={args.tp} ({prof.source}, emulator "
             f"{prof.emulator_version}; {platform.gemm_loop_order} GEMM, {platform.tiles} tiles)",
             "  measured DDR rates (GB/s): " + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in prof.ddr_rates.items()),
             f"  layer forward  {1e3 * prof.forward_s:9.3f} ms   backward {1e3 * prof.backward_s:9.3f} ms",
             f"  first-stage extra fwd {1e3 * prof.first_forward_s:8.3f} ms   bwd "
             f"{1e3 * prof.first_backward_s:8.3f} ms",
             f"  last-stage extra  fwd {1e3 * prof.last_forward_s:8.3f} ms   bwd {1e3 * prof.last_backward_s:8.3f} ms",
             "  operator            kind          fwd ms     bwd ms"]
    for o in prof.ops:
        lines.append(f"  {o.name:18s}  {o.kind:11s} {1e3 * o.forward_s:9.3f}  {1e3 * o.backward_s:9.3f}")
    return payload, "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("profile", help="per-layer latency profile from kernels emulated on mtemu")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", choices=list_models())
    g.add_argument("--hf-config", metavar="FILE")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--source", choices=PROFILE_SOURCES, default="emulated",
                   help="emulated kernels; bound: the planner's fast model; roofline: a fixed utilization")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="emulate the profile's kernels on an existing Dask distributed cluster (as `mtemu tune`)")
    add_platform_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_profile)

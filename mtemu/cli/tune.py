"""`mtemu tune`: tile search for the GEMM or the attention backward (prune, emulate, rank)."""
from __future__ import annotations

import argparse

from ..errors import MtemuError
from ..kernels.names import DEFAULT_GEMM, GEMM_LOOP_ORDERS
from .args import add_platform_args, parse_ints, platform_from_args

# its own folder: a reproduction writes results/tune, whose heatmap its report embeds
DEFAULT_OUT = "mtemu-tune"


def _tune(args: argparse.Namespace) -> tuple[dict, str]:
    from ..tune import format_tune, tune_attention, tune_gemm
    plat = platform_from_args(args)
    if args.kernel == "attention":
        for name in ("seq", "heads", "head_dim"):
            if getattr(args, name) is None:
                raise MtemuError(f"mtemu tune attention needs --{name.replace('_', '-')}")
        grid = {}
        for name in ("br", "bc"):
            v = getattr(args, "grid_" + name)
            if v:
                grid[name] = parse_ints(v)
        r = tune_attention(args.seq, args.heads, args.kv_heads or args.heads, args.head_dim, platform=plat, grid=grid,
                           workers=args.workers, scheduler=args.scheduler, out_dir=args.out, progress=not args.json,
                           cache=not args.no_cache)
        return r.to_json(), format_tune(r, args.top)
    for name in ("m", "k", "n"):
        if getattr(args, name) is None:
            raise MtemuError(f"mtemu tune gemm needs --{name}")
    grid = {}
    for name in ("mg", "kg", "k2", "n2"):
        v = getattr(args, "grid_" + name)
        if v:
            grid[name] = parse_ints(v)
    r = tune_gemm(args.m, args.k, args.n, platform=plat, grid=grid, workers=args.workers, scheduler=args.scheduler,
                  out_dir=args.out, progress=not args.json, cache=not args.no_cache, emulate_top=args.emulate_top,
                  loop_order=args.loop_order)
    return r.to_json(), format_tune(r, args.top)


def register(sub) -> None:
    p = sub.add_parser("tune", help="search tile sizes: prune by capacity, emulate, rank by utilization")
    p.add_argument("kernel", choices=("gemm", "attention"))
    p.add_argument("--m", type=int, help="GEMM rows (tune gemm)")
    p.add_argument("--k", type=int, help="GEMM inner dimension (tune gemm)")
    p.add_argument("--n", type=int, help="GEMM columns (tune gemm)")
    p.add_argument("--seq", type=int, help="sequence length (tune attention)")
    p.add_argument("--heads", type=int, help="query heads (tune attention)")
    p.add_argument("--kv-heads", type=int, help="KV heads (tune attention; default --heads)")
    p.add_argument("--head-dim", type=int, help="head dimension (tune attention)")
    p.add_argument("--br", dest="grid_br", metavar="LIST", help="comma-separated Br values (attention)")
    p.add_argument("--bc", dest="grid_bc", metavar="LIST", help="comma-separated Bc values (attention)")
    p.add_argument("--loop-order", choices=GEMM_LOOP_ORDERS, default=DEFAULT_GEMM,
                   help=f"GEMM loop order to tune (default {DEFAULT_GEMM}); its candidates are the tile grid of "
                        "mtemu.kernels.registry, the one training's --tiles tuned chooses from")
    p.add_argument("--mg", dest="grid_mg", metavar="LIST", help="comma-separated mg values to try")
    p.add_argument("--kg", dest="grid_kg", metavar="LIST", help="comma-separated kg values (a-resident)")
    p.add_argument("--k2", dest="grid_k2", metavar="LIST")
    p.add_argument("--n2", dest="grid_n2", metavar="LIST")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: all cores)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run on an existing Dask distributed cluster")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"folder for the heatmap and table (default {DEFAULT_OUT}/: "
                                                      "its own, never a reproduction's results/)")
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--emulate-top", type=int, metavar="N",
                   help="GEMM: emulate only the N candidates with the best closed-form bound (plus the defaults); "
                        "2 is what --tiles tuned emulates")
    p.add_argument("--no-cache", action="store_true", help="re-emulate even if cached")
    add_platform_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_tune)

"""Argument helpers shared by the `mtemu` commands: platform overrides, GEMM and attention tiles,
attention shapes, comma-separated lists."""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict, fields
from typing import TYPE_CHECKING

from ..errors import MtemuError
from ..platform import Platform, load_platform
from .defaults import DEFAULT_GEMM, GEMM_DEFAULT_TILES_TEXT, GEMM_DESCRIPTIONS, GEMM_LOOP_ORDERS, GEMM_TILE_FIELDS

if TYPE_CHECKING:
    from ..kernels.capacity import AttentionTiles
    from ..kernels.gemm import GemmTiles
    from ..kernels.gemm_a_resident import AResidentGemmTiles

_PLATFORM_FLAGS = {f.name: f.type for f in fields(Platform) if f.name not in ("name", "latencies")}


# --- platform -------------------------------------------------------------------------------
def add_platform_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("platform", "override any platform field (see `mtemu platform --json`)")
    g.add_argument("--platform", metavar="FILE", help="TOML or JSON file of platform fields")
    for name in _PLATFORM_FLAGS:
        g.add_argument("--" + name.replace("_", "-"), dest="plat_" + name, type=float, default=None,
                       metavar="X", help=argparse.SUPPRESS)


def platform_from_args(args: argparse.Namespace) -> Platform:
    overrides = {}
    for name, typ in _PLATFORM_FLAGS.items():
        v = getattr(args, "plat_" + name, None)
        if v is not None:
            if typ in (int, "int"):
                if not math.isfinite(v) or v != int(v):
                    raise MtemuError(f"--{name.replace('_', '-')} must be an integer, got {v}")
                v = int(v)
            overrides[name] = v
    return load_platform(args.platform, **overrides)


# --- GEMM tiles and loop order ----------------------------------------------------------------
def add_tile_args(p: argparse.ArgumentParser) -> None:
    defaults = "; ".join(GEMM_DEFAULT_TILES_TEXT[name] for name in GEMM_LOOP_ORDERS)
    g = p.add_argument_group("tiles", f"GEMM tile sizes (defaults per loop order: {defaults}). Tiles are "
                                      "clipped to the shape and nv to n2 / vector lanes (a-resident's nv=4 runs "
                                      "as nv=2 on n2=384); runs print the tiles that ran")
    for name in GEMM_TILE_FIELDS:
        g.add_argument("--" + name, type=int, default=None)
    g.add_argument("--no-pipeline", action="store_true", help="variant without load/compute overlap")


def add_loop_order_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("loop order")
    g.add_argument("--loop-order", choices=GEMM_LOOP_ORDERS, default=DEFAULT_GEMM,
                   help="; ".join(f"{name}{' (default)' if name == DEFAULT_GEMM else ''}: {GEMM_DESCRIPTIONS[name]}"
                                  for name in GEMM_LOOP_ORDERS))
    g.add_argument("--kg", type=int, help="a-resident: columns of A per resident A_g block")
    g.add_argument("--b-slots", type=int, help="a-resident: B tiles in AM (2 or 3)")


def tiles_from_args(args: argparse.Namespace) -> GemmTiles:
    from ..kernels.gemm import DEFAULT_TILES, GemmTiles
    kw = {f.name: getattr(args, f.name) for f in fields(GemmTiles)
          if f.name != "pipelined" and getattr(args, f.name, None) is not None}
    if getattr(args, "no_pipeline", False):
        kw["pipelined"] = False
    return GemmTiles(**{**asdict(DEFAULT_TILES), **kw})


def any_tiles_from_args(args: argparse.Namespace) -> GemmTiles | AResidentGemmTiles:
    """GemmTiles, or AResidentGemmTiles with --loop-order a-resident (its own defaults)."""
    from ..kernels.gemm_a_resident import AResidentGemmTiles
    if getattr(args, "loop_order", DEFAULT_GEMM) != "a-resident":
        for flag in ("kg", "b_slots"):
            if getattr(args, flag, None) is not None:
                raise MtemuError(f"--{flag.replace('_', '-')} applies to --loop-order a-resident only")
        return tiles_from_args(args)
    if getattr(args, "no_pipeline", False):
        raise MtemuError("--no-pipeline applies to --loop-order c-stationary only")
    kw = {f.name: getattr(args, f.name) for f in fields(AResidentGemmTiles)
          if f.name != "pipelined" and getattr(args, f.name, None) is not None}
    return AResidentGemmTiles(**kw)


# --- attention shape and tiles ----------------------------------------------------------------
def add_attention_shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, default=None, help="KV heads (GQA); default = --heads")
    p.add_argument("--head-dim", type=int, required=True)


def add_attention_tile_args(p: argparse.ArgumentParser, tiles_help: str) -> None:
    g = p.add_argument_group("tiles", tiles_help)
    for name in ("br", "bc", "br_prime", "bc_prime"):
        g.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=None)


def default_kv_heads(args: argparse.Namespace) -> argparse.Namespace:
    """--kv-heads defaults to --heads (MHA)."""
    if args.kv_heads is None:
        args.kv_heads = args.heads
    return args


def check_attention_shape(args: argparse.Namespace) -> None:
    if min(args.heads, args.kv_heads, args.seq, args.head_dim) <= 0:
        raise MtemuError("--heads, --kv-heads, --seq and --head-dim must be positive")
    if args.heads % args.kv_heads:
        raise MtemuError(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}")
    functional = getattr(args, "mode", "timing") == "functional"
    # timing mode still holds FP16 Q, K, V (zeros) of the shape
    from rtcommon.hostmem import check_host_memory
    need = (functional_attention_bytes(args.heads, args.seq, args.head_dim) if functional
            else 6 * args.heads * args.seq * args.head_dim)
    check_host_memory(need, f"{'functional' if functional else 'timing'} attention (heads={args.heads}, "
                      f"seq={args.seq}, head_dim={args.head_dim})" + (" with its float64 reference" if functional
                                                                      else ""), MtemuError)


def functional_attention_bytes(heads: int, seq: int, head_dim: int) -> int:
    """Host bytes of a functional attention run: the float64 reference's few (heads, seq, seq)
    matrices and (heads, seq, d) tensors, the random inputs, and the cluster's FP16 P and tensors."""
    return 48 * heads * seq * seq + 96 * heads * seq * head_dim


def check_gemm_host_memory(m: int, k: int, n: int) -> None:
    """Functional GEMM: float64 random operands and reference (8 bytes an element) plus the
    cluster's FP16 copies; refuse before allocating what the host does not have."""
    from rtcommon.hostmem import check_host_memory
    check_host_memory(12 * (m * k + k * n + m * n), f"functional GEMM {m}x{k}x{n} with its reference", MtemuError)


def attention_tiles_from_args(args: argparse.Namespace, platform: Platform) -> AttentionTiles:
    """The kernel's default tiles for --head-dim, with any of --br --bc --br-prime --bc-prime."""
    from ..kernels.attention import default_tiles
    from ..kernels.capacity import AttentionTiles
    base = default_tiles(args.head_dim, platform)
    kw = {name: getattr(args, name) for name in ("br", "bc", "br_prime", "bc_prime") if getattr(args, name) is not None}
    return AttentionTiles(**{"br": base.br, "bc": base.bc, "d": args.head_dim, "br_prime": base.br_prime,
                             "bc_prime": base.bc_prime, **kw})


# --- lists ------------------------------------------------------------------------------------
def parse_ints(text: str) -> tuple[int, ...]:
    """Positive integers from a comma-separated list."""
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise MtemuError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not vals or min(vals) <= 0:
        raise MtemuError(f"expected positive integers, got {text!r}")
    return vals


def parse_floats(text: str, flag: str) -> list[float]:
    """Positive numbers from a comma-separated list given to ``flag``."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MtemuError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not (v > 0 and math.isfinite(v)) for v in vals):
        raise MtemuError(f"{flag}: expected positive finite numbers, got {text!r}")
    return vals

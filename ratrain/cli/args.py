"""Argument helpers shared by the `ratrain` commands: the platform description and its overrides."""
from __future__ import annotations

import argparse

from ratrain.errors import ConfigError
from ratrain.spec.gpu import GpuPlatform
from ratrain.spec.lengths import ATTENTION_COSTS, PACKINGS, LengthDistribution, parse_lengths
from ratrain.spec.models import ModelSpec, from_hf_config, get_model, list_models
from ratrain.spec.offload import CONVERT_CHOICES, OFFLOAD_TARGETS
from ratrain.spec.platform import TILE_CHOICES, TrainingPlatform
from ratrain.spec.platforms import AnyPlatform, load_platform, require_mt3000


def add_platform_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("platform", "the platform every number follows (see `ratrain platform --json`)")
    g.add_argument("--platform", metavar="FILE",
                   help="platform file (.toml or .json): an MT-3000 cluster (cluster, training and kernel fields) "
                        "or, with kind = \"gpu-cluster\", a GPU cluster; default: MT-3000")
    g.add_argument("--tiles", choices=TILE_CHOICES,
                   help="GEMM tiles of the kernel latencies: the loop order's defaults, or the best per shape "
                        "on this platform (overrides the platform's 'tiles'; MT-3000 only)")


def any_platform_from_args(args: argparse.Namespace) -> AnyPlatform:
    """The ``--platform`` file of either kind (the MT-3000 default without one), with ``--tiles``."""
    platform = load_platform(getattr(args, "platform", None) or None)
    if getattr(args, "tiles", None):
        if isinstance(platform, GpuPlatform):
            raise ConfigError(f"--tiles chooses MT-3000 kernel tiles; {args.platform} is a GPU-cluster platform")
        platform = platform.with_overrides(tiles=args.tiles)
    return platform


def platform_from_args(args: argparse.Namespace, command: str | None = None) -> TrainingPlatform:
    """The ``--platform`` file for a command that runs on MT-3000 only; a GPU platform is one line
    ("FILE is a GPU-cluster platform; ratrain profile needs an MT-3000 platform")."""
    command = command or (f"ratrain {args.command}" if getattr(args, "command", None) else "this command")
    return require_mt3000(any_platform_from_args(args), command, getattr(args, "platform", None))


# ---------------------------------------------------------------- MoE, context parallelism, length distributions

def _hot_experts(text: str) -> tuple[float, float]:
    """SHARE:LOAD, e.g. 0.25:2 (a quarter of the experts at twice the mean load)."""
    try:
        share, load = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SHARE:LOAD such as 0.25:2, got {text!r}") from None
    return share, load


def _factor_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 1,1.25,2, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 1,1.25,2, got {text!r}")
    return values


def add_model_choice(p: argparse.ArgumentParser, model_help: str | None = None) -> None:
    """``--model NAME`` or ``--hf-config FILE``, one of them required (``model_from_args`` reads it)."""
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--model", help=model_help or f"built-in model: {', '.join(list_models())}")
    group.add_argument("--hf-config", metavar="FILE", help="HuggingFace config.json")


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    """The model ``--model`` names or ``--hf-config`` describes."""
    return get_model(args.model) if args.model else from_hf_config(args.hf_config)


def add_offload_args(g) -> None:
    """The offload flags of `ratrain simulate` and `ratrain memory` (docs/LIFECYCLE.md)."""
    g.add_argument("--offload", metavar="TARGETS",
                   help=f"comma-separated state kept in host memory: {', '.join(OFFLOAD_TARGETS)}")
    g.add_argument("--host-adam", action="store_true",
                   help="optimizer update on the host's cores (implies --offload optimizer,master,grads)")
    g.add_argument("--grad-convert", choices=CONVERT_CHOICES, default="auto",
                   help="host-side update: where gradients become 32-bit (device, host, or auto: the faster)")
    g.add_argument("--reload-lookahead", type=int, default=1, metavar="K",
                   help="activation offload: a reload may start K compute tasks before its consumer (default 1)")


def add_moe_cp_args(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    g = p.add_argument_group("mixture of experts and context parallelism (docs/MOE-AND-LONG-CONTEXT.md)")
    g.add_argument("--ep", type=int, default=1, help="expert parallelism EP (MoE models; divides D x CP and E)")
    g.add_argument("--cp", type=int, default=1, help="context parallelism CP: devices each sequence is split over")
    g.add_argument("--capacity-factor", type=float, metavar="C",
                   help="MoE capacity factor: each expert runs floor(C x tokens x k / E) rows (default: dropless)")
    g.add_argument("--hot-experts", type=_hot_experts, metavar="SHARE:LOAD",
                   help="MoE routing imbalance: SHARE of the experts are hot at LOAD x the mean load (e.g. 0.25:2)")
    if sweep:
        g.add_argument("--capacity-factors", type=_factor_list, metavar="C1,C2,...",
                       help="MoE: also simulate the step at each capacity factor (routing report per C)")


def moe_cp_from_args(args: argparse.Namespace) -> dict:
    """The ParallelConfig fields of the MoE and CP flags (checked by ParallelConfig)."""
    share, load = args.hot_experts if args.hot_experts is not None else (0.0, 1.0)
    return {"ep": args.ep, "cp": args.cp, "capacity_factor": args.capacity_factor, "hot_share": share,
            "hot_load": load}


def add_length_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sequence-length distribution (docs/MOE-AND-LONG-CONTEXT.md)")
    g.add_argument("--seq-lengths", metavar="FILE|L1,L2,...",
                   help="document lengths: a file (LENGTH or LENGTH COUNT per line) or a comma-separated list; "
                        "--seq is the target sequence length")
    g.add_argument("--packing", choices=PACKINGS, default="pad",
                   help="how documents become sequences: pad (default), pack, pack-masked (document mask), group")
    g.add_argument("--attention-cost", choices=ATTENTION_COSTS, default="kernel",
                   help="attention work: kernel (default: the emulated causal kernel per executed sequence) or "
                        "mask (the real mask: no padding rows, document masks honoured)")


def lengths_from_args(args: argparse.Namespace) -> LengthDistribution | None:
    if args.seq_lengths is None:
        if args.packing != "pad" or args.attention_cost != "kernel":
            raise ConfigError("--packing and --attention-cost apply to --seq-lengths: give the length distribution")
        return None
    return LengthDistribution(tuple(parse_lengths(args.seq_lengths)), args.packing, args.attention_cost)


def add_run_choice_args(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """The MoE, CP and length-distribution flags of a command that runs steps (simulate, plan)."""
    add_moe_cp_args(p, sweep)
    add_length_args(p)


def run_choices_from_args(args: argparse.Namespace) -> tuple[dict, LengthDistribution | None]:
    """(the ParallelConfig fields of the MoE and CP flags, the length distribution or None)."""
    return moe_cp_from_args(args), lengths_from_args(args)

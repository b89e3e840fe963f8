"""Argument helpers shared by the `ratrain` commands: the platform description and its overrides."""
from __future__ import annotations

import argparse

from ratrain.errors import ConfigError
from ratrain.spec.gpu import GpuPlatform
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

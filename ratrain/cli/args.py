"""Argument helpers shared by the `ratrain` commands: the platform description and its overrides."""
from __future__ import annotations

import argparse

from ratrain.spec.platform import TILE_CHOICES, TrainingPlatform


def add_platform_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("platform", "the platform every number follows (see `ratrain platform --json`)")
    g.add_argument("--platform", metavar="FILE",
                   help="platform file (.toml or .json): cluster, training and kernel fields; default: MT-3000")
    g.add_argument("--tiles", choices=TILE_CHOICES,
                   help="GEMM tiles of the kernel latencies: the loop order's defaults, or the best per shape "
                        "on this platform (overrides the platform's 'tiles')")


def platform_from_args(args: argparse.Namespace) -> TrainingPlatform:
    platform = TrainingPlatform.from_file(args.platform) if getattr(args, "platform", None) else TrainingPlatform()
    if getattr(args, "tiles", None):
        platform = platform.with_overrides(tiles=args.tiles)
    return platform

"""`mtemu platform`: the platform spec after any file and flag overrides."""
from __future__ import annotations

import argparse

from .args import add_platform_args, platform_from_args


def _platform(args: argparse.Namespace) -> tuple[dict, str]:
    plat = platform_from_args(args)
    d = plat.to_dict()
    text = "\n".join(f"{k:24s} {v}" for k, v in d.items())
    return d, text


def register(sub) -> None:
    p = sub.add_parser("platform", help="print the platform spec")
    add_platform_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_platform)

"""`ratrain platform`: the whole platform description (cluster, training, kernels) in the file format.

Dump it, edit a field and pass the file back with `--platform FILE` to any command of either CLI
(`mtemu` reads its [cluster] table).
"""
from __future__ import annotations

import argparse

from ratrain.cli.args import add_platform_args, platform_from_args
from ratrain.spec.platform import describe


def run(args: argparse.Namespace) -> tuple[dict, str]:
    platform = platform_from_args(args)
    payload = platform.to_json()
    lines = [describe(platform), "", "cluster:"]
    lines += [f"  {k:24s} {v}" for k, v in payload["cluster"].items()]
    lines += ["training:"] + [f"  {k:24s} {v}" for k, v in payload["training"].items()]
    lines += ["kernels:"] + [f"  {k:24s} {v}" for k, v in payload["kernels"].items()]
    lines.append("(`ratrain platform --json > my.json`, edit, then `--platform my.json`)")
    return payload, "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("platform", help="print the platform description (cluster, training link, kernels)")
    add_platform_args(p)
    p.add_argument("--json", action="store_true", help="print it in the file format")
    p.set_defaults(handler=run)

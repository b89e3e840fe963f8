"""`ratrain platform`: the whole platform description in the file format.

An MT-3000 platform (cluster, training, kernels) or a GPU cluster (``kind = "gpu-cluster"``:
device, node, network, collectives, kernels). Dump it, edit a field and pass the file back with
`--platform FILE` (`mtemu` reads an MT-3000 file's [cluster] table).
"""
from __future__ import annotations

import argparse

from ratrain.cli.args import add_platform_args, any_platform_from_args
from ratrain.spec.platforms import describe_platform


def run(args: argparse.Namespace) -> tuple[dict, str]:
    platform = any_platform_from_args(args)
    payload = platform.to_json()
    lines = [describe_platform(platform), ""]
    for table, values in payload.items():
        if isinstance(values, dict) and table != "derived":
            lines.append(f"{table}:")
            lines += [f"  {k:24s} {v}" for k, v in values.items()]
    lines.append("(`ratrain platform --json > my.json`, edit, then `--platform my.json`)")
    return payload, "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("platform", help="print the platform description (MT-3000 cluster or GPU cluster)")
    add_platform_args(p)
    p.add_argument("--json", action="store_true", help="print it in the file format")
    p.set_defaults(handler=run)

"""`mtemu` command line: a thin layer over the library.

Each command lives in its own module exposing ``register(subparsers)``; the
registered handler returns a JSON-able dict (printed with --json) and a text
rendering. Bad input raises MtemuError and becomes a one-line
error with exit status 2. Shared argument helpers live in ``mtemu.cli.args``.
"""
from __future__ import annotations

import argparse
import json
import sys
from types import ModuleType

from ..errors import MtemuError
from . import attention_bwd, attention_fwd, explain, gemm, platform, probe, run, tune, validate

# Modules that register subcommands, in help order.
COMMAND_MODULES: list[ModuleType] = [platform, gemm, tune, validate, attention_bwd, attention_fwd, run, explain,
                                     probe]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtemu", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.handler(args)
    except (MtemuError, FileNotFoundError) as exc:
        print(f"mtemu {args.command}: error: {exc}", file=sys.stderr)
        return 2
    if result is None:
        return 0
    payload, text = result
    try:
        if getattr(args, "json", False):
            print(json.dumps(payload, indent=2, sort_keys=False))
        else:
            print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: not an error of ours
        sys.stdout = None
    return 0

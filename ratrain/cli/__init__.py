"""`ratrain` command line: a thin layer over the library.

Each command lives in its own module exposing ``register(subparsers)``; the
registered handler returns a JSON-able dict (printed with --json) and a text
rendering. Bad input raises RatrainError/MtemuError (both rtcommon.errors.UserError) and becomes a one-line
error with exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from rtcommon.errors import UserError

# Modules that register subcommands, in help order.
COMMAND_MODULES: list[str] = [
    "ratrain.cli.platform",
    "ratrain.cli.model",
    "ratrain.cli.profile",
    "ratrain.cli.reproduce",
    "ratrain.cli.correctness",
    "ratrain.cli.simulate",
    "ratrain.cli.plan",
    "ratrain.cli.time_to_train",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ratrain", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.handler(args)
    except (UserError, FileNotFoundError) as exc:
        print(f"ratrain {args.command}: error: {exc}", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())

"""`ratrain` command line: a thin layer over the library.

Each command lives in its own module exposing ``register(subparsers)``; the
registered handler returns a JSON-able dict (printed with --json) and a text
rendering. Bad input raises RatrainError/MtemuError (both rtcommon.errors.UserError) and becomes a one-line
error with exit status 2 (``rtcommon.cli``: also OS errors, Ctrl-C as 130, strict JSON).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from rtcommon.cli import apply_policy, new_parser, run_main
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
    "ratrain.cli.task",
    "ratrain.cli.validate",
]


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser("ratrain", __doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return apply_policy(parser)


def main(argv: list[str] | None = None) -> int:
    return run_main("ratrain", build_parser(), argv, (UserError,))


if __name__ == "__main__":
    sys.exit(main())

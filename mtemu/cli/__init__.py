"""`mtemu` command line: a thin layer over the library.

Each command lives in its own module exposing ``register(subparsers)``; the
registered handler returns a JSON-able dict (printed with --json) and a text
rendering. Bad input raises MtemuError and becomes a one-line
error with exit status 2 (``rtcommon.cli``: also OS errors, Ctrl-C as 130, strict JSON).
Shared argument helpers live in ``mtemu.cli.args``.
"""
from __future__ import annotations

import argparse
from types import ModuleType

from rtcommon.cli import apply_policy, new_parser, run_main

from ..errors import MtemuError
from . import attention_bwd, attention_fwd, cache, explain, gemm, platform, probe, run, tune, validate

# Modules that register subcommands, in help order.
COMMAND_MODULES: list[ModuleType] = [platform, gemm, tune, validate, attention_bwd, attention_fwd, run, explain,
                                     probe, cache]


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser("mtemu", __doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return apply_policy(parser)


def main(argv: list[str] | None = None) -> int:
    return run_main("mtemu", build_parser(), argv, (MtemuError,))

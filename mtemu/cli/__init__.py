"""`mtemu` command line: a thin layer over the library.

Each command lives in its own module exposing ``register(subparsers)``; the
registered handler returns a JSON-able dict (printed with --json) and a text
rendering. Bad input raises MtemuError and becomes a one-line
error with exit status 2 (``rtcommon.cli``: also OS errors, Ctrl-C as 130, strict JSON).
Shared argument helpers live in ``mtemu.cli.args``.
"""
from __future__ import annotations

import argparse
import sys

from rtcommon.cli import Command, command_parser, run_main

from ..errors import MtemuError

# Every subcommand in help order: its name, the module that registers it, its one-line help (the
# top-level --help prints these without importing any command module, so without the emulator).
COMMANDS: list[Command] = [
    Command("platform", "mtemu.cli.platform", "print the platform spec"),
    Command("gemm", "mtemu.cli.gemm", "emulate an FP16 GEMM C[M,N] = A[M,K] B[K,N]"),
    Command("tune", "mtemu.cli.tune", "search tile sizes: prune by capacity, emulate, rank by utilization"),
    Command("validate", "mtemu.cli.validate", "compare emulated kernels with the paper"),
    Command("attention-bwd", "mtemu.cli.attention_bwd", "emulate the Algorithm-1 attention backward"),
    Command("attention-fwd", "mtemu.cli.attention_fwd", "emulate the attention forward (O, saved P and logsumexp)"),
    Command("run", "mtemu.cli.run", "run a program: place inputs, run, write outputs, report cycles"),
    Command("explain", "mtemu.cli.explain", "which resource bounds a kernel (VMAC, DDR, GSM, DMA, latency, barriers)"),
    Command("probe", "mtemu.cli.probe", "measure the emulated effective DDR bandwidth of training access patterns"),
    Command("cache", "mtemu.cli.cache", "list every cache: folder, entries, size on disk, format version"),
]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv`` (only the command it runs in full), or, without ``argv``, every command."""
    return command_parser("mtemu", __doc__.splitlines()[0], COMMANDS, argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_main("mtemu", build_parser(argv), argv, (MtemuError,))

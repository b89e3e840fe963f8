"""`ratrain` command line: a thin layer over the library.

Each command lives in its own module exposing ``register(subparsers)``; the
registered handler returns a JSON-able dict (printed with --json) and a text
rendering. Bad input raises RatrainError/MtemuError (both rtcommon.errors.UserError) and becomes a one-line
error with exit status 2 (``rtcommon.cli``: also OS errors, Ctrl-C as 130, strict JSON).
"""
from __future__ import annotations

import argparse
import sys

from rtcommon.cli import Command, command_parser, run_main
from rtcommon.errors import UserError

# Every subcommand in help order: its name, the module that registers it, its one-line help (the
# top-level --help prints these without importing any command module). A new command is one line
# here and one module with register(subparsers); tests/test_cli_startup.py checks the help lines.
COMMANDS: list[Command] = [
    Command("platform", "ratrain.cli.platform", "print the platform description (MT-3000 cluster or GPU cluster)"),
    Command("model", "ratrain.cli.model", "model size and one layer's operator shapes"),
    Command("memory", "ratrain.cli.model", "per-stage peak memory (paper Eq. 9) and the Eq. 10 check"),
    Command("profile", "ratrain.cli.profile", "per-layer latency profile from kernels emulated on mtemu"),
    Command("reproduce", "ratrain.cli.reproduce", "run the paper reproduction (all experiments, or one)"),
    Command("correctness", "ratrain.cli.correctness",
            "train a tiny model under Baseline-1F1B and RATrain timelines; compare loss curves (Fig. 7)"),
    Command("simulate", "ratrain.cli.simulate",
            "simulate one 1F1B/GPipe/interleaved/ZB-H1 step with training-state lifecycle tasks"),
    Command("plan", "ratrain.cli.plan", "search (P, D, Z, T, b, A, activation, prefetch) for the fastest "
            "memory-feasible configuration (Algorithm 2)"),
    Command("time-to-train", "ratrain.cli.time_to_train", "wall-clock time to train with failures, checkpoints "
            "and stragglers (Young interval, first-order overheads)"),
    Command("task", "ratrain.cli.task", "a training task against its deadline: completion time, margin, "
            "which resource decides, batch size against the noise scale"),
    Command("validate", "ratrain.cli.validate", "the simulator against measured training runs of a GPU cluster"),
]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv`` (only the command it runs in full), or, without ``argv``, every command."""
    return command_parser("ratrain", __doc__.splitlines()[0], COMMANDS, argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_main("ratrain", build_parser(argv), argv, (UserError,))


if __name__ == "__main__":
    sys.exit(main())

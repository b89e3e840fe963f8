"""Every flag of both command lines says what it does in --help (shared flags say it one way)."""
from __future__ import annotations

import argparse

from mtemu.cli import build_parser as mtemu_parser
from ratrain.cli import build_parser as ratrain_parser


def _flags(parser: argparse.ArgumentParser, prefix: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, f"{prefix} {name}")
        elif action.option_strings and action.dest != "help":
            yield f"{prefix} {action.option_strings[-1]}", action.help


def test_every_flag_has_help_text():
    flags = list(_flags(mtemu_parser(), "mtemu")) + list(_flags(ratrain_parser(), "ratrain"))
    assert len(flags) > 200
    missing = [name for name, text in flags if not text or not text.strip()]
    assert not missing, f"flags without help: {missing}"


def test_a_shared_flag_reads_the_same_everywhere():
    flags = dict(_flags(mtemu_parser(), "mtemu"))
    assert flags["mtemu gemm --mg"] == flags["mtemu validate --mg"] == flags["mtemu explain gemm --mg"]
    assert flags["mtemu tune --k2"] == "comma-separated k2 values to try"

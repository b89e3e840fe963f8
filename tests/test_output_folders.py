"""Where commands write: the reproduction under its --out folder (results/), every other command
only where its flags say, by default in a folder of its own, never into results/ or the working
folder itself, so a one-off command cannot replace a figure the reproduction's report embeds."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mtemu.cli import build_parser as mtemu_parser
from mtemu.cli import main as mtemu_main
from ratrain.cli import build_parser as ratrain_parser
from ratrain.cli import main as ratrain_main
from rtcommon.cli import OUTPUT_DIRS, OUTPUT_FILES

# the two commands whose purpose is writing where they are pointed by default
WRITE_HERE_BY_DESIGN = {("ratrain", "reproduce", "out"): "results",     # the reproduction itself
                        ("mtemu", "run", "out_dir"): "."}                # the program's declared outputs


def _output_options():
    for cli, parser in (("mtemu", mtemu_parser()), ("ratrain", ratrain_parser())):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for name, command in sub.choices.items():
            for action in command._actions:
                if action.dest in OUTPUT_DIRS | OUTPUT_FILES:
                    yield cli, name, action.dest, action.default


def test_no_command_writes_into_results_or_the_working_folder_by_default():
    seen = list(_output_options())
    assert {(c, n) for c, n, _d, _v in seen} >= {("mtemu", "tune"), ("ratrain", "correctness"), ("ratrain", "simulate")}
    for cli, name, dest, default in seen:
        if (cli, name, dest) in WRITE_HERE_BY_DESIGN:
            assert default == WRITE_HERE_BY_DESIGN[cli, name, dest]
            continue
        if default is None:                 # a file or folder only when asked
            continue
        parts = Path(default).parts
        assert dest in OUTPUT_DIRS, f"{cli} {name} --{dest} writes {default} unasked"
        assert default not in (".", "") and parts[0] != "results", f"{cli} {name}: default --{dest} {default}"
        assert name in default, f"{cli} {name}: default folder {default} is not the command's own"


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_mtemu_tune_writes_only_into_its_own_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "keep.png").write_bytes(b"the reproduction's figure")
    assert mtemu_main(["tune", "gemm", "--m", "256", "--k", "512", "--n", "768", "--mg", "128", "--k2", "64",
                       "--n2", "384", "--workers", "1", "--json"]) == 0
    written = _files(tmp_path) - {"results/keep.png"}
    assert written and all(f.startswith("mtemu-tune/") for f in written), written
    assert (tmp_path / "results" / "keep.png").read_bytes() == b"the reproduction's figure"


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_ratrain_correctness_writes_only_into_its_own_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert ratrain_main(["correctness", "--steps", "2", "--layers", "2", "--hidden", "32", "--heads", "2",
                         "--seq", "16", "--json"]) == 0
    written = _files(tmp_path)
    assert written and all(f.startswith("ratrain-correctness/") for f in written), written

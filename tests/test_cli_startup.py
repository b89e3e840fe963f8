"""Commands load what they run: --help and cheap commands import neither the emulator, Numba nor
Matplotlib, and the lazy command registry gives the same parser as registering every command."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mtemu.cli
import ratrain.cli

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numba", "matplotlib", "mtemu.machine", "mtemu.fast.queues", "mtemu.fast.runs")
UNIFORM = ["simulate", "--uniform", "--stages", "4", "--microbatches", "8", "--t-forward", "1", "--t-backward", "2",
           "--json"]


def _loaded(cli: str, argv: list[str], extra: tuple[str, ...] = ()) -> tuple[int, list[str], str]:
    """(exit status, heavy modules loaded (and any of ``extra``, by top-level name), stdout) of ``cli``'s
    main(argv) in a fresh interpreter."""
    code = (f"import sys; from {cli} import main; rc = main({argv!r}); "
            f"heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'numba' or m.startswith({HEAVY!r}) "
            f"or m in {extra!r}); "
            "print('\\nLOADED ' + repr([rc, heavy]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    text, _, tail = out.stdout.rpartition("\nLOADED ")
    rc, heavy = eval(tail)      # noqa: S307 (our own repr)
    return rc, heavy, text


# every command's --help (and the subcommands'), and an argument error: none of NumPy, Numba, Matplotlib and
# the emulator (mtemu.machine and its fast paths) loads; what a parser shows comes from light constant
# modules (mtemu.cli.defaults, ratrain.cli.defaults, ratrain.plan.choices, ...)
HELP = ([("ratrain.cli", ["--help"]), ("mtemu.cli", ["--help"])]
        + [("ratrain.cli", [c.name, "--help"]) for c in ratrain.cli.COMMANDS]
        + [("mtemu.cli", [c.name, "--help"]) for c in mtemu.cli.COMMANDS]
        + [("ratrain.cli", ["validate", "measured", "--help"]), ("ratrain.cli", ["validate", "fit-gpu", "--help"]),
           ("mtemu.cli", ["explain", "gemm", "--help"]), ("mtemu.cli", ["explain", "program", "--help"]),
           ("mtemu.cli", ["tune", "gemm", "--help"]), ("mtemu.cli", ["tune", "attention", "--help"]),
           ("mtemu.cli", ["validate", "table5", "--help"]),
           ("ratrain.cli", ["plan", "--clusters", "nine"]),          # argument errors
           ("ratrain.cli", ["correctness", "--steps", "nine"]),
           ("ratrain.cli", ["simulate", "--stages", "nine"]),
           ("mtemu.cli", ["gemm", "--m", "nine"])])


# the quick layer starts an interpreter for these (each start costs a few tenths of a second); the full
# suite (CI) for every one
QUICK_HELP = {"ratrain --help", "mtemu --help", "ratrain plan --help", "ratrain correctness --help",
              "mtemu gemm --help", "ratrain plan --clusters nine", "mtemu gemm --m nine"}


def _help_params():
    for cli, argv in HELP:
        name = " ".join([cli.split(".")[0], *argv])
        yield pytest.param(cli, argv, id=name, marks=[] if name in QUICK_HELP else [pytest.mark.slow])


@pytest.mark.parametrize("cli, argv", _help_params())
def test_help_and_argument_errors_load_no_numpy_emulator_numba_or_matplotlib(cli, argv):
    rc, heavy, _ = _loaded(cli, argv, extra=("numpy",))
    assert rc == (2 if "nine" in argv else 0)
    assert heavy == [], heavy


def test_the_ratrain_parsers_defaults_are_the_librarys():
    """ratrain.cli.defaults holds what the parsers show without loading NumPy: each equals its home."""
    from dataclasses import fields

    from ratrain.cli import defaults
    from ratrain.cost.megatron import ACTIVATION_MODES
    from ratrain.replay.correctness import CorrectnessConfig
    from ratrain.repro.gpu_fit import EVALUATIONS

    assert {f.name: f.default for f in fields(CorrectnessConfig) if f.name in defaults.CORRECTNESS_DEFAULTS} == \
        defaults.CORRECTNESS_DEFAULTS
    assert set(defaults.CORRECTNESS_DEFAULTS) == {f.name for f in fields(CorrectnessConfig)} - {"loss_scale"}
    assert (ACTIVATION_MODES, EVALUATIONS) == (defaults.GPU_ACTIVATION_MODES, defaults.FIT_EVALUATIONS)


def test_the_mtemu_parsers_defaults_are_the_librarys():
    """mtemu.cli.defaults holds what the parsers show without loading the kernels: each equals its home."""
    from dataclasses import fields

    from mtemu.cli import defaults
    from mtemu.kernels.attention.plan import SCHEDULES, VARIANTS
    from mtemu.kernels.gemm import GemmTiles
    from mtemu.kernels.registry import GEMM_VARIANTS
    from mtemu.program_runner import DEFAULT_BUILD_SECONDS, DEFAULT_MAX_SECONDS
    from mtemu.trace import DEFAULT_MAX_EVENTS, TraceOptions

    assert tuple(GEMM_VARIANTS) == defaults.GEMM_LOOP_ORDERS
    assert {v.name: v.description for v in GEMM_VARIANTS.values()} == defaults.GEMM_DESCRIPTIONS
    assert {v.name: v.default_tiles.describe() for v in GEMM_VARIANTS.values()} == defaults.GEMM_DEFAULT_TILES_TEXT
    assert tuple(f.name for f in fields(GemmTiles) if f.name != "pipelined") == defaults.GEMM_TILE_FIELDS
    assert (VARIANTS, SCHEDULES) == (defaults.ATTENTION_VARIANTS, defaults.ATTENTION_SCHEDULES)
    assert (DEFAULT_MAX_EVENTS, TraceOptions().capacity) == (defaults.TRACE_MAX_EVENTS, defaults.TRACE_CAPACITY)
    assert (DEFAULT_MAX_SECONDS, DEFAULT_BUILD_SECONDS) == \
        (defaults.PROGRAM_MAX_SECONDS, defaults.PROGRAM_BUILD_SECONDS)


def test_the_light_tiles_module_holds_the_variants_defaults_and_bound():
    """A profile's key and the fast kernel model read mtemu.kernels.gemm_tiles, not the registry: the same
    objects the variants carry (and the generators' modules still export)."""
    from mtemu.kernels import gemm, gemm_a_resident, gemm_bound, gemm_tiles
    from mtemu.kernels.registry import GEMM_VARIANTS

    assert {n: v.default_tiles for n, v in GEMM_VARIANTS.items()} == gemm_tiles.DEFAULT_TILES_OF
    assert all(GEMM_VARIANTS[n].bound is b for n, b in gemm_tiles.PLANLESS_BOUNDS.items())
    assert (gemm.DEFAULT_TILES, gemm.GemmTiles, gemm_a_resident.AResidentGemmTiles, gemm_bound.a_resident_bound) == \
        (gemm_tiles.DEFAULT_TILES, gemm_tiles.GemmTiles, gemm_tiles.AResidentGemmTiles, gemm_tiles.a_resident_bound)


def test_a_uniform_simulation_loads_no_emulator_or_matplotlib():
    rc, heavy, text = _loaded("ratrain.cli", UNIFORM)
    assert rc == 0 and heavy == []
    assert json.loads(text)["step_time_ms"] > 0


def test_a_plan_on_shipped_profiles_loads_no_emulator_numba_or_matplotlib():
    """Every profile this plan reads is shipped (the fast model's micro-batch-1 reference, the finalists'
    emulated ones): their key, the emulator version and the fast kernel model come from light modules."""
    rc, heavy, text = _loaded("ratrain.cli", ["plan", "--model", "llama2-7b", "--clusters", "8", "--global-batch",
                                              "512", "--json"], extra=("mtemu.kernels.gemm", "mtemu.ddr_probe"))
    assert rc == 0 and heavy == [], heavy
    got = json.loads(text)
    assert (got["kernel_model"], got["confirmed"]) == ("bound", 3)
    assert got["best"]["kernels"] == "emulated" and got["best"]["step_s"] > 0


def _help(parser: argparse.ArgumentParser) -> dict[tuple[str, ...], str]:
    """--help text of the parser and of every subcommand under it, by command path."""
    out = {(): parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update({(name, *path): text for path, text in _help(sub).items()})
    return out


@pytest.mark.parametrize("cli", [ratrain.cli, mtemu.cli])
def test_the_lazy_registry_builds_the_parser_of_every_command(cli, monkeypatch):
    """The top-level help from the registry alone equals the one every module registers, and each
    command's parser built for its own argv equals the full parser's."""
    monkeypatch.setenv("COLUMNS", "100")
    full = _help(cli.build_parser())
    assert _help(cli.build_parser(["--help"]))[()] == full[()]
    assert [c.name for c in cli.COMMANDS] == [path[0] for path in full if len(path) == 1]
    for command in cli.COMMANDS:
        lazy = _help(cli.build_parser([command.name, "--help"]))
        for path, text in full.items():
            if path[:1] == (command.name,):
                assert lazy[path] == text, path


def test_the_command_word_is_the_first_non_option():
    from rtcommon.cli import chosen_command
    commands = ratrain.cli.COMMANDS
    assert chosen_command(commands, ["plan", "--model", "memory"]).name == "plan"
    assert chosen_command(commands, ["-h"]) is None
    assert chosen_command(commands, ["no-such-command"]) is None
    assert chosen_command(commands, ["memory"]).module == "ratrain.cli.model"


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_a_plot_loads_matplotlib_on_the_agg_backend(tmp_path):
    out = tmp_path / "step.png"
    code = ("import sys; from ratrain.cli import main; "
            f"rc = main({UNIFORM + ['--plot', str(out)]!r}); import matplotlib; "
            "print(rc, matplotlib.get_backend().lower(), 'matplotlib.pyplot' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[-3:] == ["0", "agg", "True"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

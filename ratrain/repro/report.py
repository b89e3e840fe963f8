"""The paper reproduction's driver: runs a selection of experiments, writes ``results/<key>.json``,
the figures and ``results/report.md``, and shows progress on stderr. Numbers are measured by mtemu
and the simulator; ``ratrain.repro.targets`` supplies only the targets.
"""
from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mtemu import timing_memo
from ratrain.errors import ConfigError
from ratrain.repro import training
from ratrain.repro.budget import run_budget
from ratrain.repro.compare import DEFAULT_EXPERIMENTS as COMPARED
from ratrain.repro.compare import compare_markdown, load_baseline
from ratrain.repro.correctness import run_correctness_experiment
from ratrain.repro.cross_platform import run_cross_platform
from ratrain.repro.experiment import DEFAULT_SETTINGS, Experiment, format_check_value, settings_markdown
from ratrain.repro.experiment_list import EXPERIMENT_NAMES as EXPERIMENT_NAMES  # re-exported: the list's home
from ratrain.repro.experiment_list import EXPERIMENTS
from ratrain.repro.experiment_list import experiments_help as experiments_help
from ratrain.repro.fig9 import run_fig9
from ratrain.repro.kernels import run_attention, run_table5, run_table5_study, run_tune
from ratrain.repro.measured import run_measured
from ratrain.repro.platforms import run_platforms
from ratrain.repro.ranking import run_ranking
from ratrain.repro.schedules import run_schedules
from ratrain.repro.sensitivity import run_sensitivity
from ratrain.repro.stragglers import run_stragglers
from ratrain.repro.summary import write_summary
from ratrain.sim import simulation_memo
from rtcommon.fileio import atomic_write_json, atomic_write_text
from rtcommon.progress import Progress


# ------------------------------------------------------------------------------------------
# registry, driver, report
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One experiment of the main job: what runs it, one line on what it shows, and its cost once the
    emulator is compiled (``ratrain.repro.experiment_list``, where the names and lines live)."""

    run: Callable[..., Experiment]
    summary: str
    cost: str


def catalog() -> dict[str, Entry]:
    """Every experiment of the main job, in run order."""
    runners = {
        "table5": run_table5, "table5_study": run_table5_study, "tune": run_tune, "attention": run_attention,
        "table2": training.run_table2, "table3": training.run_table3, "table4": training.run_table4,
        "table6": training.run_table6, "ablation": training.run_ablation, "schedules": run_schedules,
        "budget": run_budget, "sensitivity": run_sensitivity, "stragglers": run_stragglers,
        "platforms": run_platforms, "ranking": run_ranking, "fig9": run_fig9,
        "correctness": run_correctness_experiment, "measured": run_measured, "cross_platform": run_cross_platform,
    }
    return {key: Entry(runners[key], summary, cost) for key, (summary, cost) in EXPERIMENTS.items()}


def registry() -> dict[str, Callable[..., Experiment]]:
    """Every experiment's runner, in run order."""
    return {key: entry.run for key, entry in catalog().items()}


def reproduce(which: list[str] | None = None, out_dir: str | Path = "results", progress: bool = True,
              settings=None) -> list[Experiment]:
    """Run ``which`` (default: every experiment) into ``out_dir``; with more than one, also the report."""
    settings = settings or DEFAULT_SETTINGS
    experiments = registry()
    keys = which or list(experiments)
    unknown = [k for k in keys if k not in experiments]
    if unknown:
        raise ConfigError(f"unknown experiment(s) {', '.join(unknown)} (known: {', '.join(experiments)})")
    out = Path(out_dir)
    prog = Progress(progress)
    start = RunClock.now()
    # one process: the emulator's experiments must not run beside others that may compile or load
    # the jitted machine (Numba's cache has one writer at a time, as the tuner's warm-up says)
    done = _run_all(keys, out, prog, settings)
    if len(keys) > 1:
        write_report(done, out, settings)
        write_summary({e.key: e.to_json() for e in done}, out)
        total = start.elapsed()
        prog(f"reproduce: {len(keys)} experiments in {_format_timing(total)}")
    return done


def _run_all(keys: list[str], out: Path, prog: Progress, settings) -> list[Experiment]:
    """The experiments ``keys`` in order, each written to ``out/<key>.json`` with its timing. They share
    simulated steps (the same inputs, e.g. Table 2's layouts in the schedules study or the ablation's
    default link in the sensitivity sweep, are simulated once) and emulated timing runs (Table 5's
    GEMMs again in its calibration study and the tuner)."""
    experiments = registry()
    done = []
    with simulation_memo.enabled(), timing_memo.enabled():
        for key in keys:
            prog(f"({keys.index(key) + 1}/{len(keys)}) {key}")
            t = RunClock.now()
            exp = experiments[key](out, prog, settings)
            exp.timing = t.elapsed()
            exp.seconds = exp.timing["wall_s"]
            atomic_write_json(out / f"{key}.json", exp.to_json() | {"settings": settings.to_json()})
            done.append(exp)
            prog(f"{key}: {exp.passed}/{len(exp.checks)} checks pass ({_format_timing(exp.timing)})")
    return done


@dataclass(frozen=True)
class RunClock:
    """Wall and CPU time at a start: CPU of this process and of its finished child processes (the
    ranking study's workers), so an experiment's CPU seconds count every core it used."""
    wall: float
    cpu: float

    @classmethod
    def now(cls) -> "RunClock":
        t = os.times()
        return cls(time.perf_counter(), t.user + t.system + t.children_user + t.children_system)

    def elapsed(self) -> dict[str, float]:
        """Wall and CPU seconds since the start, and the process's peak resident MB so far."""
        t = RunClock.now()
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024      # KiB on Linux
        return {"wall_s": t.wall - self.wall, "cpu_s": t.cpu - self.cpu, "peak_rss_mb": peak_mb}


def _format_timing(timing: dict[str, float]) -> str:
    return (f"{timing['wall_s']:.1f} s wall, {timing['cpu_s']:.1f} CPU-s, peak {timing['peak_rss_mb']:.0f} MB "
            "resident so far")


def write_report(experiments: list[Experiment], out: Path, settings=None) -> Path:
    parts = ["# RATrain reproduction report", "",
             "Every number marked *ours* is measured by the emulator (mtemu) or the simulator (ratrain);",
             "the paper's numbers are targets only. Regenerate with `ratrain reproduce`.", "",
             "Settings (choices where the paper is silent):", "", *settings_markdown(settings), "",
             "| experiment | checks passed |", "| --- | --- |"]
    for e in experiments:
        parts.append(f"| {e.title} | {e.passed}/{len(e.checks)} |")
    for e in experiments:
        parts += ["", f"## {e.title}", ""]
        if e.text:
            parts += ["```", e.text, "```", ""]
        parts += ["| check | ours | paper | tolerance | result | note |", "| --- | --- | --- | --- | --- | --- |"]
        for c in e.checks:
            ours, ref = format_check_value(c.ours), format_check_value(c.paper)
            parts.append(f"| {c.name} | {ours} | {ref} | {c.tolerance} | {'pass' if c.ok else '**miss**'} | {c.note} |")
        for fig in e.figures:
            fig_path = Path(fig).resolve()
            rel = fig_path.relative_to(out.resolve()) if fig_path.is_relative_to(out.resolve()) else Path(fig)
            parts += ["", f"![{e.key}]({rel.as_posix()})"]
        for note in e.notes:
            parts += ["", f"> {note}"]
    parts += _before_after(experiments)
    path = out / "report.md"
    atomic_write_text(path, "\n".join(parts) + "\n")
    return path


def _before_after(experiments: list[Experiment]) -> list[str]:
    """This run against the shipped baseline from before the one-platform step, table by table."""
    run = {e.key: e.to_json() for e in experiments if e.key in COMPARED}
    if not run:
        return []
    baseline = load_baseline()
    return ["", "## Before and after the one-platform step", "",
            f"Before: {baseline['description']} After: this run. **yes** marks a row that moved by more than its "
            "tolerance (one-sided tolerances: a change of pass/miss or of more than 5 %); each such row has one "
            "sentence below its table.", "",
            compare_markdown(baseline, {"experiments": run})]

"""The paper reproduction's driver: runs a selection of experiments, writes ``results/<key>.json``,
the figures and ``results/report.md``, and shows progress on stderr. Numbers are measured by mtemu
and the simulator; ``ratrain.repro.targets`` supplies only the targets.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from ratrain.errors import ConfigError
from ratrain.repro import training
from ratrain.repro.budget import run_budget
from ratrain.repro.compare import DEFAULT_EXPERIMENTS as COMPARED
from ratrain.repro.compare import compare_markdown, load_baseline
from ratrain.repro.correctness import run_correctness_experiment
from ratrain.repro.cross_platform import run_cross_platform
from ratrain.repro.experiment import DEFAULT_SETTINGS, Experiment
from ratrain.repro.fig9 import run_fig9
from ratrain.repro.kernels import run_attention, run_table5, run_table5_study, run_tune
from ratrain.repro.measured import run_measured
from ratrain.repro.platforms import run_platforms
from ratrain.repro.ranking import run_ranking
from ratrain.repro.schedules import run_schedules
from ratrain.repro.sensitivity import run_sensitivity
from ratrain.repro.stragglers import run_stragglers
from rtcommon.fileio import atomic_write_json, atomic_write_text
from rtcommon.progress import Progress


# ------------------------------------------------------------------------------------------
# registry, driver, report
# ------------------------------------------------------------------------------------------
def registry() -> dict[str, Callable[..., Experiment]]:
    """Every experiment of the main job, in run order."""
    return {"table5": run_table5, "table5_study": run_table5_study, "tune": run_tune, "attention": run_attention,
            "table2": training.run_table2, "table3": training.run_table3, "table4": training.run_table4,
            "table6": training.run_table6, "ablation": training.run_ablation,
            "schedules": run_schedules, "budget": run_budget, "sensitivity": run_sensitivity,
            "stragglers": run_stragglers, "platforms": run_platforms, "ranking": run_ranking,
            "fig9": run_fig9,
            "correctness": run_correctness_experiment, "measured": run_measured, "cross_platform": run_cross_platform}


EXPERIMENT_NAMES = ("table5", "table5_study", "tune", "attention", "table2", "table3", "table4", "table6", "ablation",
                    "schedules", "budget", "sensitivity", "stragglers", "platforms",
                    "ranking", "fig9", "correctness", "measured", "cross_platform")


def reproduce(which: list[str] | None = None, out_dir: str | Path = "results", progress: bool = True,
              settings=None) -> list[Experiment]:
    settings = settings or DEFAULT_SETTINGS
    experiments = registry()
    keys = which or list(experiments)
    unknown = [k for k in keys if k not in experiments]
    if unknown:
        raise ConfigError(f"unknown experiment(s) {', '.join(unknown)} (known: {', '.join(experiments)})")
    out = Path(out_dir)
    prog = Progress(progress)
    done = []
    for i, key in enumerate(keys):
        prog(f"({i + 1}/{len(keys)}) {key}")
        t = time.time()
        exp = experiments[key](out, prog, settings)
        exp.seconds = time.time() - t
        atomic_write_json(out / f"{key}.json", exp.to_json() | {"settings": settings.to_json()})
        done.append(exp)
        prog(f"{key}: {exp.passed}/{len(exp.checks)} checks pass ({exp.seconds:.0f} s)")
    if len(keys) > 1:
        write_report(done, out, settings)
    return done


def write_report(experiments: list[Experiment], out: Path, settings=None) -> Path:
    parts = ["# RATrain reproduction report", "",
             "Every number marked *ours* is measured by the emulator (mtemu) or the simulator (ratrain);",
             "the paper's numbers are targets only. Regenerate with `ratrain reproduce`.", "",
             f"Settings (choices where the paper is silent): `{settings.to_json() if settings else {}}`", "",
             "| experiment | checks passed |", "| --- | --- |"]
    for e in experiments:
        parts.append(f"| {e.title} | {e.passed}/{len(e.checks)} |")
    for e in experiments:
        parts += ["", f"## {e.title}", ""]
        if e.text:
            parts += ["```", e.text, "```", ""]
        parts += ["| check | ours | paper | tolerance | result | note |", "| --- | --- | --- | --- | --- | --- |"]
        for c in e.checks:
            ours = f"{c.ours:.4g}" if isinstance(c.ours, float) else str(c.ours)
            ref = f"{c.paper:.4g}" if isinstance(c.paper, float) else str(c.paper)
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

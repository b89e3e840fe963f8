"""The paper reproduction's driver: runs a selection of experiments, writes ``results/<key>.json``,
the figures and ``results/report.md``, and shows progress on stderr. Numbers are measured by mtemu
and the simulator; ``ratrain.repro.targets`` supplies only the targets.
"""
from __future__ import annotations

import itertools
import os
import pickle
import resource
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mtemu import jit, timing_memo
from ratrain.errors import ConfigError, RatrainError
from ratrain.repro import training
from ratrain.repro.budget import run_budget
from ratrain.repro.compare import DEFAULT_EXPERIMENTS as COMPARED
from ratrain.repro.compare import compare_markdown, load_baseline
from ratrain.repro.correctness import run_correctness_experiment
from ratrain.repro.cross_platform import run_cross_platform
from ratrain.repro.experiment import DEFAULT_SETTINGS, Experiment, format_check_value, settings_markdown
from ratrain.repro.experiment_list import EXPERIMENT_NAMES as EXPERIMENT_NAMES  # re-exported: the list's home
from ratrain.repro.experiment_list import EXPERIMENTS
from ratrain.repro.experiment_list import default_jobs as default_jobs  # re-exported
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


# The experiments that run the emulator (the jitted machine: Numba's compile and its on-disk cache):
# the kernel checks; the budget study, whose TP plans at small budgets emulate GEMMs on empty caches;
# and the what-if platforms, whose profiles probe DDR on the machine on empty caches. With two jobs
# they run in one worker process, so only one process ever compiles or loads the machine, and their
# memory is returned when it exits. The experiments in SIDE_EXPERIMENTS share no simulated steps with
# the others and need no jitted machine: whichever process is done with its own list first takes
# them, one at a time (``_claim``), so the two processes end close together both on a first run,
# where the emulator's side is the longer, and on later runs, where the simulations' side is.
EMULATOR_EXPERIMENTS = ("table5", "table5_study", "tune", "attention", "budget", "platforms")
SIDE_EXPERIMENTS = ("correctness", "measured", "cross_platform")


def reproduce(which: list[str] | None = None, out_dir: str | Path = "results", progress: bool = True,
              settings=None, jobs: int = 1) -> list[Experiment]:
    """Run ``which`` (default: every experiment) into ``out_dir``; with more than one, also the report.

    ``jobs`` 2: the emulator's experiments in a worker process beside the others, ``SIDE_EXPERIMENTS``
    in whichever is free first (``_run_split``); the results, files and their order are those of one
    process."""
    settings = settings or DEFAULT_SETTINGS
    experiments = registry()
    keys = which or list(experiments)
    unknown = [k for k in keys if k not in experiments]
    if unknown:
        raise ConfigError(f"unknown experiment(s) {', '.join(unknown)} (known: {', '.join(experiments)})")
    out = Path(out_dir)
    prog = Progress(progress)
    start = RunClock.now()
    # the emulator's experiments never run beside others that may compile or load the jitted machine
    # (Numba's cache has one writer at a time, as the tuner's warm-up says): only the worker does
    split = _split(keys) if jobs > 1 else None
    done = _run_split(keys, *split, out, prog, settings) if split else _run_all(keys, out, prog, settings)
    if len(keys) > 1:
        write_report(done, out, settings)
        write_summary({e.key: e.to_json() for e in done}, out)
        total = start.elapsed()
        prog(f"reproduce: {len(keys)} experiments in {_format_timing(total)}")
    return done


def _split(keys: list[str]) -> tuple[list[str], list[str], list[str]] | None:
    """(the worker's keys, this process's keys, the keys either takes when done with its own), or None
    when one process must run them all: the worker would have no emulator experiment or this process
    nothing of its own, or this process already runs threads (Numba's, once a kernel ran here), which
    a fork must not copy."""
    worker = [k for k in keys if k in EMULATOR_EXPERIMENTS]
    shared = [k for k in keys if k in SIDE_EXPERIMENTS]
    here = [k for k in keys if k not in worker and k not in shared]
    if not worker or not here or threading.active_count() > 1:
        return None
    return worker, here, shared


def _claim(claims: str, key: str) -> bool:
    """True for the one process that first asks for ``key``: its claim file in ``claims`` is created
    exclusively, which the file system decides for both processes at once."""
    try:
        os.close(os.open(os.path.join(claims, key), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _run_split(keys: list[str], worker: list[str], here: list[str], shared: list[str], out: Path,
               prog: Progress, settings) -> list[Experiment]:
    """``worker`` in a forked process while this one runs ``here``, then each of ``shared`` in whichever
    asks for it first; the experiments back in ``keys`` order. The worker writes its own files and
    hands its Experiments back through a file (pickled), so it exits, and frees its memory, as soon as
    it is done. A bare fork, waited for only at the end: multiprocessing would reap it whenever another
    process starts (the ranking study's pool), adding its CPU time to whichever experiment runs then.
    While the worker runs, any load or compile of jitted code in this process (or in one it starts)
    waits until the worker has exited (``mtemu.jit.hold_jit_for``): the worker compiles the machine into
    Numba's cache, which takes one writer at a time; none of this side's experiments needs the machine
    with the shipped profiles."""
    fd, handoff = tempfile.mkstemp(prefix="ratrain-reproduce-", suffix=".pickle")
    os.close(fd)
    claims = tempfile.mkdtemp(prefix="ratrain-reproduce-claims-")
    try:
        pid = os.fork()
        if pid == 0:                     # the worker
            code = 1
            try:
                _worker_main(keys, worker, shared, claims, out, prog, settings, handoff)
                code = 0
            finally:
                os._exit(code)
        jit.hold_jit_for(pid)
        try:
            mine = _run_all(keys, out, prog, settings, only=here, shared=shared, claims=claims)
        finally:
            exitcode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            jit.release_jit()
        with open(handoff, "rb") as f:
            got = pickle.load(f) if exitcode == 0 else None
    finally:
        os.unlink(handoff)
        shutil.rmtree(claims, ignore_errors=True)
    if isinstance(got, BaseException):
        raise got
    if not isinstance(got, list):
        raise RatrainError(f"reproduce: the worker running {', '.join(worker)} exited with code {exitcode}")
    by_key = {e.key: e for e in mine + got}
    return [by_key[k] for k in keys]


def _worker_main(keys: list[str], worker: list[str], shared: list[str], claims: str, out: Path, prog: Progress,
                 settings, handoff: str) -> None:
    """The forked worker: run ``worker`` and the ``shared`` keys it claims first, and leave the
    Experiments (or the error) in ``handoff``."""
    try:
        got: object = _run_all(keys, out, prog, settings, only=worker, shared=shared, claims=claims)
    except BaseException as exc:         # handed to the parent, which raises it
        got = exc
    try:
        blob = pickle.dumps(got)
    except Exception as exc:             # an unpicklable error: its line
        blob = pickle.dumps(RatrainError(f"reproduce worker: {exc}"))
    with open(handoff, "wb") as f:
        f.write(blob)
    sys.stderr.flush()


def _run_all(keys: list[str], out: Path, prog: Progress, settings, only: list[str] | None = None,
             shared: list[str] = (), claims: str | None = None) -> list[Experiment]:
    """The experiments ``keys`` in order, each written to ``out/<key>.json`` with its timing. They share
    simulated steps (the same inputs, e.g. Table 2's layouts in the schedules study or the ablation's
    default link in the sensitivity sweep, are simulated once) and emulated timing runs (Table 5's
    GEMMs again in its calibration study and the tuner). ``only``: run just these of ``keys`` (numbered
    as in ``keys``), then each of ``shared`` that ``_claim`` gives this process in ``claims``."""
    experiments = registry()
    done = []
    with simulation_memo.enabled(), timing_memo.enabled():
        # the claims are asked lazily, each when this process is free for it
        for key in keys if only is None else itertools.chain(only, (k for k in shared if _claim(claims, k))):
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

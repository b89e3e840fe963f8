"""Time to train: a training step's wall-clock cost once failures, checkpoints and stragglers are counted.

First-order model (every term a fraction of useful time, i.e. of the fault-free straggler-bound run):

* Stragglers. Each of the N clusters' step time is normal with mean ``step_s`` and standard deviation
  ``cv * step_s``, independent across clusters and steps; the synchronous step waits for the slowest, so the
  expected step is ``step_s * (1 + cv * E[max of N standard normals])``. This is a choice and an upper-ish
  estimate: it lets the whole step vary (communication is usually steadier than compute) and assumes no
  correlation between clusters (shared causes would make the maximum smaller).
* Failures. Each cluster fails as a Poisson process with mean time between failures ``mtbf_hours``; any single
  failure interrupts the job, so the job MTBF is M = mtbf / N.
* Checkpoints every X seconds of work, each taking c seconds: save = c / X; a failure loses on average half
  a segment of work plus checkpoint, rework = (X + c) / (2M); restarting costs r per failure, restart = r / M.
  Wall time = useful time * (1 + save + rework + restart); expected interruptions = wall time / M.
* Interval. Young's rule X* = sqrt(2 c M) is the exact minimiser of that total (d/dX of c/X + X/2M is zero
  there), so it is the one reported ("young"); Daly's higher-order correction only matters when c is not
  small next to M, where this first-order model is itself off.

When rework + restart reach 1, failures eat all the time (the first-order model would print a finite but
meaningless number): the result says ``progress_possible: false`` and gives no hours.
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ratrain.errors import ConfigError
from rtcommon.fileio import atomic_write_figure
from rtcommon.plotting import plt

INTERVAL_RULE = "young"                  # X* = sqrt(2 c M)
TABLE_INTERVALS_S = (300.0, 900.0, 1800.0)  # plus half, once and twice the optimum: the flat minimum
_GRID_STEP = 0.005                       # trapezoid on a smooth, fast-decaying integrand: error ~1e-13
_GRID_HALF_WIDTH = 12.0                  # n * phi(12) is negligible for any n below 1e25


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(f"{name}={value!r}: must be a finite number")
    return float(value)


def _positive(name: str, value: float) -> float:
    if _finite(name, value) <= 0:
        raise ConfigError(f"{name}={value!r}: must be positive")
    return float(value)


def _non_negative(name: str, value: float) -> float:
    if _finite(name, value) < 0:
        raise ConfigError(f"{name}={value!r}: must not be negative")
    return float(value)


def _whole(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{name}={value!r}: must be an integer >= {minimum}")
    return int(value)


@lru_cache(maxsize=1)
def _normal_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, log phi(x), log Phi(x) on a fine grid; log Phi via erfc keeps precision in both tails."""
    x = np.arange(-_GRID_HALF_WIDTH, _GRID_HALF_WIDTH + _GRID_STEP / 2, _GRID_STEP)
    log_pdf = -0.5 * x * x - 0.5 * math.log(2.0 * math.pi)
    log_cdf = np.array([math.log(0.5 * math.erfc(-v / math.sqrt(2.0))) if v < 0
                        else math.log1p(-0.5 * math.erfc(v / math.sqrt(2.0))) for v in x])
    return x, log_pdf, log_cdf


def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals] = integral of x * n * phi(x) * Phi(x)^(n-1) dx."""
    n = _whole("n", n, 1)
    x, log_pdf, log_cdf = _normal_grid()
    density = np.exp(math.log(n) + log_pdf + (n - 1) * log_cdf)
    return float(np.trapezoid(x * density, x))


def sd_max_normal(n: int) -> float:
    """Standard deviation of the max of n iid standard normals (same quadrature as ``expected_max_normal``)."""
    n = _whole("n", n, 1)
    x, log_pdf, log_cdf = _normal_grid()
    density = np.exp(math.log(n) + log_pdf + (n - 1) * log_cdf)
    mean = float(np.trapezoid(x * density, x))
    second = float(np.trapezoid(x * x * density, x))
    return math.sqrt(max(0.0, second - mean * mean))


def straggler_step(step_s: float, clusters: int, cv: float) -> float:
    """Expected synchronous step: each cluster's step ~ Normal(step_s, cv * step_s), the job waits for the max."""
    clusters = _whole("clusters", clusters, 1)
    return _positive("step_s", step_s) * (1.0 + _non_negative("compute_cv", cv) * expected_max_normal(clusters))


def job_mtbf_s(mtbf_hours: float, clusters: int) -> float:
    """Job MTBF in seconds: exponential failures per cluster, any one interrupts the job."""
    return _positive("mtbf_hours", mtbf_hours) * 3600.0 / _whole("clusters", clusters, 1)


def young_daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval sqrt(2 c M) (work seconds between checkpoints)."""
    return math.sqrt(2.0 * _non_negative("checkpoint_s", checkpoint_s) * _positive("mtbf_s", mtbf_s))


@dataclass
class Overhead:
    """Fractions of useful time spent saving, redoing lost work and restarting."""
    save: float
    rework: float
    restart: float

    @property
    def total(self) -> float:
        return self.save + self.rework + self.restart

    @property
    def progress_possible(self) -> bool:
        return self.rework + self.restart < 1.0

    def to_json(self) -> dict:
        return {"save": self.save, "rework": self.rework, "restart": self.restart, "total": self.total}


def overhead(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> Overhead:
    checkpoint_s = _non_negative("checkpoint_s", checkpoint_s)
    if checkpoint_s == 0 and interval_s == 0:
        # free checkpoints taken continuously (Young's optimum for c = 0): nothing saved, nothing redone
        restart = _non_negative("restart_s", restart_s) / _positive("mtbf_s", mtbf_s)
        return Overhead(save=0.0, rework=0.0, restart=restart)
    interval_s = _positive("interval_s", interval_s)
    if checkpoint_s >= interval_s:
        raise ConfigError(f"checkpoint_s={checkpoint_s:g} must be shorter than interval_s={interval_s:g}")
    mtbf_s = _positive("mtbf_s", mtbf_s)
    return Overhead(save=checkpoint_s / interval_s, rework=(interval_s + checkpoint_s) / (2.0 * mtbf_s),
                    restart=_non_negative("restart_s", restart_s) / mtbf_s)


@dataclass
class Reliability:
    """Failure and checkpoint inputs: give checkpoint_s, or checkpoint_bytes and write_gbps (1e9 bytes/s)."""
    mtbf_hours: float                    # one cluster's mean time between failures
    checkpoint_s: float | None = None
    checkpoint_bytes: float | None = None
    write_gbps: float | None = None
    restart_s: float = 0.0
    compute_cv: float = 0.0              # per-step coefficient of variation of one cluster's step time

    def save_seconds(self) -> float:
        if self.checkpoint_s is not None:
            if self.checkpoint_bytes is not None or self.write_gbps is not None:
                raise ConfigError("checkpoint_s: give either checkpoint_s or checkpoint_bytes + write_gbps, not both")
            return _non_negative("checkpoint_s", self.checkpoint_s)
        if self.checkpoint_bytes is None or self.write_gbps is None:
            raise ConfigError("checkpoint_s: missing (or give both checkpoint_bytes and write_gbps)")
        return _non_negative("checkpoint_bytes", self.checkpoint_bytes) / (_positive("write_gbps", self.write_gbps)
                                                                            * 1e9)

    def validate(self) -> None:
        _positive("mtbf_hours", self.mtbf_hours)
        _non_negative("restart_s", self.restart_s)
        _non_negative("compute_cv", self.compute_cv)
        self.save_seconds()


@dataclass
class TimeToTrain:
    step_s: float
    straggler_step_s: float
    steps: int
    clusters: int
    tokens_per_step: float | None
    reliability: Reliability
    checkpoint_s: float
    job_mtbf_s: float
    optimal_interval_s: float
    interval_s: float
    overhead: Overhead
    useful_s: float
    interval_table: list[dict] = field(default_factory=list)

    @property
    def progress_possible(self) -> bool:
        return self.overhead.progress_possible

    @property
    def wall_s(self) -> float | None:
        return self.useful_s * (1.0 + self.overhead.total) if self.progress_possible else None

    def to_json(self) -> dict:
        wall = self.wall_s
        tokens_per_s = (self.tokens_per_step * self.steps / wall
                        if wall is not None and self.tokens_per_step is not None else None)
        return {
            "step_s": self.step_s,
            "straggler_step_s": self.straggler_step_s,
            "straggler_factor": self.straggler_step_s / self.step_s,
            "steps": self.steps,
            "clusters": self.clusters,
            "tokens_per_step": self.tokens_per_step,
            "mtbf_hours_per_cluster": self.reliability.mtbf_hours,
            "job_mtbf_s": self.job_mtbf_s,
            "checkpoint_s": self.checkpoint_s,
            "restart_s": self.reliability.restart_s,
            "compute_cv": self.reliability.compute_cv,
            "interval_rule": INTERVAL_RULE,
            "optimal_interval_s": self.optimal_interval_s,
            "interval_s": self.interval_s,
            "overhead": self.overhead.to_json(),
            "progress_possible": self.progress_possible,
            "useful_hours": self.useful_s / 3600.0,
            "hours": None if wall is None else wall / 3600.0,
            "expected_interruptions": None if wall is None else wall / self.job_mtbf_s,
            "tokens_per_s": tokens_per_s,
            "interval_table": self.interval_table,
        }


def _table_row(interval_s: float, useful_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> dict:
    terms = overhead(interval_s, checkpoint_s, restart_s, mtbf_s)
    hours = useful_s * (1.0 + terms.total) / 3600.0 if terms.progress_possible else None
    return {"interval_s": interval_s, "overhead": terms.to_json(), "hours": hours}


def time_to_train(step_s: float, steps: int, clusters: int, tokens_per_step: float | None,
                  reliability: Reliability, interval_s: float | None = None) -> TimeToTrain:
    """Wall-clock estimate of ``steps`` synchronous steps on ``clusters`` clusters; interval_s None = optimum."""
    steps = _whole("steps", steps, 1)
    clusters = _whole("clusters", clusters, 1)
    if tokens_per_step is not None:
        _positive("tokens_per_step", tokens_per_step)
    reliability.validate()
    checkpoint_s = reliability.save_seconds()
    mtbf_s = job_mtbf_s(reliability.mtbf_hours, clusters)
    optimal = young_daly_interval(checkpoint_s, mtbf_s)
    if interval_s is None:
        # c >= 2M: a checkpoint outlasts the expected time between failures (c = 0: optimum 0, fine)
        if checkpoint_s > 0 and checkpoint_s >= optimal:
            raise ConfigError(f"checkpoint_s={checkpoint_s:g} is at least twice the job MTBF ({mtbf_s:g} s over "
                              f"{clusters} clusters): no checkpoint interval lets the job make progress")
        interval_s = optimal
    terms = overhead(interval_s, checkpoint_s, reliability.restart_s, mtbf_s)
    slow_step = straggler_step(step_s, clusters, reliability.compute_cv)
    useful_s = slow_step * steps
    table = [_table_row(x, useful_s, checkpoint_s, reliability.restart_s, mtbf_s)
             for x in sorted({*TABLE_INTERVALS_S, optimal / 2, optimal, 2 * optimal, float(interval_s)})
             if x > checkpoint_s]
    return TimeToTrain(step_s=float(step_s), straggler_step_s=slow_step, steps=steps, clusters=clusters,
                       tokens_per_step=None if tokens_per_step is None else float(tokens_per_step),
                       reliability=reliability, checkpoint_s=checkpoint_s, job_mtbf_s=mtbf_s,
                       optimal_interval_s=optimal, interval_s=float(interval_s), overhead=terms,
                       useful_s=useful_s, interval_table=table)


def plot_time_to_train_vs_clusters(rows: list[tuple[int, float]], path: str | os.PathLike) -> None:
    """Line plot of wall-clock hours against cluster count (log2 x axis), written atomically as PNG."""
    if not rows:
        raise ConfigError("plot rows: no (clusters, hours) points to plot")
    clusters = [c for c, _ in rows]
    hours = [h for _, h in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(clusters, hours, marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("clusters")
    ax.set_ylabel("time to train (hours)")
    ax.set_title("Time to train at a fixed step: failures, checkpoints, stragglers")
    ax.grid(True, alpha=0.3)
    atomic_write_figure(path, fig, dpi=120, bbox_inches="tight")


def sweep_clusters(step_s: float, steps: int, tokens_per_step: float | None, reliability: Reliability,
                   cluster_counts: list[int], interval_s: float | None = None) -> list[dict]:
    """Time to train at each cluster count with the step fixed: only the job MTBF and stragglers change.

    A count where no interval lets the job progress gets ``hours: None`` instead of an error.
    """
    reliability.validate()
    checkpoint_s = reliability.save_seconds()
    rows = []
    for clusters in cluster_counts:
        if interval_s is None and checkpoint_s >= young_daly_interval(checkpoint_s,
                                                                      job_mtbf_s(reliability.mtbf_hours, clusters)):
            rows.append({"clusters": clusters, "interval_s": None, "hours": None})
            continue
        result = time_to_train(step_s, steps, clusters, tokens_per_step, reliability, interval_s).to_json()
        rows.append({"clusters": clusters, "interval_s": result["interval_s"], "hours": result["hours"]})
    return rows

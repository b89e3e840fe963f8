"""Checkpoints on the critical path: synchronous and asynchronous saves, and the interval that costs least.

Extends the first-order failure model of ``ratrain.plan.time_to_train`` (job MTBF M, work X
between checkpoints, restart r per failure; every term a share of useful time):

* Synchronous save: training pauses c per checkpoint: save c / X, rework (X + c) / (2M), restart
  r / M (``time_to_train.overhead``; Young's X* = sqrt(2 c M) minimises it).
* Asynchronous save: a short pause p (the snapshot into host memory), then a background write of
  w seconds that shares the link or storage path with training, slowing training by the share s
  while it runs; the snapshot counts for recovery only once the write has committed. A failure u
  seconds after the snapshot loses u when u >= w, and X + u when u < w (the previous committed
  checkpoint is the last good one). With u uniform over the interval (w <= X) the expected loss is
  (1 / X) [ integral_0^w (X + u) du + integral_w^X u du ] = X / 2 + w, so

      save = (p + s w) / X,   rework = (X / 2 + w) / M,   restart = r / M,

  minimised at X* = sqrt(2 M (p + s w)).
* Beside the first-order total, the exact expected wall time of a segment under exponential
  failures (Daly's model: a failure restarts the segment after r): E[segment] = M e^(r/M)
  (e^((X + c)/M) - 1), so the share is E / X - 1. Its minimum, found numerically, is the interval
  "that minimises it"; Young's sqrt(2 c M) and Daly's higher-order estimate
  sqrt(2 c M) (1 + sqrt(c / 2M) / 3 + c / 18M) - c (for c < 2M; M otherwise) sit beside it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ratrain.errors import ConfigError
from ratrain.plan.time_to_train import Overhead, overhead, young_daly_interval

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def _check(name: str, value: float, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise ConfigError(f"{name}={value!r}: must be a {'positive' if positive else 'non-negative'} finite number")
    return float(value)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum: sqrt(2cM)(1 + sqrt(c/2M)/3 + c/(18M)) - c for c < 2M, else M."""
    c, m = _check("checkpoint_s", checkpoint_s), _check("mtbf_s", mtbf_s, positive=True)
    if c >= 2.0 * m:
        return m
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c


def exact_overhead_share(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """E[wall time of one segment] / X - 1 under exponential failures (module docstring)."""
    x = _check("interval_s", interval_s, positive=True)
    c, r = _check("checkpoint_s", checkpoint_s), _check("restart_s", restart_s)
    m = _check("mtbf_s", mtbf_s, positive=True)
    return m * math.exp(r / m) * math.expm1((x + c) / m) / x - 1.0


def exact_optimal_interval(checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """The interval minimising ``exact_overhead_share`` (golden-section search on log X; the share is
    unimodal in X: it falls as c/X and rises as e^(X/M)/X)."""
    c, m = _check("checkpoint_s", checkpoint_s), _check("mtbf_s", mtbf_s, positive=True)
    lo, hi = math.log(max(1e-6, 1e-3 * max(c, 1e-3))), math.log(50.0 * m)

    def share(log_x: float) -> float:
        return exact_overhead_share(math.exp(log_x), c, restart_s, m)

    a, b = lo + (1 - _GOLDEN) * (hi - lo), lo + _GOLDEN * (hi - lo)
    fa, fb = share(a), share(b)
    for _ in range(200):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = lo + (1 - _GOLDEN) * (hi - lo)
            fa = share(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + _GOLDEN * (hi - lo)
            fb = share(b)
        if hi - lo < 1e-12:
            break
    return math.exp((lo + hi) / 2.0)


@dataclass(frozen=True)
class AsyncSave:
    """An asynchronous checkpoint: pause, background write and the training slowdown while it writes."""
    pause_s: float              # foreground snapshot (training stopped)
    write_s: float              # background write until the checkpoint is committed
    slowdown_share: float = 0.0  # share of training speed lost while the write shares the link/storage

    def __post_init__(self) -> None:
        _check("async pause_s", self.pause_s)
        _check("async write_s", self.write_s)
        s = _check("async slowdown_share", self.slowdown_share)
        if s > 1.0:
            raise ConfigError(f"async slowdown_share={s!r}: must be at most 1 (the whole training speed)")

    @property
    def cost_s(self) -> float:
        """Training time one save costs: the pause plus the slowed share of the write."""
        return self.pause_s + self.slowdown_share * self.write_s


def async_lost_work_s(interval_s: float, write_s: float, failure_after_s: float) -> float:
    """Work lost by a failure ``failure_after_s`` after the latest snapshot: only the committed one counts."""
    x, w, u = (_check("interval_s", interval_s, positive=True), _check("write_s", write_s),
               _check("failure_after_s", failure_after_s))
    if u > x:
        raise ConfigError(f"failure_after_s={u:g} is beyond the interval {x:g} (the next snapshot was taken)")
    return x + u if u < w else u


def async_overhead(interval_s: float, save: AsyncSave, restart_s: float, mtbf_s: float) -> Overhead:
    """First-order shares of an asynchronous save every ``interval_s`` of work (module docstring)."""
    x = _check("interval_s", interval_s, positive=True)
    if save.write_s > x:
        raise ConfigError(f"async write_s={save.write_s:g} is longer than the interval {x:g}: a save would "
                          f"start before the previous one committed")
    m = _check("mtbf_s", mtbf_s, positive=True)
    return Overhead(save=save.cost_s / x, rework=(x / 2.0 + save.write_s) / m,
                    restart=_check("restart_s", restart_s) / m)


def async_optimal_interval(save: AsyncSave, mtbf_s: float) -> float:
    """sqrt(2 M (p + s w)), not below the write itself (a save must commit before the next)."""
    return max(math.sqrt(2.0 * _check("mtbf_s", mtbf_s, positive=True) * save.cost_s), save.write_s)


def interval_table(checkpoint_s: float, restart_s: float, mtbf_s: float, async_save: AsyncSave | None = None,
                   intervals: list[float] | None = None, chosen_s: float | None = None) -> dict:
    """The save/redo/restart share per interval (sync first-order and exact, async first-order) and the
    intervals that minimise them, beside Young's and Daly's (and the interval chosen, if one was)."""
    c, r, m = _check("checkpoint_s", checkpoint_s), _check("restart_s", restart_s), _check("mtbf_s", mtbf_s, True)
    young = young_daly_interval(c, m)
    daly = daly_interval(c, m)
    best = exact_optimal_interval(c, r, m) if c > 0 else None
    marks = [x for x in (young, daly, best) if x]
    if async_save is not None:
        marks.append(async_optimal_interval(async_save, m))
    if chosen_s is not None:
        marks.append(_check("chosen interval_s", chosen_s, positive=True))
    if intervals is None:
        centre = young if young > 0 else (marks[-1] if marks else 600.0)
        intervals = []
        for x in sorted([centre * 2.0 ** (k / 2) for k in range(-4, 5)] + marks):
            if not intervals or x > intervals[-1] * (1.0 + 1e-3):     # one row per distinct interval
                intervals.append(x)
    rows = []
    for x in intervals:
        row: dict = {"interval_s": x}
        if c < x:
            row["sync"] = overhead(x, c, r, m).to_json()
            row["sync_exact_total"] = exact_overhead_share(x, c, r, m)
        else:
            row["sync"] = row["sync_exact_total"] = None
        if async_save is not None:
            row["async"] = async_overhead(x, async_save, r, m).to_json() if async_save.write_s <= x else None
        rows.append(row)
    out = {"mtbf_s": m, "checkpoint_s": c, "restart_s": r, "young_s": young, "daly_s": daly,
           "exact_optimum_s": best, "rows": rows}
    if async_save is not None:
        out["async"] = {"pause_s": async_save.pause_s, "write_s": async_save.write_s,
                        "slowdown_share": async_save.slowdown_share,
                        "optimum_s": async_optimal_interval(async_save, m)}
    return out


__all__ = ["AsyncSave", "async_lost_work_s", "async_optimal_interval", "async_overhead", "daly_interval",
           "exact_optimal_interval", "exact_overhead_share", "interval_table"]

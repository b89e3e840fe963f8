"""Fitting a GPU platform's kernel constants on measured runs: `ratrain validate fit-gpu`.

What is fitted, and how (docs/VALIDATION.md gives the values and the errors they leave):

- the collective model (``collectives.launch_s``, ``step_latency_s``, ``intra_bus_efficiency``):
  one weighted linear least-squares solve on the measured all-reduce times
  (``ratrain.cost.collectives.fit_allreduce``);
- the kernel model (``kernels.gemm_efficiency``, ``hbm_efficiency``, ``launch_s``,
  ``step_overhead_s``): the mean absolute relative error of the simulated iterations over the fit
  rows, minimised by a deterministic coordinate search (each constant in turn tried at a factor
  above and below its value, the factor halved when no move helps), from the platform's values.

The fit rows are a subset of the runs (by default those on 2 and 4 GPUs); the rest are held out
and reported apart, so the error on runs the fit did not see is stated beside the fit's own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ratrain.cost.collectives import fit_allreduce
from ratrain.errors import ConfigError
from ratrain.repro.measured import MeasuredRun, validate
from ratrain.spec.gpu import GpuPlatform
from rtcommon.progress import Progress

KERNEL_CONSTANTS = ("kernels.gemm_efficiency", "kernels.hbm_efficiency", "kernels.launch_s",
                    "kernels.step_overhead_s")
# bounds the search keeps each constant in (the platform file's ranges may be wider)
BOUNDS = {"kernels.gemm_efficiency": (0.05, 1.0), "kernels.hbm_efficiency": (0.05, 1.0),
          "kernels.launch_s": (1e-7, 1e-3), "kernels.step_overhead_s": (0.0, 1.0)}


@dataclass
class GpuFit:
    constants: dict
    fit_rows: int
    held_out_rows: int
    fit_error: dict
    held_out_error: dict
    allreduce: dict
    evaluations: int

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _get(platform: GpuPlatform, dotted: str) -> float:
    table, name = dotted.split(".")
    return float(getattr(getattr(platform, table), name))


def _objective(platform: GpuPlatform, runs: list[MeasuredRun]) -> float:
    return validate(runs, platform).summary["mean_abs_error"]


def fit_kernel_constants(platform: GpuPlatform, runs: list[MeasuredRun], *, rounds: int = 6,
                         progress: bool | None = None) -> tuple[GpuPlatform, int]:
    """Coordinate search over KERNEL_CONSTANTS minimising the mean |error| on ``runs``."""
    say = Progress(bool(progress))
    best = _objective(platform, runs)
    evals, step = 1, 1.5
    for r in range(rounds):
        moved = False
        for name in KERNEL_CONSTANTS:
            lo, hi = BOUNDS[name]
            value = _get(platform, name)
            candidates = [value * step, value / step] if value > 0 else [1e-3, 1e-2]
            for cand in candidates:
                cand = min(max(cand, lo), hi)
                if cand == value:
                    continue
                trial = platform.with_overrides(**{name: cand})
                err = _objective(trial, runs)
                evals += 1
                if err < best - 1e-12:
                    best, platform, moved = err, trial, True
                    value = cand
        say(f"fit round {r + 1}: mean |error| {100 * best:.2f} % after {evals} simulations of the fit rows")
        if not moved:
            step = math.sqrt(step)
    return platform, evals


def fit_gpu_platform(platform: GpuPlatform, runs: list[MeasuredRun], allreduce: list[tuple[int, float, float]],
                     *, fit_gpus: tuple[int, ...] = (2, 4), rounds: int = 6,
                     progress: bool | None = None) -> tuple[GpuPlatform, GpuFit]:
    """Fit the collectives on ``allreduce``, then the kernel constants on the runs on ``fit_gpus``."""
    ar = fit_allreduce(allreduce, platform.node.intra_bandwidth)
    platform = platform.with_overrides(**{"collectives.launch_s": ar.launch_s,
                                          "collectives.step_latency_s": ar.step_latency_s,
                                          "collectives.intra_bus_efficiency": ar.intra_bus_efficiency})
    fit_rows = [r for r in runs if r.gpus in fit_gpus]
    held = [r for r in runs if r.gpus not in fit_gpus]
    if not fit_rows:
        raise ConfigError(f"no runs on {fit_gpus} GPUs to fit on")
    platform, evals = fit_kernel_constants(platform, fit_rows, rounds=rounds, progress=progress)

    def errors(rows):
        if not rows:
            return {}
        s = validate(rows, platform).summary
        return {"runs": s["runs"], "mean_abs_error": s["mean_abs_error"], "max_abs_error": s["max_abs_error"],
                "mean_group_tau": s["mean_group_tau"]}

    constants = {name: _get(platform, name) for name in KERNEL_CONSTANTS}
    constants.update({"collectives.launch_s": ar.launch_s, "collectives.step_latency_s": ar.step_latency_s,
                      "collectives.intra_bus_efficiency": ar.intra_bus_efficiency})
    return platform, GpuFit(constants, len(fit_rows), len(held), errors(fit_rows), errors(held), ar.to_json(), evals)


__all__ = ["BOUNDS", "KERNEL_CONSTANTS", "GpuFit", "fit_gpu_platform", "fit_kernel_constants"]

"""Fitting a GPU platform's kernel constants on measured runs: `ratrain validate fit-gpu`.

What is fitted, and how (docs/VALIDATION.md gives the values and the errors they leave):

- the collective model (``collectives.launch_s``, ``step_latency_s``, ``intra_bus_efficiency``,
  ``byte_s``):
  one weighted linear least-squares solve on the measured all-reduce times
  (``ratrain.cost.collectives.fit_allreduce``);
- the kernel model (``kernels.gemm_efficiency``, ``hbm_efficiency``, ``launch_s``,
  ``step_overhead_s``, ``p2p_host_s``): the mean absolute relative error of the simulated iterations over the fit
  rows, minimised by a deterministic Nelder-Mead search over their logarithms, from the
  platform's values.

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
                    "kernels.step_overhead_s", "kernels.p2p_host_s")
# bounds the search keeps each constant in (the platform file's ranges may be wider)
BOUNDS = {"kernels.gemm_efficiency": (0.05, 1.0), "kernels.hbm_efficiency": (0.05, 1.0),
          "kernels.launch_s": (1e-7, 1e-3), "kernels.step_overhead_s": (0.0, 1.0),
          "kernels.p2p_host_s": (0.0, 0.01)}


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


def _clip(name: str, value: float) -> float:
    lo, hi = BOUNDS[name]
    return min(max(value, lo), hi)


def fit_kernel_constants(platform: GpuPlatform, runs: list[MeasuredRun], *, evaluations: int = 120,
                         progress: bool | None = None) -> tuple[GpuPlatform, int]:
    """Nelder-Mead over the logarithms of KERNEL_CONSTANTS (each clipped to BOUNDS), minimising the
    mean |error| on ``runs``: deterministic (fixed start simplex, fixed coefficients), no gradients
    (the error is piecewise smooth: waves and host floors switch)."""
    say = Progress(bool(progress))
    names = KERNEL_CONSTANTS
    start = [math.log(max(_get(platform, n), 1e-6)) for n in names]

    def build(x: list[float]) -> GpuPlatform:
        return platform.with_overrides(**{n: _clip(n, math.exp(v)) for n, v in zip(names, x, strict=True)})

    cache: dict[tuple, float] = {}

    def f(x: list[float]) -> float:
        key = tuple(round(v, 12) for v in x)
        if key not in cache:
            cache[key] = _objective(build(x), runs)
        return cache[key]

    simplex = [start] + [[v + (0.3 if i == j else 0.0) for j, v in enumerate(start)] for i in range(len(names))]
    values = [f(x) for x in simplex]
    while len(cache) < evaluations:
        order = sorted(range(len(simplex)), key=lambda i: values[i])
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        best, worst = simplex[0], simplex[-1]
        centre = [sum(x[j] for x in simplex[:-1]) / (len(simplex) - 1) for j in range(len(names))]
        reflect = [c + (c - w) for c, w in zip(centre, worst, strict=True)]
        fr = f(reflect)
        if fr < values[0]:
            expand = [c + 2 * (c - w) for c, w in zip(centre, worst, strict=True)]
            fe = f(expand)
            simplex[-1], values[-1] = (expand, fe) if fe < fr else (reflect, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflect, fr
        else:
            contract = [c + 0.5 * (w - c) for c, w in zip(centre, worst, strict=True)]
            fc = f(contract)
            if fc < values[-1]:
                simplex[-1], values[-1] = contract, fc
            else:
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, xs, strict=True)] for xs in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
        if len(cache) % 20 < 2:
            say(f"fit: mean |error| {100 * min(values):.2f} % after {len(cache)} simulations of the fit rows")
        if max(values) - min(values) < 1e-5:
            break
    i = min(range(len(simplex)), key=lambda k: values[k])
    return build(simplex[i]), len(cache)


def fit_gpu_platform(platform: GpuPlatform, runs: list[MeasuredRun], allreduce: list[tuple[int, float, float]],
                     *, fit_gpus: tuple[int, ...] = (2, 4), evaluations: int = 120,
                     progress: bool | None = None) -> tuple[GpuPlatform, GpuFit]:
    """Fit the collectives on ``allreduce``, then the kernel constants on the runs on ``fit_gpus``."""
    ar = fit_allreduce(allreduce, platform.node.intra_bandwidth)
    platform = platform.with_overrides(**{"collectives.launch_s": ar.launch_s,
                                          "collectives.step_latency_s": ar.step_latency_s,
                                          "collectives.intra_bus_efficiency": ar.intra_bus_efficiency,
                                          "collectives.byte_s": ar.byte_s})
    fit_rows = [r for r in runs if r.gpus in fit_gpus]
    held = [r for r in runs if r.gpus not in fit_gpus]
    if not fit_rows:
        raise ConfigError(f"no runs on {fit_gpus} GPUs to fit on")
    platform, evals = fit_kernel_constants(platform, fit_rows, evaluations=evaluations, progress=progress)

    def errors(rows):
        if not rows:
            return {}
        s = validate(rows, platform).summary
        return {"runs": s["runs"], "mean_abs_error": s["mean_abs_error"], "max_abs_error": s["max_abs_error"],
                "mean_group_tau": s["mean_group_tau"]}

    constants = {name: _get(platform, name) for name in KERNEL_CONSTANTS}
    constants.update({"collectives.launch_s": ar.launch_s, "collectives.step_latency_s": ar.step_latency_s,
                      "collectives.intra_bus_efficiency": ar.intra_bus_efficiency,
                      "collectives.byte_s": ar.byte_s})
    return platform, GpuFit(constants, len(fit_rows), len(held), errors(fit_rows), errors(held), ar.to_json(), evals)


__all__ = ["BOUNDS", "KERNEL_CONSTANTS", "GpuFit", "fit_gpu_platform", "fit_kernel_constants"]

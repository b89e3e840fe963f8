"""Fitting a GPU platform's kernel constants on measured runs: `ratrain validate fit-gpu`.

What is fitted, and how (docs/VALIDATION.md gives the values and the errors they leave):

- the collective model (``collectives.launch_s``, ``step_latency_s``, ``intra_bus_efficiency``,
  ``byte_s``):
  one weighted linear least-squares solve on the measured all-reduce times
  (``ratrain.cost.collectives.fit_allreduce``);
- the kernel model (``kernels.gemm_efficiency``, ``hbm_efficiency``, ``launch_s``,
  ``step_overhead_s``, ``p2p_host_s``): the mean absolute relative error of the simulated iterations over the fit
  rows, minimised by a deterministic Nelder-Mead search over their logarithms, from
  :data:`FIT_START` (round a-priori values, the same for every fit, so that no fit starts from
  constants fitted on rows it is meant not to see).

The fit rows are the runs on ``fit_gpus`` GPUs (by default every run); the rest are held out and
reported apart. :func:`cross_validate` states what the fit does on runs it did not see: for each
GPU count, the kernel constants fitted on the runs on the other GPU counts predict that count's
runs (leave one GPU count out); the all-reduce constants are fitted on the nccl-tests curves,
which are not iteration times, and are the same in every fold.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ratrain.cost.collectives import fit_allreduce
from ratrain.errors import ConfigError
from ratrain.repro.measured import MeasuredRun, compare, predict, validate
from ratrain.spec.gpu import GpuPlatform
from rtcommon.progress import Progress

KERNEL_CONSTANTS = ("kernels.gemm_efficiency", "kernels.hbm_efficiency", "kernels.launch_s",
                    "kernels.step_overhead_s", "kernels.p2p_host_s")
# bounds the search keeps each constant in (the platform file's ranges may be wider)
BOUNDS = {"kernels.gemm_efficiency": (0.05, 1.0), "kernels.hbm_efficiency": (0.05, 1.0),
          "kernels.launch_s": (1e-7, 1e-3), "kernels.step_overhead_s": (0.0, 1.0),
          "kernels.p2p_host_s": (0.0, 0.01)}
# where every search starts: round a-priori values, not fitted (a large GEMM at 85 % of peak, elementwise
# kernels at 90 % of HBM bandwidth, 50 us of host time per kernel, 1 ms per iteration and per pipeline
# send or receive)
FIT_START = {"kernels.gemm_efficiency": 0.85, "kernels.hbm_efficiency": 0.9, "kernels.launch_s": 5e-5,
             "kernels.step_overhead_s": 1e-3, "kernels.p2p_host_s": 1e-3}
EVALUATIONS = 160


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
    """Mean |error| of the simulated iterations (``validate``'s, without its memory and ranking measures)."""
    return sum(abs(predict(r, platform).iteration_ms / r.measured_ms - 1.0) for r in runs) / len(runs)


def _clip(name: str, value: float) -> float:
    lo, hi = BOUNDS[name]
    return min(max(value, lo), hi)


def fit_kernel_constants(platform: GpuPlatform, runs: list[MeasuredRun], *, evaluations: int = EVALUATIONS,
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


def _with_allreduce_fit(platform: GpuPlatform, allreduce: list[tuple[int, float, float]]):
    ar = fit_allreduce(allreduce, platform.node.intra_bandwidth)
    return platform.with_overrides(**{"collectives.launch_s": ar.launch_s,
                                      "collectives.step_latency_s": ar.step_latency_s,
                                      "collectives.intra_bus_efficiency": ar.intra_bus_efficiency,
                                      "collectives.byte_s": ar.byte_s}), ar


def fit_gpu_platform(platform: GpuPlatform, runs: list[MeasuredRun], allreduce: list[tuple[int, float, float]],
                     *, fit_gpus: tuple[int, ...] | None = None, evaluations: int = EVALUATIONS,
                     progress: bool | None = None) -> tuple[GpuPlatform, GpuFit]:
    """Fit the collectives on ``allreduce``, then the kernel constants (from :data:`FIT_START`) on the
    runs on ``fit_gpus`` GPUs (None: every run)."""
    platform, ar = _with_allreduce_fit(platform, allreduce)
    platform = platform.with_overrides(**FIT_START)
    if fit_gpus is None:
        fit_gpus = tuple(sorted({r.gpus for r in runs}))
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


@dataclass
class CrossValidation:
    """Leave one GPU count out: per fold the constants fitted without it and the error on it."""
    folds: list[dict]        # {"held_out_gpus", "fit_rows", "constants", "error"} per GPU count
    error: dict              # over every run, each predicted by the fold that did not see it

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _summary(rows: list[dict], name: str) -> dict:
    s = compare(rows, name).summary
    return {key: s[key] for key in ("runs", "mean_abs_error", "max_abs_error", "mean_group_tau", "min_group_tau",
                                    "mean_top1_regret_pct", "max_top1_regret_pct")}


def cross_validate(platform: GpuPlatform, runs: list[MeasuredRun], allreduce: list[tuple[int, float, float]], *,
                   evaluations: int = EVALUATIONS, progress: bool | None = None) -> CrossValidation:
    """For each GPU count g of ``runs``: the kernel constants fitted (as :func:`fit_gpu_platform` fits
    them, from :data:`FIT_START`) on the runs on the other GPU counts, and their error on the runs
    on g GPUs; then the error over all runs so predicted."""
    counts = sorted({r.gpus for r in runs})
    if len(counts) < 2:
        raise ConfigError(f"cross-validation needs runs on at least two GPU counts, got {counts}")
    folds, predicted = [], []
    for g in counts:
        fitted, _ = fit_gpu_platform(platform, runs, allreduce, fit_gpus=tuple(c for c in counts if c != g),
                                     evaluations=evaluations, progress=progress)
        rows = validate([r for r in runs if r.gpus == g], fitted).runs
        predicted += rows
        folds.append({"held_out_gpus": g, "fit_rows": sum(r.gpus != g for r in runs),
                      "constants": {name: _get(fitted, name) for name in KERNEL_CONSTANTS},
                      "error": _summary(rows, fitted.name)})
    predicted.sort(key=lambda r: r["row"])
    return CrossValidation(folds, _summary(predicted, platform.name))


__all__ = ["BOUNDS", "EVALUATIONS", "FIT_START", "KERNEL_CONSTANTS", "CrossValidation", "GpuFit", "cross_validate",
           "fit_gpu_platform", "fit_kernel_constants"]

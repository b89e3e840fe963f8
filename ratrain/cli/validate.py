"""`ratrain validate`: the simulator against measured runs, and the fit of a GPU platform's constants."""
from __future__ import annotations

import argparse
from pathlib import Path

from ratrain.cli.args import any_platform_from_args
from ratrain.cli.defaults import FIT_EVALUATIONS, GPU_ACTIVATION_MODES
from ratrain.errors import ConfigError
from ratrain.spec.gpu import GpuPlatform


def register(subparsers) -> None:
    p = subparsers.add_parser("validate", help="the simulator against measured training runs of a GPU cluster")
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("measured", help="simulate every row of a runs CSV and compare with its measured time")
    m.add_argument("runs", metavar="RUNS.csv", help="measured runs (the calibration file's columns)")
    _common(m)
    m.add_argument("--activation", choices=GPU_ACTIVATION_MODES, default="ckpt",
                   help="activation mode of the runs (default ckpt: each layer recomputed from its input)")
    m.add_argument("--sequence-parallel", action="store_true", help="the runs used sequence parallelism")
    m.add_argument("--plot", metavar="FILE", help="PNG of predicted against measured (log-log, y = x, +-10 %%)")
    m.add_argument("--rows", type=int, default=20, help="worst rows to list in the text output")
    m.set_defaults(handler=run_measured)
    f = sub.add_parser("fit-gpu", help="fit a GPU platform's collective and kernel constants on measured data")
    f.add_argument("runs", metavar="RUNS.csv", help="measured runs (the calibration file's columns)")
    f.add_argument("--allreduce", metavar="DIR", required=True,
                   help="folder of nccl-tests all-reduce CSVs named allreduce-<N>gpu.csv")
    f.add_argument("--fit-gpus", type=int, nargs="+", default=None,
                   help="GPU counts whose runs are fitted on; the others are held out (default: every run)")
    f.add_argument("--cross-validate", action="store_true",
                   help="also fit once per GPU count on the other counts' runs and predict its runs")
    f.add_argument("--evaluations", type=int, default=FIT_EVALUATIONS,
                   help="simulations of the fit rows each search may spend")
    _common(f)
    f.set_defaults(handler=run_fit)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--platform", metavar="FILE", required=True, help="GPU-cluster platform file (.toml or .json)")
    p.add_argument("--json", action="store_true", help="print the JSON payload")


def _gpu_platform(args: argparse.Namespace) -> GpuPlatform:
    platform = any_platform_from_args(args)
    if not isinstance(platform, GpuPlatform):
        raise ConfigError(f"{args.platform} is an MT-3000 platform; ratrain validate needs a GPU-cluster platform "
                          "(kind = \"gpu-cluster\")")
    return platform


def run_measured(args: argparse.Namespace) -> tuple[dict, str]:
    from ratrain.repro.measured import format_validation, plot_validation, read_runs, validate
    platform = _gpu_platform(args)
    runs = read_runs(args.runs)
    result = validate(runs, platform, activation=args.activation, sequence_parallel=args.sequence_parallel,
                      progress=not args.json)
    if args.plot:
        plot_validation(result, Path(args.plot))
    payload = result.to_json()
    payload["plot"] = args.plot
    return payload, format_validation(result, args.rows) + (f"\nplot: {args.plot}" if args.plot else "")


def run_fit(args: argparse.Namespace) -> tuple[dict, str]:
    from ratrain.repro.gpu_fit import cross_validate, fit_gpu_platform
    from ratrain.repro.measured import read_allreduce, read_runs
    platform = _gpu_platform(args)
    runs = read_runs(args.runs)
    samples = read_allreduce(args.allreduce)
    fit_gpus = tuple(args.fit_gpus) if args.fit_gpus else None
    fitted, fit = fit_gpu_platform(platform, runs, samples, fit_gpus=fit_gpus, evaluations=args.evaluations,
                                   progress=not args.json)
    payload = {"fit": fit.to_json(), "platform": fitted.to_json(), "cross_validation": None}
    counts = fit_gpus or sorted({r.gpus for r in runs})
    lines = [f"fitted on {fit.fit_rows} runs ({', '.join(map(str, counts))} GPUs), "
             f"{fit.held_out_rows} held out; {fit.evaluations} evaluations"]
    for name, value in fit.constants.items():
        lines.append(f"  {name:<36} {value:.6g}")
    for label, err in (("fit rows", fit.fit_error), ("held-out rows", fit.held_out_error)):
        if err:
            lines.append(f"{label}: mean |error| {100 * err['mean_abs_error']:.2f} %, "
                         f"max {100 * err['max_abs_error']:.2f} %")
    ar = fit.allreduce
    lines.append(f"all-reduce fit: {ar['rows']} measurements, mean |error| {100 * ar['mean_abs_error']:.2f} %, "
                 f"max {100 * ar['max_abs_error']:.2f} %")
    if args.cross_validate:
        cv = cross_validate(platform, runs, samples, evaluations=args.evaluations, progress=not args.json)
        payload["cross_validation"] = cv.to_json()
        for fold in cv.folds:
            e = fold["error"]
            lines.append(f"{fold['held_out_gpus']} GPUs predicted by the fit on the others: mean |error| "
                         f"{100 * e['mean_abs_error']:.2f} %, max {100 * e['max_abs_error']:.2f} %")
        lines.append(f"cross-validated, all runs: mean |error| {100 * cv.error['mean_abs_error']:.2f} %, "
                     f"max {100 * cv.error['max_abs_error']:.2f} %")
    return payload, "\n".join(lines)

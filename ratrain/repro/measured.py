"""The simulator against measured training runs: `ratrain validate measured RUNS.csv`.

Each row of a runs file is one measured Megatron iteration (the columns of the calibration set,
``../shared/measured/a100-single-node-runs.csv``: GPUs, global batch, micro batch, hidden size,
attention heads, layers, sequence length, tensor / data / pipeline parallelism, iteration time in
ms). Every row becomes Megatron's GPT (``ratrain.spec.models.gpt_model``, vocabulary padded for
its T) and a layout (P, D, T, b, A = global batch / (b * D)), is costed on the GPU platform
(``ratrain.cost.megatron``) and simulated (``ratrain.sim.megatron_step``), and is compared with
its measurement:

- per row: predicted and measured ms and the relative error;
- over all rows: mean and max absolute relative error;
- per group of the same model and GPU count: mean and max error and the Kendall tau-b of the
  predicted against the measured times;
- per group of the same model, GPU count and global batch (the same work, so the layouts
  compete): the Kendall tau and the top-1 regret, how much slower (measured) the predicted-fastest
  layout is than the measured-fastest.
"""
from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ratrain.cost.megatron import megatron_step
from ratrain.errors import ConfigError
from ratrain.repro.experiment import Check, Experiment
from ratrain.repro.figures import plt, save_figure
from ratrain.repro.ranking import kendall_tau_b
from ratrain.sim.megatron_step import MegatronResult, simulate_megatron
from ratrain.spec.gpu import GpuPlatform
from ratrain.spec.memory import MemoryConstants, stage_memory
from ratrain.spec.models import gpt_model
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import GIB
from ratrain.spec.platforms import load_platform
from rtcommon.progress import Progress

# the calibration file's columns, in order, and the field each one fills
COLUMNS = (("# GPUs", "gpus"), ("global batch", "global_batch"), ("micro batch", "micro_batch"),
           ("hidden size", "hidden"), ("attention heads", "heads"), ("# layers", "layers"),
           ("sequence length", "seq"), ("tensor parallelism", "tp"), ("data parallelism", "dp"),
           ("pipeline parallelism", "pp"), ("iteration time (ms)", "measured_ms"))
INT_FIELDS = tuple(f for _, f in COLUMNS if f != "measured_ms")
MAX_ROWS = 1_000_000
# a layout no real run has: refuse it rather than simulate a billion micro-batches
MAX_MICROBATCHES = 1 << 16


@dataclass(frozen=True)
class MeasuredRun:
    row: int                 # line number in the file (the header is line 1)
    gpus: int
    global_batch: int
    micro_batch: int
    hidden: int
    heads: int
    layers: int
    seq: int
    tp: int
    dp: int
    pp: int
    measured_ms: float

    @property
    def accum(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def model_label(self) -> str:
        return f"h{self.hidden}-l{self.layers}-a{self.heads}-s{self.seq}"

    def layout(self) -> str:
        return f"T{self.tp}D{self.dp}P{self.pp}b{self.micro_batch}"


def _header_key(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def read_runs(path: str | os.PathLike) -> list[MeasuredRun]:
    """Read a runs CSV; every problem is one ConfigError naming the file, the row and the field."""
    where = os.fspath(path)
    try:
        with open(where, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a UTF-8 text file") from None
    except csv.Error as exc:
        raise ConfigError(f"{where}: not a CSV file ({exc})") from None
    if not rows:
        raise ConfigError(f"{where}: empty file (expected a header: {', '.join(c for c, _ in COLUMNS)})")
    header = [_header_key(c) for c in rows[0]]
    index = {}
    for column, name in COLUMNS:
        if _header_key(column) not in header:
            raise ConfigError(f"{where}: row 1: missing column {column!r}")
        index[name] = header.index(_header_key(column))
    if len(rows) - 1 > MAX_ROWS:
        raise ConfigError(f"{where}: {len(rows) - 1} rows, more than the {MAX_ROWS} a runs file may have")
    runs = []
    for line, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < len(header):
            raise ConfigError(f"{where}: row {line}: {len(row)} fields, the header has {len(header)}")
        values: dict = {}
        for column, name in COLUMNS:
            text = row[index[name]].strip()
            try:
                value = float(text) if name == "measured_ms" else int(text)
            except ValueError:
                kind = "a number" if name == "measured_ms" else "an integer"
                raise ConfigError(f"{where}: row {line}: field {column!r} must be {kind}, got {text!r}") from None
            if name == "measured_ms":
                if not math.isfinite(value) or value <= 0:
                    raise ConfigError(f"{where}: row {line}: field {column!r} must be a finite time > 0 ms, "
                                      f"got {text!r}")
            elif not 1 <= value <= 1 << 40:
                raise ConfigError(f"{where}: row {line}: field {column!r} must be an integer in 1..2**40, got {text!r}")
            values[name] = value
        run = MeasuredRun(row=line, **values)
        _check_run(run, where)
        runs.append(run)
    if not runs:
        raise ConfigError(f"{where}: no runs after the header")
    return runs


def _check_run(run: MeasuredRun, where: str) -> None:
    at = f"{where}: row {run.row}"
    if run.tp * run.dp * run.pp != run.gpus:
        raise ConfigError(f"{at}: GPUs={run.gpus} is not tensor x data x pipeline parallelism "
                          f"= {run.tp} x {run.dp} x {run.pp}")
    if run.global_batch % (run.micro_batch * run.dp):
        raise ConfigError(f"{at}: global batch {run.global_batch} is not a multiple of micro batch x data "
                          f"parallelism = {run.micro_batch} x {run.dp}")
    if run.accum > MAX_MICROBATCHES:
        raise ConfigError(f"{at}: {run.accum} micro-batches per replica, more than {MAX_MICROBATCHES}")
    if run.heads % run.tp or run.hidden % run.heads:
        raise ConfigError(f"{at}: tensor parallelism {run.tp} must divide the {run.heads} heads, and the heads "
                          f"the hidden size {run.hidden}")
    if run.layers % run.pp:
        raise ConfigError(f"{at}: pipeline parallelism {run.pp} must divide the {run.layers} layers")


def read_allreduce(folder: str | os.PathLike) -> list[tuple[int, float, float]]:
    """(GPUs, bytes, seconds) from nccl-tests CSVs named ``allreduce-<N>gpu.csv`` (out-of-place time)."""
    where = Path(folder)
    files = sorted(where.glob("allreduce-*gpu.csv"))
    if not files:
        raise ConfigError(f"{where}: no allreduce-<N>gpu.csv files")
    samples = []
    for path in files:
        n = int(re.search(r"allreduce-(\d+)gpu", path.name).group(1))
        with open(path, newline="", encoding="utf-8") as handle:
            for line, row in enumerate(csv.reader(handle), start=1):
                if line == 1:
                    continue
                try:
                    size, t_ns = float(row[0]), float(row[3])
                except (ValueError, IndexError):
                    raise ConfigError(f"{path}: row {line}: size and time must be numbers") from None
                if not (math.isfinite(size) and math.isfinite(t_ns) and size > 0 and t_ns > 0):
                    raise ConfigError(f"{path}: row {line}: size and time must be positive")
                samples.append((n, size, t_ns * 1e-9))
    return samples


# ---------------------------------------------------------------- prediction

def _layout(run: MeasuredRun, activation: str):
    model = gpt_model(run.hidden, run.heads, run.layers, run.seq, tp=run.tp)
    cfg = ParallelConfig(pp=run.pp, dp=run.dp, tp=run.tp, zero=0, micro_batch=run.micro_batch,
                         accum=run.accum, seq=run.seq, activation=activation, partition="uniform")
    return model, cfg


def predict(run: MeasuredRun, platform: GpuPlatform, *, activation: str = "ckpt",
            sequence_parallel: bool = False) -> MegatronResult:
    """The simulated iteration of one measured run."""
    model, cfg = _layout(run, activation)
    return simulate_megatron(megatron_step(model, cfg, platform, activation=activation,
                                           sequence_parallel=sequence_parallel))


def peak_memory(run: MeasuredRun, platform: GpuPlatform, *, activation: str = "ckpt",
                sequence_parallel: bool = False) -> dict:
    """The worst stage's peak under Megatron's mixed-precision state, by part (GiB), and whether
    it fits the platform's memory budget."""
    model, cfg = _layout(run, activation)
    stages = stage_memory(model, cfg, constants=MemoryConstants.megatron(), sequence_parallel=sequence_parallel)
    worst = max(stages, key=lambda m: m.peak_bytes)
    return {"stage": worst.stage, "peak_gib": worst.peak_bytes / GIB, "fits": worst.peak_bytes
            <= platform.memory_budget_bytes, "state_gib": worst.state_bytes / GIB,
            "activations_gib": worst.activation_bytes / GIB, "buffers_gib": worst.buffer_bytes / GIB}


@dataclass
class Validation:
    runs: list[dict]
    summary: dict
    groups: list[dict]
    batch_groups: list[dict]

    def to_json(self) -> dict:
        return asdict(self)


def _errors(rows: list[dict]) -> tuple[float, float]:
    errs = [abs(r["error"]) for r in rows]
    return sum(errs) / len(errs), max(errs)


def validate(runs: list[MeasuredRun], platform: GpuPlatform, *, activation: str = "ckpt",
             sequence_parallel: bool = False, progress: bool | None = None) -> Validation:
    """Simulate every run and compare (see the module docstring for the measures)."""
    out = []
    say = Progress(bool(progress))
    for i, run in enumerate(runs):
        if i % 200 == 0:
            say(f"validate measured: {i} of {len(runs)} runs simulated")
        result = predict(run, platform, activation=activation, sequence_parallel=sequence_parallel)
        out.append({"row": run.row, "model": run.model_label, "gpus": run.gpus, "global_batch": run.global_batch,
                    "layout": run.layout(), "tp": run.tp, "dp": run.dp, "pp": run.pp,
                    "micro_batch": run.micro_batch, "predicted_ms": result.iteration_ms,
                    "measured_ms": run.measured_ms, "error": result.iteration_ms / run.measured_ms - 1.0,
                    "breakdown_ms": result.breakdown_ms,
                    "memory": peak_memory(run, platform, activation=activation, sequence_parallel=sequence_parallel)})
    return compare(out, platform.name, activation=activation, sequence_parallel=sequence_parallel)


def compare(out: list[dict], platform_name: str, *, activation: str = "ckpt",
            sequence_parallel: bool = False) -> Validation:
    """The measures over already simulated rows (``validate``'s rows, or a subset of them)."""
    mean, worst = _errors(out)
    groups, batch_groups = [], []
    keyed: dict = {}
    for r in out:
        keyed.setdefault((r["model"], r["gpus"]), []).append(r)
    for (model, gpus), rows in sorted(keyed.items()):
        g_mean, g_max = _errors(rows)
        groups.append({"model": model, "gpus": gpus, "runs": len(rows), "mean_abs_error": g_mean,
                       "max_abs_error": g_max, "kendall_tau": _tau(rows)})
    keyed = {}
    for r in out:
        keyed.setdefault((r["model"], r["gpus"], r["global_batch"]), []).append(r)
    for (model, gpus, batch), rows in sorted(keyed.items()):
        best_pred = min(rows, key=lambda r: (r["predicted_ms"], r["row"]))
        best = min(r["measured_ms"] for r in rows)
        batch_groups.append({"model": model, "gpus": gpus, "global_batch": batch, "runs": len(rows),
                             "kendall_tau": _tau(rows) if len(rows) > 1 else None,
                             "predicted_best": best_pred["layout"],
                             "top1_regret_pct": 100.0 * (best_pred["measured_ms"] / best - 1.0)})
    taus = [g["kendall_tau"] for g in groups if g["kendall_tau"] is not None]
    ranked = [g for g in batch_groups if g["runs"] > 1]
    summary = {"runs": len(out), "mean_abs_error": mean, "max_abs_error": worst,
               "median_abs_error": sorted(abs(r["error"]) for r in out)[len(out) // 2],
               "groups": len(groups), "min_group_tau": min(taus) if taus else None,
               "mean_group_tau": sum(taus) / len(taus) if taus else None,
               "batch_groups": len(ranked),
               "mean_top1_regret_pct": sum(g["top1_regret_pct"] for g in ranked) / len(ranked) if ranked else None,
               "max_top1_regret_pct": max(g["top1_regret_pct"] for g in ranked) if ranked else None,
               "activation": activation, "sequence_parallel": sequence_parallel, "platform": platform_name}
    return Validation(out, summary, groups, batch_groups)


def _tau(rows: list[dict]) -> float | None:
    tau = kendall_tau_b([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows])
    return None if math.isnan(tau) else tau


def plot_validation(validation: Validation, path: Path) -> None:
    """Predicted against measured, log-log, with y = x and a +-10 % band, coloured by GPU count."""
    fig, ax = plt.subplots(figsize=(6, 5.5))
    runs = validation.runs
    lo = min(min(r["measured_ms"], r["predicted_ms"]) for r in runs) * 0.8
    hi = max(max(r["measured_ms"], r["predicted_ms"]) for r in runs) * 1.25
    xs = [lo, hi]
    ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="#dddddd", label="+-10 %")
    ax.plot(xs, xs, "k-", lw=0.8, label="y = x")
    for gpus, colour in ((2, "#1f77b4"), (4, "#ff7f0e"), (8, "#2ca02c")):
        sel = [r for r in runs if r["gpus"] == gpus]
        if sel:
            ax.scatter([r["measured_ms"] for r in sel], [r["predicted_ms"] for r in sel], s=6, alpha=0.6,
                       color=colour, label=f"{gpus} GPUs")
    other = [r for r in runs if r["gpus"] not in (2, 4, 8)]
    if other:
        ax.scatter([r["measured_ms"] for r in other], [r["predicted_ms"] for r in other], s=6, alpha=0.6,
                   color="#9467bd", label="other GPU counts")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured iteration time (ms)")
    ax.set_ylabel("predicted iteration time (ms)")
    s = validation.summary
    ax.set_title(f"{s['platform']}: {s['runs']} runs, mean |error| {100 * s['mean_abs_error']:.1f} %, "
                 f"max {100 * s['max_abs_error']:.1f} %", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    save_figure(fig, path)


def format_validation(validation: Validation, limit: int = 20) -> str:
    s = validation.summary
    lines = [f"{s['runs']} runs on {s['platform']} (activation {s['activation']}): mean |error| "
             f"{100 * s['mean_abs_error']:.2f} %, median {100 * s['median_abs_error']:.2f} %, "
             f"max {100 * s['max_abs_error']:.2f} %"]
    if s["mean_group_tau"] is not None:
        lines.append(f"Kendall tau per model and GPU count: mean {s['mean_group_tau']:.3f}, "
                     f"min {s['min_group_tau']:.3f} over {s['groups']} groups")
    if s["mean_top1_regret_pct"] is not None:
        lines.append(f"top-1 regret per model, GPUs and global batch: mean {s['mean_top1_regret_pct']:.2f} %, "
                     f"max {s['max_top1_regret_pct']:.2f} % over {s['batch_groups']} groups")
    lines.append("")
    lines.append(f"{'model':<18} {'GPUs':>4} {'runs':>5} {'mean err %':>10} {'max err %':>10} {'tau':>6}")
    for g in validation.groups:
        tau = "-" if g["kendall_tau"] is None else f"{g['kendall_tau']:.3f}"
        lines.append(f"{g['model']:<18} {g['gpus']:>4} {g['runs']:>5} {100 * g['mean_abs_error']:>10.2f} "
                     f"{100 * g['max_abs_error']:>10.2f} {tau:>6}")
    worst = sorted(validation.runs, key=lambda r: -abs(r["error"]))[:limit]
    lines.append("")
    lines.append(f"worst {len(worst)} rows:")
    lines.append(f"{'row':>5} {'model':<18} {'layout':<14} {'batch':>5} {'predicted':>10} {'measured':>10} "
                 f"{'err %':>7}")
    for r in worst:
        lines.append(f"{r['row']:>5} {r['model']:<18} {r['layout']:<14} {r['global_batch']:>5} "
                     f"{r['predicted_ms']:>10.1f} {r['measured_ms']:>10.1f} {100 * r['error']:>7.2f}")
    return "\n".join(lines)


__all__ = ["COLUMNS", "CROSS_VALIDATION_FOLDS", "MeasuredRun", "Validation", "compare", "cross_validated",
           "cross_validation_table", "error_table", "format_validation",
           "residual_table", "residuals", "run_measured",
           "plot_validation", "predict", "read_allreduce", "read_runs", "validate"]


def _table_row(label: str, rows: list[dict], name: str) -> str:
    s = compare(rows, name).summary
    return (f"| {label} | {s['runs']} | {100 * s['mean_abs_error']:.2f} % | {100 * s['max_abs_error']:.2f} % | "
            f"{s['mean_group_tau']:.3f} / {s['min_group_tau']:.3f} | "
            f"{s['mean_top1_regret_pct']:.2f} % / {s['max_top1_regret_pct']:.2f} % |")


def error_table(runs: list[MeasuredRun], platform: GpuPlatform) -> list[str]:
    """The markdown rows of docs/VALIDATION.md's error table: all runs (the fit's own rows), then
    the runs on each GPU count."""
    whole = validate(runs, platform).runs
    lines = [_table_row("all (the fit's rows)", whole, platform.name)]
    for g in sorted({r["gpus"] for r in whole}):
        lines.append(_table_row(f"{g} GPUs", [r for r in whole if r["gpus"] == g], platform.name))
    return lines


def cross_validated(runs: list[MeasuredRun], platform: GpuPlatform) -> tuple[dict[int, list[dict]], list[dict]]:
    """Each GPU count's runs simulated with the kernel constants fitted without them
    (:data:`CROSS_VALIDATION_FOLDS`), and all of them in input order."""
    folds = {}
    for g in sorted({r.gpus for r in runs}):
        if g not in CROSS_VALIDATION_FOLDS:
            raise ConfigError(f"no cross-validation fold holds out the runs on {g} GPUs")
        folds[g] = validate([r for r in runs if r.gpus == g], platform.with_overrides(**CROSS_VALIDATION_FOLDS[g])).runs
    return folds, sorted((r for rows in folds.values() for r in rows), key=lambda r: r["row"])


def cross_validation_table(runs: list[MeasuredRun], platform: GpuPlatform) -> list[str]:
    """The markdown rows of docs/VALIDATION.md's cross-validation table: each GPU count predicted by
    the fit on the others, then all runs so predicted."""
    folds, every = cross_validated(runs, platform)
    lines = []
    for g, rows in folds.items():
        others = " and ".join(str(c) for c in folds if c != g)
        lines.append(_table_row(f"{g} GPUs, fitted on {others}", rows, platform.name))
    lines.append(_table_row("all, each predicted by the fit without its GPU count", every, platform.name))
    return lines


# ---------------------------------------------------------------- the reproduction's experiment

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "measured"
CALIBRATION_RUNS = DATA_DIR / "a100-single-node-runs.csv"
CALIBRATION_ALLREDUCE = DATA_DIR / "a100-allreduce"
# the shipped platform of the calibration cluster, in the source checkout's platforms/ folder
CALIBRATION_PLATFORM = Path(__file__).resolve().parents[2] / "platforms" / "a100-measured-cluster.toml"
# the kernel constants `ratrain validate fit-gpu --cross-validate` fits on the runs on every GPU
# count but the key (the shipped platform's are fitted on all runs): docs/VALIDATION.md
CROSS_VALIDATION_FOLDS: dict[int, dict[str, float]] = {
    2: {
        "kernels.gemm_efficiency": 0.8439388298819106,
        "kernels.hbm_efficiency": 1.0,
        "kernels.launch_s": 6.162113465612964e-05,
        "kernels.step_overhead_s": 0.0005542991230607532,
        "kernels.p2p_host_s": 0.0002942318793143122,
    },
    4: {
        "kernels.gemm_efficiency": 0.8550144524277757,
        "kernels.hbm_efficiency": 1.0,
        "kernels.launch_s": 6.211260399819294e-05,
        "kernels.step_overhead_s": 0.00022843715180629308,
        "kernels.p2p_host_s": 0.00026779660602218035,
    },
    8: {
        "kernels.gemm_efficiency": 0.8600952275359739,
        "kernels.hbm_efficiency": 1.0,
        "kernels.launch_s": 6.164184351879572e-05,
        "kernels.step_overhead_s": 2.07156017432511e-05,
        "kernels.p2p_host_s": 0.0007238527070484594,
    },
}
TARGET_MEAN_ERROR = 0.05           # the aim: mean |error| at most 5 %
TARGET_TAU = 0.8                   # and Kendall tau at least 0.8 in every group
RESIDUAL_KEYS = ("tp", "pp", "dp", "micro_batch")


def residuals(validation: Validation) -> dict:
    """Signed mean error by tensor, pipeline and data parallelism and micro-batch, and the share of
    the predicted time each part of the iteration takes: what the residual error is made of."""
    out: dict = {}
    for key in RESIDUAL_KEYS:
        by: dict = {}
        for r in validation.runs:
            by.setdefault(r[key], []).append(r["error"])
        out[key] = {str(k): {"runs": len(e), "mean_error": sum(e) / len(e),
                             "mean_abs_error": sum(abs(x) for x in e) / len(e)} for k, e in sorted(by.items())}
    totals: dict = {}
    for r in validation.runs:
        for part, ms in r["breakdown_ms"].items():
            totals[part] = totals.get(part, 0.0) + ms
    whole = sum(totals.values())
    out["share_of_predicted_time"] = {part: ms / whole for part, ms in totals.items()}
    return out


def run_measured(out: Path, prog, settings) -> Experiment:
    """`ratrain reproduce measured`: the shipped A100 platform against its calibration set."""
    platform = load_platform(CALIBRATION_PLATFORM)
    runs = read_runs(CALIBRATION_RUNS)
    prog(f"measured: {len(runs)} runs on {platform.name}")
    whole = validate(runs, platform)
    held = compare(cross_validated(runs, platform)[1], platform.name).summary
    figure = Path(out) / "measured_validation.png"
    plot_validation(whole, figure)
    s = whole.summary
    checks = [Check("mean |error|, all runs", s["mean_abs_error"], None, f"<= {TARGET_MEAN_ERROR:.0%}",
                    s["mean_abs_error"] <= TARGET_MEAN_ERROR, "the aim for a simulator with fitted kernels"),
              Check("mean |error|, cross-validated (each GPU count predicted by the fit on the others)",
                    held["mean_abs_error"], None, f"<= {TARGET_MEAN_ERROR:.0%}",
                    held["mean_abs_error"] <= TARGET_MEAN_ERROR, "runs the fit did not see"),
              Check("min Kendall tau per model and GPU count", s["min_group_tau"], None, f">= {TARGET_TAU}",
                    s["min_group_tau"] is not None and s["min_group_tau"] >= TARGET_TAU,
                    f"{s['groups']} groups")]
    rows = [dict(g) for g in whole.groups]
    res = residuals(whole)
    lines = [format_validation(whole, 10), "",
             f"fitted on all runs; cross-validated (each GPU count predicted by the fit on the others): "
             f"mean |error| {100 * held['mean_abs_error']:.2f} %, max {100 * held['max_abs_error']:.2f} %", "",
             "signed mean error by " + "; ".join(
                 f"{key}: " + ", ".join(f"{k} {100 * v['mean_error']:+.1f} %" for k, v in res[key].items())
                 for key in RESIDUAL_KEYS),
             "share of the predicted time: " + ", ".join(
                 f"{k} {100 * v:.1f} %" for k, v in res["share_of_predicted_time"].items())]
    return Experiment("measured", "Measured runs: the simulator on an A100 node (1,440 runs)", rows, checks,
                      [str(figure)], "\n".join(lines),
                      ["Constants fitted on all runs and the all-reduce measurements; leave-one-GPU-count-out "
                       "cross-validation states the error on unseen runs. What was fitted and what the residual "
                       "error is made of: docs/VALIDATION.md."])


def residual_table(validation: Validation) -> list[str]:
    """The markdown rows of docs/VALIDATION.md's residual table: signed mean error per value of
    T, P, D and b, and the share of the predicted time each part takes."""
    res = residuals(validation)
    lines = []
    for key, label in zip(RESIDUAL_KEYS, ("T", "P", "D", "b"), strict=True):
        cells = ", ".join(f"{k}: {100 * v['mean_error']:+.1f} %" for k, v in res[key].items())
        lines.append(f"| {label} | {cells} |")
    share = ", ".join(f"{k.replace('_', ' ')} {100 * v:.1f} %" for k, v in res["share_of_predicted_time"].items())
    lines.append(f"| share of the predicted time | {share} |")
    return lines

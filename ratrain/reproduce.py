"""The paper reproduction: every validation, ours beside the paper's, with figures and a report.

Each experiment returns an :class:`Experiment`: JSON-able rows (ours and the paper's value side
by side), pass/miss checks against the issue's tolerances, and figure paths. ``reproduce``
runs a selection, writes ``results/<key>.json``, the figures and ``results/report.md``, and
shows progress on stderr. Numbers are measured by mtemu and the simulator; ``ratrain.paper``
supplies only the targets.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mtemu.fileio import atomic_write_json, atomic_write_text

from . import paper


@dataclass
class Check:
    name: str
    ours: float | str | None
    paper: float | str | None
    tolerance: str
    ok: bool
    note: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "ours": self.ours, "paper": self.paper, "tolerance": self.tolerance,
                "ok": self.ok, "note": self.note}


@dataclass
class Experiment:
    key: str
    title: str
    rows: list[dict]
    checks: list[Check] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    text: str = ""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        return sum(c.ok for c in self.checks)

    def to_json(self) -> dict:
        return {"key": self.key, "title": self.title, "rows": self.rows, "checks": [c.to_json() for c in self.checks],
                "figures": self.figures, "notes": self.notes, "seconds": self.seconds}


class Progress:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.t0 = time.time()

    def __call__(self, msg: str) -> None:
        if self.enabled:
            print(f"[{time.time() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# Table 5 (mtemu)
# ------------------------------------------------------------------------------------------
def run_table5(out: Path, progress: Progress, settings=None) -> Experiment:
    from mtemu.validate import TABLE5_TOLERANCE_PP, format_table5, format_variants, table5, table5_variants
    progress("Table 5: emulating the five FP16 GEMMs (timing mode)")
    rows = table5()
    progress("Table 5: variants without software pipeline / with naive tiles")
    variants = table5_variants()
    checks = [Check(f"{r.m}x{r.k}x{r.n} utilization", round(100 * r.utilization, 2), round(100 * r.paper_utilization, 2),
                    f"±{TABLE5_TOLERANCE_PP} pp", r.ok, "fit row" if r.fit else "held out") for r in rows]
    fig = out / "table5_utilization.png"
    _plot_table5(rows, variants, fig)
    return Experiment("table5", "Table 5: FP16 GEMM MAC utilization (M = 2048)", [r.to_json() for r in rows], checks,
                      [str(fig)], format_table5(rows) + "\n\n" + format_variants(variants),
                      notes=["One fitted platform constant (DMA per-row overhead) on the two fit rows; see docs/CHOICES.md."])


def _plot_table5(rows, variants, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from mtemu.fileio import atomic_write_bytes
    import io

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels = [f"{r.k}x{r.n}" for r in rows]
    x = np.arange(len(rows))
    ax1.bar(x - 0.2, [100 * r.utilization for r in rows], 0.4, label="mtemu (emulated)", color="#1f77b4")
    ax1.bar(x + 0.2, [100 * r.paper_utilization for r in rows], 0.4, label="paper", color="#bbbbbb")
    for i, r in enumerate(rows):
        ax1.text(i - 0.2, 100 * r.utilization + 0.5, f"{100 * r.utilization:.1f}", ha="center", fontsize=8)
    ax1.set_xticks(x, labels)
    ax1.set_ylim(0, 80)
    ax1.set_ylabel("MAC utilization (%)")
    ax1.set_title("FP16 GEMM, M=2048 (weights K x N)")
    ax1.legend(loc="lower right")
    kinds = ["dma_wait", "barrier", "latency", "branch", "imbalance"]
    names = [v["variant"] for v in variants]
    bottom = np.zeros(len(variants))
    for kind in kinds:
        vals = np.array([v["stalls"].get(kind, 0) for v in variants], dtype=float) / 1e6
        ax2.barh(names, vals, left=bottom, label=kind)
        bottom += vals
    for i, v in enumerate(variants):
        ax2.text(bottom[i], i, f"  util {100 * v['utilization']:.1f}%", va="center", fontsize=8)
    ax2.set_xlabel("stall cycles, summed over 24 DSPs (millions)")
    ax2.set_title("Why: stall breakdown on 2048x4096x4096")
    ax2.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


# ------------------------------------------------------------------------------------------
# correctness (issue 6)
# ------------------------------------------------------------------------------------------
def run_correctness_experiment(out: Path, progress: Progress, settings=None) -> Experiment:
    from .correctness import CorrectnessConfig, run_correctness, save_outputs
    progress("Correctness: training Baseline-1F1B, RATrain and single-stage on the tiny model")
    result = run_correctness(CorrectnessConfig(steps=20))
    save_outputs(result, out / "correctness")
    d = result.to_json()
    rows = [{"step": i + 1, "baseline_loss": b, "ratrain_loss": r, "rel_dev": dv}
            for i, (b, r, dv) in enumerate(zip(result.baseline_loss, result.ratrain_loss, result.rel_dev))]
    checks = [Check("max per-step relative loss deviation", d["max_rel_dev"], paper.CORRECTNESS_MAX_REL_DEV,
                    f"<= {paper.CORRECTNESS_MAX_REL_DEV}", d["max_rel_dev"] <= paper.CORRECTNESS_MAX_REL_DEV,
                    "bit-identical" if d["bit_identical"] else "differs"),
              Check("single-stage loop agrees", d["single_stage_max_rel_dev"], 0.0, "== 0",
                    d["single_stage_max_rel_dev"] == 0.0)]
    text = (f"RATrain vs Baseline-1F1B over {d['steps']} steps: max {d['max_rel_dev']:.3g}, mean {d['mean_rel_dev']:.3g}, "
            f"final {d['final_rel_dev']:.3g} relative deviation (paper max {paper.CORRECTNESS_MAX_REL_DEV:.3%}); "
            f"bit-identical: {d['bit_identical']}")
    return Experiment("correctness", "Correctness: lifecycle scheduling changes timing, not learning", rows, checks,
                      [d["plot"]], text)


# ------------------------------------------------------------------------------------------
# registry, driver, report
# ------------------------------------------------------------------------------------------
def registry() -> dict[str, Callable[..., Experiment]]:
    """Every experiment of the main job, in run order."""
    from . import experiments as ex
    return {"table5": run_table5, "table2": ex.run_table2, "table3": ex.run_table3, "table4": ex.run_table4,
            "table6": ex.run_table6, "ablation": ex.run_ablation, "correctness": run_correctness_experiment}


EXPERIMENT_NAMES = ("table5", "table2", "table3", "table4", "table6", "ablation", "correctness")


def reproduce(which: list[str] | None = None, out_dir: str | Path = "results", progress: bool = True,
              settings=None) -> list[Experiment]:
    from .errors import ConfigError
    from .experiments import DEFAULT_SETTINGS
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


def format_checks(exp: Experiment) -> str:
    lines = [f"{'check':52s} {'ours':>12s} {'paper':>12s}  tolerance        mark"]
    for c in exp.checks:
        ours = f"{c.ours:.4g}" if isinstance(c.ours, float) else str(c.ours)
        ref = f"{c.paper:.4g}" if isinstance(c.paper, float) else str(c.paper)
        lines.append(f"{c.name[:52]:52s} {ours:>12s} {ref:>12s}  {c.tolerance:15s}  {'pass' if c.ok else 'MISS'}"
                     + (f"  ({c.note})" if c.note else ""))
    return "\n".join(lines)


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
            rel = Path(fig).resolve().relative_to(out.resolve()) if Path(fig).resolve().is_relative_to(out.resolve()) else Path(fig)
            parts += ["", f"![{e.key}]({rel.as_posix()})"]
        for note in e.notes:
            parts += ["", f"> {note}"]
    path = out / "report.md"
    atomic_write_text(path, "\n".join(parts) + "\n")
    return path

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

from rtcommon.fileio import atomic_write_json, atomic_write_text

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
    from rtcommon.fileio import atomic_write_figure

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
    atomic_write_figure(path, fig, dpi=110)


# ------------------------------------------------------------------------------------------
# attention backward: resident vs DDR-staged (paper Fig. 10)
# ------------------------------------------------------------------------------------------
def run_attention(out: Path, progress: Progress, settings=None) -> Experiment:
    from mtemu.kernels.attention import validate_attention
    lo, hi = paper.FIG10_SPEEDUP
    progress("Attention: emulating the resident and DDR-staged backward for seq 512..4096 (timing mode)")
    rows = validate_attention()
    for r in rows:
        # Our staged kernel is DDR-bound, so its time is its bytes over the rate it achieves; the
        # paper's speedups then fix how many bytes its baseline could have moved.
        rate = r["staged_ddr_bytes"] / r["staged_ms"]
        r["paper_implied_staged_bytes_ratio"] = [s * r["resident_ms"] * rate / r["resident_ddr_bytes"] for s in (lo, hi)]
    checks = [Check(f"seq {r['seq']}: resident / DDR-staged speedup", r["speedup"], f"{lo}-{hi}",
                    f"within {lo}-{hi}", lo <= r["speedup"] <= hi,
                    f"DDR {r['staged_ddr_bytes'] / max(r['resident_ddr_bytes'], 1):.1f}x the resident bytes; the "
                    "paper's range means {:.1f}-{:.1f}x".format(*r["paper_implied_staged_bytes_ratio"]))
              for r in rows]
    implied = [x for r in rows for x in r["paper_implied_staged_bytes_ratio"]]
    fig = out / "attention_speedup.png"
    _plot_attention(rows, fig, lo, hi)
    text = "\n".join(f"seq {r['seq']:5d}: resident {r['resident_ms']:8.3f} ms ({100 * r['resident_utilization']:.1f}% util), "
                     f"staged {r['staged_ms']:8.3f} ms, speedup {r['speedup']:.2f}x" for r in rows)
    return Experiment("attention", "Fig. 10: memory-resident attention backward vs DDR-staged (head dim 128)", rows,
                      checks, [str(fig)], text,
                      notes=["The staged baseline round-trips GP, GS, P and the partial gradients through DDR; with "
                             "24 DSPs sharing 30 GB/s it moves 5-9x the resident kernel's bytes, so our speedups "
                             "exceed the paper's 1.24-1.54x. The paper does not give its baseline's traffic; "
                             "see docs/CHOICES.md, 'mtemu attention kernels'.",
                             f"At the DDR rate our staged kernel achieves, the paper's 1.24-1.54x corresponds to a "
                             f"baseline moving {min(implied):.1f}-{max(implied):.1f}x the resident kernel's bytes: "
                             "less extra traffic than one round trip of a single seq x seq FP16 intermediate "
                             "(0.2-0.9 of one), where the staged schedule makes several."])


def _plot_attention(rows, path: Path, lo: float, hi: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rtcommon.fileio import atomic_write_figure
    fig, ax = plt.subplots(figsize=(6, 4))
    seqs = [r["seq"] for r in rows]
    ax.plot(seqs, [r["speedup"] for r in rows], "o-", label="ours (emulated)")
    ax.fill_between(seqs, lo, hi, color="grey", alpha=0.3, label=f"paper Fig. 10 ({lo}-{hi}x)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs, [str(s) for s in seqs])
    ax.set_xlabel("sequence length")
    ax.set_ylabel("speedup over DDR-staged (x)")
    ax.set_title("Attention backward: memory-resident vs DDR-staged")
    ax.legend()
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=110)


# ------------------------------------------------------------------------------------------
# Table 5 calibration study: which DDR rate and calibration could meet the 1.5 pp target
# ------------------------------------------------------------------------------------------
def run_table5_study(out: Path, progress: Progress, settings=None) -> Experiment:
    from mtemu.calibrate import bandwidth_study, emulate_a_resident, emulate_fit, format_study, plot_study
    from mtemu.validate import TABLE5_TOLERANCE_PP
    progress("Table 5 study: closed-form calibrations at 30-51 GB/s")
    rows = bandwidth_study()
    # the best this GEMM can do at the paper's 30 GB/s, re-measured on the emulator
    best = emulate_fit(rows[0].oracle, progress=progress)
    # Fig. 4's loop order, emulated at the chip's raw DDR rate with no platform constant fitted
    fig4 = emulate_a_resident(progress=progress)
    fig = out / "table5_study.png"
    plot_study(rows, str(fig), [best, fig4])
    reach = next((r.ddr_bandwidth for r in rows if r.oracle.worst_error_pp <= TABLE5_TOLERANCE_PP), None)
    checks = [Check(f"Table 5 worst |delta|, best calibration at {best.ddr_bandwidth / 1e9:g} GB/s fit on all rows "
                    "(emulated)", round(best.worst_error_pp, 2), f"<= {TABLE5_TOLERANCE_PP}",
                    f"<= {TABLE5_TOLERANCE_PP} pp", best.worst_error_pp <= TABLE5_TOLERANCE_PP,
                    f"{best.tiles.describe()}, row overhead {best.row_overhead_cycles:.2f} cycles"),
              Check(f"Table 5 worst |delta|, Fig. 4 loop order at the raw {fig4.ddr_bandwidth / 1e9:g} GB/s, no fitted "
                    "platform constant (emulated)", round(fig4.worst_error_pp, 2), f"<= {TABLE5_TOLERANCE_PP}",
                    f"<= {TABLE5_TOLERANCE_PP} pp", fig4.worst_error_pp <= TABLE5_TOLERANCE_PP,
                    "platforms/mt3000-raw-ddr.toml; not the project default (the issue fixes 30 GB/s)")]
    notes = ["Upper bound on what any calibration of this kernel reaches: the tiles and the row overhead are "
             "chosen on all five rows, so no row is held out.",
             "Lowest DDR rate at which the closed-form bound reaches the target: "
             + (f"{reach / 1e9:g} GB/s." if reach else "none in the range studied."),
             "Fig. 4's literal loop order (A_g resident in GSM, C through DDR between k-blocks) exists only "
             f"as a closed form: fit on all rows its worst row is {rows[0].a_resident.worst_error_pp:.2f} pp at "
             f"{rows[0].ddr_bandwidth / 1e9:g} GB/s and {rows[-1].a_resident.worst_error_pp:.2f} pp at "
             f"{rows[-1].ddr_bandwidth / 1e9:g} GB/s.",
             f"Emulated, that loop order ({fig4.tiles.describe()}; mg and kg chosen on the two fit rows) at the chip's "
             f"raw {fig4.ddr_bandwidth / 1e9:g} GB/s with no platform constant fitted gives "
             + " / ".join(f"{u:.2f}" for u in fig4.utilization_pp)
             + f" %: {fig4.rows_within}/5 rows within {TABLE5_TOLERANCE_PP} pp, worst {fig4.worst_error_pp:.2f} pp."]
    return Experiment("table5_study", "Table 5: which DDR rate and calibration could meet the target",
                      [r.to_json() for r in rows] + [{"emulated": best.to_json()}, {"emulated": fig4.to_json()}],
                      checks, [str(fig)], format_study(rows, [best, fig4]), notes)


# ------------------------------------------------------------------------------------------
# tile tuner on the Table 5 shapes (issue: the tuner finds tiles at least as good as the defaults)
# ------------------------------------------------------------------------------------------
TUNE_GRID = {"mg": (1024, 2048), "k2": (64, 128), "n2": (576, 768, 960), "mr_nv": ((6, 4),)}
# emulate the 4 best by the closed-form bound (plus the defaults); on every Table 5 shape the
# full 12-candidate sweep's winner is the bound's first choice, so this only saves time
TUNE_EMULATE_TOP = 4


def run_tune(out: Path, progress: Progress, settings=None) -> Experiment:
    from mtemu.tune import tune_gemm
    from mtemu.validate import TABLE5, TABLE5_M
    rows, checks, figs = [], [], []
    for i, (k, n, *_r) in enumerate(TABLE5):
        progress(f"Tuner: {TABLE5_M}x{k}x{n} ({i + 1}/{len(TABLE5)})")
        r = tune_gemm(TABLE5_M, k, n, grid=TUNE_GRID, out_dir=out / "tune", progress=False, emulate_top=TUNE_EMULATE_TOP)
        gain = 100 * (r.best.utilization - r.default.utilization)
        rows.append({"shape": f"{TABLE5_M}x{k}x{n}", "default_utilization": r.default.utilization,
                     "best_utilization": r.best.utilization, "gain_pp": gain, "best_tiles": r.best.tiles,
                     "emulated": len(r.candidates), "pruned": len(r.pruned), "screened": len(r.screened)})
        checks.append(Check(f"{TABLE5_M}x{k}x{n}: tuned over default", round(gain, 2), ">= 0", ">= 0 pp", gain >= 0,
                            "best " + " ".join(f"{key}={r.best.tiles[key]}" for key in ("mg", "k2", "n2"))))
        if i == 0:
            figs.append(r.heatmap)
    text = "\n".join(f"{r['shape']}: default {100 * r['default_utilization']:.2f}% -> best "
                     f"{100 * r['best_utilization']:.2f}% ({r['gain_pp']:+.2f} pp) with "
                     f"mg={r['best_tiles']['mg']} k2={r['best_tiles']['k2']} n2={r['best_tiles']['n2']}"
                     for r in rows)
    return Experiment("tune", "Tile tuner on the Table 5 shapes (prediction beyond the paper)", rows, checks, figs,
                      text, notes=["The paper-matching default tiles stay the Table 5 validation setting; the "
                                   "tuned tiles are the emulator's prediction. Candidates outside the closed-form "
                                   "bound's top 4 are screened, not emulated. Full grids: `mtemu tune gemm`."])


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
    from .sensitivity import run_sensitivity
    return {"table5": run_table5, "table5_study": run_table5_study, "tune": run_tune, "attention": run_attention, "table2": ex.run_table2,
            "table3": ex.run_table3, "table4": ex.run_table4, "table6": ex.run_table6, "ablation": ex.run_ablation,
            "sensitivity": run_sensitivity, "correctness": run_correctness_experiment}


EXPERIMENT_NAMES = ("table5", "table5_study", "tune", "attention", "table2", "table3", "table4", "table6", "ablation",
                    "sensitivity",
                    "correctness")


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

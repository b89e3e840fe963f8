"""Figures of the reproduction (PNG, written atomically): paper vs ours, side by side."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from rtcommon.figstyle import DPI, finish, subplots
from rtcommon.fileio import atomic_write_figure
from rtcommon.plotting import matplotlib, plt

__all__ = ["plt", "save_figure", "bar_comparison", "scaleout_figure", "ablation_figure", "stage_memory_figure",
           "table5_figure", "attention_figure"]


def save_figure(fig, path: Path) -> None:
    """Write ``fig`` in the house style (rtcommon.figstyle): readable tick labels, fitted layout, nothing
    outside the canvas (legends placed below a panel are kept)."""
    finish(fig)
    atomic_write_figure(path, fig, dpi=DPI, bbox_inches="tight")


def bar_comparison(path: Path, labels, ours, theirs, ylabel: str, title: str, ref: float | None = None,
                   missing: str = "n/a") -> None:
    """Ours beside the paper's per label; a zero or missing value is marked ``missing`` at its bar's foot,
    the legend sits outside the bars."""
    fig, ax = subplots(figsize=(max(7, 1.1 * len(labels)), 4))
    x = np.arange(len(labels))
    ours = [v or 0.0 for v in ours]
    theirs = [v or 0.0 for v in theirs]
    ax.bar(x - 0.2, ours, 0.4, label="ours (simulated)", color="#1f77b4")
    ax.bar(x + 0.2, theirs, 0.4, label="paper", color="#bbbbbb")
    for xs, values in ((x - 0.2, ours), (x + 0.2, theirs)):
        for xi, v in zip(xs, values, strict=True):
            if not v:
                ax.text(xi, 0, missing, rotation=90, ha="center", va="bottom", fontsize=7, color="#555555")
    if ref is not None:
        ax.axhline(ref, color="k", lw=0.8, ls=":")
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    save_figure(fig, path)


def scaleout_figure(rows, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    n = [r["clusters"] for r in rows]
    ax.plot(n, [r["tokens_per_s"] / 1e3 for r in rows], "o-", label="ours (simulated)")
    pts = [(r["clusters"], r["paper_tokens_per_s"] / 1e3) for r in rows if r["paper_tokens_per_s"] is not None]
    if pts:
        ax.plot(*zip(*pts, strict=False), "s--", color="grey", label="paper")
    ax.plot(n, [rows[0]["tokens_per_s"] / 1e3 * c / n[0] for c in n], ":", color="k", label="linear")
    for r in rows:
        ax.annotate(f"{100 * r['efficiency']:.1f}%", (r["clusters"], r["tokens_per_s"] / 1e3), fontsize=8,
                    textcoords="offset points", xytext=(0, 6), ha="center")
    ax.set_xlabel("clusters")
    ax.set_ylabel("throughput (k tokens/s)")
    ax.set_title("LLaMA-2-7B scale-out (global batch grows with clusters)")
    ax.legend()
    save_figure(fig, path)


def ablation_figure(rows, path: Path) -> None:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["variant"] for r in rows]
    x = np.arange(len(rows))
    a1.bar(x - 0.2, [r["normalized_step"] for r in rows], 0.4, label="ours")
    a1.bar(x + 0.2, [r["paper_normalized_step"] for r in rows], 0.4, label="paper", color="#bbbbbb")
    a1.set_xticks(x, names, fontsize=8)
    a1.set_ylabel("normalized step time")
    a1.set_ylim(0.9, max(1.4, max(r["normalized_step"] for r in rows) + 0.05))
    a1.legend()
    a2.bar(x - 0.2, [r["tail_amplification"] or 0 for r in rows], 0.4, label="ours")
    a2.bar(x + 0.2, [r["paper_tail_amplification"] or 0 for r in rows], 0.4, label="paper", color="#bbbbbb")
    a2.set_xticks(x, names, fontsize=8)
    a2.set_ylabel("exposed-tail amplification (x)")
    a2.legend()
    fig.suptitle("Ablation (Qwen2.5-32B, P=8, D=32, A=128)")
    save_figure(fig, path)


def stage_memory_figure(rows, path: Path) -> None:
    fig, axes = subplots(1, len(rows), figsize=(4 * len(rows), 4.2), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=False):
        st = r.get("stages") or []
        x = np.arange(len(st))
        bottom = np.zeros(len(st))
        for key, color in (("state_gb", "#1f77b4"), ("activation_gb", "#ff7f0e"), ("buffer_gb", "#2ca02c")):
            vals = np.array([s[key] for s in st])
            ax.bar(x, vals, bottom=bottom, color=color, label=key.replace("_gb", ""))
            bottom += vals
        ax.axhline(20, color="red", lw=1, ls="--", label="20 GB budget")
        # the layout on lines of its own: four panels' one-line titles ran into each other
        config = textwrap.fill(str(r.get("config", "none fits")).replace(",", ", "), 34)
        ax.set_title(f"{r['model']}\n{config}", fontsize=8)
        ax.set_xlabel("stage")
        ax.set_ylabel("GB (2^30 bytes)")
        ax.set_ylim(0, 22)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.06), frameon=False)
    fig.suptitle("Table 3: per-stage memory of the smallest feasible footprint found")
    save_figure(fig, path)


def table5_figure(rows, variants, path: Path, tiles_text: str = "") -> None:
    """Left: Table 5's rows (``tiles_text``: the loop order and tiles they ran); right: each variant's
    stall breakdown, labelled with its loop order."""
    matplotlib.use("Agg")

    fig, (ax1, ax2) = subplots(1, 2, figsize=(13, 4.6), width_ratios=(1, 1.2))
    labels = [f"{r.k}x{r.n}" for r in rows]
    x = np.arange(len(rows))
    ax1.bar(x - 0.2, [100 * r.utilization for r in rows], 0.4, label="mtemu (emulated)", color="#1f77b4")
    ax1.bar(x + 0.2, [100 * r.paper_utilization for r in rows], 0.4, label="paper", color="#bbbbbb")
    for i, r in enumerate(rows):
        ax1.text(i - 0.2, 100 * r.utilization + 0.5, f"{100 * r.utilization:.1f}", ha="center", fontsize=8)
    ax1.set_xticks(x, labels)
    ax1.set_ylim(0, 90)
    ax1.set_ylabel("MAC utilization (%)")
    ax1.set_title("FP16 GEMM, M=2048 (weights K x N)" + (f"\n{tiles_text}" if tiles_text else ""), fontsize=10)
    ax1.legend(loc="upper left", ncol=2, fontsize=9)
    kinds = ["dma_wait", "barrier", "latency", "branch", "imbalance"]
    names = [v["variant"] for v in variants]
    bottom = np.zeros(len(variants))
    for kind in kinds:
        vals = np.array([v["stalls"].get(kind, 0) for v in variants], dtype=float) / 1e6
        ax2.barh(names, vals, left=bottom, label=kind)
        bottom += vals
    for i, v in enumerate(variants):
        ax2.text(bottom[i], i, f"  util {100 * v['utilization']:.1f}%", va="center", fontsize=8)
    ax2.set_xlim(0, 1.3 * max(bottom.max(), 1e-9))        # room for the utilization labels
    ax2.invert_yaxis()                                      # the default loop order on top
    ax2.set_xlabel("stall cycles, summed over 24 DSPs (millions)")
    ax2.set_title("Why: stall breakdown on 2048x4096x4096\n(pipeline and tile variants of the c-stationary loop "
                  "order)", fontsize=10)
    ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(kinds), frameon=False)
    save_figure(fig, path)


def attention_figure(rows, path: Path, lo: float, hi: float) -> None:
    matplotlib.use("Agg")
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
    save_figure(fig, path)

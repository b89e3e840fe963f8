"""Figures of ``ratrain task`` (PNG, written atomically): completion per scheme, scaling, deadline boundary,
which resource decides, and the save interval. Matplotlib loads only when a figure is drawn."""
from __future__ import annotations

import os

from rtcommon.figstyle import sparse_log_minor_labels
from rtcommon.fileio import atomic_write_figure

COLOURS = {"reserve": "#bbbbbb", "base": "#1f77b4", "recovery": "#d62728"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | os.PathLike) -> None:
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=110)


def _finish_log_log(plt, fig, ax, path, xlabel: str, ylabel: str, title: str, x_base: int = 10) -> None:
    ax.set_xscale("log", base=x_base)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)


def completion_figure(schemes: list[dict], deadline_days: float, path: str | os.PathLike) -> None:
    """One stacked bar per scheme: planned stall, base training, save and recovery; the deadline as a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(schemes) + 2), 4.2))
    labels = [f"{s['platform']}\n{s['devices']} devices" for s in schemes]
    x = list(range(len(schemes)))
    reserve = [s["reserve_days"] for s in schemes]
    base = [s["base_days"] for s in schemes]
    recovery = [s["save_and_recovery_days"] or 0.0 for s in schemes]
    ax.bar(x, reserve, 0.6, color=COLOURS["reserve"], label="planned stall (reserve)")
    ax.bar(x, base, 0.6, bottom=reserve, color=COLOURS["base"], label="base training")
    ax.bar(x, recovery, 0.6, bottom=[r + b for r, b in zip(reserve, base, strict=True)], color=COLOURS["recovery"],
           label="save and recovery")
    ax.axhline(deadline_days, color="k", lw=1.0, ls="--", label=f"deadline ({deadline_days:g} days)")
    for i, s in enumerate(schemes):
        top = reserve[i] + base[i] + recovery[i]
        text = "no progress" if s["completion_days"] is None else \
            f"{s['completion_days']:.1f} d" + ("" if s["meets_deadline"] else " (late)")
        ax.annotate(text, (i, top), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
    tops = [r + b + v for r, b, v in zip(reserve, base, recovery, strict=True)] + [deadline_days]
    ax.set_ylim(0, 1.12 * max(tops))      # headroom so the bar labels clear the title
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("days")
    ax.set_title("Completion time per scheme")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path)
    plt.close(fig)


def scaling_figure(rows: list[dict], ceiling: float, path: str | os.PathLike) -> None:
    """Completion days against devices, weak (batch grows) and strong (batch fixed) scaling."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    n = [r["devices"] for r in rows]
    ax.plot(n, [r["weak"]["completion_days"] for r in rows], "o-", label="weak scaling (global batch grows)")
    strong = [(r["devices"], r["strong"]["completion_days"]) for r in rows if r["strong"]["completion_days"]]
    if strong:
        ax.plot(*zip(*strong, strict=True), "s--", label="strong scaling (global batch fixed)")
    _finish_log_log(plt, fig, ax, path, "devices", "completion (days)",
                    f"Batch size against the noise scale (weak scaling speed-up at most {ceiling:.2f}x)", x_base=2)


def boundary_figure(rows: list[dict], tokens: float, mfu: float, days: float, path: str | os.PathLike) -> None:
    """Devices needed against model size per device type (log-log)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    params = [r["parameters"] for r in rows]
    for name in rows[0]["devices"]:
        ax.plot(params, [r["devices"][name] for r in rows], "o-", ms=3, label=name)
    _finish_log_log(plt, fig, ax, path, "model parameters N", "devices needed",
                    f"Deadline boundary: 6 N D FLOPs, D = {tokens:.3g} tokens, {days:g} days at MFU {mfu:g}")


def resource_figure(table: dict, label: str, path: str | os.PathLike) -> None:
    """T'/T per resource at each ratio: Amdahl's (hatched) beside the simulated value."""
    plt = _pyplot()
    rows = table["rows"]
    ratios = [q["r"] for q in rows[0]["ratios"]]
    fig, ax = plt.subplots(figsize=(max(6.5, 1.6 * len(rows)), 4.2))
    width = 0.8 / (2 * len(ratios))
    for j, r in enumerate(ratios):
        for k, kind in enumerate(("amdahl", "simulated")):
            offset = (2 * j + k - len(ratios) + 0.5) * width
            values = [row["ratios"][j][kind] or 0.0 for row in rows]
            ax.bar([i + offset for i in range(len(rows))], values, width, color=f"C{j}",
                   hatch="//" if kind == "amdahl" else None, alpha=0.55 if kind == "amdahl" else 1.0,
                   label=f"r = {r:g}, {'Amdahl' if kind == 'amdahl' else 'simulated'}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), [f"{row['resource']}\nf = {row['share']:.2f}" for row in rows], fontsize=8)
    ax.set_ylabel("step time T'/T")
    ax.set_title(f"Which resource decides: {label}", fontsize=10)
    ax.legend(fontsize=7, ncol=3)
    _save(fig, path)
    plt.close(fig)


def interval_figure(table: dict, path: str | os.PathLike) -> None:
    """The save/redo/restart share against the save interval; Young's, Daly's and the optimum marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    rows = table["rows"]
    sync = [(r["interval_s"], r["sync"]["total"]) for r in rows if r["sync"]]
    exact = [(r["interval_s"], r["sync_exact_total"]) for r in rows if r["sync_exact_total"] is not None]
    if sync:
        ax.plot(*zip(*sync, strict=True), "o-", label="synchronous, first order")
    if exact:
        ax.plot(*zip(*exact, strict=True), "^:", label="synchronous, exponential failures")
    asyn = [(r["interval_s"], r["async"]["total"]) for r in rows if r.get("async")]
    if asyn:
        ax.plot(*zip(*asyn, strict=True), "s--", label="asynchronous, first order")
    for name, key, style in (("Young", "young_s", ":"), ("Daly", "daly_s", "-."), ("optimum", "exact_optimum_s", "-")):
        if table.get(key):
            ax.axvline(table[key], color="grey", ls=style, lw=0.9, label=f"{name} {table[key]:.0f} s")
    ax.set_xscale("log")
    sparse_log_minor_labels(ax.xaxis)
    ax.set_xlabel("work between saves (s)")
    ax.set_ylabel("save + redo + restart share L")
    ax.set_title("Save interval", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))       # beside the curves, not on them
    _save(fig, path)
    plt.close(fig)


__all__ = ["boundary_figure", "completion_figure", "interval_figure", "resource_figure", "scaling_figure"]

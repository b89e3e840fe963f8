"""PNG figures of simulated steps (matplotlib, Agg backend), written atomically.

``plot_timeline``: per-stage rows in the style of the paper's Fig. 6 (F, B, R and,
under zb-h1, the weight gradient W of each micro-batch on the stage's compute
row; DDR and link work such as
UpdateShard, PrefetchW, GradSync and Send/Recv on their own rows).
``plot_stage_memory``: per-stage peak memory against the budget.
"""
from __future__ import annotations

import os
from typing import Sequence

from ratrain.errors import ConfigError
from ratrain.sim.timeline import Task
from rtcommon.durations import format_ms, time_unit
from rtcommon.fileio import atomic_write_figure
from rtcommon.plotting import plt

COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#2E7D6B", "R": "#DD8452", "Send": "#9A9A9A", "Recv": "#C8C8C8",
          "GradSync": "#8172B3", "UpdateShard": "#C44E52", "PrefetchW": "#937860", "Update": "#DA8BC3",
          "ToHost": "#64B5CD", "FromHost": "#CCB974", "Convert": "#8C8C8C"}
SHORT = {"GradSync": "G", "UpdateShard": "U", "PrefetchW": "P", "Update": "Upd"}
COMPUTE_KINDS = ("F", "B", "W", "R")
GIB = 2 ** 30
LABEL_PT_PER_CHAR = 0.65 * 6      # the box labels' width per character at 6 pt


def _save(fig, path: str | os.PathLike) -> None:
    atomic_write_figure(path, fig, dpi=120, bbox_inches="tight")


def _boxes(tasks: list[Task], chunk_of: dict[int, int] | None = None) -> list[tuple[str, str, float, float]]:
    """(kind, label, start, end); consecutive per-layer pieces of one F/B/W/R of a micro-batch merge.
    ``chunk_of`` (layer -> stage-local chunk, interleaved) adds the chunk to the label: F3c1."""
    out: list[list] = []
    for t in sorted(tasks, key=lambda t: (t.start_ms, t.end_ms)):
        if t.kind in COMPUTE_KINDS + ("Send", "Recv"):
            label = f"{t.kind}{t.microbatch}" if t.kind in COMPUTE_KINDS else ""
            if label and chunk_of and t.layer in chunk_of:
                label += f"c{chunk_of[t.layer]}"
        else:
            label = f"{SHORT.get(t.kind, t.kind)}{'' if t.layer is None else t.layer}"
        if out and t.kind in COMPUTE_KINDS and out[-1][0] == t.kind and out[-1][1] == label \
                and abs(out[-1][3] - t.start_ms) < 1e-9:
            out[-1][3] = t.end_ms
            continue
        out.append([t.kind, label, t.start_ms, t.end_ms])
    return [tuple(b) for b in out]


def plot_timeline(result, path: str | os.PathLike, *, stages: Sequence[int] | None = None,
                  t_range: tuple[float, float] | None = None, title: str | None = None,
                  max_labels: int = 600) -> None:
    """Draw a SimResult's timeline (or a subset of stages / a time window) to ``path``."""
    tasks: list[Task] = list(result.tasks)
    if not tasks:
        raise ConfigError("plot_timeline: the timeline has no tasks")
    all_stages = sorted({t.stage for t in tasks})
    stages = all_stages if stages is None else list(stages)
    for p in stages:
        if p not in all_stages:
            raise ConfigError(f"plot_timeline: stage {p} not in the timeline (stages {all_stages})")
    step = getattr(result, "step_time_ms", None)
    lo, hi = t_range if t_range is not None else (0.0, max(max(t.end_ms for t in tasks), step or 0.0))
    if not hi > lo:
        raise ConfigError(f"plot_timeline: empty time range {lo}..{hi}")
    rows: list[tuple[str, list[Task]]] = []
    for p in stages:
        mine = [t for t in tasks if t.stage == p and t.end_ms >= lo and t.start_ms <= hi]
        rows.append((f"S{p} compute", [t for t in mine if t.resource == "compute"]))
        for res in ("ddr", "link", "d2h", "h2d", "host"):      # the host side only where something offloads
            sub = [t for t in mine if t.resource == res]
            if sub:
                rows.append((f"S{p} {res}", sub))
    chunk_of = None
    v = getattr(result, "virtual_stages", 1)
    if v > 1:
        n_stages = len(result.stage_layers)
        chunks = result.pipeline.chunks(sum(len(x) for x in result.stage_layers), n_stages)
        chunk_of = {layer: g // n_stages for g, r in enumerate(chunks) for layer in r}
    from matplotlib.patches import Patch  # after plt: its first use sets the backend
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(14, 0.5 * len(rows) + 1.6))
    span = hi - lo
    # a box is labelled only where its label fits inside it with 2 pt each side (6 pt text, about 0.65 em a
    # character)
    pt_per_ms = ax.get_position().width * fig.get_figwidth() * 72 / span
    labels = 0
    used = set()
    for i, (_, row) in enumerate(rows):
        y = len(rows) - 1 - i
        per_kind: dict[str, list[tuple[float, float]]] = {}
        for kind, label, a, b in _boxes(row, chunk_of):
            if b <= a:
                continue
            per_kind.setdefault(kind, []).append((a, b - a))
            fits = (b - a) >= 0.012 * span and (b - a) * pt_per_ms >= LABEL_PT_PER_CHAR * len(label) + 4
            if label and fits and labels < max_labels and a >= lo and b <= hi:
                ax.text((a + b) / 2, y, label, ha="center", va="center", fontsize=6, clip_on=True,
                        color="white" if kind in ("F", "B", "W", "GradSync", "UpdateShard") else "black")
                labels += 1
        for kind, bars in per_kind.items():
            ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=COLORS.get(kind, "#333333"),
                           edgecolor="white", linewidth=0.3)
            used.add(kind)
    last_b = getattr(result, "last_backward_end_ms", None)
    if last_b is not None and lo <= last_b <= hi:
        ax.axvline(last_b, color="black", linestyle="--", linewidth=0.8)
    if step is not None and lo <= step <= hi:
        ax.axvline(step, color="red", linewidth=1.0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([name for name, _ in reversed(rows)], fontsize=8)
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    # data stay in ms; the axis reads in the unit that suits the span drawn
    unit, per = time_unit(span)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x / per:g}"))
    ax.set_xlabel(f"time ({unit})")
    handles = [Patch(color=COLORS[k], label=k) for k in COLORS if k in used]
    if last_b is not None and lo <= last_b <= hi:
        handles.append(plt.Line2D([], [], color="black", linestyle="--", label="last backward"))
    if step is not None and lo <= step <= hi:
        handles.append(plt.Line2D([], [], color="red", label="step end"))
    # 0.6 inch under the axes, clear of the tick labels and the axis label, however tall the axes
    below = 0.6 / (ax.get_position().height * fig.get_figheight())
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -below),
              ncol=min(len(handles), 6), fontsize=8, frameon=False)
    if title is None and step is not None:
        v = getattr(result, "virtual_stages", 1)
        title = (f"{getattr(result, 'schedule', '')}{f' v={v}' if v > 1 else ''} step {format_ms(step)}, exposed tail "
                 f"{format_ms(getattr(result, 'exposed_tail_ms', 0.0))}"
                 + ("" if t_range is None else f"; window {format_ms(lo)} to {format_ms(hi)}"))
    if title:
        ax.set_title(title, fontsize=10)
    _save(fig, path)


def plot_stage_memory(stages_peak_bytes: Sequence[float], budget_bytes: float, path: str | os.PathLike, *,
                      labels: Sequence[str] | None = None, title: str | None = None) -> None:
    """Bar per stage of peak memory (GiB = 2**30 bytes) with the budget as a line; over-budget bars are red."""
    peaks = list(stages_peak_bytes)
    if not peaks:
        raise ConfigError("plot_stage_memory: no stages given")
    if any(v < 0 for v in peaks) or not budget_bytes > 0:
        raise ConfigError(f"plot_stage_memory: peaks must be >= 0 and the budget > 0, got budget {budget_bytes}")
    if labels is not None and len(labels) != len(peaks):
        raise ConfigError(f"plot_stage_memory: {len(labels)} labels for {len(peaks)} stages")
    names = list(labels) if labels is not None else [f"S{p}" for p in range(len(peaks))]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(peaks) + 2), 3.2))
    colors = ["#C44E52" if v > budget_bytes else "#4C72B0" for v in peaks]
    ax.bar(range(len(peaks)), [v / GIB for v in peaks], color=colors)
    ax.axhline(budget_bytes / GIB, color="black", linestyle="--", linewidth=1.0,
               label=f"budget {budget_bytes / GIB:.2f} GiB")
    ax.set_xticks(range(len(peaks)))
    ax.set_xticklabels(names, fontsize=8, rotation=0 if len(peaks) <= 16 else 90)
    ax.set_ylabel("peak memory (GiB)")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    _save(fig, path)


__all__ = ["COLORS", "plot_stage_memory", "plot_timeline"]

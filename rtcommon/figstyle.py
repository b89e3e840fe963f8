"""One style for every figure the project writes: sizes, fonts, and x tick labels that do not run
into each other.

Figure modules make their figures with :func:`subplots` (the house fonts and a panel size) and
write them through :func:`finish` (every axes' x tick labels made readable, then laid out), so a
change of style is made here once. :func:`overlapping_xtick_labels` is what the tests use to
check the written figures: text extents measured after a draw, as the PNG shows them.
"""
from __future__ import annotations

import math
from itertools import combinations
from typing import Callable

from rtcommon.figure_check import polygons_overlap, text_corners
from rtcommon.plotting import matplotlib, plt  # imported on first use: importing this module draws nothing

FONT_SIZE = 9                  # axis labels, legends
TICK_FONT_SIZE = 8
TITLE_FONT_SIZE = 10
PANEL_SIZE = (6.0, 4.2)        # inches per panel
DPI = 110
# rotations tried, in order, until a panel's x tick labels stop overlapping
TICK_ROTATIONS = (0, 30, 45, 90)
LABEL_GAP_PX = 2.0             # the least space between two tick labels' rectangles
STYLE = {"font.size": FONT_SIZE, "axes.titlesize": TITLE_FONT_SIZE, "axes.labelsize": FONT_SIZE,
         "xtick.labelsize": TICK_FONT_SIZE, "ytick.labelsize": TICK_FONT_SIZE, "legend.fontsize": TICK_FONT_SIZE,
         "figure.titlesize": TITLE_FONT_SIZE + 1, "savefig.dpi": DPI}


def apply_style() -> None:
    """The house fonts for figures made from now on."""
    plt.rcParams.update(STYLE)


def subplots(nrows: int = 1, ncols: int = 1, panel: tuple[float, float] = PANEL_SIZE, **kwargs):
    """``plt.subplots`` in the house style, ``panel`` inches per panel (``figsize`` overrides)."""
    apply_style()
    kwargs.setdefault("figsize", (panel[0] * ncols, panel[1] * nrows))
    return plt.subplots(nrows, ncols, **kwargs)


def _power_of_ten(v: float) -> str:
    exponent = math.floor(math.log10(v) + 1e-9)
    digit = round(v / 10 ** exponent)
    return f"$10^{{{exponent}}}$" if digit == 1 else f"${digit}\\times10^{{{exponent}}}$"


def sparse_log_minor_labels(axis, keep: tuple[int, ...] = (2, 5),
                            text: Callable[[float], str] = _power_of_ten) -> None:
    """Label a log axis' minor ticks at ``keep`` times each power of ten only, as ``text`` writes them:
    where a panel spans about a decade, Matplotlib labels most of the nine and they run together."""
    def label(v: float, _pos) -> str:
        if v <= 0:
            return ""
        return text(v) if round(v / 10 ** math.floor(math.log10(v) + 1e-9)) in keep else ""
    axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(label))


def _visible_labels(ax) -> list:
    return [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text().strip()]


def _crowded_labels(ax, renderer) -> list[tuple[str, str]]:
    """Pairs of ``ax``'s x tick labels whose rotated rectangles come closer than :data:`LABEL_GAP_PX`."""
    labels = _visible_labels(ax)
    shapes = [text_corners(t, renderer) for t in labels]
    return [(a.get_text(), b.get_text()) for (a, sa), (b, sb) in combinations(zip(labels, shapes, strict=True), 2)
            if polygons_overlap(sa, sb, -LABEL_GAP_PX)]


def overlapping_xtick_labels(fig) -> list[tuple[str, str]]:
    """Pairs of x tick labels of one axes whose drawn extents (the rotated rectangles the text fills)
    overlap or come closer than :data:`LABEL_GAP_PX`, after a draw of ``fig``."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    return [pair for ax in fig.axes for pair in _crowded_labels(ax, renderer)]


def overlapping_titles(fig) -> list[tuple[str, str]]:
    """Pairs of axes titles (and the figure's title) whose drawn extents overlap."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    titles = [t for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title)]
    if fig._suptitle is not None:
        titles.append(fig._suptitle)
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in titles if t.get_visible() and t.get_text()]
    return [(a, b) for (a, box_a), (b, box_b) in combinations(boxes, 2) if box_a.overlaps(box_b)]


def readable_xticks(fig) -> None:
    """Rotate each axes' x tick labels by the least of :data:`TICK_ROTATIONS` at which none overlap
    (right-aligned under their tick when slanted); a panel whose labels fit stays as it is."""
    # one layout pass places the ticks (nothing rasterised); a rotation moves no label's anchor, so no
    # pass per rotation tried
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax in [ax for ax in fig.axes if _crowded_labels(ax, renderer)]:
        for rotation in TICK_ROTATIONS[1:]:
            for t in ax.get_xticklabels():
                t.set_rotation(rotation)
                t.set_horizontalalignment("right" if rotation < 90 else "center")
                t.set_rotation_mode("anchor" if rotation < 90 else "default")
            if not _crowded_labels(ax, renderer):
                break


def finish(fig) -> None:
    """Ready ``fig`` to be written: readable x tick labels, then the layout fitted to them."""
    readable_xticks(fig)
    if not fig.get_constrained_layout():
        fig.tight_layout()
    if _any_overlap(fig):          # tight_layout narrowed a panel: rotate further where needed
        readable_xticks(fig)
        if not fig.get_constrained_layout():
            fig.tight_layout()


def _any_overlap(fig) -> bool:
    return bool(overlapping_xtick_labels(fig))

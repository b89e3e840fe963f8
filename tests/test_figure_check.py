"""rtcommon.figure_check on hand-made figures: each kind of finding is reported where it is drawn and
not where it is not (the checker can fail)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from rtcommon.figure_check import check_figure  # noqa: E402


@pytest.fixture
def ax():
    fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
    yield ax
    plt.close(fig)


def _kinds(findings) -> list[str]:
    return [f.kind for f in findings]


def test_a_plain_figure_reads(ax):
    ax.plot([0, 1, 2], [0, 1, 0], label="rise and fall")
    ax.set_title("a title")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    assert check_figure(ax.figure, {"bbox_inches": "tight"}) == []


def test_two_texts_on_one_spot_overlap(ax):
    ax.text(0.5, 0.5, "first label", transform=ax.transAxes)
    ax.text(0.52, 0.5, "second label", transform=ax.transAxes)
    (finding,) = check_figure(ax.figure)
    assert finding.kind == "overlap"
    assert {finding.first, finding.second} == {"text 'first label' of axes 0", "text 'second label' of axes 0"}


def test_texts_side_by_side_do_not(ax):
    ax.text(0.1, 0.5, "left", transform=ax.transAxes)
    ax.text(0.6, 0.5, "right", transform=ax.transAxes)
    assert check_figure(ax.figure) == []


def test_crowded_tick_labels_are_named(ax):
    ax.set_xticks(range(6), [f"a long tick label {i}" for i in range(6)])
    findings = check_figure(ax.figure, {"bbox_inches": "tight"})
    assert findings and set(_kinds(findings)) == {"overlap"}
    assert all(f.first.startswith("x tick label 'a long") and f.second.endswith("of axes 0") for f in findings)


def test_slanted_labels_that_clear_each_other_read(ax):
    """Their axis-aligned boxes overlap; the rotated rectangles they fill do not."""
    ax.set_xticks(range(5), [f"a longer label, number {i}" for i in range(5)], rotation=45,
                  ha="right", rotation_mode="anchor")
    ax.figure.tight_layout()
    fig = ax.figure
    fig.canvas.draw()
    a, b = ax.get_xticklabels()[:2]
    renderer = fig.canvas.get_renderer()
    assert a.get_window_extent(renderer).overlaps(b.get_window_extent(renderer))
    assert check_figure(fig, {"bbox_inches": "tight"}) == []


def test_text_off_the_canvas(ax):
    ax.text(1.3, 0.5, "far right", transform=ax.transAxes)
    assert _kinds(check_figure(ax.figure)) == ["outside canvas"]
    # a tight save grows the canvas to hold it
    assert check_figure(ax.figure, {"bbox_inches": "tight"}) == []


def test_text_cut_by_its_axes(ax):
    ax.text(0.95, 0.5, "cut at the spine", transform=ax.transAxes, clip_on=True)
    assert _kinds(check_figure(ax.figure, {"bbox_inches": "tight"})) == ["clipped"]


def test_suptitle_over_a_title(ax):
    ax.set_title("the panel's title")
    ax.figure.suptitle("the figure's title", y=0.93)
    (finding,) = check_figure(ax.figure, {"bbox_inches": "tight"})
    assert {finding.first, finding.second} == {"suptitle 'the figure's title'", "title 'the panel's title' of axes 0"}


def test_legend_over_a_line(ax):
    ax.plot([0, 1], [1, 1], label="flat at the top")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper right")
    (finding,) = check_figure(ax.figure, {"bbox_inches": "tight"})
    assert finding.kind == "legend over data" and finding.second == "line 'flat at the top' of axes 0"


def test_legend_beside_the_data(ax):
    ax.plot([0, 1], [1, 1], label="flat at the top")
    ax.set_ylim(0, 2)
    ax.legend(loc="lower right")
    assert check_figure(ax.figure, {"bbox_inches": "tight"}) == []


def test_legend_over_a_segment_with_no_vertex_under_it(ax):
    """A line crossing the legend counts, though both its ends lie outside the legend."""
    ax.plot([0, 1], [0.95, 0.95], label="crossing")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper center")
    assert _kinds(check_figure(ax.figure, {"bbox_inches": "tight"})) == ["legend over data"]


def test_legend_over_bars_scatter_and_text(ax):
    ax.bar([0, 1, 2], [3, 3, 3], label="tall bars")
    ax.legend(loc="upper left")
    (finding,) = check_figure(ax.figure, {"bbox_inches": "tight"})
    assert finding.second.startswith("rectangle") and finding.second.endswith("of axes 0")
    plt.close(ax.figure)
    fig, bx = plt.subplots(figsize=(4, 3))
    bx.scatter([0.05], [0.95], s=30, label="a point")
    bx.set_xlim(0, 1)
    bx.set_ylim(0, 1)
    bx.legend(loc="upper left")
    assert [f.second for f in check_figure(fig, {"bbox_inches": "tight"})] == ["PathCollection 'a point' of axes 0"]
    plt.close(fig)
    fig, cx = plt.subplots(figsize=(4, 3))
    cx.plot([0, 1], [0, 0], label="low")
    cx.text(0.02, 0.95, "a note", transform=cx.transAxes, va="top")
    cx.legend(loc="upper left")
    covered = [f.second for f in check_figure(fig, {"bbox_inches": "tight"}) if f.kind == "legend over data"]
    assert covered == ["text 'a note' of axes 0"]
    plt.close(fig)


def test_figure_legend_over_the_tick_labels(ax):
    ax.plot([0, 1], [0, 1], label="a line")
    ax.figure.legend(loc="lower center", bbox_to_anchor=(0.5, 0.03))
    findings = [f for f in check_figure(ax.figure, {"bbox_inches": "tight"}) if f.kind == "legend over data"]
    assert findings and all(f.first == "legend of the figure" for f in findings)
    assert any(f.second.startswith("x tick label") for f in findings)


def test_measuring_a_slanted_label_leaves_it_as_it_was(ax):
    label = ax.text(0.5, 0.5, "slanted down", rotation=330, transform=ax.transAxes)
    check_figure(ax.figure)
    assert label.get_rotation() == 330

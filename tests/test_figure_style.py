"""Figures read: no two x tick labels of a panel overlap in what is written (text extents measured
after a draw, rtcommon.figstyle), for the figures whose labels ran together and a few others, drawn
from data shaped like a run's (no experiment runs)."""
from __future__ import annotations

from types import SimpleNamespace

import matplotlib.pyplot as plt
import pytest

from ratrain.repro import figures, platforms
from rtcommon import figstyle

LONG_LABELS = [f"bandwidth-rich-more-memory\nqwen2.5-32b {i}" for i in range(8)]


def _captured(monkeypatch) -> list:
    """Figures as save_figure leaves them (written nowhere; a test reads their text extents)."""
    kept = []
    monkeypatch.setattr(figures, "atomic_write_figure", lambda path, fig, **kw: kept.append(fig))
    return kept


def test_overlapping_labels_are_detected_and_rotated_apart():
    fig, ax = figstyle.subplots(panel=(4, 3))
    ax.bar(range(8), range(8))
    ax.set_xticks(range(8), LONG_LABELS)
    assert figstyle.overlapping_xtick_labels(fig)             # as drawn: they run together
    figstyle.finish(fig)
    assert figstyle.overlapping_xtick_labels(fig) == []
    assert {t.get_rotation() for t in ax.get_xticklabels()} != {0.0}
    plt.close(fig)


def test_labels_that_fit_stay_level():
    fig, ax = figstyle.subplots()
    ax.bar(range(3), [1, 2, 3])
    ax.set_xticks(range(3), ["a", "b", "c"])
    figstyle.finish(fig)
    assert {t.get_rotation() for t in ax.get_xticklabels()} == {0.0}
    plt.close(fig)


def test_table5_utilization_labels_do_not_overlap(monkeypatch, tmp_path):
    kept = _captured(monkeypatch)
    rows = [SimpleNamespace(k=k, n=n, utilization=0.65, paper_utilization=0.66)
            for k, n in ((4096, 4096), (4096, 11008), (11008, 4096), (6656, 6656), (8192, 8192))]
    variants = [{"variant": f"c-stationary {name}", "utilization": 0.6,
                 "stalls": {"dma_wait": 1e6, "barrier": 2e6, "latency": 1e5}}
                for name in ("pipelined (default tiles)", "no pipeline", "tiles mg=1024 k2=128 n2=768")]
    figures.table5_figure(rows, variants, tmp_path / "table5_utilization.png", "a-resident mg=512 kg=768")
    (fig,) = kept
    assert figstyle.overlapping_xtick_labels(fig) == []


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_platforms_slowdown_labels_do_not_overlap(monkeypatch, tmp_path):
    kept = _captured(monkeypatch)
    names = ["mt3000", "bandwidth-rich", "more-memory", "bandwidth-rich-more-memory"]
    rows = [{"kind": kind, "platform": p, "model": m, "method": method, "slowdown_vs_ratrain": 1.1}
            for kind in ("table2", "planner") for p in names for m in platforms.MODELS
            for method in platforms.BASELINES]
    platforms._figure(rows, names, tmp_path / "platforms_slowdown.png")
    (fig,) = kept
    assert figstyle.overlapping_xtick_labels(fig) == []


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("n", [4, 12, 24])
def test_bar_comparisons_of_any_width_read(monkeypatch, tmp_path, n):
    kept = _captured(monkeypatch)
    labels = [f"llama2-13b tp-heavy {i}" for i in range(n)]
    figures.bar_comparison(tmp_path / "b.png", labels, [1.0] * n, [1.1] * n, "slowdown (x)", "Table 2")
    (fig,) = kept
    assert figstyle.overlapping_xtick_labels(fig) == []


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_table3_memory_titles_do_not_collide(monkeypatch, tmp_path):
    kept = _captured(monkeypatch)
    stage = {"state_gb": 12.0, "activation_gb": 2.0, "buffer_gb": 3.0}
    rows = [{"model": model, "config": f"P={p},D=2,Z=2,b=1,A=128,seq=2048,FSR,layerwise,balanced",
             "stages": [stage] * p} for model, p in (("llama2-7b", 2), ("baichuan2-13b", 8),
                                                    ("qwen2.5-32b", 24), ("llama2-70b", 48))]
    figures.stage_memory_figure(rows, tmp_path / "table3_memory.png")
    (fig,) = kept
    assert figstyle.overlapping_titles(fig) == [] and figstyle.overlapping_xtick_labels(fig) == []
    ticks = [float(t.get_text().replace("\u2212", "-")) for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert ticks and all(t == int(t) for t in ticks)            # stages are whole numbers


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_ablation_scaleout_and_attention_figures_read(monkeypatch, tmp_path):
    kept = _captured(monkeypatch)
    variants = ["full", "w/o FSR", "w/o update-prefetch", "w/o layer-wise sync", "all off"]
    figures.ablation_figure([{"variant": v, "normalized_step": 1.0 + i / 10, "paper_normalized_step": 1.1,
                              "tail_amplification": 2.0, "paper_tail_amplification": None}
                             for i, v in enumerate(variants)], tmp_path / "ablation.png")
    figures.scaleout_figure([{"clusters": c, "tokens_per_s": 1e5 * c / 256, "paper_tokens_per_s": 0.98e5 * c / 256,
                              "efficiency": 0.999} for c in (256, 512, 768, 1024)], tmp_path / "table6_scaleout.png")
    figures.attention_figure([{"seq": s, "speedup": 3.0 + s / 2048} for s in (512, 1024, 2048, 4096)],
                             tmp_path / "attention_speedup.png", 1.24, 1.54)
    assert len(kept) == 3
    for fig in kept:
        assert figstyle.overlapping_xtick_labels(fig) == [] and figstyle.overlapping_titles(fig) == []

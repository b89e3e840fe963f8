"""The cross-platform study: comparable device counts, the field swaps, and its rows."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from ratrain.repro.cross_platform import comparable_devices, cross_platform_rows, swapped_platforms
from ratrain.repro.experiment import DEFAULT_SETTINGS
from ratrain.spec.platform import TrainingPlatform
from ratrain.spec.platforms import load_platform

PLATFORMS = Path(__file__).resolve().parents[1] / "platforms"


def test_comparable_devices_round_up_to_whole_nodes():
    mt = TrainingPlatform()
    a100, rtx = load_platform(PLATFORMS / "dgx-a100.toml"), load_platform(PLATFORMS / "rtx4090-pcie.toml")
    aggregate = 256 * 2 * mt.peak_mac_per_s
    assert comparable_devices(a100, mt, 256) == 8 * math.ceil(aggregate / 312e12 / 8) == 16
    assert comparable_devices(rtx, mt, 256) == 8 * math.ceil(aggregate / 165.2e12 / 8) == 32


def test_swapped_platforms_take_mt3000s_link_and_memory():
    mt, a100 = TrainingPlatform(), load_platform(PLATFORMS / "dgx-a100.toml")
    links, memory, both = swapped_platforms(a100, mt)
    assert links.node.intra_bandwidth == mt.link_bandwidth
    per_gpu_nic = links.network.nic_bandwidth * links.network.nics_per_node / links.node.gpus_per_node
    assert per_gpu_nic == pytest.approx(mt.link_bandwidth)
    assert links.memory_budget_bytes == a100.memory_budget_bytes
    assert memory.memory_budget_bytes == mt.memory_budget_bytes and memory.node == a100.node
    assert both.memory_budget_bytes == mt.memory_budget_bytes and both.node == links.node
    assert len({p.name for p in (links, memory, both)}) == 3


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_rows_cover_every_platform_model_and_method():
    rows, summaries = cross_platform_rows(DEFAULT_SETTINGS)
    platforms = list(dict.fromkeys(r["platform"] for r in rows))
    assert platforms[:3] == ["mt3000", "dgx-a100", "rtx4090-pcie"] and len(platforms) == 6
    assert len(summaries) == 2 * len(platforms)
    for s in summaries:
        if s["ratrain_step_s"] is not None and s["gpu_style_vs_ratrain"] is not None:
            assert s["gpu_style_vs_ratrain"] > 0
    # the same layouts' steps only grow when the links are MT-3000's
    base = {(r["model"], r["method"], r["config"]): r["step_s"] for r in rows if r["platform"] == "dgx-a100"}
    for r in rows:
        key = (r["model"], r["method"], r["config"])
        if r["platform"] == "dgx-a100+mt3000-links" and key in base and r["step_s"] is not None:
            assert r["step_s"] >= base[key] * (1 - 1e-12)

"""Platform sweeps for the rows an honest model misses (ratrain.repro.sensitivity), on the roofline profile."""
from dataclasses import replace

import pytest

from ratrain.cost.terms import pipeline_costs
from ratrain.plan.planner import Planner
from ratrain.repro import targets as paper
from ratrain.repro.experiment import Settings
from ratrain.repro.sensitivity import absolute_gap, fit_link_latency, scaleout_efficiency, sweep_link_latency
from ratrain.repro.training import ablation_config, ablation_rows, scaleout_base
from ratrain.spec.models import get_model
from ratrain.spec.platform import TrainingPlatform

pytestmark = pytest.mark.slow       # full experiments on emulated profiles

FAST = Settings(profile_source="roofline")


@pytest.fixture(scope="module")
def base():
    return scaleout_base(FAST)


def test_link_latency_fit_hits_the_target_and_efficiency_falls_with_latency(base):
    sweep = sweep_link_latency(FAST, latencies=(20e-6, 2e-3, 5e-3), base=base)
    last = [row["efficiency"][1024] for row in sweep]
    assert last[0] > last[1] > last[2]
    lat = fit_link_latency(FAST, base=base, iterations=10)
    assert lat is not None and 0 < lat < 20e-3
    eff = scaleout_efficiency(replace(FAST, platform=TrainingPlatform(link_latency_s=lat)), base)
    target = next(x[5] for x in paper.TABLE6 if x[0] == 1024)
    assert eff[1024] == pytest.approx(target, abs=2e-3)
    # the fit never touches the default platform
    assert FAST.platform.link_latency_s == 20e-6


def test_unreachable_latency_target_returns_none(base):
    assert fit_link_latency(FAST, base=base, hi=1e-6, iterations=2) is None


def test_ablation_tails_are_closed_forms_when_the_link_keeps_up():
    """With a fast link every chain finishes within the backward that follows it, so the full tail
    is stage 0's first-layer chain and the bulk (no-layerwise) tail is the sum of its chains."""
    s = replace(FAST, platform=TrainingPlatform(link_bandwidth=16e9))
    rows, _ = ablation_rows(s, partition="uniform")
    by = {r["variant"]: r for r in rows}
    model = get_model(s.ablation_model)
    cfg = ablation_config(s, "uniform")
    prof = Planner(model, s.platform, profile_source="roofline").profile(1, s.seq, 1)
    stage0 = pipeline_costs(model, cfg, prof, s.platform).stages[0]
    chain = [(layer.gradsync_ms + layer.update_ms + layer.prefetch_ms) / 1e3 for layer in stage0]
    assert by["full"]["exposed_tail_s"] == pytest.approx(chain[0], rel=1e-6)
    assert by["no-layerwise"]["exposed_tail_s"] == pytest.approx(sum(chain), rel=1e-6)
    assert by["no-layerwise"]["tail_amplification"] == pytest.approx(sum(chain) / chain[0], rel=1e-6)


def test_absolute_gap_arithmetic():
    rows = [{"model": "llama2-13b", "method": "ratrain", "config": "P=2", "step_s": 400.0, "paper_step_s": 800.0},
            {"model": "llama2-13b", "method": "tp-heavy", "config": "P=2,T=2", "step_s": 500.0,
             "paper_step_s": 900.0}]
    (g,) = absolute_gap(rows, FAST)
    assert g["paper_over_ours"] == 2.0 and g["paper_share_unexplained"] == 0.5
    assert sum(g["layer_split"].values()) == pytest.approx(1.0)
    assert g["layer_split"]["gemm"] > 0.5


def test_scale_out_accepts_cluster_counts_outside_the_paper(tmp_path):
    from ratrain.repro.training import run_table6
    from rtcommon.progress import Progress
    s = replace(FAST, table6_clusters=(256, 512, 1280))
    exp = run_table6(tmp_path, Progress(False), s)
    assert [r["clusters"] for r in exp.rows] == [256, 512, 1280]
    assert [c.name for c in exp.checks] == ["efficiency at 512 clusters"]     # no paper row for 1280
    assert (tmp_path / "table6_scaleout.png").stat().st_size > 5000


def test_scale_out_refuses_a_count_that_is_not_a_multiple_of_the_base(base):
    from ratrain.errors import ConfigError
    from ratrain.repro.training import scaleout_rows
    with pytest.raises(ConfigError, match="300"):
        scaleout_rows(replace(FAST, table6_clusters=(256, 300)), base=base)

"""Planner ranking study: the ranking measures on hand cases, the steady-state
extrapolation against a full simulation, and one small real case end to end."""
from __future__ import annotations

import dataclasses
import math

import pytest

from ratrain.cost.terms import pipeline_costs
from ratrain.plan.planner import Planner, mechanisms_for
from ratrain.repro.experiment import DEFAULT_SETTINGS, Settings
from ratrain.repro.ranking import (
    _discordant_terms,
    _sample,
    _simulate_all,
    case_ranking,
    kendall_tau_b,
    simulate_step,
    top1_regret_pct,
    top_k,
    topk_overlap,
)
from ratrain.sim.simulator import simulate
from ratrain.spec.models import get_model
from ratrain.spec.parallel import ParallelConfig

# ---------------------------------------------------------------- Kendall tau-b by hand

def test_tau_same_and_reversed_order():
    assert kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0


def test_tau_one_swap():
    # 6 pairs, only (1, 2) discordant: (5 - 1) / 6
    assert kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)


def test_tau_b_ties_in_one_sequence():
    # x ties pair (0, 1): untied pairs 2 in x, 3 in y; both untied pairs concordant: 2 / sqrt(6)
    assert kendall_tau_b([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))


def test_tau_b_ties_in_both():
    # (0, 1) tied in both; (0,2) (0,3) (1,2) (1,3) concordant, (2,3) discordant; 5 untied pairs each
    assert kendall_tau_b([1, 1, 2, 3], [5, 5, 7, 6]) == pytest.approx((4 - 1) / 5)


def test_tau_constant_is_nan_and_length_checked():
    assert math.isnan(kendall_tau_b([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="length"):
        kendall_tau_b([1, 2], [1, 2, 3])


# ---------------------------------------------------------------- regret and overlap by hand

def test_regret():
    assert top1_regret_pct([110.0, 100.0, 120.0]) == pytest.approx(10.0)
    assert top1_regret_pct([110.0, 100.0, 120.0], pick=1) == 0.0


def test_top_k_ties_go_to_the_earlier_position():
    assert top_k([3.0, 1.0, 1.0, 2.0], 2) == [1, 2]
    assert top_k([3.0, 1.0, 1.0, 2.0], 3) == [1, 2, 3]


def test_overlap():
    pred = [1, 2, 3, 4, 5, 6, 7]
    sim = [1, 2, 3, 4, 9, 5, 8]            # the simulator's top 5 swaps index 4 for index 5
    assert topk_overlap(pred, sim, 5) == pytest.approx(4 / 5)
    assert topk_overlap(pred, pred, 5) == 1.0
    assert topk_overlap([1, 2, 3], [3, 2, 1], 5) == 1.0       # fewer than k: all of them
    assert topk_overlap([1, 2, 3], [3, 2, 1], 1) == 0.0


def test_discordant_pair_charged_to_the_term_that_flips_it():
    def point(pm, pt, sm, st):
        return {"predicted_ms": pm + pt, "predicted_main_ms": pm, "predicted_tail_ms": pt,
                "simulated_ms": sm + st, "simulated_main_ms": sm, "simulated_tail_ms": st}
    # a: predicted faster (100 vs 101) but simulates slower (102 vs 101); a's main path error is -3,
    # b's 0, tails exact: the main path flips the pair
    a, b = point(95, 5, 97, 5), point(96, 5, 96, 5)
    assert _discordant_terms([a, b]) == {"main path": 1, "exposed tail": 0}
    # same totals, but now the tail is what the model got wrong
    a, b = point(95, 5, 95, 7), point(96, 5, 96, 5)
    assert _discordant_terms([a, b]) == {"main path": 0, "exposed tail": 1}
    assert _discordant_terms([a, a]) == {"main path": 0, "exposed tail": 0}


def test_sample_keeps_pick_and_order_and_is_seeded():
    ranked = list(range(50))
    s = Settings(ranking_max_configs=10, ranking_seed=3)
    got, sampled = _sample(ranked, s)
    assert sampled and len(got) == 10 and got[0] == 0 and got == sorted(got)
    assert _sample(ranked, s) == (got, True)
    assert _sample(ranked, Settings(ranking_max_configs=50)) == (ranked, False)


# ---------------------------------------------------------------- simulated steps (real profiles)

@pytest.fixture(scope="module")
def llama7b():
    model = get_model("llama2-7b")
    return model, Planner(model, progress=False).profile(1, 2048, 1)


def test_extrapolated_step_equals_the_full_simulation(llama7b):
    model, prof = llama7b
    cfg = ParallelConfig(pp=2, dp=4, zero=2, micro_batch=1, accum=40, seq=2048, activation="fsr")
    mech = mechanisms_for("ratrain", "fsr", "layerwise")
    got = simulate_step(model, cfg, prof, DEFAULT_SETTINGS.platform, mech)
    assert got.extrapolated                       # 6 + 10 + 14 micro-batches < 40
    full = simulate(pipeline_costs(model, cfg, prof, DEFAULT_SETTINGS.platform), mechanisms=mech)
    assert got.step_ms == pytest.approx(full.step_time_ms, rel=1e-9)
    assert got.main_ms == pytest.approx(full.last_backward_end_ms, rel=1e-9)
    assert got.tail_ms == pytest.approx(full.exposed_tail_ms, rel=1e-6)
    short = simulate_step(model, dataclasses.replace(cfg, accum=8), prof, DEFAULT_SETTINGS.platform, mech)
    assert not short.extrapolated


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_worker_pool_gives_the_same_steps(llama7b):
    model, prof = llama7b
    jobs = [(model, ParallelConfig(pp=2, dp=4, zero=z, micro_batch=1, accum=8, seq=2048, activation="ckpt"),
             prof, DEFAULT_SETTINGS.platform, mechanisms_for("ratrain", "ckpt", "layerwise"), "compute")
            for z in (0, 2)]
    assert _simulate_all(jobs, 2, lambda m: None) == _simulate_all(jobs, 1, lambda m: None)


def test_small_real_case():
    # Table 3's LLaMA-2-70B footprint: 96 clusters, global batch 32 -> 4 feasible configurations
    s = Settings(ranking_workers=1)
    row = case_ranking("llama2-70b", 96, 32, s)
    assert row["configs"] == row["feasible"] == len(row["points"]) == 4 and not row["sampled"]
    pts = row["points"]
    # the planner's order: non-decreasing predicted steps, and its pick is what plan() returns
    assert [p["predicted_ms"] for p in pts] == sorted(p["predicted_ms"] for p in pts)
    best = Planner(get_model("llama2-70b"), progress=False).plan(
        96, 32, 2048, "ratrain", top=1, micro_batches=(1,), tp_degrees=(1,), zero_stages=(0, 1, 2)).best
    assert row["planner_pick"] == best.config.describe(verbose=True) == pts[0]["config"]
    sims = [p["simulated_ms"] for p in pts]
    assert row["top1_regret_pct"] == pytest.approx(100 * (sims[0] / min(sims) - 1))
    assert row["kendall_tau"] == pytest.approx(kendall_tau_b([p["predicted_ms"] for p in pts], sims))
    assert -1.0 <= row["kendall_tau"] <= 1.0 and row["top5_overlap"] == topk_overlap(
        [p["predicted_ms"] for p in pts], sims)
    for p in pts:     # both sides split the step into main path + tail
        assert p["predicted_main_ms"] + p["predicted_tail_ms"] == pytest.approx(p["predicted_ms"])
        assert p["simulated_main_ms"] + p["simulated_tail_ms"] == pytest.approx(p["simulated_ms"])
        assert abs(p["predicted_ms"] / p["simulated_ms"] - 1) < 0.03      # Table 4's tolerance

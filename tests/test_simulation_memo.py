"""The reproduction's exact simulator shortcuts: ``simulate_step_time`` returns ``simulate``'s own
step time and main-path end bit for bit, and the run memo returns what a fresh simulation returns
for bit-identical inputs only; plus the exact payload comparison that checks a whole run."""
from __future__ import annotations

import dataclasses

import pytest

from ratrain.cost.tasks import LayerCosts, PipelineCosts
from ratrain.repro.experiment import DEFAULT_SETTINGS
from ratrain.repro.payload_diff import compare_payloads, differences
from ratrain.repro.training import _sim, _step_and_tail_ms
from ratrain.sim import simulation_memo
from ratrain.sim.pipeline_order import PipelineSchedule
from ratrain.sim.simulator import Mechanisms, simulate, simulate_step_time
from ratrain.spec.models import get_model
from ratrain.spec.parallel import ParallelConfig


def _costs(microbatches: int = 12, stages: int = 3, transfer: float = 0.37) -> PipelineCosts:
    # uneven layers and every lifecycle term, so recovery, state tasks and transfers all run
    layer = [LayerCosts(forward_ms=1.0 + 0.1 * i, backward_ms=2.1 + 0.05 * i, recompute_ms=0.9,
                        gradsync_ms=0.7 + 0.01 * i, update_ms=0.3, prefetch_ms=0.45,
                        act_full_bytes=1000, act_ckpt_bytes=100, recovery_bytes=900) for i in range(2 * stages)]
    return PipelineCosts([layer[2 * p:2 * p + 2] for p in range(stages)], transfer_ms=transfer,
                         microbatches=microbatches, dp=4)


CASES = [("1f1b", Mechanisms()), ("1f1b", Mechanisms.variant("no-fsr")), ("1f1b", Mechanisms.variant("no-layerwise")),
         ("1f1b", Mechanisms.variant("no-update-prefetch")), ("gpipe", Mechanisms()),
         (PipelineSchedule("interleaved", virtual_stages=2), Mechanisms()), ("zb-h1", Mechanisms.all_off())]


@pytest.mark.parametrize("schedule,mech", CASES)
def test_step_time_equals_the_full_simulation_bit_for_bit(schedule, mech):
    costs = _costs()
    full = simulate(costs, schedule=schedule, mechanisms=mech)
    step, main = simulate_step_time(costs, schedule=schedule, mechanisms=mech)
    assert step.hex() == full.step_time_ms.hex() and main.hex() == full.last_backward_end_ms.hex()


def test_memo_shares_identical_inputs_only():
    costs, mech = _costs(), Mechanisms()
    fresh = simulate(costs, mechanisms=mech)
    with simulation_memo.enabled() as memo:
        first = simulate(costs, mechanisms=mech)
        assert simulate(_costs(), mechanisms=mech) is first          # equal inputs, another object
        assert simulate_step_time(costs, mechanisms=mech) == (first.step_time_ms, first.last_backward_end_ms)
        other = simulate(_costs(transfer=0.38), mechanisms=mech)     # one field differs: simulated anew
        assert other is not first and other.step_time_ms != first.step_time_ms
        assert simulate(costs, mechanisms=dataclasses.replace(mech, fsr_lookahead=2)) is not first
        assert memo.misses == 3 and memo.hits == 2
    assert simulation_memo.active() is None
    assert first.step_time_ms == fresh.step_time_ms and first.tasks == fresh.tasks and first.stages == fresh.stages


@pytest.mark.parametrize("mech", [Mechanisms.variant("no-fsr"), Mechanisms(activation="full", fsr=False),
                                  Mechanisms.all_off()])
def test_where_recovery_would_run_is_one_key_without_fsr(mech):
    """Without FSR there is no recovery task: the step on the other recovery resource is the same
    simulation, so the memo hands it back; with FSR it is simulated anew."""
    ddr = dataclasses.replace(_costs(), recovery_resource="ddr")
    alone = simulate(ddr, mechanisms=mech)
    with simulation_memo.enabled() as memo:
        first = simulate(_costs(), mechanisms=mech)
        assert simulate(ddr, mechanisms=mech) is first
        assert simulate_step_time(ddr, mechanisms=mech) == (first.step_time_ms, first.last_backward_end_ms)
        assert simulate(ddr, mechanisms=Mechanisms()) is not simulate(_costs(), mechanisms=Mechanisms())
        assert memo.misses == 3
    assert alone.to_json() == first.to_json()


def test_memo_tells_zero_from_negative_zero_and_drops_old_full_results(monkeypatch):
    memo = simulation_memo.SimulationMemo()
    assert memo.key(0.0, "1f1b", None) != memo.key(-0.0, "1f1b", None)
    monkeypatch.setattr(simulation_memo, "FULL_RESULTS", 2)
    for i in range(3):
        memo.store(("k", i), object(), (float(i), 0.0))
    assert list(memo.results) == [("k", 1), ("k", 2)] and len(memo.steps) == 3


def test_payload_comparison_ignores_timings_and_folders_only():
    exp = {"key": "ranking", "rows": [{"tau": 0.5, "seconds": 3.0}], "seconds": 9.0, "timing": {"wall_s": 9.0},
           "figures": ["/a/ranking.png"], "notes": ["Study time 9 s."],
           "text": "model  tau  seconds\n-----  ---  -------\nx      0.5  3"}
    before = {"experiments": {"ranking": exp}, "report": "/a/report.md", "timing": {"wall_s": 1.0}}
    after = {"experiments": {"ranking": {**exp, "rows": [{"tau": 0.5, "seconds": 1.0}], "seconds": 2.0,
                                         "figures": ["/b/ranking.png"], "notes": ["Study time 2 s."],
                                         "text": exp["text"].replace("x      0.5  3", "x      0.5  1")}},
             "report": "/b/report.md", "timing": {"wall_s": 5.0}}
    assert compare_payloads(before, after) == []
    moved = {**after, "experiments": {"ranking": {**after["experiments"]["ranking"],
                                                  "rows": [{"tau": 0.5000000000000001}]}}}
    assert compare_payloads(before, moved) == ["experiments.ranking.rows[0].tau: 0.5 -> 0.5000000000000001"]
    assert differences({"x": -0.0}, {"x": 0.0}) == ["x: -0.0 -> 0.0"]
    assert differences({"x": float("nan")}, {"x": float("nan")}) == []


@pytest.mark.parametrize("variant", ["full", "no-fsr", "no-layerwise"])
def test_sensitivity_steps_equal_the_experiments_simulation(variant):
    # the sweeps' step-only path against the SimCheck path the tables use, on the shipped profile
    model = get_model("llama2-7b")
    cfg = ParallelConfig(pp=2, dp=4, zero=2, micro_batch=1, accum=6, seq=2048, activation="fsr")
    mech = Mechanisms.variant(variant)
    chk = _sim(model, cfg, "ratrain", DEFAULT_SETTINGS, mechanisms=mech)
    step, tail = _step_and_tail_ms(model, cfg, "ratrain", DEFAULT_SETTINGS, mechanisms=mech)
    assert step.hex() == chk.simulated_ms.hex() and tail.hex() == chk.result.exposed_tail_ms.hex()


"""`ratrain reproduce schedules` on a small layout with roofline latencies (no emulation)."""
from __future__ import annotations

import json

import pytest

from ratrain.errors import ConfigError
from ratrain.repro.experiment import Settings
from ratrain.repro.schedules import SCHEDULE_SET, paper_layouts, run_schedules
from ratrain.sim.pipeline_order import interleaved_chunk_sizes
from ratrain.spec.models import FP16, get_model, layer_tp_parameter_count, stage_edge_parameters
from ratrain.spec.parallel import ParallelConfig

S = Settings(profile_source="roofline")
CFG = ParallelConfig(pp=2, dp=2, tp=1, zero=2, micro_batch=1, accum=4, seq=2048, activation="fsr")


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    out = tmp_path_factory.mktemp("schedules")
    return run_schedules(out, lambda msg: None, S, layouts=[("test", "llama2-7b", CFG)]), out


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_rows_figures_and_strict_json(experiment):
    exp, out = experiment
    rows = {r["schedule"]: r for r in exp.rows}
    assert list(rows) == [name for name, _ in SCHEDULE_SET]
    json.dumps(exp.to_json(), allow_nan=False)
    for r in rows.values():
        assert r["step_s"] > 0 and r["step_without_s"] > 0 and r["gain"] == pytest.approx(
            r["step_without_s"] / r["step_s"])
        assert len(r["peak_gb"]) == len(r["idle_s"]) == len(r["link_gb"]) == CFG.pp
        assert r["max_peak_gb"] == pytest.approx(max(r["peak_gb"]))
    assert rows["1f1b"]["vs_1f1b"] == 1.0
    # the analytic model's in-flight count is 1F1B's; the measured one follows each schedule
    assert rows["1f1b"]["in_flight_analytic"] == rows["1f1b"]["in_flight_schedule"] == [2, 1]
    assert rows["zb-h1"]["activation_sets"] == rows["zb-h1"]["in_flight_schedule"] == [2.0, 2.0]
    assert rows["gpipe"]["activation_sets"] == [4.0, 4.0]
    # interleaving: about v times the boundary traffic; the collectives do not change
    assert rows["interleaved"]["boundary_gb"] > 2 * rows["1f1b"]["boundary_gb"]
    assert rows["interleaved"]["stage_layer_counts"] == rows["1f1b"]["stage_layer_counts"] == [16, 16]
    for f in exp.figures:
        assert (out / f.split("/")[-1]).read_bytes()[:4] == b"\x89PNG"
    assert {c.ok for c in exp.checks} <= {True, False} and exp.checks


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_link_bytes_by_hand(experiment):
    exp, _ = experiment
    r = next(x for x in exp.rows if x["schedule"] == "1f1b")
    m = get_model("llama2-7b")
    act = 2048 * m.hidden * FP16
    emb, head = stage_edge_parameters(m, 2, 1)
    grads0 = FP16 * (16 * layer_tp_parameter_count(m, 1) + emb)
    # stage 0: 4 forward sends + 4 backward receives; reduce-scatter and all-gather each move (D-1)/D
    want0 = 8 * act + grads0 * 0.5 + grads0 * 0.5
    assert r["link_gb"][0] * 2 ** 30 == pytest.approx(want0, rel=1e-12)


def test_layouts_and_chunk_errors():
    lay = paper_layouts(S)
    assert [(src, name, c.pp, c.dp, c.accum) for src, name, c in lay] == [
        ("table2", "llama2-13b", 2, 128, 32), ("table2", "qwen2.5-32b", 8, 32, 128),
        ("table3", "llama2-7b", 2, 4, 128), ("table3", "baichuan2-13b", 8, 2, 128),
        ("table3", "qwen2.5-32b", 16, 4, 128), ("table3", "llama2-70b", 48, 2, 16)]
    sizes = interleaved_chunk_sizes(get_model("qwen2.5-32b"), lay[1][2], 2)
    assert len(sizes) == 16 and sum(sizes) == 64
    assert [sizes[p] + sizes[p + 8] for p in range(8)] == [7, 8, 8, 8, 8, 9, 9, 7]   # the balanced 1F1B split
    with pytest.raises(ConfigError, match="80 layers cannot be cut into P x v = 48 x 2"):
        interleaved_chunk_sizes(get_model("llama2-70b"), lay[5][2], 2)

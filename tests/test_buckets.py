"""Gradient buckets in the event simulator: hand-derived steps, the two limits, the sweep, bad input."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ratrain.cli import main as ratrain_main
from ratrain.cost.collectives import collectives_for, ring_allreduce_ms
from ratrain.cost.tasks import PipelineCosts
from ratrain.cost.terms import load_profile, pipeline_costs
from ratrain.errors import ConfigError
from ratrain.sim.bucket_sweep import bucket_sweep, default_sizes
from ratrain.sim.buckets import GradBuckets, group_layers
from ratrain.sim.simulator import Mechanisms, simulate
from ratrain.sim.trace import chrome_trace
from ratrain.spec.models import get_model
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platforms import load_platform

PLATFORMS = Path(__file__).resolve().parents[1] / "platforms"


def _json(result) -> dict:
    out = result.to_json(timeline=True)
    out.pop("gradient_buckets", None)
    return out


def _two_layers(**kw) -> PipelineCosts:
    # one stage, one micro-batch, two layers: F 1 ms and B 2 ms each, GradSync 3 ms each (1 ms of it
    # the collective's launch), 100 gradient bytes each
    return PipelineCosts.uniform(1, 1, t_forward=2, t_backward=4, t_gradsync=6, layers_per_stage=2,
                                 grad_bytes=100, gradsync_launch_ms=1.0, **kw)


def test_one_layer_bucket_is_layerwise_gradsync_exactly():
    costs = PipelineCosts.uniform(3, 6, t_forward=1.5, t_backward=2.5, t_gradsync=4.0, t_update=0.7,
                                  t_prefetch=0.4, t_recompute=1.0, layers_per_stage=3, grad_bytes=1000,
                                  gradsync_launch_ms=0.2, prefetch_resource="link")
    for mech in (Mechanisms(), Mechanisms.variant("no-update-prefetch"), Mechanisms.all_off()):
        plain = simulate(costs, mechanisms=mech)
        for size in (1, 1000):          # no larger than the smallest layer gradient: one layer per bucket
            bucketed = simulate(costs, mechanisms=mech, buckets=GradBuckets(size))
            assert _json(bucketed) == _json(plain)
            assert all(len(b.layers) == 1 for b in bucketed.buckets)


def test_two_layer_step_by_hand():
    # F0 [0,1] F1 [1,2] B1 [2,4] B0 [4,6]. Layer-wise: GradSync(1) [4,7]; GradSync(0) ready at 6, the
    # link busy until 7: [7,10]. The step repeats once layer 0's chain (zero-length update and prefetch)
    # is done before its next forward: T = 10.
    costs = _two_layers()
    plain = simulate(costs)
    assert plain.step_time_ms == pytest.approx(10.0)
    layerwise = simulate(costs, buckets=GradBuckets(100))
    b1, b0 = layerwise.buckets
    assert (b1.layers, b1.start_ms, b1.end_ms) == ((1,), 4.0, 7.0)
    assert (b0.layers, b0.ready_ms, b0.start_ms, b0.end_ms) == ((0,), 6.0, 7.0, 10.0)
    assert b0.wait_link_ms == pytest.approx(1.0) and b0.wait_data_ms == 0.0
    # one bucket of both: waits on data from 4 (layer 1) to 6 (layer 0), then one collective of
    # 3 + 3 - 1 = 5 ms (one launch saved): [6, 11]; T = 11
    one = simulate(costs, buckets=GradBuckets(200))
    (b,) = one.buckets
    assert (b.layers, b.first_gradient_ms, b.ready_ms, b.start_ms, b.end_ms) == ((1, 0), 4.0, 6.0, 6.0, 11.0)
    assert b.wait_data_ms == pytest.approx(2.0) and b.wait_link_ms == 0.0
    assert one.step_time_ms == pytest.approx(11.0)
    summary = one.to_json(timeline=False)["gradient_buckets"]
    assert summary["exposed_after_last_backward_ms"] == pytest.approx(5.0)
    assert summary["link_ms"] == pytest.approx(5.0)
    # the trace shows the wait on data (and no wait on the link)
    trace = chrome_trace(one.tasks, buckets=one.buckets)
    waits = [e for e in trace["traceEvents"] if e.get("cat") == "bucket"]
    assert [(e["name"], e["ts"], e["dur"]) for e in waits] == [("bucket 0 waits on data", 4000.0, 2000.0)]


def test_one_bucket_of_everything_is_the_step_end_allreduce():
    # D = 4 replicas, ring all-reduce at 3.7 GB/s with 20 us per step: each layer's GradSync is the
    # ring all-reduce of its gradient, the launch its cost at zero bytes. One bucket of the whole
    # stage must be one all-reduce of the stage's gradient, starting at the stage's last backward.
    bw, lat, D, layers, g = 3.7e9, 20e-6, 4, 4, 50_000_000
    per_layer = ring_allreduce_ms(g, D, bw, lat)
    launch = ring_allreduce_ms(0, D, bw, lat)
    assert launch == pytest.approx(1e3 * 2 * (D - 1) * lat)
    costs = PipelineCosts.uniform(1, 2, t_forward=4, t_backward=8, t_gradsync=layers * per_layer,
                                  layers_per_stage=layers, grad_bytes=g, gradsync_launch_ms=launch, dp=D)
    everything = simulate(costs, buckets=GradBuckets(layers * g))
    (b,) = everything.buckets
    step_end = 1e3 * (2 * (D - 1) / D * layers * g / bw + 2 * (D - 1) * lat)
    assert b.end_ms - b.start_ms == pytest.approx(step_end, rel=1e-12)
    assert b.start_ms == everything.last_backward_end_ms
    # and so does bulk step-end processing with one bucket
    bulk = simulate(costs, mechanisms=Mechanisms.all_off(), buckets=GradBuckets(10 ** 12))
    assert bulk.buckets[0].end_ms - bulk.buckets[0].start_ms == pytest.approx(step_end, rel=1e-12)
    assert everything.step_time_ms == pytest.approx(everything.last_backward_end_ms + step_end)


def test_grouping_closes_a_bucket_at_its_size():
    sizes = {3: 40, 2: 40, 1: 40, 0: 100}
    assert group_layers([3, 2, 1, 0], sizes, 80) == [[3, 2], [1, 0]]
    assert group_layers([3, 2, 1, 0], sizes, 1) == [[3], [2], [1], [0]]
    assert group_layers([3, 2, 1, 0], sizes, 10 ** 9) == [[3, 2, 1, 0]]


def test_sweep_finds_the_best_size():
    # launch small against the GradSync: layer-wise wins (10 ms against 11 ms above)
    points, best = bucket_sweep(_two_layers())
    assert [q.bucket_bytes for q in points] == [100, 200] == default_sizes(_two_layers())
    assert [q.step_time_ms for q in points] == pytest.approx([10.0, 11.0])
    assert best.bucket_bytes == 100
    # launch nearly all of each GradSync (2.9 of 3 ms), four layers, B3..B0 ending at 6, 8, 10, 12:
    # layer-wise the link runs 4 x 3 ms from 6: T = 18; one bucket of all: 12 - 3 x 2.9 = 3.3 ms from
    # 12: T = 15.3; two buckets of two layers: 3.1 ms from 8 (hidden) and from 12: T = 15.1, the best
    costs = PipelineCosts.uniform(1, 1, t_forward=4, t_backward=8, t_gradsync=12, layers_per_stage=4,
                                  grad_bytes=100, gradsync_launch_ms=2.9)
    points, best = bucket_sweep(costs)
    assert [q.bucket_bytes for q in points] == [100, 200, 400]
    assert [q.step_time_ms for q in points] == pytest.approx([18.0, 15.1, 15.3])
    assert [q.link_ms for q in points] == pytest.approx([12.0, 6.2, 3.3])
    assert [q.exposed_ms for q in points] == pytest.approx([6.0, 3.1, 3.3])
    assert best.bucket_bytes == 200


def test_bucket_bad_input():
    with pytest.raises(ConfigError, match="bucket size"):
        GradBuckets(0)
    with pytest.raises(ConfigError, match="no gradient size"):
        simulate(PipelineCosts.uniform(1, 1, t_forward=1, t_backward=1, t_gradsync=1), buckets=GradBuckets(8))
    with pytest.raises(ConfigError, match="shorter than one collective's launch"):
        simulate(PipelineCosts.uniform(1, 1, t_forward=1, t_backward=1, t_gradsync=1, grad_bytes=8,
                                       gradsync_launch_ms=2.0), buckets=GradBuckets(8))


UNIFORM = ["simulate", "--uniform", "--stages", "2", "--microbatches", "2", "--t-forward", "1", "--t-backward", "2",
           "--t-gradsync", "2", "--layers-per-stage", "2"]


@pytest.mark.parametrize("extra, message", [
    (["--bucket-bytes", "0", "--layer-grad-bytes", "10"], "gradient bucket size must be an integer >= 1 byte"),
    (["--offload", "weights"], "offload target 'weights' is not one of"),
    (["--offload", "optimizer", "--host-link-bandwidth", "0"], "host field 'link_bandwidth' = 0"),
])
def test_cli_bad_input_is_one_line(capsys, extra, message):
    assert ratrain_main(UNIFORM + extra + ["--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_sweep_and_buckets(capsys):
    assert ratrain_main(UNIFORM + ["--layer-grad-bytes", "100", "--t-launch", "0.5", "--bucket-bytes", "200",
                                   "--bucket-sweep", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["gradient_buckets"]["bucket_bytes"] == 200
    assert [s["buckets"] for s in payload["gradient_buckets"]["stages"]] == [1, 1]
    sweep = payload["bucket_sweep"]
    assert [q["bucket_bytes"] for q in sweep["points"]] == [100, 200]
    assert sweep["best"]["step_time_ms"] == min(q["step_time_ms"] for q in sweep["points"])
    assert math.isfinite(sweep["best"]["link_ms"])


def test_one_bucket_is_the_step_end_collective_with_the_cost_model():
    # Megatron's step end on a GPU cluster: each stage reduce-scatters its whole gradient after its
    # last backward (ratrain.cost.megatron). With the cost model's per-layer GradSyncs and launch, one
    # bucket of a stage is that one collective.
    platform = load_platform(PLATFORMS / "dgx-a100.toml")
    model = get_model("llama2-7b")
    cfg = ParallelConfig(pp=2, dp=4, tp=1, zero=2, accum=4, activation="ckpt")
    costs = pipeline_costs(model, cfg, load_profile(model, 1, cfg.seq, 1, platform=platform), platform)
    net = collectives_for(platform, cfg.tp, cfg.dp, cfg.pp)
    assert costs.gradsync_launch_ms == pytest.approx(net.reduce_scatter_ms(0, "dp"))
    result = simulate(costs, mechanisms=Mechanisms.all_off(), buckets=GradBuckets(10 ** 15))
    for b in result.buckets:
        stage_bytes = sum(lc.grad_bytes for lc in costs.stages[b.stage])
        assert b.nbytes == stage_bytes
        assert b.end_ms - b.start_ms == pytest.approx(net.reduce_scatter_ms(stage_bytes, "dp"), rel=1e-9)

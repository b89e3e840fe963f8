"""Offloading to the host: transfer waits by hand, the host-side update, gradient conversion,
the memory model, and the invariants (never a higher device peak, never a shorter step)."""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from ratrain.cli import main as ratrain_main
from ratrain.cost.tasks import PipelineCosts
from ratrain.errors import ConfigError
from ratrain.sim.offload import (
    ADAM_FLOPS,
    HOST_ADAM_BYTES,
    OffloadPlan,
    conversion_choice,
    conversion_paths,
)
from ratrain.sim.simulator import Mechanisms, activation_residency, simulate
from ratrain.spec.host import HostSide, host_of
from ratrain.spec.memory import max_peak, stage_memory
from ratrain.spec.models import get_model
from ratrain.spec.offload import Offload
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import TrainingPlatform
from ratrain.spec.platforms import load_platform

# 1 GB/s, no latency: a transfer of V bytes lasts V / 1e6 ms
HOST = HostSide(link_bandwidth=1e9, link_latency_s=0.0, memory_bandwidth=8e9, cores=4, core_flops=1e9)
FREE = HostSide(link_bandwidth=1e14, link_latency_s=0.0, memory_bandwidth=8e9, cores=4, core_flops=1e9)


def _plan(targets=(), host=HOST, **kw) -> OffloadPlan:
    options = {k: kw.pop(k) for k in ("host_adam", "convert", "reload_lookahead") if k in kw}
    return OffloadPlan(Offload(tuple(targets), **options), host, **kw)


def _task(result, kind, layer, mb=None):
    (t,) = [t for t in result.tasks if t.kind == kind and t.layer == layer and t.microbatch == mb]
    return t


def test_activation_reload_waits_v_over_b_minus_window():
    # one stage, one micro-batch, three layers, full activations of 3e6 B (3 ms each way).
    # F0 [0,1] F1 [1,2] F2 [2,3]; ToHost 0, 1, 2 queue on d2h: [1,4] [4,7] [7,10].
    # Reload 2 (may start after F1 and ToHost 2): [10,13], so B2 [13,15] (ready at 3).
    # Reload 1 (after F2 and ToHost 1): [7,10]; B1 [15,17].
    # Reload 0 may start once B2 ends (one compute task ahead of B0): W = 17 - 15 = 2 ms, so B0 waits
    # max(0, V/B - W) = 1 ms: [18, 20].
    costs = PipelineCosts.uniform(1, 1, t_forward=3, t_backward=6, layers_per_stage=3,
                                  act_full_bytes=3_000_000, act_ckpt_bytes=1_000_000)
    mech = Mechanisms(activation="full", fsr=False)
    r = simulate(costs, mechanisms=mech, offload=_plan(["activations"]))
    assert [(_task(r, "ToHost", i, 0).start_ms, _task(r, "ToHost", i, 0).end_ms) for i in range(3)] == \
        [(1.0, 4.0), (4.0, 7.0), (7.0, 10.0)]
    assert (_task(r, "FromHost", 0, 0).start_ms, _task(r, "FromHost", 0, 0).end_ms) == (15.0, 18.0)
    assert [_task(r, "B", i, 0).start_ms for i in (2, 1, 0)] == [13.0, 15.0, 18.0]
    assert r.last_backward_end_ms == 20.0
    act = r.to_json(timeline=False)["offload"]["transfers"]["activations"]
    assert act["bytes"] == 6 * 3_000_000 and act["max_consumer_wait_ms"] == pytest.approx(10.0)
    # resident: B at 3, 5, 7; the step is longer with the tensors away. The link is too slow to empty the
    # device before F2 (at 2.5 ms all three sets are still there), so the peak is not lower, only shorter
    resident = simulate(costs, mechanisms=mech)
    assert resident.last_backward_end_ms == 9.0
    assert max(activation_residency(r, costs)) == max(activation_residency(resident, costs)) == 9_000_000
    # a link ten times faster (0.3 ms a transfer) has layer 0's set gone before F2 ends
    fast = simulate(costs, mechanisms=mech, offload=_plan(["activations"], host=HostSide(
        link_bandwidth=1e10, link_latency_s=0.0)))
    assert max(activation_residency(fast, costs)) == 6_000_000


def test_state_fetch_before_a_device_update():
    # one stage, one micro-batch, two layers of 250k parameters: 3e6 B of master + moments each (3 ms).
    # B1 [2,4] B0 [4,6]; FromHost 1 [4,7], UpdateShard 1 [7,7.5]; FromHost 0 ready at 6, h2d busy:
    # [7,10], UpdateShard 0 [10,10.5], then the state goes back; T = 10.5 (resident: 6.5)
    costs = PipelineCosts.uniform(1, 1, t_forward=2, t_backward=4, t_update=1.0, layers_per_stage=2,
                                  grad_bytes=500_000)
    r = simulate(costs, offload=_plan(["optimizer", "master"]))
    assert (_task(r, "FromHost", 1).start_ms, _task(r, "FromHost", 1).end_ms) == (4.0, 7.0)
    assert (_task(r, "UpdateShard", 0).start_ms, _task(r, "UpdateShard", 0).end_ms) == (10.0, 10.5)
    assert (_task(r, "ToHost", 0).start_ms, _task(r, "ToHost", 0).end_ms) == (10.5, 13.5)
    assert r.step_time_ms == pytest.approx(10.5)
    assert simulate(costs).step_time_ms == pytest.approx(6.5)
    stage = r.to_json(timeline=False)["offload"]["stages"][0]
    assert stage["state_buffer_peak_bytes"] == 2 * 3_000_000      # layer 1 writing back while layer 0 arrives


def test_host_adam_runs_on_the_host_cores():
    n = 1_000_000
    costs = PipelineCosts.uniform(1, 1, t_forward=1, t_backward=2, t_update=5.0, grad_bytes=2 * n)
    r = simulate(costs, offload=_plan(host_adam=True, convert="host"))
    u = _task(r, "UpdateShard", 0)
    expected = 1e3 * max(n * HOST_ADAM_BYTES / HOST.memory_bandwidth, n * ADAM_FLOPS / (HOST.cores * HOST.core_flops))
    assert u.resource == "host" and u.end_ms - u.start_ms == pytest.approx(expected)
    # 16-bit gradients out (2 ms), converted on the host (6 B per parameter at 8 GB/s), FP16 weights back
    x = _task(r, "ToHost", 0)
    assert x.end_ms - x.start_ms == pytest.approx(2.0) and x.start_ms == 3.0
    c = _task(r, "Convert", 0)
    assert c.resource == "host" and c.end_ms - c.start_ms == pytest.approx(1e3 * 6 * n / 8e9)
    assert u.start_ms == pytest.approx(c.end_ms)
    back = _task(r, "FromHost", 0)
    assert back.start_ms == pytest.approx(u.end_ms) and back.end_ms - back.start_ms == pytest.approx(2.0)
    # the same step with a free link is never longer
    assert simulate(costs, offload=_plan(host=FREE, host_adam=True, convert="host")).step_time_ms \
        <= r.step_time_ms + 1e-9


def test_conversion_paths_and_the_flip_bandwidth():
    host, rate, n = HostSide(link_latency_s=0.0), 1e11, 1_000_000
    paths = conversion_paths(host, n, rate)
    assert paths["device_path_ms"] == pytest.approx(1e3 * (6 * n / rate + 4 * n / host.link_bandwidth))
    assert paths["host_path_ms"] == pytest.approx(1e3 * (2 * n / host.link_bandwidth + 6 * n / host.memory_bandwidth))
    # equal where 2 / B = 6 / host_bw - 6 / device_rate
    flip = 2 / (6 / host.memory_bandwidth - 6 / rate)
    assert paths["flip_link_bandwidth"] == pytest.approx(flip)
    for factor, faster in ((1.01, "device"), (0.99, "host")):
        moved = conversion_paths(HostSide(link_bandwidth=flip * factor, link_latency_s=0.0), n, rate)
        assert moved["faster"] == faster
    assert paths["device_buffer_bytes"] == {"device": 4 * n, "host": 0}
    # a host that converts at least as fast as the device: the host path always wins, no flip
    fast = conversion_paths(HostSide(memory_bandwidth=2e11), n, rate)
    assert fast["flip_link_bandwidth"] is None and fast["faster"] == "host"
    plan = OffloadPlan(Offload(host_adam=True), host, device_stream_rate=rate)
    assert conversion_choice(plan, n) == paths["faster"]


CASES = [dict(stages=2, mb=4, layers=2, f=2.0, b=4.0), dict(stages=3, mb=6, layers=1, f=1.0, b=3.0),
         dict(stages=1, mb=2, layers=3, f=3.0, b=5.0)]


@pytest.mark.parametrize("case", CASES)
def test_offload_never_shortens_the_step_nor_raises_the_activation_peak(case):
    costs = PipelineCosts.uniform(case["stages"], case["mb"], t_forward=case["f"], t_backward=case["b"],
                                  t_recompute=case["f"], t_update=1.0, t_gradsync=2.0, layers_per_stage=case["layers"],
                                  grad_bytes=4_000_000, act_full_bytes=2_000_000, act_ckpt_bytes=500_000,
                                  recovery_bytes=1_500_000, dp=2)
    targets = [("activations",), ("optimizer",), ("master",), ("optimizer", "master", "activations")]
    for mech, t in itertools.product((Mechanisms(), Mechanisms(activation="full", fsr=False), Mechanisms.all_off()),
                                     targets):
        resident = simulate(costs, mechanisms=mech)
        moved = simulate(costs, mechanisms=mech, offload=_plan(t, dp=2, zero=1))
        assert moved.step_time_ms >= resident.step_time_ms - 1e-9, (mech, t)
        assert max(activation_residency(moved, costs)) <= max(activation_residency(resident, costs)), (mech, t)
        free = simulate(costs, mechanisms=mech, offload=_plan(t, host=FREE, dp=2, zero=1))
        assert moved.step_time_ms >= free.step_time_ms - 1e-9


def test_memory_model_never_raises_the_device_peak():
    model = get_model("llama2-7b")
    for pp, dp, zero, act in ((1, 1, 0, "full"), (2, 4, 2, "fsr"), (4, 2, 1, "ckpt"), (2, 8, 3, "fsr")):
        cfg = ParallelConfig(pp=pp, dp=dp, zero=zero, accum=8, activation=act)
        resident = stage_memory(model, cfg)
        for targets, host_adam in ((("optimizer",), False), (("master",), False), (("activations",), False),
                                   (("optimizer", "master", "activations"), False), ((), True)):
            for host_path in (True, False):
                moved = stage_memory(model, cfg, offload=Offload(targets, host_adam=host_adam),
                                     host_path_convert=host_path)
                for a, b in zip(moved, resident, strict=True):
                    assert a.peak_bytes <= b.peak_bytes, (cfg, targets, host_adam)
                assert max_peak(moved) <= max_peak(resident)


def test_memory_terms_by_hand():
    model = get_model("llama2-7b")
    cfg = ParallelConfig(pp=1, dp=1, zero=0, accum=1, activation="ckpt")
    (resident,) = stage_memory(model, cfg)
    (moved,) = stage_memory(model, cfg, offload=Offload(("optimizer",)))
    params = resident.breakdown["weights"] // 2
    assert resident.breakdown["optimizer"] - moved.breakdown["optimizer"] == 8 * params == moved.host["optimizer_state"]
    # the state in flight: two of the largest object's (the LM head's) moments, on the device
    biggest = max(model.vocab * model.hidden, 12 * model.hidden ** 2)
    assert 0 < moved.breakdown["host_state_buffer"] <= 2 * 8 * biggest + 8 * model.vocab * model.hidden
    assert moved.peak_bytes == resident.peak_bytes - 8 * params + moved.breakdown["host_state_buffer"]


def test_offload_bad_input():
    with pytest.raises(ConfigError, match="offload target 'disk'"):
        Offload(("disk",))
    with pytest.raises(ConfigError, match="needs the host-side optimizer"):
        Offload(("grads",))
    with pytest.raises(ConfigError, match="link_bandwidth"):
        HostSide(link_bandwidth=0)
    with pytest.raises(ConfigError, match=r"\[host\]"):
        TrainingPlatform.from_dict({"host": {"pcie_lanes": 16}})
    with pytest.raises(ConfigError, match="link_bandwidth"):
        TrainingPlatform.from_dict({"host": {"link_bandwidth": 0}})


def test_cli_offload_reports(capsys):
    argv = ["simulate", "--uniform", "--stages", "2", "--microbatches", "4", "--t-forward", "2", "--t-backward", "4",
            "--t-update", "1", "--layers-per-stage", "2", "--layer-grad-bytes", "2000000",
            "--layer-act-bytes", "1000000", "--activation", "full", "--offload", "activations", "--host-adam",
            "--json"]
    assert ratrain_main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    off = payload["offload"]
    assert off["targets"] == ["optimizer", "master", "grads", "activations"] and off["host_adam"]
    assert set(off["transfers"]) >= {"activations", "gradients", "weights"}
    conv = off["gradient_conversion"]
    big = conv["largest_layer"]
    assert big["faster"] in ("device", "host") and conv["chosen"] == big["faster"]
    assert math.isfinite(conv["step_device_path_ms"]) and math.isfinite(conv["step_host_path_ms"])
    assert {t["resource"] for t in payload["timeline"]} >= {"d2h", "h2d", "host"}
    assert ratrain_main(["memory", "--model", "llama2-7b", "--pp", "2", "--offload", "optimizer,activations",
                         "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)
    assert mem["max_peak_bytes"] <= mem["offload"]["resident_max_peak_bytes"]
    assert all(st["host"]["optimizer_state"] > 0 for st in mem["stages"])


def test_platform_host_table_round_trips(tmp_path):
    path = tmp_path / "mt.toml"
    path.write_text('name = "mt-fast-host"\n[host]\nlink_bandwidth = 16e9\ncores = 8\n')
    plat = load_platform(path)
    assert host_of(plat) == HostSide(link_bandwidth=16e9, cores=8)
    assert TrainingPlatform.from_dict(plat.to_json()) == plat
    gpu = load_platform(Path(__file__).resolve().parents[1] / "platforms" / "dgx-a100.toml")
    assert host_of(gpu) == HostSide.pcie4_x16_share(8)

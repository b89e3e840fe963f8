"""The compiled event loop (ratrain.sim.event_loop) against the Python one (_Sim.run_python), its reference:
every job's start, end and promotion, and the whole SimResult, equal to the bit (==, never approx), over the
schedules, activation policies, mechanisms, resources, unequal micro-batches, zero-length tasks, buckets,
offloading and random per-layer costs. The graphs are small (the compiled loop is forced by the switch,
``COMPILED_LOOP_MIN_JOBS``); one slow-marked case is large."""
from __future__ import annotations

import importlib
import random
import sys

import numpy as np
import pytest

from ratrain.cost.tasks import LayerCosts, PipelineCosts
from ratrain.errors import RatrainError
from ratrain.sim import simulator
from ratrain.sim.buckets import GradBuckets
from ratrain.sim.offload import OffloadPlan
from ratrain.sim.pipeline_order import PipelineSchedule
from ratrain.sim.simulator import ABLATION_VARIANTS, Mechanisms, _edge, _run_step, _Sim, simulate, simulate_step_time
from ratrain.spec.host import HostSide
from ratrain.spec.offload import Offload

HOST = HostSide(link_bandwidth=1e9, link_latency_s=1e-5, memory_bandwidth=8e9, cores=4, core_flops=1e9)


def _costs(P=3, A=6, L=2, seed=0, zero=(), **options) -> PipelineCosts:
    """Random per-layer costs (seeded; not dyadic, so any change in the order of float operations shows);
    the fields in ``zero`` are 0 for every other layer."""
    rng = random.Random(seed)

    def layer(i: int) -> LayerCosts:
        got = dict(forward_ms=rng.uniform(0.5, 1.5), backward_ms=rng.uniform(1.0, 3.0),
                   recompute_ms=rng.uniform(0.2, 1.0), gradsync_ms=rng.uniform(0.1, 2.0),
                   update_ms=rng.uniform(0.1, 1.0), prefetch_ms=rng.uniform(0.1, 1.0),
                   act_full_bytes=rng.randrange(1, 4) * 10 ** 6, act_ckpt_bytes=10 ** 5,
                   recovery_bytes=10 ** 5, grad_bytes=rng.randrange(1, 5) * 10 ** 6)
        for name in zero:
            if i % 2 == 0:
                got[name] = 0.0
        return LayerCosts(**got)

    stages = [[layer(p * L + i) for i in range(L)] for p in range(P)]
    return PipelineCosts(stages=stages, transfer_ms=options.pop("transfer_ms", rng.uniform(0.05, 0.3)),
                         microbatches=A, **options)


def _jobs(sim) -> list[tuple]:
    return [(j.idx, j.kind, j.start, j.end, j.promoted_at, j.cls, j.state) for j in sim.jobs]


def _compare(monkeypatch, costs, schedule="1f1b", mech=None, buckets=None, offload=None) -> None:
    """Both loops on the same inputs: the same jobs' times, first forwards, period, and SimResult."""
    mech = mech or Mechanisms()
    got = {}
    for loop, threshold in (("python", 10 ** 12), ("compiled", 0)):
        monkeypatch.setattr(simulator, "COMPILED_LOOP_MIN_JOBS", threshold)
        monkeypatch.setattr(simulator, "COMPILED_LOOP_FIRST_JOBS", threshold)
        sim, _, T, last_b, _ = _run_step(costs, schedule, mech, "test", buckets, offload)
        result = simulate(costs, schedule=schedule, mechanisms=mech, buckets=buckets, offload=offload)
        step = simulate_step_time(costs, schedule=schedule, mechanisms=mech, buckets=buckets, offload=offload)
        got[loop] = (_jobs(sim), list(sim.first_f_start.items()), sim.next_main, T, last_b,
                     result.to_json(), step)
    python, compiled = got["python"], got["compiled"]
    assert compiled[0] == python[0]
    assert compiled[1:5] == python[1:5]
    assert compiled[5] == python[5]
    assert compiled[6] == python[6]


SCHEDULES = [("1f1b", 3, 6), ("gpipe", 3, 6), (PipelineSchedule("interleaved", 2), 2, 4),
             (PipelineSchedule("interleaved", 3), 2, 4), (PipelineSchedule("zb-h1", weight_fraction=0.4), 3, 6),
             (PipelineSchedule("zb-h1", weight_fraction=(0.1, 0.5, 0.3, 0.7, 0.2, 0.6)), 3, 6)]


@pytest.mark.parametrize("schedule, P, A", SCHEDULES, ids=lambda x: str(x) if not isinstance(x, PipelineSchedule)
                         else f"{x.name}-{x.virtual_stages}-{x.weight_fraction}")
@pytest.mark.parametrize("activation", ["full", "ckpt", "fsr"])
def test_schedules_and_activations(monkeypatch, schedule, P, A, activation):
    L = 3 if isinstance(schedule, PipelineSchedule) and schedule.virtual_stages == 3 else 2
    _compare(monkeypatch, _costs(P, A, L, seed=P * A), schedule, Mechanisms(activation=activation))


@pytest.mark.parametrize("variant", list(ABLATION_VARIANTS) + ["all-off"])
@pytest.mark.parametrize("schedule", ["1f1b", PipelineSchedule("zb-h1", weight_fraction=0.5)], ids=["1f1b", "zb-h1"])
def test_ablation_variants(monkeypatch, variant, schedule):
    _compare(monkeypatch, _costs(seed=7), schedule, Mechanisms.variant(variant))


@pytest.mark.parametrize("lookahead", [1, 2, 3])
@pytest.mark.parametrize("skip_adjacent", [False, True])
@pytest.mark.parametrize("buffer_layers", [None, 1, 2])
def test_fsr_options(monkeypatch, lookahead, skip_adjacent, buffer_layers):
    mech = Mechanisms(fsr_lookahead=lookahead, fsr_skip_adjacent=skip_adjacent, fsr_buffer_layers=buffer_layers)
    _compare(monkeypatch, _costs(P=3, A=6, L=3, seed=lookahead), "1f1b", mech)


@pytest.mark.parametrize("recovery", ["compute", "ddr"])
@pytest.mark.parametrize("update, prefetch", [("ddr", "ddr"), ("link", "ddr"), ("ddr", "link"), ("link", "link")])
@pytest.mark.parametrize("mech", [Mechanisms(), Mechanisms(update_prefetch=False), Mechanisms.all_off()],
                         ids=["full", "no-update-prefetch", "all-off"])
def test_resources(monkeypatch, recovery, update, prefetch, mech):
    costs = _costs(seed=11, recovery_resource=recovery, update_resource=update, prefetch_resource=prefetch)
    _compare(monkeypatch, costs, "1f1b", mech)


def test_bulk_update(monkeypatch):
    _compare(monkeypatch, _costs(seed=5, bulk_update_ms=1.7), "1f1b", Mechanisms.all_off())
    _compare(monkeypatch, _costs(seed=5, bulk_update_ms=1.7), "gpipe", Mechanisms.variant("no-layerwise"))


@pytest.mark.parametrize("schedule", ["1f1b", PipelineSchedule("interleaved", 2),
                                      PipelineSchedule("zb-h1", weight_fraction=0.3)], ids=["1f1b", "int2", "zb"])
def test_unequal_microbatches(monkeypatch, schedule):
    scales = (1.0, 0.5, 1.75, 0.25, 1.3, 0.9)
    _compare(monkeypatch, _costs(P=2, A=6, L=2, seed=3, microbatch_scales=scales), schedule)


@pytest.mark.parametrize("zero", [("recompute_ms",), ("gradsync_ms", "update_ms", "prefetch_ms"),
                                  ("forward_ms", "recompute_ms")], ids=["recompute", "state", "forward"])
@pytest.mark.parametrize("transfer", [0.0, 0.2])
@pytest.mark.parametrize("mech", [Mechanisms(), Mechanisms.all_off()], ids=["full", "all-off"])
def test_zero_length_tasks(monkeypatch, zero, transfer, mech):
    _compare(monkeypatch, _costs(seed=13, zero=zero, transfer_ms=transfer), "1f1b", mech)


@pytest.mark.parametrize("size", [10 ** 6, 4 * 10 ** 6, 10 ** 12])
@pytest.mark.parametrize("mech", [Mechanisms(), Mechanisms.all_off()], ids=["full", "all-off"])
def test_buckets(monkeypatch, size, mech):
    _compare(monkeypatch, _costs(seed=17, gradsync_launch_ms=0.05), "1f1b", mech, buckets=GradBuckets(size))


@pytest.mark.parametrize("plan", [
    OffloadPlan(Offload(("activations",)), HOST),
    OffloadPlan(Offload(("activations",), reload_lookahead=0), HOST),
    OffloadPlan(Offload(("optimizer",)), HOST, dp=2, zero=1),
    OffloadPlan(Offload(host_adam=True, convert="device"), HOST, dp=2, zero=2),
    OffloadPlan(Offload(("activations",), host_adam=True, convert="host"), HOST)],
    ids=["activations", "activations-0", "optimizer", "host-adam-device", "host-adam-host"])
@pytest.mark.parametrize("mech", [Mechanisms(), Mechanisms(activation="full", fsr=False), Mechanisms.all_off()],
                         ids=["fsr", "full", "all-off"])
def test_offload(monkeypatch, plan, mech):
    _compare(monkeypatch, _costs(seed=19), "1f1b", mech, offload=plan)


@pytest.mark.parametrize("seed", range(6))
def test_random_costs(monkeypatch, seed):
    rng = random.Random(seed)
    schedule = rng.choice(["1f1b", "gpipe", PipelineSchedule("zb-h1", weight_fraction=rng.random())])
    mech = Mechanisms(activation=rng.choice(["full", "ckpt", "fsr"]), fsr_lookahead=rng.randint(1, 3),
                      layerwise=rng.random() < 0.8, update_prefetch=rng.random() < 0.7)
    costs = _costs(P=rng.randint(1, 4), A=rng.randint(1, 8), L=rng.randint(1, 3), seed=100 + seed,
                   recovery_resource=rng.choice(["compute", "ddr"]), update_resource=rng.choice(["ddr", "link"]),
                   prefetch_resource=rng.choice(["ddr", "link"]))
    _compare(monkeypatch, costs, schedule, mech)


@pytest.mark.parametrize("P, A, L, t_backward", [(2, 4, 3, 2.0), (4, 8, 3, 3.0)])
@pytest.mark.parametrize("schedule", ["1f1b", PipelineSchedule("zb-h1", weight_fraction=0.4)], ids=["1f1b", "zb"])
@pytest.mark.parametrize("lookahead", [1, 2])
def test_uniform_costs(monkeypatch, P, A, L, t_backward, schedule, lookahead):
    """Equal layers of thirds of a millisecond: the near-ties where the order of dispatch and the window
    checks' tolerance decide (a loop that dispatched resources out of order, or compared without the
    tolerance, fails here)."""
    costs = PipelineCosts.uniform(P, A, t_forward=1.0, t_backward=t_backward, t_transfer=0.1, t_update=0.5,
                                  layers_per_stage=L, t_recompute=0.3, t_gradsync=2.0, t_prefetch=0.5,
                                  update_resource="link")
    _compare(monkeypatch, costs, schedule, Mechanisms(fsr_lookahead=lookahead))


@pytest.mark.parametrize("lookahead", [1, 2])
def test_link_near_ties(monkeypatch, lookahead):
    """State tasks on the link between transfers of equal fifths of a millisecond: the link window check's
    tolerance decides."""
    costs = PipelineCosts.uniform(2, 4, t_forward=1.0, t_backward=2.0, t_transfer=0.7, t_update=0.3,
                                  layers_per_stage=5, t_recompute=0.3, t_gradsync=0.3, t_prefetch=0.5,
                                  update_resource="link", prefetch_resource="link")
    _compare(monkeypatch, costs, PipelineSchedule("interleaved", 2), Mechanisms(fsr_lookahead=lookahead))


@pytest.mark.parametrize("offload", [None, OffloadPlan(Offload(("activations",)), HOST)], ids=["logged", "offload"])
def test_edges_from_the_log_are_the_jobs_own(offload):
    """The CSR read from the build's edge log equals the one read from every job's lists (order included);
    with offloading (whose edges the log lacks) the loop reads the jobs."""
    event_loop = importlib.import_module("ratrain.sim.event_loop")
    sim = _Sim(_costs(seed=31), PipelineSchedule("zb-h1", weight_fraction=0.3), Mechanisms(fsr_buffer_layers=2),
               offload=offload)
    npred = np.array([j.npred for j in sim.jobs])
    from_jobs = (*event_loop._edges(sim.jobs, "preds", npred),
                 *event_loop._edges(sim.jobs, "succs", np.array([len(j.succs) for j in sim.jobs])))
    assert (len(sim.edge_log) == 2 * npred.sum()) == (offload is None)
    if offload is None:
        for got, want in zip(event_loop._logged_edges(sim.edge_log, npred), from_jobs, strict=True):
            assert got.tolist() == want.tolist()


def test_deadlock_is_reported_the_same(monkeypatch):
    """A graph that cannot run (an edge back from the last job to the first, added after the build's check):
    both loops stop with the same error line."""
    messages = []
    for run in (_Sim.run_python, lambda sim: importlib.import_module("ratrain.sim.event_loop").run(sim)):
        sim = _Sim(_costs(seed=23), PipelineSchedule.of("1f1b"), Mechanisms())
        _edge(sim.jobs[-1], sim.main_chain[0][1])
        with pytest.raises(RatrainError, match="simulator deadlock") as err:
            run(sim)
        messages.append(str(err.value))
    assert messages[0] == messages[1]


def test_the_switch_picks_the_loop(monkeypatch):
    """The compiled loop runs from COMPILED_LOOP_MIN_JOBS jobs where Numba is loaded, or once the process
    has simulated COMPILED_LOOP_FIRST_JOBS jobs in all; the Python one otherwise."""
    ran = []
    monkeypatch.setattr(_Sim, "run_python", lambda self: ran.append(len(self.jobs)))
    sim = _Sim(_costs(seed=1), PipelineSchedule.of("1f1b"), Mechanisms())
    n = len(sim.jobs)
    importlib.import_module("ratrain.sim.event_loop")           # Numba loaded
    for low, first, python in ((n + 1, 0, True), (n, 10 ** 12, False), (0, n, False)):
        monkeypatch.setattr(simulator, "COMPILED_LOOP_MIN_JOBS", low)
        monkeypatch.setattr(simulator, "COMPILED_LOOP_FIRST_JOBS", first)
        ran.clear()
        sim = _Sim(_costs(seed=1), PipelineSchedule.of("1f1b"), Mechanisms())
        sim.run()
        assert ran == ([n] if python else []), (low, first)
        assert python or all(j.state == simulator._DONE for j in sim.jobs)
    with monkeypatch.context() as m:        # where Numba is not loaded: once the process has simulated enough
        m.delitem(sys.modules, "numba")
        m.setattr(simulator, "_JOBS_SIMULATED", [0])
        m.setattr(simulator, "COMPILED_LOOP_MIN_JOBS", 0)
        m.setattr(simulator, "COMPILED_LOOP_FIRST_JOBS", 2 * n)
        for python in (True, False, False):             # n jobs simulated, then 2n, 3n
            ran.clear()
            _Sim(_costs(seed=1), PipelineSchedule.of("1f1b"), Mechanisms()).run()
            assert ran == ([n] if python else [])
        assert simulator._JOBS_SIMULATED == [3 * n]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", PipelineSchedule("interleaved", 2),
                                      PipelineSchedule("zb-h1", weight_fraction=0.3)], ids=["1f1b", "int2", "zb"])
def test_large_step(monkeypatch, schedule):
    costs = _costs(P=8, A=48, L=4, seed=29, update_resource="link", prefetch_resource="link")
    _compare(monkeypatch, costs, schedule, Mechanisms(fsr_lookahead=2))

"""The simulator's post-processing on arrays (busy intervals, period, task records, notes, summaries,
peaks, activation residency) against its plain-Python reference (tests/sim_reference.py): exact equality on a broad
set of simulations, and the lazily built task list behaving as a list given up front."""
from __future__ import annotations

import copy
import dataclasses
import pickle
import random

import pytest
import sim_reference as ref

from ratrain.cost.tasks import LayerCosts, PipelineCosts
from ratrain.sim import simulator as sim_mod
from ratrain.sim.buckets import GradBuckets
from ratrain.sim.offload import OffloadPlan
from ratrain.sim.pipeline_order import PipelineSchedule
from ratrain.sim.simulator import Mechanisms, activation_residency, simulate, stage_task_counts
from ratrain.sim.timeline import Task
from ratrain.spec.host import HostSide
from ratrain.spec.offload import Offload

HOST = HostSide(link_bandwidth=1e9, link_latency_s=0.0, memory_bandwidth=8e9, cores=4, core_flops=1e9)


def _costs(stages=3, mb=5, layers=2, seed=0, **options) -> PipelineCosts:
    """Random per-layer costs (seeded), times on a 1/8 ms grid so ties happen, bytes > 0."""
    rng = random.Random(seed)

    def t(lo, hi):
        return rng.randint(lo, hi) / 8

    def layer():
        full = rng.randint(4, 9) * 1000
        return LayerCosts(forward_ms=t(4, 12), backward_ms=t(8, 24), recompute_ms=t(2, 10), gradsync_ms=t(0, 16),
                          update_ms=t(0, 8), prefetch_ms=t(0, 8), act_full_bytes=full,
                          act_ckpt_bytes=full // rng.randint(2, 5), recovery_bytes=rng.randint(1, 3) * 500,
                          grad_bytes=rng.randint(1, 4) * 100)
    return PipelineCosts(stages=[[layer() for _ in range(layers)] for _ in range(stages)], transfer_ms=t(1, 6),
                         microbatches=mb, **options)


CASES = {
    "1f1b fsr": dict(),
    "1f1b full": dict(mechanisms=Mechanisms(activation="full", fsr=False)),
    "1f1b ckpt all-off": dict(mechanisms=Mechanisms.all_off()),
    "no-update-prefetch": dict(mechanisms=Mechanisms.variant("no-update-prefetch")),
    "no-layerwise": dict(mechanisms=Mechanisms.variant("no-layerwise")),
    "fsr lookahead 2, no buffer cap": dict(mechanisms=Mechanisms(fsr_lookahead=2, fsr_buffer_layers=None)),
    "fsr skip adjacent": dict(mechanisms=Mechanisms(fsr_skip_adjacent=True)),
    "gpipe": dict(schedule="gpipe"),
    "interleaved v=2": dict(schedule=PipelineSchedule("interleaved", virtual_stages=2), layers=4, mb=6),
    "zb-h1": dict(schedule="zb-h1"),
    "zb-h1 per-layer W share, ckpt": dict(schedule=PipelineSchedule("zb-h1", weight_fraction=(0.2, 0.4, 0.6, 0.3,
                                                                                              0.5, 0.7)),
                                          mechanisms=Mechanisms.all_off()),
    "recovery on ddr": dict(costs=dict(recovery_resource="ddr")),
    "update and prefetch on the link": dict(costs=dict(update_resource="link", prefetch_resource="link")),
    "bulk update": dict(mechanisms=Mechanisms.variant("no-layerwise"), costs=dict(bulk_update_ms=3.0)),
    "unequal micro-batches": dict(costs=dict(microbatch_scales=(1.0, 0.5, 1.5, 0.75, 1.25))),
    "buckets": dict(buckets=GradBuckets(250)),
    "offload activations": dict(offload=OffloadPlan(Offload(("activations",)), HOST),
                                mechanisms=Mechanisms(activation="full", fsr=False)),
    "offload state": dict(offload=OffloadPlan(Offload(("optimizer", "master")), HOST)),
}


def _case(name, seed=0):
    kw = dict(CASES[name])
    costs = _costs(layers=kw.pop("layers", 2), mb=kw.pop("mb", 5), seed=seed, **kw.pop("costs", {}))
    return costs, kw


def _both(costs, kw):
    """The arrays' SimResult and the reference's, from one event simulation (whose busy intervals
    and period the reference's are checked against first)."""
    mech = kw.get("mechanisms", Mechanisms())
    sim, pipeline, T, last_b, segs = sim_mod._run_step(costs, kw.get("schedule", "1f1b"), mech, "test",
                                                       kw.get("buckets"), kw.get("offload"))
    assert segs == ref.segments(sim.jobs, sim.P)
    for lower in (last_b, 0.5 * last_b, T):
        assert sim_mod._period(segs, lower).hex() == ref.period(segs, lower).hex()
    args = (sim, pipeline, mech, T, last_b, segs, kw.get("buckets"), kw.get("offload"))
    return sim_mod._result(*args), ref.result(*args)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", sorted(CASES))
def test_result_and_residency_equal_the_reference(name, seed):
    costs, kw = _case(name, seed)
    new, old = _both(costs, kw)
    # the summaries first, read before the task list exists
    assert new.stages == old.stages
    assert [list(s.busy_by_kind_ms) for s in new.stages] == [list(s.busy_by_kind_ms) for s in old.stages]
    assert new.to_json(timeline=False) == old.to_json(timeline=False)
    wgb = [300 + 17 * i for i in range(costs.num_layers)]
    for wb in (None, 700, wgb):
        assert activation_residency(new, costs, weight_grad_bytes=wb) == \
            ref.activation_residency(old, costs, weight_grad_bytes=wb)
    kinds = ("Send", "Recv")
    assert stage_task_counts(new, kinds) == [sum(1 for t in old.tasks if t.stage == p and t.kind in kinds)
                                             for p in range(costs.num_stages)]
    assert new.tasks == old.tasks
    assert new.notes == old.notes
    assert new.to_json() == old.to_json()
    # from the task list now that it exists
    for wb in (None, wgb):
        assert activation_residency(new, costs, weight_grad_bytes=wb) == \
            ref.activation_residency(old, costs, weight_grad_bytes=wb)


def test_the_case_set_covers_what_the_arrays_handle():
    """The cases hold every kind of record the arrays treat apart (or the test above proves less)."""
    kinds, recovery = set(), set()
    for name in CASES:
        r = simulate(*_case(name)[:1], **_case(name)[1])
        kinds |= {t.kind for t in r.tasks}
        recovery |= {(t.resource, n.hidden_by) for t, n in zip(r.tasks, r.notes, strict=True) if t.kind == "R"}
    assert kinds >= {"F", "B", "W", "R", "Send", "Recv", "GradSync", "UpdateShard", "PrefetchW", "Update",
                     "ToHost", "FromHost"}
    # recovery on compute (annotated as arrays) both hidden and promoted to the critical path; on DDR too
    assert recovery >= {("compute", "bubble"), ("compute", "backward critical path"), ("ddr", "bubble"),
                        ("ddr", "backward critical path")}


def test_residency_reads_a_changed_task_list():
    """Once the task list exists it is what counts: a change to it shows in the residency."""
    costs, kw = _case("1f1b full")
    r = simulate(costs, **kw)
    before = activation_residency(r, costs)
    r.tasks = [t for t in r.tasks if not (t.kind == "F" and t.stage == 0)]
    assert activation_residency(r, costs)[0] == 0 < before[0]


def test_residency_of_a_hand_made_result():
    """A SimResult built from a task list (no arrays): the same numbers as the reference, and the
    reference's error for an F without its B."""
    costs, kw = _case("1f1b fsr")
    r = simulate(costs, **kw)
    made = dataclasses.replace(r, tasks=list(r.tasks), notes=list(r.notes))
    assert "_timeline" not in made.__dict__
    assert activation_residency(made, costs) == ref.activation_residency(made, costs)
    broken = dataclasses.replace(made, tasks=[t for t in made.tasks if not (t.kind == "B" and t.layer == 1
                                                                            and t.microbatch == 2)])
    with pytest.raises(KeyError):
        ref.activation_residency(broken, costs)
    with pytest.raises(KeyError):
        activation_residency(broken, costs)


def test_the_lazy_task_list_is_an_ordinary_attribute():
    costs, kw = _case("zb-h1")
    r = simulate(costs, **kw)
    assert "tasks" not in r.__dict__
    clone = pickle.loads(pickle.dumps(r))
    shallow, deep = copy.copy(r), copy.deepcopy(r)
    assert r.tasks is r.tasks and isinstance(r.tasks, list) and all(isinstance(t, Task) for t in r.tasks)
    assert clone.tasks == r.tasks and clone.notes == r.notes and clone == r
    assert shallow == r and deep == r
    assert dataclasses.asdict(r)["tasks"] == [dataclasses.asdict(t) for t in r.tasks]
    assert len(r.hidden_by) == len(r.tasks)
    with pytest.raises(AttributeError):
        r.no_such_field  # noqa: B018

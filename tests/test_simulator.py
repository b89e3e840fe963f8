"""The lifecycle simulator: closed forms, dependency and resource invariants, mechanisms, CLI."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratrain.cli import main as cli_main
from ratrain.cost.tasks import LayerCosts, PipelineCosts
from ratrain.errors import ConfigError
from ratrain.sim.pipeline_order import build
from ratrain.sim.simulator import LIFECYCLE_KINDS, Mechanisms, activation_residency, peak_inflight, simulate
from ratrain.sim.timeline import RESOURCES, TASK_KINDS

EPS = 1e-9
F, B, U = 1.5, 2.5, 0.75


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=1e-9)


# ------------------------------------------------------------ invariant checkers

def check_resources(result):
    """No resource ever runs two tasks at once (zero-length tasks occupy nothing)."""
    per = {}
    for t in result.tasks:
        assert t.kind in TASK_KINDS and t.resource in RESOURCES
        assert t.end_ms >= t.start_ms >= 0.0
        if t.end_ms > t.start_ms:
            per.setdefault((t.stage, t.resource), []).append((t.start_ms, t.end_ms, t))
    T = result.step_time_ms
    for key, ivs in per.items():
        ivs.sort(key=lambda x: (x[0], x[1]))
        for (_a0, a1, ta), (b0, _b1, tb) in zip(ivs, ivs[1:], strict=False):
            assert b0 >= a1 - EPS, f"{key}: {ta} overlaps {tb}"
        # the step repeats every T: this step's tasks never overlap the next step's
        both = sorted([(a, b, 0) for a, b, _ in ivs] + [(a + T, b + T, 1) for a, b, _ in ivs])
        for (a0, a1, _sa), (b0, b1, _sb) in zip(both, both[1:], strict=False):
            assert b0 >= a1 - EPS, f"{key}: step boundary overlap {a0}-{a1} vs {b0}-{b1} (T={T})"


def check_fillers_never_delay_main(result, costs):
    """Low-priority work on compute (FSR recovery in windows, compute-resident state tasks)
    ends before the next main-path task there is ready, unless that task waits for it anyway."""
    P = costs.num_stages
    recv, own_r = {}, {}
    for t, n in zip(result.tasks, result.notes, strict=False):
        if t.kind == "Recv":
            recv[(t.stage, t.microbatch, "F" if n.peer == t.stage - 1 else "B")] = t
        elif t.kind == "R":
            own_r[(t.layer, t.microbatch)] = (t, n)
    for p in range(P):
        rng = costs.layer_range(p)
        main = sorted((t for t in result.tasks if t.stage == p and t.kind in ("F", "B")),
                      key=lambda t: (t.start_ms, t.end_ms))
        fillers = [(t, n) for t, n in zip(result.tasks, result.notes,
                                          strict=False) if t.stage == p and t.resource == "compute"
                   and t.end_ms > t.start_ms and (t.kind in LIFECYCLE_KINDS or
                                                  (t.kind == "R" and n.hidden_by == "bubble" and n.exposed_ms == 0))]
        for f, _ in fillers:
            k = next((i for i, x in enumerate(main) if x.start_ms >= f.end_ms - EPS), None)
            if k is None:
                continue
            x = main[k]
            if f.kind == "R" and x.kind == "B" and (x.layer, x.microbatch) == (f.layer, f.microbatch):
                continue
            ready = main[k - 1].end_ms if k else 0.0
            if x.kind == "F" and x.layer == rng[0] and p > 0:
                ready = max(ready, recv[(p, x.microbatch, "F")].end_ms)
            if x.kind == "B" and x.layer == rng[-1] and p < P - 1:
                ready = max(ready, recv[(p, x.microbatch, "B")].end_ms)
            extra = 0.0
            if x.kind == "B" and (x.layer, x.microbatch) in own_r:
                rx = own_r[(x.layer, x.microbatch)][0]
                if rx.resource == "compute" and rx.start_ms >= f.end_ms - EPS:
                    extra = rx.end_ms - rx.start_ms
                elif rx.resource != "compute":
                    ready = max(ready, rx.end_ms)
            assert f.end_ms + extra <= ready + EPS, f"{f} delays {x} (ready {ready})"


def check_dependencies(result, costs, schedule="1f1b"):
    """Every task starts after what it depends on; counts and compute order match the schedule."""
    P, A, X = costs.num_stages, costs.microbatches, costs.transfer_ms
    policy = result.mechanisms.policy
    f, b, r, life = {}, {}, {}, {}
    for t in result.tasks:
        key = (t.layer, t.microbatch)
        if t.kind in ("F", "B", "R"):
            store = {"F": f, "B": b, "R": r}[t.kind]
            assert key not in store, f"duplicate {t}"
            store[key] = t
        elif t.kind in LIFECYCLE_KINDS:
            k = (t.kind, t.stage, t.layer)
            assert k not in life, f"duplicate {t}"
            life[k] = t
    L = costs.num_layers
    assert set(f) == set(b) == {(layer_index, m) for layer_index in range(L) for m in range(A)}
    if policy == "fsr" and not result.mechanisms.fsr_skip_adjacent:
        assert set(r) == set(f)
    if policy in ("full", "ckpt"):
        assert not r
    sends = [(t, n) for t, n in zip(result.tasks, result.notes, strict=False) if t.kind == "Send"]
    recvs = {(t.stage, t.microbatch, t.start_ms, t.end_ms, n.peer) for t, n in zip(result.tasks, result.notes,
                                                                                   strict=False)
             if t.kind == "Recv"}
    assert len(sends) == len(recvs) == 2 * (P - 1) * A
    transfer = {}
    for s, n in sends:
        assert s.end_ms - s.start_ms == approx(X)
        assert (n.peer, s.microbatch, s.start_ms, s.end_ms, s.stage) in recvs
        transfer[(s.stage, n.peer, s.microbatch)] = s
    for p in range(P):
        rng = costs.layer_range(p)
        for m in range(A):
            for layer_index in rng:
                if layer_index > rng[0]:
                    assert f[(layer_index, m)].start_ms >= f[(layer_index - 1, m)].end_ms - EPS
                if layer_index < rng[-1]:
                    assert b[(layer_index, m)].start_ms >= b[(layer_index + 1, m)].end_ms - EPS
                if (layer_index, m) in r:
                    assert r[(layer_index, m)].start_ms >= f[(layer_index, m)].end_ms - EPS
                    assert b[(layer_index, m)].start_ms >= r[(layer_index, m)].end_ms - EPS
            if p > 0:
                s = transfer[(p - 1, p, m)]
                assert s.start_ms >= f[(rng[0] - 1, m)].end_ms - EPS
                assert f[(rng[0], m)].start_ms >= s.end_ms - EPS
                assert f[(rng[0], m)].start_ms >= f[(rng[0] - 1, m)].end_ms + X - EPS
            if p < P - 1:
                s = transfer[(p + 1, p, m)]
                assert s.start_ms >= b[(rng[-1] + 1, m)].end_ms - EPS
                assert b[(rng[-1], m)].start_ms >= s.end_ms - EPS
            else:
                assert b[(rng[-1], m)].start_ms >= f[(rng[-1], m)].end_ms - EPS
        # compute runs the schedule's order unchanged
        seq = []
        for t in sorted((t for t in result.tasks if t.stage == p and t.kind in ("F", "B")),
                        key=lambda t: (t.start_ms, t.end_ms)):
            if not seq or seq[-1] != (t.kind, t.microbatch):
                seq.append((t.kind, t.microbatch))
        assert seq == [(k, m) for k, m, _ in build(schedule, P, A)[p]]
        # lifecycle chain of every layer
        last_b = max(b[(layer_index, m)].end_ms for layer_index in rng for m in range(A))
        for layer_index in rng:
            gs = life[("GradSync", p, layer_index)]
            acc_done = max(b[(layer_index, m)].end_ms for m in range(A))
            assert gs.start_ms >= (acc_done if result.mechanisms.layerwise else last_b) - EPS
            w = life[("PrefetchW", p, layer_index)]
            if ("UpdateShard", p, layer_index) in life:
                us = life[("UpdateShard", p, layer_index)]
                assert us.start_ms >= gs.end_ms - EPS and w.start_ms >= us.end_ms - EPS
            else:
                upd = life[("Update", p, None)]
                assert upd.start_ms >= gs.end_ms - EPS and w.start_ms >= upd.end_ms - EPS
            # the next step's Forward(l) (at T + its offset) never precedes PrefetchW(l)
            if result.mechanisms.deadline_aware:
                assert w.end_ms <= result.step_time_ms + result.next_forward_ms[layer_index] + EPS
            else:
                assert w.end_ms <= result.step_time_ms + result.next_forward_ms[rng[0]] + EPS


def check_all(result, costs, schedule="1f1b"):
    check_resources(result)
    check_fillers_never_delay_main(result, costs)
    check_dependencies(result, costs, schedule)
    assert result.exposed_tail_ms >= -EPS
    assert result.step_time_ms == approx(result.last_backward_end_ms + result.exposed_tail_ms)
    assert len(result.notes) == len(result.tasks)
    for t, n in zip(result.tasks, result.notes, strict=False):
        if t.kind in ("R",) + LIFECYCLE_KINDS:
            assert n.hidden_by in ("bubble", "backward critical path", "link-idle during compute",
                                   "ddr-idle during compute", "compute-idle while waiting on link",
                                   "compute-idle while waiting on ddr",
                                   "compute-idle while waiting on compute"), (t, n)
            assert -EPS <= n.exposed_ms <= t.end_ms - t.start_ms + EPS
        else:
            assert n.hidden_by is None


# ------------------------------------------------------------ closed forms

SHAPES = [(1, 1), (1, 5), (2, 1), (2, 3), (3, 7), (4, 2), (4, 8), (8, 16)]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("P,A", SHAPES)
def test_uniform_step_closed_form(P, A, schedule):
    costs = PipelineCosts.uniform(P, A, t_forward=F, t_backward=B, t_update=U)
    res = simulate(costs, schedule=schedule)
    assert res.step_time_ms == approx((A + P - 1) * (F + B) + U)
    assert res.exposed_tail_ms == approx(U)
    check_all(res, costs, schedule)


@pytest.mark.parametrize("P,A,L", [(3, 5, 4), (4, 8, 2)])
def test_uniform_step_many_layers_bulk(P, A, L):
    costs = PipelineCosts.uniform(P, A, t_forward=F, t_backward=B, t_update=U, layers_per_stage=L)
    for mech in (Mechanisms.variant("no-layerwise"), Mechanisms(activation="full")):
        res = simulate(costs, mechanisms=mech)
        want_tail = U if not mech.layerwise else U / L     # layer-wise: only layer 0's update is exposed
        assert res.step_time_ms == approx((A + P - 1) * (F + B) + want_tail)
        check_all(res, costs)


@pytest.mark.parametrize("P,A", SHAPES)
def test_inflight_is_exactly_min_p_minus_stage_a(P, A):
    costs = PipelineCosts.uniform(P, A, t_forward=F, t_backward=B, t_transfer=0.2, layers_per_stage=2)
    res = simulate(costs)
    assert res.peak_inflight == [min(P - p, A) for p in range(P)]
    assert peak_inflight(res.tasks, P) == res.peak_inflight          # without the costs, from layers seen
    assert simulate(costs, schedule="gpipe").peak_inflight == [A] * P


@pytest.mark.parametrize("P,A,R", [(1, 4, 0.7), (3, 5, 0.7), (4, 8, 2.0)])
def test_backward_checkpointing_adds_recompute_on_critical_path(P, A, R):
    costs = PipelineCosts.uniform(P, A, t_forward=F, t_backward=B, t_update=U, t_recompute=R)
    want = (A + P - 1) * (F + B + R) + U
    ckpt = simulate(costs, mechanisms=Mechanisms(activation="ckpt"))
    assert ckpt.step_time_ms == approx(want)
    off = simulate(costs, mechanisms=Mechanisms.variant("no-fsr"))
    fsr_off = simulate(costs, mechanisms=Mechanisms(fsr=False, activation="fsr"))
    assert off.step_time_ms == fsr_off.step_time_ms == ckpt.step_time_ms
    assert not [t for t in ckpt.tasks if t.kind == "R"]          # recompute lives inside B
    check_all(ckpt, costs)
    full = simulate(costs, mechanisms=Mechanisms(activation="full"))
    assert full.step_time_ms == approx((A + P - 1) * (F + B) + U)


def test_fsr_falls_back_when_there_is_no_window():
    # one stage: B(m) follows F(m) immediately, compute is never idle -> every R is backward-time
    A, R = 5, 0.7
    costs = PipelineCosts.uniform(1, A, t_forward=F, t_backward=B, t_update=U, t_recompute=R)
    res = simulate(costs)
    assert res.step_time_ms == approx(A * (F + B + R) + U)
    rs = [(t, n) for t, n in zip(res.tasks, res.notes, strict=False) if t.kind == "R"]
    assert len(rs) == A
    assert all(n.hidden_by == "backward critical path" and n.exposed_ms == approx(R) for _, n in rs)
    assert res.stages[0].exposed_recovery_ms == approx(A * R)
    check_all(res, costs)


@pytest.mark.parametrize("P", [2, 3, 5])
def test_fsr_hides_recovery_in_the_warmup_window(P):
    # A = 1: stage p < P-1 idles from its F until the gradient returns; R fits there.
    # The last stage runs B right after F, so its recovery is exposed (Eq. 7, W = 0).
    R = 0.75
    costs = PipelineCosts.uniform(P, 1, t_forward=F, t_backward=B, t_update=U, t_recompute=R)
    res = simulate(costs)
    assert res.step_time_ms == approx(P * (F + B) + R + U)
    for s in res.stages:
        assert s.exposed_recovery_ms == approx(R if s.stage == P - 1 else 0.0)
        assert s.hidden_recovery_ms == approx(0.0 if s.stage == P - 1 else R)
    kept = simulate(costs, mechanisms=Mechanisms(fsr_skip_adjacent=True))
    assert kept.step_time_ms == approx(P * (F + B) + U)
    ckpt = simulate(costs, mechanisms=Mechanisms.variant("no-fsr"))
    assert ckpt.step_time_ms == approx(P * (F + B + R) + U)
    check_all(res, costs)


@pytest.mark.parametrize("resource", ["ddr", "compute"])
def test_fsr_window_partially_covers_recovery(resource):
    # Eq. 7: exposed = max(0, T_rec - W_rec). A = 1, P = 2: stage 0's window is stage 1's
    # F + R + B; stage 1 exposes all of its R. Recovery longer than stage 0's window
    # starts right after its forward anyway and exposes exactly the overflow.
    P, R = 2, 0.9
    long_r = PipelineCosts(stages=[[LayerCosts(F, B, recompute_ms=R * 10)], [LayerCosts(F, B, recompute_ms=R)]],
                           transfer_ms=0.0, microbatches=1, recovery_resource=resource)
    res = simulate(long_r)
    window = F + R + B
    assert res.stages[0].exposed_recovery_ms == approx(R * 10 - window)
    assert res.stages[1].exposed_recovery_ms == approx(R)
    assert res.step_time_ms == approx(P * (F + B) + R + (R * 10 - window))
    check_all(res, long_r)


@pytest.mark.parametrize("buffer_layers", [None, 2])
@pytest.mark.parametrize("P,A,L", [(4, 8, 1), (4, 8, 3), (6, 20, 2), (3, 2, 2)])
def test_fsr_on_ddr_hides_all_recovery_when_it_fits_the_forward(P, A, L, buffer_layers):
    # an unbounded buffer, or a double one (recovery k runs beside backward k-1, R < B)
    R = 0.95 * F
    costs = PipelineCosts.uniform(P, A, t_forward=F, t_backward=B, t_update=U, t_recompute=R, layers_per_stage=L,
                                  recovery_resource="ddr")
    # the last stage keeps its single in-flight set
    mech = Mechanisms(fsr_skip_adjacent=True, fsr_buffer_layers=buffer_layers)
    res = simulate(costs, mechanisms=mech)
    assert res.step_time_ms == approx((A + P - 1) * (F + B) + U / L)
    assert all(s.exposed_recovery_ms == approx(0.0) for s in res.stages)
    single = simulate(costs, mechanisms=Mechanisms(fsr_skip_adjacent=True, fsr_buffer_layers=1))
    # one buffer: every recovery but a micro-batch's first waits for a backward to free the slot
    exposed = sum(s.exposed_recovery_ms for s in single.stages)
    assert (exposed == approx(0.0)) if L == 1 else (exposed > R)
    assert not [t for t in res.tasks if t.kind == "R" and t.stage == P - 1]
    ckpt = simulate(costs, mechanisms=Mechanisms.variant("no-fsr"))
    assert ckpt.step_time_ms == approx((A + P - 1) * (F + B + R) + U / L)
    check_all(res, costs)


@pytest.mark.parametrize("P,A,L,R", [(2, 16, 1, 1.5), (4, 12, 2, 1.0), (8, 32, 4, 1.5), (4, 8, 2, 6.0)])
def test_fsr_never_worse_than_backward_checkpointing(P, A, L, R):
    costs = PipelineCosts.uniform(P, A, t_forward=F, t_backward=B, t_update=U, t_recompute=R, layers_per_stage=L,
                                  t_transfer=0.1)
    fsr = simulate(costs)
    ckpt = simulate(costs, mechanisms=Mechanisms.variant("no-fsr"))
    assert fsr.step_time_ms <= ckpt.step_time_ms + EPS
    total = sum(s.exposed_recovery_ms + s.hidden_recovery_ms for s in fsr.stages)
    assert total == approx(A * P * R)
    assert sum(s.hidden_recovery_ms for s in fsr.stages) > 0
    check_all(fsr, costs)


# ------------------------------------------------------------ lifecycle mechanisms

@pytest.mark.parametrize("P,A,L", [(3, 6, 4), (2, 5, 2), (4, 8, 8)])
def test_exposed_tail_closed_forms_per_mechanism(P, A, L):
    # per-layer GradSync and update+prefetch keep up with the per-layer backward,
    # so only layer 0's chain is exposed when layer-wise; bulk exposes everything.
    G, Uu, W = 2.0, 1.0, 0.8
    costs = PipelineCosts.uniform(P, A, t_forward=1.0, t_backward=2.0, t_update=Uu, t_gradsync=G,
                                  t_prefetch=W, layers_per_stage=L)
    main = (A + P - 1) * 3.0
    want = {"full": (G + Uu + W) / L, "no-update-prefetch": G / L + Uu + W, "no-layerwise": G + Uu + W}
    tails = {}
    for name, tail in want.items():
        res = simulate(costs, mechanisms=Mechanisms.variant(name))
        assert res.exposed_tail_ms == approx(tail), name
        assert res.step_time_ms == approx(main + tail), name
        tails[name] = res.exposed_tail_ms
        check_all(res, costs)
    assert tails["full"] < tails["no-update-prefetch"] < tails["no-layerwise"]


@pytest.mark.parametrize("G", [0.5, 3.0, 40.0])
def test_layerwise_tail_strictly_smaller_than_bulk(G):
    costs = PipelineCosts.uniform(4, 8, t_forward=1.0, t_backward=2.0, t_update=0.5, t_gradsync=G,
                                  t_prefetch=0.2, layers_per_stage=4, t_transfer=0.1, t_recompute=0.5)
    lw = simulate(costs)
    bulk = simulate(costs, mechanisms=Mechanisms(layerwise=False))
    assert lw.exposed_tail_ms < bulk.exposed_tail_ms
    assert lw.step_time_ms < bulk.step_time_ms
    check_all(lw, costs)
    check_all(bulk, costs)


def test_deadline_aware_prefetch_overlaps_next_forward():
    # DDR-bound PrefetchW backs up behind the last backward; earliest-deadline-first
    # serves layer 0 first and lets layer 2 finish during the next step's forward.
    costs = PipelineCosts.uniform(2, 4, t_forward=1.0, t_backward=2.0, t_prefetch=8.0, layers_per_stage=4)
    res = simulate(costs)
    E, T = res.last_backward_end_ms, res.step_time_ms
    w = {t.layer: t for t in res.tasks if t.kind == "PrefetchW" and t.stage == 0}
    assert [w[layer_index].start_ms - E for layer_index in (3, 0, 1, 2)] == [approx(-1.5), approx(0.5), approx(2.5),
                                                                             approx(4.5)]
    assert T - E == approx(6.0)
    assert w[2].end_ms == approx(T + res.next_forward_ms[2])       # exactly at its deadline, after T
    assert w[2].end_ms > T
    bulk = simulate(costs, mechanisms=Mechanisms.variant("no-update-prefetch"))
    assert bulk.exposed_tail_ms == approx(8.0)
    check_all(res, costs)
    check_all(bulk, costs)


def test_compute_resident_prefetch_cannot_spill_into_next_forward():
    # same backlog as above, but PrefetchW runs on compute: the next step's forward needs
    # that compute, so the step cannot end before every PrefetchW is done
    costs = PipelineCosts.uniform(2, 4, t_forward=1.0, t_backward=2.0, t_prefetch=8.0, layers_per_stage=4,
                                  prefetch_resource="compute")
    res = simulate(costs)
    assert res.exposed_tail_ms == approx(8.0)
    assert max(t.end_ms for t in res.tasks if t.stage == 0) == approx(res.step_time_ms)
    check_all(res, costs)


def test_fsr_fillers_wait_for_a_window_that_fits():
    # lookahead 2 lets R of the next-but-one micro-batch fill idle time; recovery longer
    # than the transfer waits must not be started there (it would delay the pipeline)
    costs = PipelineCosts.uniform(4, 12, t_forward=1.0, t_backward=2.0, t_recompute=1.6, t_transfer=0.4,
                                  layers_per_stage=2)
    res = simulate(costs, mechanisms=Mechanisms(fsr_lookahead=2))
    check_all(res, costs)


def test_transfers_keep_priority_over_gradsync():
    # huge per-layer GradSync: it must never delay a stage-boundary transfer, so the
    # main path (last backward) is the same as without any GradSync
    base = PipelineCosts.uniform(4, 6, t_forward=1.0, t_backward=2.0, t_transfer=0.3, layers_per_stage=3)
    heavy = PipelineCosts.uniform(4, 6, t_forward=1.0, t_backward=2.0, t_transfer=0.3, layers_per_stage=3,
                                  t_gradsync=30.0)
    a, b = simulate(base), simulate(heavy)
    assert b.last_backward_end_ms == approx(a.last_backward_end_ms)
    main = lambda r: [(t.kind, t.stage, t.microbatch, t.layer, t.start_ms) for t in r.tasks  # noqa: E731
                      if t.kind in ("F", "B", "Send", "Recv")]
    assert main(a) == main(b)
    check_all(b, heavy)


def test_bulk_update_task_and_annotations():
    costs = PipelineCosts.uniform(3, 4, t_forward=1.0, t_backward=2.0, t_gradsync=1.5, t_update=3.0,
                                  layers_per_stage=2, bulk_update_ms=2.0)
    bulk = simulate(costs, mechanisms=Mechanisms.all_off())
    kinds = Counter(t.kind for t in bulk.tasks)
    assert kinds["Update"] == 3 and kinds["UpdateShard"] == 0 and kinds["PrefetchW"] == 6
    # stage 0's bulk phase runs after the last backward with nothing else to do
    s0 = [(t, n) for t, n in zip(bulk.tasks, bulk.notes, strict=False) if t.stage == 0 and t.kind in ("GradSync",
                                                                                                      "Update")]
    assert all(n.hidden_by.startswith("compute-idle while waiting on") for _, n in s0)
    assert bulk.exposed_tail_ms == approx(1.5 + 2.0)
    # layer-wise ignores bulk_update_ms; the upper layer's GradSync hides under stage 0's backward
    lw = simulate(costs)
    assert Counter(t.kind for t in lw.tasks)["UpdateShard"] == 6
    g1 = next(n for t, n in zip(lw.tasks, lw.notes, strict=False) if t.kind == "GradSync" and t.layer == 1)
    assert g1.hidden_by == "link-idle during compute" and g1.exposed_ms == approx(0.0)
    # stage 2 finishes its backward early: its chain hides in the pipeline bubble
    g5 = next(n for t, n in zip(lw.tasks, lw.notes, strict=False) if t.kind == "GradSync" and t.layer == 5)
    assert g5.hidden_by in ("bubble", "link-idle during compute")
    check_all(bulk, costs)
    check_all(lw, costs)


def test_update_on_compute_fills_bubbles_not_the_main_path():
    costs = PipelineCosts.uniform(4, 6, t_forward=1.0, t_backward=2.0, t_update=2.0, layers_per_stage=2,
                                  update_resource="compute", prefetch_resource="compute")
    res = simulate(costs)
    ref = simulate(PipelineCosts.uniform(4, 6, t_forward=1.0, t_backward=2.0, layers_per_stage=2))
    assert res.last_backward_end_ms == approx(ref.last_backward_end_ms)
    assert all(t.resource == "compute" for t in res.tasks if t.kind in ("UpdateShard", "PrefetchW"))
    check_all(res, costs)


# ------------------------------------------------------------ PrefetchW on the link (ZeRO-1/2 all-gather)

def _link_life(res, stage):
    """(kind initial, layer) of the stage's link lifecycle tasks in the order the port ran them."""
    ts = sorted((t for t in res.tasks if t.stage == stage and t.resource == "link"
                 and t.kind in ("GradSync", "PrefetchW") and t.end_ms > t.start_ms), key=lambda t: t.start_ms)
    return [(t.kind[0], t.layer) for t in ts]


@pytest.mark.parametrize("P,A,L", [(3, 6, 4), (2, 5, 2), (4, 8, 8)])
def test_link_prefetch_closed_forms_per_mechanism(P, A, L):
    # per layer G + U + W = 1.9/L fits the per-layer backward 2/L: each layer's chain (with its
    # PrefetchW on the link) ends before the next layer's GradSync is ready
    G, Uu, W = 1.0, 0.3, 0.6
    costs = PipelineCosts.uniform(P, A, t_forward=1.0, t_backward=2.0, t_update=Uu, t_gradsync=G,
                                  t_prefetch=W, layers_per_stage=L, prefetch_resource="link")
    main = (A + P - 1) * 3.0
    want = {"full": (G + Uu + W) / L, "no-update-prefetch": G / L + Uu + W, "no-layerwise": G + Uu + W}
    for name, tail in want.items():
        res = simulate(costs, mechanisms=Mechanisms.variant(name))
        assert res.exposed_tail_ms == approx(tail), name
        assert res.step_time_ms == approx(main + tail), name
        assert {t.resource for t in res.tasks if t.kind == "PrefetchW"} == {"link"}
        check_all(res, costs)
        if name == "full" and L > 1:     # G, W alternate per layer, top layer first
            assert _link_life(res, 0) == [(k, layer_index) for layer_index in reversed(range(L)) for k in "GP"]


def test_link_prefetch_shares_the_port_earliest_deadline_first():
    # per layer g = 0.3, w = 0.4 on the link against a 0.5 backward: the port falls behind.
    # Deadline-aware: GradSync and PrefetchW are served earliest deadline (lowest layer) first,
    # without preemption; PrefetchW(2) is left for the next step's forward.
    kw = dict(t_forward=1.0, t_backward=2.0, t_gradsync=1.2, t_prefetch=1.6, layers_per_stage=4)
    costs = PipelineCosts.uniform(3, 6, prefetch_resource="link", **kw)
    res = simulate(costs)
    assert _link_life(res, 0) == [("G", 3), ("P", 3), ("G", 2), ("G", 1), ("P", 1), ("G", 0), ("P", 0), ("P", 2)]
    # at the last backward's end the port is 0.2 into PrefetchW(1); then GradSync(0), PrefetchW(0)
    assert res.exposed_tail_ms == approx(0.2 + 0.3 + 0.4)
    w2 = next(t for t in res.tasks if t.kind == "PrefetchW" and t.layer == 2)
    assert res.step_time_ms < w2.end_ms <= res.step_time_ms + res.next_forward_ms[2] + EPS
    g0 = next(n for t, n in zip(res.tasks, res.notes, strict=False) if t.kind == "GradSync" and t.layer == 0)
    assert g0.hidden_by == "compute-idle while waiting on link" and g0.exposed_ms == approx(0.3)
    check_all(res, costs)
    # on DDR the same PrefetchW does not compete with GradSync: G(0) then W(0)
    ddr = simulate(PipelineCosts.uniform(3, 6, prefetch_resource="ddr", **kw))
    assert ddr.exposed_tail_ms == approx(0.3 + 0.4)
    # bulk phases: G/L + W, and G + W
    for name, tail in (("no-update-prefetch", 0.3 + 1.6), ("no-layerwise", 1.2 + 1.6)):
        bulk = simulate(costs, mechanisms=Mechanisms.variant(name))
        assert bulk.exposed_tail_ms == approx(tail), name
        check_all(bulk, costs)


@pytest.mark.parametrize("variant", ["full", "no-update-prefetch", "no-layerwise"])
def test_transfers_keep_priority_over_link_prefetch(variant):
    base = PipelineCosts.uniform(4, 6, t_forward=1.0, t_backward=2.0, t_transfer=0.3, layers_per_stage=3)
    heavy = PipelineCosts.uniform(4, 6, t_forward=1.0, t_backward=2.0, t_transfer=0.3, layers_per_stage=3,
                                  t_gradsync=3.0, t_prefetch=30.0, prefetch_resource="link")
    mech = Mechanisms.variant(variant)
    a, b = simulate(base, mechanisms=mech), simulate(heavy, mechanisms=mech)
    main = lambda r: [(t.kind, t.stage, t.microbatch, t.layer, t.start_ms) for t in r.tasks  # noqa: E731
                      if t.kind in ("F", "B", "Send", "Recv")]
    assert main(a) == main(b)
    check_all(b, heavy)


def test_zero_length_link_prefetch_changes_nothing():
    # no all-gather (Z = 0, D = 1): zero-length PrefetchWs occupy nothing, GradSync stays FIFO
    kw = dict(t_forward=1.0, t_backward=2.0, t_gradsync=8.0, t_update=0.5, layers_per_stage=4, t_transfer=0.2)
    a = simulate(PipelineCosts.uniform(3, 5, prefetch_resource="ddr", **kw))
    b = simulate(PipelineCosts.uniform(3, 5, prefetch_resource="link", **kw))
    strip = lambda r: [(t.kind, t.stage, t.microbatch, t.layer, t.start_ms, t.end_ms) for t in r.tasks]  # noqa: E731
    assert strip(a) == strip(b) and a.step_time_ms == b.step_time_ms


# ------------------------------------------------------------ general invariants

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(P=st.integers(1, 5), A=st.integers(1, 7), L=st.integers(1, 3),
       times=st.lists(st.sampled_from([0.0, 0.3, 1.0, 2.5]), min_size=6, max_size=6),
       X=st.sampled_from([0.0, 0.2, 1.3]), schedule=st.sampled_from(["1f1b", "gpipe"]),
       variant=st.sampled_from(["full", "no-fsr", "no-update-prefetch", "no-layerwise", "all-off"]),
       rec=st.sampled_from(["compute", "ddr"]), upd=st.sampled_from(["compute", "ddr", "link"]),
       pre=st.sampled_from(["compute", "ddr", "link"]), lookahead=st.integers(1, 3))
def test_invariants_hold_for_random_configs(P, A, L, times, X, schedule, variant, rec, upd, pre, lookahead):
    fwd, bwd = 1.0 + times[0], 1.0 + times[1]     # main-path tasks have positive length
    costs = PipelineCosts.uniform(P, A, t_forward=fwd, t_backward=bwd, t_recompute=times[2], t_gradsync=times[3],
                                  t_update=times[4], t_prefetch=times[5], t_transfer=X, layers_per_stage=L,
                                  recovery_resource=rec, update_resource=upd, prefetch_resource=pre)
    base = Mechanisms.variant(variant)
    mech = Mechanisms(layerwise=base.layerwise, update_prefetch=base.update_prefetch, fsr=base.fsr,
                      activation=base.activation, fsr_lookahead=lookahead)
    res = simulate(costs, schedule=schedule, mechanisms=mech)
    check_all(res, costs, schedule)
    inflight = [min(P - p, A) for p in range(P)] if schedule == "1f1b" else [A] * P
    assert res.peak_inflight == inflight


def test_determinism():
    costs = PipelineCosts.uniform(4, 9, t_forward=1.0, t_backward=2.0, t_recompute=0.9, t_gradsync=2.0,
                                  t_update=1.0, t_prefetch=0.5, t_transfer=0.15, layers_per_stage=3)
    a, b = simulate(costs), simulate(costs)
    assert a.tasks == b.tasks and a.notes == b.notes and a.step_time_ms == b.step_time_ms
    assert a.to_json() == b.to_json()


def test_activation_residency_closed_forms():
    P, A, L = 4, 8, 2
    full_b, ckpt_b, rec_b = 1000, 100, 700
    costs = PipelineCosts.uniform(P, A, t_forward=1.0, t_backward=2.0, t_recompute=0.5, layers_per_stage=L,
                                  act_full_bytes=full_b, act_ckpt_bytes=ckpt_b, recovery_bytes=rec_b)
    n = [min(P - p, A) for p in range(P)]
    full = simulate(costs, mechanisms=Mechanisms(activation="full"))
    assert activation_residency(full, costs) == [k * L * full_b for k in n]
    ckpt = simulate(costs, mechanisms=Mechanisms(activation="ckpt"))
    assert activation_residency(ckpt, costs) == [k * L * ckpt_b + max(full_b - ckpt_b, rec_b) for k in n]
    fsr = simulate(costs)
    got = activation_residency(fsr, costs)
    # Eq. 6: checkpoints of the in-flight micro-batches plus at most one micro-batch of
    # recovery buffers (lookahead 1), never the full-save footprint
    for p in range(P):
        assert n[p] * L * ckpt_b + rec_b <= got[p] <= n[p] * L * ckpt_b + L * rec_b + (full_b - ckpt_b)
        assert got[p] < activation_residency(full, costs)[p] or n[p] == 1


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_large_step_p8_a128_l8_completes():
    # its speed is tracked by the asv benchmark TimeRatrain.time_simulate_step_p8_a128_l8
    costs = PipelineCosts.uniform(8, 128, t_forward=8.0, t_backward=16.0, t_recompute=8.0, t_gradsync=6.0,
                                  t_update=4.0, t_prefetch=1.0, t_transfer=0.3, layers_per_stage=8)
    res = simulate(costs)
    assert len(res.tasks) > 8 * 128 * 8 * 3


def test_mechanisms_api_and_errors():
    assert Mechanisms() == Mechanisms.variant("full")
    off = Mechanisms.all_off()
    assert (off.layerwise, off.update_prefetch, off.fsr, off.activation) == (False, False, False, "ckpt")
    assert Mechanisms.variant("no-fsr").policy == "ckpt"
    assert Mechanisms.variant("no-layerwise").deadline_aware is False
    with pytest.raises(ConfigError, match="variant"):
        Mechanisms.variant("no-magic")
    with pytest.raises(ConfigError, match="activation"):
        Mechanisms(activation="offload")
    with pytest.raises(ConfigError, match="fsr_lookahead"):
        Mechanisms(fsr_lookahead=0)
    with pytest.raises(ConfigError, match="schedule"):
        simulate(PipelineCosts.uniform(2, 2, t_forward=1, t_backward=1), schedule="zb")
    with pytest.raises(ConfigError, match="forward_ms"):
        LayerCosts(forward_ms=-1.0, backward_ms=1.0)
    with pytest.raises(ConfigError, match="microbatches"):
        PipelineCosts.uniform(2, 0, t_forward=1, t_backward=1)
    with pytest.raises(ConfigError, match="recovery_resource"):
        PipelineCosts.uniform(2, 2, t_forward=1, t_backward=1, recovery_resource="link")
    with pytest.raises(ConfigError, match="prefetch_resource.*'pcie'"):
        PipelineCosts.uniform(2, 2, t_forward=1, t_backward=1, prefetch_resource="pcie")
    c = PipelineCosts.uniform(2, 2, t_forward=1, t_backward=1, update_resource="link", prefetch_resource="link")
    assert (c.to_json()["update_resource"], c.to_json()["prefetch_resource"]) == ("link", "link")
    with pytest.raises(ConfigError, match=r"stages\[1\]"):
        PipelineCosts(stages=[[LayerCosts(1, 1)], []], transfer_ms=0, microbatches=1)


def test_uniform_costs_split_evenly():
    c = PipelineCosts.uniform(3, 4, t_forward=6.0, t_backward=9.0, t_gradsync=3.0, layers_per_stage=3)
    assert c.num_layers == 9 and list(c.layer_range(1)) == [3, 4, 5] and c.stage_of(7) == 2
    assert c.layer(4).forward_ms == 2.0 and c.layer(4).backward_ms == 3.0 and c.layer(4).gradsync_ms == 1.0
    assert c.stage_total(2, "forward_ms") == pytest.approx(6.0)


# ------------------------------------------------------------ CLI

BASE_ARGS = ["simulate", "--uniform", "--stages", "4", "--microbatches", "6", "--t-forward", "1.5",
             "--t-backward", "2.5", "--t-update", "0.75"]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_cli_json(capsys, tmp_path):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    assert cli_main(BASE_ARGS + ["--trace", str(trace), "--plot", str(png), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["step_time_ms"] == approx((6 + 4 - 1) * 4.0 + 0.75)
    assert payload["exposed_tail_ms"] == approx(0.75)
    assert payload["peak_inflight"] == [4, 3, 2, 1]
    tl = payload["timeline"]
    assert tl and all(set(t) == {"stage", "kind", "microbatch", "layer", "resource", "start_ms", "end_ms"}
                      for t in tl)
    assert Counter(t["kind"] for t in tl)["F"] == 4 * 6
    ev = json.loads(trace.read_text())["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == len(tl) and {e["pid"] for e in xs} == {0, 1, 2, 3}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_flags_and_errors(capsys):
    assert cli_main(BASE_ARGS + ["--t-recompute", "0.5", "--activation", "ckpt", "--json"]) == 0
    ckpt = json.loads(capsys.readouterr().out)
    assert ckpt["step_time_ms"] == approx(9 * 4.5 + 0.75)
    assert cli_main(BASE_ARGS + ["--t-gradsync", "2", "--layers-per-stage", "2", "--no-layerwise",
                                 "--no-fsr", "--json"]) == 0
    bulk = json.loads(capsys.readouterr().out)
    assert bulk["mechanisms"]["layerwise"] is False and bulk["exposed_tail_ms"] == approx(2.75)
    assert cli_main(BASE_ARGS) == 0
    assert "exposed tail" in capsys.readouterr().out
    assert cli_main(["simulate", "--stages", "4"]) == 2
    assert "--model NAME" in capsys.readouterr().err
    assert cli_main(["simulate", "--uniform", "--stages", "4", "--microbatches", "2", "--t-forward", "1"]) == 2
    assert "--t-backward is required" in capsys.readouterr().err
    assert cli_main(BASE_ARGS + ["--t-gradsync", "-1"]) == 2


def test_recovery_buffer_capacity_hand_case():
    # P = 1, A = 1, L = 3, recovery on DDR: F0 F1 F2, then B2 B1 B0. Unbounded: R0 and R1 run
    # during the later forwards, R2 after F2 is exposed once. One buffer: R1 waits for B2 and
    # R0 for B1, each on the backward path. Two: R0 runs beside B1 (R < B), as unbounded.
    R = 1.0                                   # per stage; uniform() splits each time over the 3 layers
    costs = PipelineCosts.uniform(1, 1, t_forward=F, t_backward=B, t_update=0.0, t_recompute=R, layers_per_stage=3,
                                  recovery_resource="ddr")
    steps = {cap: simulate(costs, mechanisms=Mechanisms(fsr_buffer_layers=cap)).step_time_ms for cap in (None, 1, 2)}
    assert steps[None] == approx(F + R / 3 + B)
    assert steps[1] == approx(F + R + B)
    assert steps[2] == approx(steps[None])
    with pytest.raises(ConfigError, match="fsr_buffer_layers"):
        Mechanisms(fsr_buffer_layers=0)


def test_cli_text_writes_times_in_the_unit_that_suits_them(capsys):
    """A 36.75 ms step reads in ms; the same step with stage times x 1000 in seconds, never as ms."""
    from rtcommon.durations import format_ms
    assert [format_ms(x) for x in (0.5, 999.4, 1500.0, 963013.496, 1.5e6)] == [
        "0.500 ms", "999.40 ms", "1.500 s", "963.01 s", "1500.0 s"]
    assert cli_main(BASE_ARGS) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["step", "time", "36.75", "ms"] and lines[4].endswith("(times in ms)")
    slow = ["simulate", "--uniform", "--stages", "4", "--microbatches", "6", "--t-forward", "1500",
            "--t-backward", "2500", "--t-update", "750"]
    assert cli_main(slow) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["step", "time", "36.75", "s"] and lines[4].endswith("(times in s)")
    assert lines[5].split()[1] == "24.00"          # stage 0 computes 6 x (1.5 + 2.5) s


def test_cli_every_simulate_flag_has_help():
    import argparse

    from ratrain.cli.simulate import register
    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    parser = sub.choices["simulate"]
    bare = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert bare == []


def test_cli_plot_window_in_seconds(capsys, tmp_path, monkeypatch):
    """--window START:END (s) reaches the plot as a ms range; the axis reads in the span's unit."""
    import ratrain.cli.simulate as cli_simulate
    seen = {}
    real = cli_simulate.plot_timeline
    monkeypatch.setattr(cli_simulate, "plot_timeline",
                        lambda result, path, **kw: (seen.update(kw), real(result, path, **kw)))
    png = tmp_path / "w.png"
    slow = ["simulate", "--uniform", "--stages", "4", "--microbatches", "6", "--t-forward", "1500",
            "--t-backward", "2500", "--plot", str(png)]
    assert cli_main(slow + ["--window", "10:20"]) == 0
    assert seen["t_range"] == (10_000.0, 20_000.0) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert cli_main(slow + ["--window", "20:10"]) == 2
    assert "START < END" in capsys.readouterr().err
    assert cli_main(BASE_ARGS + ["--window", "0:1"]) == 2
    assert "--window applies to --plot" in capsys.readouterr().err
    from rtcommon.durations import time_unit
    assert time_unit(10_000.0) == ("s", 1e3) and time_unit(999.0) == ("ms", 1.0)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_collector_state_restored_around_a_simulation():
    """The simulator pauses Python's cyclic collector while it runs and gives it back as it was, also
    when the inputs are refused; the unlinked task graph leaves no cycles for the collector."""
    import gc

    costs = PipelineCosts.uniform(3, 6, t_forward=1.0, t_backward=2.0, t_gradsync=0.5, layers_per_stage=2)
    assert gc.isenabled()
    simulate(costs)
    assert gc.isenabled()
    with pytest.raises(ConfigError):
        simulate(costs, mechanisms="all-off")
    assert gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        simulate(costs)
        assert not gc.isenabled()
        assert gc.collect() == 0          # nothing cyclic left behind by the step
    finally:
        gc.enable()

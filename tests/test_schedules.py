"""Interleaved 1F1B and ZB-H1: orders, hand-checked times, invariants, memory, lifecycle, CLI.

Replays of these timelines on the tiny model live in tests/test_executor.py.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratrain.cli import main as cli_main
from ratrain.cost.tasks import PipelineCosts
from ratrain.errors import ConfigError
from ratrain.sim.pipeline_order import (
    PipelineSchedule,
    build,
    chunk_layers,
    held_activation_sets,
    interleaved,
    interleaved_chunks,
    interleaved_sequence,
    interleaved_warmup,
    one_f_one_b,
    zb_h1,
)
from ratrain.sim.simulator import LIFECYCLE_KINDS, Mechanisms, activation_residency, simulate
from ratrain.sim.timeline import RESOURCES, TASK_KINDS
from ratrain.sim.weight_split import weight_fractions, weight_gradient_bytes
from ratrain.spec.models import get_model
from ratrain.spec.parallel import in_flight_activation_sets

EPS = 1e-9


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=1e-9)


def ops(kinds: str, chunked: bool = False):
    """'F0 F1 B0' -> [("F", 0, 0), ...]; with ``chunked``, 'F0.1' is micro-batch 0, chunk 1."""
    out = []
    for tok in kinds.split():
        if chunked:
            m, c = tok[1:].split(".")
            out.append((tok[0], int(m), int(c)))
        else:
            out.append((tok[0], int(tok[1:]), 0))
    return out


# ------------------------------------------------------------ orders, hand-written

def test_interleaved_order_p2_a4_v2_by_hand():
    # Megatron: groups of P=2 micro-batches, chunk by chunk; stage 0 warms up 2(P-1) + (v-1)P = 4
    # virtual micro-batches, stage 1 warms up (v-1)P = 2; backwards run the chunks in reverse.
    got = interleaved(2, 4, 2)
    assert got[0] == ops("F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0", True)
    assert got[1] == ops("F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0", True)
    assert interleaved_sequence(3, 6, 2, backward=True) == [(0, 1), (1, 1), (2, 1), (0, 0), (1, 0), (2, 0),
                                                            (3, 1), (4, 1), (5, 1), (3, 0), (4, 0), (5, 0)]
    assert [interleaved_warmup(3, 6, 2, p) for p in range(3)] == [7, 5, 3]
    assert [interleaved_warmup(3, 3, 2, p) for p in range(3)] == [6, 6, 6]     # A <= P: all forwards first


def test_zb_h1_order_p3_a4_by_hand():
    # 1F1B's F/B order; stage p holds back p weight gradients, then one W after every B, the rest at the end
    got = zb_h1(3, 4)
    assert got[0] == ops("F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3")
    assert got[1] == ops("F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3")
    assert got[2] == ops("F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3")
    assert zb_h1(3, 2)[1] == ops("F0 F1 B0 B1 W0 W1")


# ------------------------------------------------------------ orders, properties

@pytest.mark.parametrize("P", [1, 2, 3, 4])
@pytest.mark.parametrize("A", [1, 2, 3, 4, 5, 8, 12])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_interleaved_order_properties(P, A, v):
    if v > 1 and A > P and A % P:
        with pytest.raises(ConfigError, match="Megatron's rule"):
            interleaved(P, A, v)
        return
    orders = interleaved(P, A, v)
    if v == 1:
        assert orders == one_f_one_b(P, A)
        return
    fwd = interleaved_sequence(P, A, v, backward=False)
    bwd = interleaved_sequence(P, A, v, backward=True)
    assert sorted(fwd) == sorted(bwd) == sorted((m, c) for m in range(A) for c in range(v))
    for p, o in enumerate(orders):
        assert [(m, c) for k, m, c in o if k == "F"] == fwd
        assert [(m, c) for k, m, c in o if k == "B"] == bwd
        for m in range(A):
            for c in range(v):
                assert o.index(("F", m, c)) < o.index(("B", m, c))
        warm = interleaved_warmup(P, A, v, p)
        assert next(i for i, op in enumerate(o) if op[0] == "B") == min(warm + 1, A * v) \
            if warm < A * v else A * v
        assert held_activation_sets(o, v) == approx(in_flight_activation_sets("interleaved", p, P, A, v))


@pytest.mark.parametrize("P", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("A", [1, 2, 3, 4, 7, 12])
def test_zb_h1_order_properties(P, A):
    for p, (o, base) in enumerate(zip(zb_h1(P, A), one_f_one_b(P, A), strict=True)):
        assert [op for op in o if op[0] != "W"] == base                    # F/B exactly 1F1B's
        assert [m for k, m, _ in o if k == "W"] == list(range(A))          # W in micro-batch order
        for m in range(A):
            assert o.index(("B", m, 0)) < o.index(("W", m, 0))
        first_w = o.index(("W", 0, 0))
        assert sum(1 for k, _, _ in o[:first_w] if k == "B") == min(p + 1, A)
        assert held_activation_sets(o) == min(P, A) == in_flight_activation_sets("zb-h1", p, P, A)
        assert in_flight_activation_sets("1f1b", p, P, A) == held_activation_sets(base) == min(P - p, A)


def test_schedule_spec_and_errors():
    assert PipelineSchedule.of("zb-h1") == PipelineSchedule("zb-h1")
    assert build(PipelineSchedule("interleaved", 1), 3, 4) == one_f_one_b(3, 4)
    s = PipelineSchedule("zb-h1", weight_fraction=[0.25, 0.75])
    assert s.weight_fraction == (0.25, 0.75) and s.layer_weight_fraction(1) == 0.75
    assert PipelineSchedule("1f1b").layer_weight_fraction(0) == 0.0          # no split outside zb-h1
    with pytest.raises(ConfigError, match="schedule must be one of"):
        PipelineSchedule("zb")
    with pytest.raises(ConfigError, match="needs schedule 'interleaved'"):
        PipelineSchedule("1f1b", virtual_stages=2)
    with pytest.raises(ConfigError, match="weight_fraction must be in"):
        PipelineSchedule("zb-h1", weight_fraction=1.5)
    with pytest.raises(ConfigError, match="virtual_stages"):
        PipelineSchedule("interleaved", virtual_stages=0)
    with pytest.raises(ConfigError, match="chunk_sizes"):
        PipelineSchedule("interleaved", 2, chunk_sizes=(2, 2, 2)).chunks(8, 2)
    assert [list(r) for r in PipelineSchedule("interleaved", 2, chunk_sizes=(1, 3, 3, 1)).chunks(8, 2)] == \
        [[0], [1, 2, 3], [4, 5, 6], [7]]


def test_chunk_cuts():
    # earlier chunks take the extra layers; every stage of a uniform pipeline still gets its layers
    assert [len(r) for r in chunk_layers(6, 4)] == [2, 2, 1, 1]
    chunks = interleaved_chunks(6, 2, 2)
    assert [sum(len(chunks[g]) for g in range(p, 4, 2)) for p in range(2)] == [3, 3]
    assert [list(r) for r in interleaved_chunks(8, 2, 2)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ConfigError, match="--virtual-stages 3 does not divide the layers: 4 layers"):
        interleaved_chunks(4, 2, 3)


# ------------------------------------------------------------ hand-checked times

def oracle_makespan(P: int, A: int, sched: PipelineSchedule, layers_per_stage: int, tf: float, tb: float,
                    wf: float) -> dict:
    """Op-level list schedule of the fixed orders, written independently of the simulator: each stage
    runs its ops in order, an op starts when its stage is free and its input is there (no transfers).
    Returns {(stage, kind, m, chunk): (start, end)}."""
    v = sched.virtual_stages if sched.name == "interleaved" else 1
    chunks = sched.chunks(P * layers_per_stage, P) if v > 1 else chunk_layers(P * layers_per_stage, P)
    per_layer_f, per_layer_b = tf / layers_per_stage, tb / layers_per_stage
    G = P * v
    end: dict = {}
    orders = build(sched, P, A)
    pos, free = [0] * P, [0.0] * P
    out = {}
    while any(pos[p] < len(orders[p]) for p in range(P)):
        moved = False
        for p in range(P):
            if pos[p] >= len(orders[p]):
                continue
            kind, m, c = orders[p][pos[p]]
            g = c * P + p
            n = len(chunks[g])
            if kind == "F":
                dep = ("F", m, g - 1) if g > 0 else None
                dur = n * per_layer_f
            elif kind == "B":
                dep = ("B", m, g + 1) if g < G - 1 else ("F", m, g)
                dur = n * per_layer_b * (1 - (wf if sched.name == "zb-h1" else 0.0))
            else:
                dep = ("B", m, g)
                dur = n * per_layer_b * wf
            if dep is not None and dep not in end:
                continue
            t0 = max(free[p], end[dep] if dep else 0.0)
            end[(kind, m, g)] = free[p] = t0 + dur
            out[(p, kind, m, c)] = (t0, t0 + dur)
            pos[p] += 1
            moved = True
        assert moved, "oracle deadlocked"
    return out


HAND = [
    # (schedule, P, A, expected last-backward end) for F = 1, B = 2 per stage (zb-h1: W = 1 of the 2)
    ("1f1b", 2, 2, 9.0), ("1f1b", 3, 4, 18.0),
    ("zb-h1", 2, 2, 7.0), ("zb-h1", 3, 4, 14.0), ("zb-h1", 3, 2, 9.0), ("zb-h1", 2, 4, 13.0),
    ("interleaved", 2, 2, 7.5), ("interleaved", 2, 4, 13.5), ("interleaved", 3, 3, 12.0),
    ("interleaved", 3, 6, 21.0), ("interleaved", 3, 2, 10.5),
]


@pytest.mark.parametrize("name,P,A,want", HAND)
def test_hand_checked_step_times(name, P, A, want):
    """Worked by hand on paper (unit chunks, no transfers): ZB-H1's bubble is (P-1)(F+B-W) for
    A >= P, Megatron's interleaved bubble (P-1)(F+B)/v for A a multiple of P."""
    sched = PipelineSchedule(name, virtual_stages=2 if name == "interleaved" else 1)
    costs = PipelineCosts.uniform(P, A, t_forward=1.0, t_backward=2.0, layers_per_stage=2)
    res = simulate(costs, schedule=sched, mechanisms=Mechanisms(activation="full"))
    assert res.last_backward_end_ms == approx(want)
    assert res.step_time_ms == approx(want)
    if name == "zb-h1" and A >= P:
        assert want == approx(A * 3.0 + (P - 1) * (1.0 + 1.0 - 1.0))
    if name == "interleaved" and A % P == 0 and A > P:
        assert want == approx(A * 3.0 + (P - 1) * 3.0 / 2)


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("interleaved", 3),
                                    ("zb-h1", 1)])
@pytest.mark.parametrize("P,A", [(2, 2), (2, 3), (2, 4), (3, 2), (3, 3), (3, 4), (4, 8)])
@pytest.mark.parametrize("tf,tb,wf", [(1.0, 2.0, 0.5), (1.3, 1.7, 0.2), (0.7, 3.1, 0.9)])
def test_every_op_starts_when_the_oracle_says(name, v, P, A, tf, tb, wf):
    lps = 3
    sched = PipelineSchedule(name, virtual_stages=v, weight_fraction=wf)
    costs = PipelineCosts.uniform(P, A, t_forward=tf, t_backward=tb, layers_per_stage=lps)
    if name == "interleaved" and A > P and A % P:
        with pytest.raises(ConfigError, match=f"A={A}.* must be a multiple of the stages .P={P}"):
            simulate(costs, schedule=sched)
        return
    res = simulate(costs, schedule=sched, mechanisms=Mechanisms(activation="full"))
    want = oracle_makespan(P, A, sched, lps, tf, tb, wf)
    chunks = sched.chunks(P * lps, P) if v > 1 else chunk_layers(P * lps, P)
    chunk_of = {layer: g for g, r in enumerate(chunks) for layer in r}
    got: dict = {}
    for t in res.tasks:
        if t.kind in ("F", "B", "W"):
            key = (t.stage, t.kind, t.microbatch, chunk_of[t.layer] // P)
            a, z = got.get(key, (float("inf"), float("-inf")))
            got[key] = (min(a, t.start_ms), max(z, t.end_ms))
    assert set(got) == set(want)
    for key, (a, z) in want.items():
        assert got[key][0] == pytest.approx(a, abs=1e-9), key
        assert got[key][1] == pytest.approx(z, abs=1e-9), key


# ------------------------------------------------------------ invariants for any configuration

def check_schedule_invariants(res, costs, sched: PipelineSchedule):
    P, A, X = costs.num_stages, costs.microbatches, costs.transfer_ms
    L = costs.num_layers
    v = sched.virtual_stages if sched.name == "interleaved" else 1
    chunks = sched.chunks(L, P) if v > 1 else [costs.layer_range(p) for p in range(P)]
    stage_of = {layer: g % P for g, r in enumerate(chunks) for layer in r}
    policy = res.mechanisms.policy
    T = res.step_time_ms
    # resources: never two tasks at once, not even across the step boundary
    per: dict = {}
    for t in res.tasks:
        assert t.kind in TASK_KINDS and t.resource in RESOURCES and t.end_ms >= t.start_ms >= 0.0
        if t.kind in ("F", "B", "W", "R", "GradSync", "UpdateShard", "PrefetchW", "Update") and t.layer is not None:
            assert t.stage == stage_of[t.layer], t
        if t.end_ms > t.start_ms:
            per.setdefault((t.stage, t.resource), []).append((t.start_ms, t.end_ms))
    for ivs in per.values():
        both = sorted(ivs + [(a + T, b + T) for a, b in ivs])
        for (_, a1), (b0, _) in zip(both, both[1:], strict=False):
            assert b0 >= a1 - EPS
    # one F and one B per (layer, micro-batch); W exactly under zb-h1; R exactly under fsr
    idx: dict = {}
    for t in res.tasks:
        if t.kind in ("F", "B", "W", "R"):
            assert (t.kind, t.layer, t.microbatch) not in idx, t
            idx[(t.kind, t.layer, t.microbatch)] = t
    want = {(layer, m) for layer in range(L) for m in range(A)}
    for kind in ("F", "B"):
        assert {(k[1], k[2]) for k in idx if k[0] == kind} == want
    assert {(k[1], k[2]) for k in idx if k[0] == "W"} == (want if sched.name == "zb-h1" else set())
    if policy == "fsr":
        assert {(k[1], k[2]) for k in idx if k[0] == "R"} == want
    for layer in range(L):
        for m in range(A):
            f, b = idx[("F", layer, m)], idx[("B", layer, m)]
            if layer > 0:
                prev = idx[("F", layer - 1, m)]
                hop = X if stage_of[layer - 1] != stage_of[layer] else 0.0
                assert f.start_ms >= prev.end_ms + hop - EPS
            if layer < L - 1:
                nxt = idx[("B", layer + 1, m)]
                hop = X if stage_of[layer + 1] != stage_of[layer] else 0.0
                assert b.start_ms >= nxt.end_ms + hop - EPS
            assert b.start_ms >= f.end_ms - EPS
            if ("W", layer, m) in idx:
                assert idx[("W", layer, m)].start_ms >= b.end_ms - EPS
            if ("R", layer, m) in idx:
                r = idx[("R", layer, m)]
                assert r.start_ms >= f.end_ms - EPS and b.start_ms >= r.end_ms - EPS
    # compute runs the schedule's order unchanged (zero-length ops have no place in time to check)
    def op_of(t):
        return (t.kind, t.microbatch, next(g for g, r in enumerate(chunks) if t.layer in r) // P)

    timed = {(t.stage, op_of(t)) for t in res.tasks if t.kind in ("F", "B", "W") and t.end_ms > t.start_ms}
    orders = build(sched, P, A)
    for p in range(P):
        seq = []
        for t in sorted((t for t in res.tasks if t.stage == p and t.kind in ("F", "B", "W")
                         and t.end_ms > t.start_ms), key=lambda t: (t.start_ms, t.end_ms)):
            if not seq or seq[-1] != op_of(t):
                seq.append(op_of(t))
        assert seq == [op for op in orders[p] if (p, op) in timed]
    # lifecycle: GradSync after the layer's last contribution (W under zb-h1, its chunk's last B otherwise)
    life = {(t.kind, t.layer): t for t in res.tasks if t.kind in LIFECYCLE_KINDS}
    acc = "W" if sched.name == "zb-h1" else "B"
    for layer in range(L):
        gs = life[("GradSync", layer)]
        done = max(idx[(acc, layer, m)].end_ms for m in range(A))
        if not res.mechanisms.layerwise:
            done = max(t.end_ms for t in res.tasks if t.stage == stage_of[layer] and t.kind in ("F", "B", "W"))
        assert gs.start_ms >= done - EPS
        pw = life[("PrefetchW", layer)]
        assert pw.start_ms >= gs.end_ms - EPS
        if res.mechanisms.deadline_aware:
            assert pw.end_ms <= T + res.next_forward_ms[layer] + EPS
    assert res.step_time_ms == approx(res.last_backward_end_ms + res.exposed_tail_ms)
    assert res.exposed_tail_ms >= -EPS
    assert res.last_backward_end_ms == approx(max(t.end_ms for t in res.tasks if t.kind in ("B", "W")))
    assert len(res.stage_idle_ms) == P and all(-EPS <= x <= T + EPS for x in res.stage_idle_ms)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(P=st.integers(1, 4), A=st.integers(1, 8), L=st.integers(1, 3), v=st.integers(1, 3),
       name=st.sampled_from(["interleaved", "zb-h1"]),
       times=st.lists(st.sampled_from([0.0, 0.3, 1.0, 2.5]), min_size=6, max_size=6),
       wf=st.sampled_from([0.0, 0.3, 0.5, 1.0]), X=st.sampled_from([0.0, 0.2, 1.3]),
       variant=st.sampled_from(["full", "no-fsr", "no-update-prefetch", "no-layerwise", "all-off"]),
       rec=st.sampled_from(["compute", "ddr"]), pre=st.sampled_from(["compute", "ddr", "link"]))
def test_invariants_hold_for_random_configs(P, A, L, v, name, times, wf, X, variant, rec, pre):
    if name == "interleaved" and v > L:
        v = L
    if name == "interleaved" and A > P and A % P:
        A = P * (A // P)                    # Megatron's rule (refusal tested elsewhere)
    sched = PipelineSchedule(name, virtual_stages=v if name == "interleaved" else 1, weight_fraction=wf)
    costs = PipelineCosts.uniform(P, A, t_forward=1.0 + times[0], t_backward=1.0 + times[1],
                                  t_recompute=times[2], t_gradsync=times[3], t_update=times[4],
                                  t_prefetch=times[5], t_transfer=X, layers_per_stage=L, recovery_resource=rec,
                                  prefetch_resource=pre)
    res = simulate(costs, schedule=sched, mechanisms=Mechanisms.variant(variant))
    check_schedule_invariants(res, costs, sched)
    if name == "zb-h1" or L % sched.virtual_stages == 0:      # equal chunks: the closed form holds
        want = [in_flight_activation_sets(name, p, P, A, sched.virtual_stages) for p in range(P)]
        assert res.peak_activation_sets == pytest.approx(want)


def test_determinism_and_json():
    costs = PipelineCosts.uniform(3, 6, t_forward=1.0, t_backward=2.0, t_recompute=0.9, t_gradsync=2.0,
                                  t_update=1.0, t_prefetch=0.5, t_transfer=0.15, layers_per_stage=4)
    for sched in (PipelineSchedule("interleaved", 2), PipelineSchedule("zb-h1", weight_fraction=0.4)):
        a, b = simulate(costs, schedule=sched), simulate(costs, schedule=sched)
        assert a.tasks == b.tasks and a.to_json() == b.to_json()
        j = json.loads(json.dumps(a.to_json(), allow_nan=False))
        assert j["schedule"] == sched.name and j["virtual_stages"] == sched.virtual_stages
        assert len(j["stage_idle_ms"]) == 3 and j["stage_idle_ms"] == [s["compute_idle_ms"] for s in j["stages"]]
        assert sorted(x for s in j["stage_layers"] for x in s) == list(range(12))
    assert simulate(costs, schedule="interleaved").stage_layers == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert simulate(costs, schedule=PipelineSchedule("interleaved", 2)).stage_layers == \
        [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10, 11]]
    with pytest.raises(ConfigError, match="does not divide the layers"):
        simulate(costs, schedule=PipelineSchedule("interleaved", 5))
    with pytest.raises(ConfigError, match="weight_fraction has 2 entries for 12 layers"):
        simulate(costs, schedule=PipelineSchedule("zb-h1", weight_fraction=(0.5, 0.5)))


# ------------------------------------------------------------ lifecycle readiness

def test_gradsync_ready_at_last_w_and_last_chunk_backward():
    """With an idle link, layer l's GradSync starts exactly when its accumulation completes: its last
    W under zb-h1 (not its last B), the last backward of its chunk under interleaved."""
    costs = PipelineCosts.uniform(3, 6, t_forward=1.0, t_backward=2.0, t_gradsync=0.003, layers_per_stage=4)
    for sched, acc in ((PipelineSchedule("zb-h1", weight_fraction=0.5), "W"),
                       (PipelineSchedule("interleaved", 2), "B")):
        res = simulate(costs, schedule=sched, mechanisms=Mechanisms(activation="full"))
        ends: dict = {}
        for t in res.tasks:
            if t.kind == acc:
                ends[t.layer] = max(ends.get(t.layer, 0.0), t.end_ms)
        last_b: dict = {}
        for t in res.tasks:
            if t.kind == "B":
                last_b[t.layer] = max(last_b.get(t.layer, 0.0), t.end_ms)
        for t in res.tasks:
            if t.kind == "GradSync":
                assert t.start_ms == approx(ends[t.layer])
                if acc == "W":
                    assert t.start_ms > last_b[t.layer] + 0.1


# ------------------------------------------------------------ memory

def test_activation_residency_per_schedule():
    P, A, L = 3, 6, 2
    full_b, ckpt_b, rec_b = 1000, 100, 700
    costs = PipelineCosts.uniform(P, A, t_forward=1.0, t_backward=2.0, t_recompute=0.5, layers_per_stage=L,
                                  act_full_bytes=full_b, act_ckpt_bytes=ckpt_b, recovery_bytes=rec_b)
    full = Mechanisms(activation="full")
    for name, v in (("1f1b", 1), ("zb-h1", 1), ("interleaved", 2), ("gpipe", 1)):
        res = simulate(costs, schedule=PipelineSchedule(name, v), mechanisms=full)
        n = [in_flight_activation_sets(name, p, P, A, v) for p in range(P)]
        assert activation_residency(res, costs) == [round(k * L * full_b) for k in n], name
    # ZB-H1 keeps every stage at min(P, A) = 1F1B's first stage; 1F1B's later stages hold less
    assert [min(P, A)] * P == [in_flight_activation_sets("zb-h1", p, P, A) for p in range(P)]
    # what W reads, when given, replaces the whole set between B and W: less than the upper bound,
    # never less than 1F1B
    zb = simulate(costs, schedule="zb-h1", mechanisms=full)
    upper = activation_residency(zb, costs)
    lean = activation_residency(zb, costs, weight_grad_bytes=300)
    base = activation_residency(simulate(costs, mechanisms=full), costs)
    assert all(b <= x <= u for b, x, u in zip(base, lean, upper, strict=True))
    assert lean[-1] < upper[-1]


def test_in_flight_helper_errors():
    assert in_flight_activation_sets("gpipe", 0, 4, 9) == 9
    assert in_flight_activation_sets("interleaved", 0, 4, 8, 2) == (2 * 3 + 4 + 1) / 2
    with pytest.raises(ConfigError, match="schedule must be one of"):
        in_flight_activation_sets("zb", 0, 2, 2)
    with pytest.raises(ConfigError, match="out of range"):
        in_flight_activation_sets("1f1b", 2, 2, 2)


# ------------------------------------------------------------ RATrain's mechanisms under each schedule

@pytest.mark.parametrize("name,v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_mechanisms_still_pay_under_every_schedule(name, v):
    costs = PipelineCosts.uniform(4, 8, t_forward=1.0, t_backward=2.0, t_recompute=1.0, t_gradsync=1.5,
                                  t_update=0.8, t_prefetch=0.3, t_transfer=0.05, layers_per_stage=4,
                                  prefetch_resource="link")
    sched = PipelineSchedule(name, v)
    on = simulate(costs, schedule=sched)
    off = simulate(costs, schedule=sched, mechanisms=Mechanisms.all_off())
    assert on.step_time_ms < off.step_time_ms
    assert on.exposed_tail_ms < off.exposed_tail_ms
    check_schedule_invariants(on, costs, sched)
    check_schedule_invariants(off, costs, sched)


# ------------------------------------------------------------ weight-gradient share

def test_weight_fractions_from_profile_dw_gemms():
    gemm = lambda name, dw: SimpleNamespace(name=name, kind="gemm", backward_s=2 * dw,  # noqa: E731
                                            gemms=[[1, 1, 1, dw, "x"], [1, 1, 1, dw, "x"], [1, 1, 1, dw, "x"]])
    prof = SimpleNamespace(ops=[gemm("q", 0.002), SimpleNamespace(name="attn", kind="attention", backward_s=0.004,
                                                                   gemms=[])],
                           first_ops=[SimpleNamespace(name="embedding", kind="embedding", backward_s=0.001, gemms=[])],
                           last_ops=[gemm("lm_head", 0.003)])
    costs = PipelineCosts.uniform(2, 2, t_forward=1.0, t_backward=8.0, layers_per_stage=2)   # 4 ms per layer
    # layer 0 adds the embedding's 1 ms; the last layer's 2 + 3 ms of W exceed its 4 ms backward: capped
    assert weight_fractions(costs, prof) == pytest.approx((3 / 4, 2 / 4, 2 / 4, 1.0))
    costs = PipelineCosts.uniform(1, 2, t_forward=1.0, t_backward=40.0, layers_per_stage=2)  # 20 ms per layer
    assert weight_fractions(costs, prof) == pytest.approx((3 / 20, 5 / 20))


def test_weight_gradient_bytes_by_hand():
    m = get_model("llama2-7b")           # hidden 4096, ffn 11008, 32 heads of 128, no GQA
    h, f, tokens = 4096, 11008, 2 * 512
    inputs = h + h + h + f               # q/k/v input, o input, gate/up input, down input
    grads = 3 * h + h + 2 * f + h        # dq dk dv, d(o out), d gate, d up, d(down out)
    assert weight_gradient_bytes(m, 2, 512) == tokens * (inputs + grads) * 2
    assert weight_gradient_bytes(m, 2, 512, last=True) - weight_gradient_bytes(m, 2, 512) == tokens * (h + 32000) * 2
    assert weight_gradient_bytes(m, 2, 512, tp=2) < weight_gradient_bytes(m, 2, 512)


# ------------------------------------------------------------ CLI

BASE = ["simulate", "--uniform", "--stages", "3", "--microbatches", "4", "--t-forward", "1", "--t-backward", "2",
        "--t-gradsync", "0.5", "--t-update", "0.25"]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_cli_interleaved_and_zb_h1(capsys, tmp_path):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    six = [x if x != "4" else "6" for x in BASE]          # A = 6: a multiple of P = 3
    assert cli_main(six + ["--schedule", "interleaved", "--virtual-stages", "2", "--layers-per-stage", "2",
                           "--trace", str(trace), "--plot", str(png), "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["schedule"] == "interleaved" and p["virtual_stages"] == 2 and p["config"]["virtual_stages"] == 2
    assert p["stage_layers"] == [[0, 3], [1, 4], [2, 5]]
    # 6 x 3 ms of work + Megatron's bubble (P-1)(F+B)/v = 3 ms
    assert len(p["stage_idle_ms"]) == 3 and p["last_backward_end_ms"] == approx(21.0)
    assert png.read_bytes()[:4] == b"\x89PNG" and json.loads(trace.read_text())["traceEvents"]
    assert cli_main(BASE + ["--schedule", "zb-h1", "--t-backward-weight", "1", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    ws = [t for t in p["timeline"] if t["kind"] == "W"]
    assert len(ws) == 3 * 4 and all(t["end_ms"] - t["start_ms"] == approx(1.0) for t in ws)
    assert p["last_backward_end_ms"] == approx(14.0) and p["pipeline"]["weight_fraction"] == 0.5
    assert p["in_flight"]["analytic_1f1b"] == [3, 2, 1] and p["in_flight"]["schedule"] == [3.0, 3.0, 3.0]
    assert p["in_flight"]["measured"] == [3.0, 3.0, 3.0]
    assert cli_main(BASE + ["--schedule", "zb-h1"]) == 0
    assert "simulate zb-h1" in capsys.readouterr().out
    # --grid: the text grid after the table, and in the payload only when asked
    assert cli_main(BASE + ["--schedule", "zb-h1", "--grid"]) == 0
    out = capsys.readouterr().out
    assert "grid: one column per" in out and "S2 | " in out and " W3" in out
    assert cli_main(BASE + ["--grid", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["grid"].splitlines()[1].startswith("S0 | F0 ")
    assert cli_main(BASE + ["--json"]) == 0
    assert "grid" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("extra,message", [
    (["--schedule", "interleaved", "--virtual-stages", "3", "--layers-per-stage", "2", "--microbatches", "6"],
     "--virtual-stages 3 does not divide the layers"),
    (["--schedule", "zb-h1", "--t-backward-weight", "2.5"], "--t-backward-weight 2.5 ms is larger than the backward"),
    (["--schedule", "zb-h1", "--t-backward-weight", "-1"], "--t-backward-weight must be >= 0"),
    (["--schedule", "1f1b", "--virtual-stages", "2"], "--virtual-stages 2 needs --schedule interleaved"),
    (["--schedule", "interleaved", "--virtual-stages", "0"], "--virtual-stages must be an integer >= 1"),
    (["--schedule", "interleaved", "--virtual-stages", "2", "--layers-per-stage", "2"],
     "--microbatches 4 must be a multiple of --stages 3"),
])
def test_cli_bad_input_is_one_error_and_nothing_written(capsys, tmp_path, extra, message):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    assert cli_main(BASE + extra + ["--trace", str(trace), "--plot", str(png), "--json"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not trace.exists() and not png.exists() and not list(tmp_path.iterdir())


def test_uniform_step_too_large_to_simulate_is_refused(capsys):
    from ratrain.cli import main
    rc = main(["simulate", "--uniform", "--stages", "1000000", "--microbatches", "1000000", "--t-forward", "1",
               "--t-backward", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "at most 2,000,000 pairs are simulated" in err and err.count("\n") == 1

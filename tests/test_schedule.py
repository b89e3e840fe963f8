"""Operation orders of 1F1B and GPipe (interleaved and ZB-H1: tests/test_schedules.py)."""
from __future__ import annotations

import pytest

from ratrain.cost.tasks import PipelineCosts
from ratrain.errors import ConfigError
from ratrain.sim.grid import format_grid
from ratrain.sim.pipeline_order import (
    PipelineSchedule,
    build,
    format_order,
    gpipe,
    interleaved_microbatches_ok,
    one_f_one_b,
    parse_order,
    warmup_forwards,
)
from ratrain.sim.simulator import Mechanisms, simulate

CASES = [(1, 1), (1, 4), (2, 1), (2, 5), (4, 2), (4, 4), (4, 8), (8, 3), (8, 32)]


def _inflight_peak(ops):
    cur = peak = 0
    for kind, _, _ in ops:
        cur += 1 if kind == "F" else -1
        peak = max(peak, cur)
        assert cur >= 0
    return peak


@pytest.mark.parametrize("P,A", CASES)
def test_1f1b_order(P, A):
    orders = one_f_one_b(P, A)
    assert len(orders) == P
    for p, ops in enumerate(orders):
        fs = [m for k, m, _ in ops if k == "F"]
        bs = [m for k, m, _ in ops if k == "B"]
        assert fs == list(range(A)) and bs == list(range(A))     # A of each, in micro-batch order
        for m in range(A):
            assert ops.index(("F", m, 0)) < ops.index(("B", m, 0))
        warm = min(P - p - 1, A)
        assert warmup_forwards(P, A, p) == warm
        # warm-up forwards, then the first steady-state forward, then the first backward
        lead = next(i for i, (k, _, _) in enumerate(ops) if k == "B")
        assert lead == min(warm + 1, A)
        # steady state strictly alternates F, B; cool-down is backwards only
        steady = ops[warm:warm + 2 * (A - warm)]
        assert [k for k, _, _ in steady] == ["F", "B"] * (A - warm)
        assert all(k == "B" for k, _, _ in ops[warm + 2 * (A - warm):])
        assert _inflight_peak(ops) == min(P - p, A)


def test_1f1b_known_stage0_p4_a8():
    # the paper's Fig. 6 setting: S0 runs F0..F3, then B0, F4, B1, ...
    ops = one_f_one_b(4, 8)[0]
    assert ops[:6] == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("F", 3, 0), ("B", 0, 0), ("F", 4, 0)]
    assert ops[-4:] == [("B", 4, 0), ("B", 5, 0), ("B", 6, 0), ("B", 7, 0)]
    assert one_f_one_b(4, 8)[3][:4] == [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0)]


@pytest.mark.parametrize("P,A", CASES)
def test_gpipe_order(P, A):
    for ops in gpipe(P, A):
        assert ops == [("F", m, 0) for m in range(A)] + [("B", m, 0) for m in range(A)]
        assert _inflight_peak(ops) == A


def test_build_and_errors():
    assert build("1f1b", 3, 4) == one_f_one_b(3, 4)
    assert build("gpipe", 3, 4) == gpipe(3, 4)
    with pytest.raises(ConfigError, match="schedule must be one of"):
        build("looped-bfs", 2, 2)
    for bad in [(0, 2), (2, 0), (2, -1), (True, 2), (2.0, 2)]:
        with pytest.raises(ConfigError):
            one_f_one_b(*bad)


# ------------------------------------------------------------ the schedule type

def test_one_schedule_type_validates_once():
    assert PipelineSchedule("interleaved", 2).label() == "interleaved v=2" and PipelineSchedule().label() == "1f1b"
    assert PipelineSchedule("interleaved", 1).chunks_per_stage == 1
    assert PipelineSchedule("interleaved", 3).chunks_per_stage == 3
    for bad in (dict(name="2f2b"), dict(name="zb-h1", virtual_stages=2), dict(name="gpipe", virtual_stages=0),
                dict(name="interleaved", virtual_stages=True)):
        with pytest.raises(ConfigError):
            PipelineSchedule(**bad)
    # Megatron's micro-batch rule, written once: A <= P, or A a multiple of P
    assert [a for a in range(1, 13) if interleaved_microbatches_ok(4, a)] == [1, 2, 3, 4, 8, 12]
    inter = PipelineSchedule("interleaved", 2)
    assert inter.runs(4, 8) and inter.runs(4, 3) and not inter.runs(4, 6)
    assert PipelineSchedule("interleaved", 1).runs(4, 6) and PipelineSchedule("zb-h1").runs(4, 6)
    with pytest.raises(ConfigError, match=r"A=6\) must be a multiple of the stages \(P=4\)"):
        inter.check_layout(4, 6)


# ------------------------------------------------------------ text form and grid

def test_order_text_of_1f1b_p2_a4_by_hand():
    # stage 0 warms up min(P-1, A) = 1 forward, then F/B pairs, then the last backward; stage 1 alternates
    text = format_order(one_f_one_b(2, 4))
    assert text == "S0: F0 F1 B0 F2 B1 F3 B2 B3\nS1: F0 B0 F1 B1 F2 B2 F3 B3"
    assert parse_order(text) == one_f_one_b(2, 4)


@pytest.mark.parametrize("sched", [PipelineSchedule("1f1b"), PipelineSchedule("gpipe"), PipelineSchedule("zb-h1"),
                                   PipelineSchedule("interleaved", 2), PipelineSchedule("interleaved", 3)],
                         ids=lambda s: s.label())
@pytest.mark.parametrize("P,A", [(1, 1), (2, 4), (3, 3), (4, 8)])
def test_order_text_round_trips(sched, P, A):
    orders = build(sched, P, A)
    text = format_order(orders)
    assert parse_order(text) == orders
    assert len(text.splitlines()) == P and text.splitlines()[0].startswith("S0: ")
    assert ("." in text) == (sched.chunks_per_stage > 1)          # chunk indices only when interleaved
    assert parse_order("\n" + text + "\n\n") == orders


@pytest.mark.parametrize("text,message", [("S1: F0", "expected 'S0: ...'"), ("S0: F0 X1", "bad op 'X1'"),
                                          ("S0: F0\nS0: B0", "line 2: expected 'S1: ...'"), ("S0 F0", "line 1"),
                                          ("S0: F0.", "bad op 'F0.'")])
def test_order_text_errors_name_the_line(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_order(text)


def test_grid_of_1f1b_p2_a4_by_hand():
    # F = 1 ms, B = 2 ms, no transfers: S1 runs F0 at 1, B0 at 2-4; S0's B0 follows at 4-6, and so on
    costs = PipelineCosts.uniform(2, 4, t_forward=1, t_backward=2, layers_per_stage=2)
    grid = format_grid(simulate(costs, mechanisms=Mechanisms(activation="full")))
    assert grid.splitlines() == [
        "grid: one column per 1 ms, 15 columns to 15 ms; '.' = no F/B/W",
        "S0 | F0 F1 .  .  B0 B0 F2 B1 B1 F3 B2 B2 .  B3 B3",
        "S1 | .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 .  ."]
    coarse = format_grid(simulate(costs, mechanisms=Mechanisms(activation="full")), max_columns=5)
    assert coarse.splitlines()[0].startswith("grid: one column per 3 ms, 5 columns")


def test_grid_of_zb_h1_p3_a4_by_hand():
    # the zero-bubble paper's H1 figure: stage p holds back p W's, the rest fill the tail
    costs = PipelineCosts.uniform(3, 4, t_forward=1, t_backward=2, layers_per_stage=2)
    grid = format_grid(simulate(costs, schedule="zb-h1", mechanisms=Mechanisms(activation="full")))
    assert grid.splitlines()[1:] == [
        "S0 | F0 F1 F2 .  .  B0 W0 F3 B1 W1 B2 W2 B3 W3",
        "S1 | .  F0 F1 .  B0 F2 B1 W0 F3 B2 W1 B3 W2 W3",
        "S2 | .  .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3"]

"""Operation orders of 1F1B and GPipe (interleaved and ZB-H1: tests/test_schedules.py)."""
from __future__ import annotations

import pytest

from ratrain.errors import ConfigError
from ratrain.sim.pipeline_order import build, gpipe, one_f_one_b, warmup_forwards

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

"""Trace recording in the machine, its pure-Python references, and the Chrome trace writer."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtemu import isa
from mtemu.assembler import parse
from mtemu.errors import MtemuError
from mtemu.explain import run_gemm_stats
from mtemu.kernels.gemm import GemmTiles
from mtemu.machine import S_BUNDLES, S_CYCLES, S_DMAS, S_STALL0, Cluster, _tr_state
from mtemu.platform import DEFAULT
from mtemu.trace import (
    TRACE_STATES,
    TS_ISSUE,
    TraceOptions,
    chrome_trace,
    coarsen,
    coarsen_reference,
    merge_segments_reference,
    parse_window,
    write_chrome_trace,
)

P4 = DEFAULT.with_overrides(dsps=4)

# loops (branch delay), nops (latency), DMAs and waits, DSP-dependent work, a barrier, GSM traffic
PROGRAM = """
.desc d src=DDR dst=AM rows=2 row_bytes=256 src_stride=256 dst_stride=256 mode=copy
.desc g src=AM dst=GSM rows=1 row_bytes=512 src_stride=0 dst_stride=0 mode=copy
{ dma 0, d, [s0+0], [s0+0] | smovi s1, 3 }
{ dmawait 0 }
top:
{ vldh v1, [s0+0] }
""" + "{ nop }\n" * 8 + """
{ bdec s1, top }
{ bnz s3, skip }
""" + "{ nop }\n" * 40 + """
skip:
{ barrier }
{ dma 1, g, [s0+0], [s2+0] }
{ dmawait 1 }
{ nop branch }
{ halt }
"""


def run_program(trace=None, platform=P4):
    prog = parse(PROGRAM, platform)
    init = {d: {2: 512 * d, 3: d % 2} for d in range(platform.dsps)}
    return Cluster(platform, ddr_bytes=4096).run([prog], init_sregs=init, trace=trace)


def record(segments, capacity):
    """Feed contiguous segments to the machine's recorder; return (spans, count, cut)."""
    ev = np.zeros((1, capacity, 2), np.int64)
    n = np.zeros(1, np.int64)
    last = np.full(1, -1, np.int64)
    cut = np.full(1, -1, np.int64)
    for start, end, state in segments:
        if end > start:               # the machine never records an empty segment
            _tr_state(ev, n, last, cut, 0, start, state)
    return ev[0], int(n[0]), int(cut[0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, len(TRACE_STATES) - 1)), max_size=60))
def test_recorder_merges_like_the_reference(pieces):
    segments, t = [], 0
    for length, state in pieces:
        segments.append((t, t + length, state))
        t += length
    ref = merge_segments_reference(segments)
    ev, n, cut = record(segments, 1000)
    assert n == len(ref) and cut == -1
    for k, (start, _end, state) in enumerate(ref):
        assert (ev[k, 0], ev[k, 1]) == (start, state)
    # a full buffer keeps counting, keeps the first changes, and marks where it stopped
    if len(ref) > 3:
        ev3, n3, cut3 = record(segments, 3)
        assert n3 == len(ref) and (ev3 == ev[:3]).all() and cut3 == ref[3][0]


def test_state_totals_equal_the_run_counters():
    stats = run_program(TraceOptions())
    tr = stats.trace
    totals = tr.state_cycles()
    per = stats.per_dsp
    for d in range(P4.dsps):
        spans = tr.dsp_spans(d)
        # contiguous from cycle 0 to the DSP's halt
        assert spans[0, 0] == 0 and spans[-1, 1] == per[d, S_CYCLES]
        assert (spans[1:, 0] == spans[:-1, 1]).all() and (spans[1:, 2] != spans[:-1, 2]).all()
        for k, name in enumerate(isa.STALLS):
            assert totals[d, 1 + k] == per[d, S_STALL0 + k], (d, name)
        nop_bundles = per[d, S_STALL0 + isa.ST_LATENCY] + 1    # the one `nop branch` bundle
        assert totals[d, TS_ISSUE] == per[d, S_BUNDLES] - nop_bundles
    assert totals[:, 4].sum() > 0 and totals[:, 2].sum() > 0 and totals[:, 3].sum() > 0
    assert tr.dropped == {"state_changes": 0, "dma": 0, "barriers": 0} and not tr.truncated


def test_dma_and_barrier_records_match_the_counters():
    stats = run_program(TraceOptions())
    tr = stats.trace
    ints, times = tr.transfers()
    assert len(ints) == stats.per_dsp[:, S_DMAS].sum() == tr.dma_total
    assert ints[:, 4].sum() == stats.dma_bytes
    for name, srv in (("ddr", 0), ("gsm", 1)):
        sel = ints[:, 1] == srv
        assert (times[sel, 1] - times[sel, 0]).sum() == pytest.approx(stats.server_busy[name])
        assert ints[sel, 4].sum() == stats.server_bytes[name]
        # a server serves one transfer at a time, first come first served
        order = np.argsort(times[sel, 0], kind="stable")
        assert (times[sel][order][1:, 0] >= times[sel][order][:-1, 1] - 1e-9).all()
    assert (times[:, 0] >= ints[:, 0] + P4.dma_latency_cycles).all()
    bars = tr.barrier_spans()
    assert tr.barrier_total == 1 and bars[0, 2] == P4.dsps and bars[0, 1] > bars[0, 0]


def test_tracing_changes_no_counter():
    for run in (run_program, lambda trace: run_gemm_stats(96, 256, 384, GemmTiles(mg=48, k2=64, n2=192),
                                                          DEFAULT, trace)):
        off, on = run(None), run(TraceOptions())
        assert off.trace is None and on.trace is not None
        assert off.cycles == on.cycles
        assert (off.per_dsp == on.per_dsp).all()
        assert off.server_bytes == on.server_bytes and off.server_busy == on.server_busy


def test_small_buffers_truncate_without_failing():
    full = run_program(TraceOptions()).trace
    small = run_program(TraceOptions(capacity=5, dma_capacity=3, barrier_capacity=0)).trace
    assert small.truncated
    assert small.dropped["dma"] == full.dma_total - 3 and small.dropped["barriers"] == 1
    for d in range(P4.dsps):
        kept = small.dsp_spans(d)
        assert len(kept) <= 5
        ref = full.dsp_spans(d)
        # exact up to the cut: the kept spans are the first spans of the full trace
        assert (kept[:-1] == ref[:len(kept) - 1]).all() and kept[-1, 1] == small.cut[d]
    obj = chrome_trace(small)
    assert obj["otherData"]["recorded"]["dropped"]["barriers"] == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=1, max_size=50), st.integers(1, 64))
def test_coarsen_matches_its_reference(pieces, resolution):
    start, t, keep = [], 0, []
    for length, k in pieces:
        start.append((t, t + length, 0))
        keep.append(k)
        t += length
    s = np.array([x[0] for x in start])
    e = np.array([x[1] for x in start])
    g = coarsen(s, e, np.zeros(len(s), np.int64), 1, resolution, np.array(keep))
    ref = coarsen_reference(start, resolution, keep)
    assert list(zip(g.start.tolist(), g.end.tolist(), g.members.tolist(), strict=True)) == [tuple(r) for r in ref]
    assert g.weights[:, 0].sum() == t


def _x_events(obj):
    return [e for e in obj["traceEvents"] if e["ph"] == "X"]


def test_chrome_trace_is_strict_json_with_named_non_overlapping_tracks(tmp_path):
    stats = run_program(TraceOptions())
    info = write_chrome_trace(stats.trace, tmp_path / "t.json")
    obj = json.loads((tmp_path / "t.json").read_text())
    assert info["resolution_cycles"] == 1 and info["spans"] == len(_x_events(obj))
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in obj["traceEvents"] if e["ph"] == "M"
             and e["name"] in ("process_name", "thread_name")}
    assert names[(1, None)] == "DSPs" and names[(1, 3)] == "DSP 3" and names[(2, 0)] == "DDR"
    assert names[(2, 1)] == "GSM" and names[(3, None)] == "Barriers"
    tracks = {}
    for e in _x_events(obj):
        tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:], strict=False))
    # full detail: one span per recorded state run; ts in microseconds at the platform clock
    dsp0 = [e for e in _x_events(obj) if e["pid"] == 1 and e["tid"] == 0]
    raw = stats.trace.dsp_spans(0)
    assert [e["name"] for e in dsp0] == [TRACE_STATES[s] for s in raw[:, 2]]
    assert dsp0[-1]["ts"] + dsp0[-1]["dur"] == pytest.approx(raw[-1, 1] / P4.clock_hz * 1e6, abs=1e-3)
    ddr = [e for e in _x_events(obj) if e["pid"] == 2 and e["tid"] == 0]
    assert {e["args"]["src"] for e in ddr} == {"DDR"} and sum(e["args"]["bytes"] for e in ddr) == 512 * P4.dsps


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_coarsening_respects_the_budget_and_keeps_the_window():
    stats = run_gemm_stats(96, 256, 384, GemmTiles(mg=48, k2=64, n2=192), DEFAULT, TraceOptions())
    full = chrome_trace(stats.trace)
    n_full = len(_x_events(full))
    budget = n_full // 4
    small = chrome_trace(stats.trace, max_events=budget)
    res = small["otherData"]["resolution_cycles"]
    assert res > 1 and res & (res - 1) == 0 and len(_x_events(small)) <= budget
    # the state cycles survive merging (in the args of merged spans)
    merged = sum(sum(e["args"].get(s, 0) for s in TRACE_STATES) if "merged_spans" in e["args"] else e["args"]["cycles"]
                 for e in _x_events(small) if e["pid"] == 1)
    assert merged == stats.trace.state_cycles().sum()
    # inside the window, DSP 0's spans are exactly the recorded ones
    window = (stats.cycles // 3, stats.cycles // 3 + 2000)
    win = chrome_trace(stats.trace, window=window, max_events=budget)
    raw = stats.trace.dsp_spans(0)
    inside = raw[(raw[:, 0] < window[1]) & (raw[:, 1] > window[0])]
    got = [e for e in _x_events(win) if e["pid"] == 1 and e["tid"] == 0 and "cycles" in e["args"]]
    got_cycles = [e["args"]["cycles"] for e in got]
    assert len(inside) > 5
    sub = list(inside[:, 1] - inside[:, 0])
    assert any(got_cycles[i:i + len(sub)] == sub for i in range(len(got_cycles)))


def test_window_and_options_are_checked():
    assert parse_window("10:20") == (10, 20)
    for bad in ("10", "a:b", "20:10", "-1:5", "1:2:3"):
        with pytest.raises(MtemuError, match="trace-window"):
            parse_window(bad)
    with pytest.raises(MtemuError, match="capacity"):
        TraceOptions(capacity=-1)

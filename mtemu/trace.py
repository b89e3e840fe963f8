"""What a traced run recorded, and its Chrome/Perfetto trace (open in ui.perfetto.dev or chrome://tracing).

The machine (:mod:`mtemu.machine`) records, when ``Cluster.run(trace=TraceOptions())`` asks it to:

- per DSP, the cycles at which its state changes. States: ``issuing`` (a bundle with work),
  ``latency`` and ``branch`` (an all-nop bundle of that reason, and the delay of a taken branch),
  ``dma_wait`` (a ``dmawait`` blocked on its channel) and ``barrier`` (arrived, not released).
  Consecutive equal states form one span, so a DSP's timeline is a list of (cycle, state)
  changes; it ends when the DSP halts. :func:`merge_segments_reference` is the same rule in
  plain Python (tests compare the two);
- every DMA transfer (issue cycle, start and end on its server, server, source and destination
  memory, bytes, rows, DSP, channel, mode);
- every barrier release (first arrival, release, DSPs that waited).

Buffers are preallocated; when one fills, the machine keeps counting, and :class:`Trace` says
what was dropped (a DSP's timeline stays exact up to ``cut[d]``).

The Chrome trace has one process per track group (DSPs, DMA servers, barriers) and one thread per
DSP or server, ``X`` spans with ``ts``/``dur`` in microseconds at the platform clock (cycle
boundaries are rounded to whole nanoseconds, the same way for both neighbours of a boundary, so
spans never overlap). To keep a long run small, spans shorter than a *resolution* are merged per
resolution-wide bin into one span named after its dominant state (``args`` give the cycles of
each); spans at least that long, and every span that overlaps ``window``, keep full detail. The
resolution is the smallest power of two that fits ``max_events`` (1, full detail, when it fits).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rtcommon.fileio import atomic_write_bytes

from . import isa
from .errors import MtemuError

TRACE_STATES = ("issuing", "latency", "branch", "dma_wait", "barrier")
TS_ISSUE, TS_LATENCY, TS_BRANCH, TS_DMA, TS_BARRIER = range(len(TRACE_STATES))
# the machine maps a stall reason isa.ST_x to trace state 1 + ST_x
assert TRACE_STATES[1:] == isa.STALLS

DMA_FIELDS = ("issue", "server", "src", "dst", "bytes", "rows", "dsp", "channel", "mode")
N_DMA_FIELDS = len(DMA_FIELDS)

DEFAULT_MAX_EVENTS = 250_000


@dataclass(frozen=True)
class TraceOptions:
    """Buffer sizes of a traced run: state changes per DSP, DMA transfers, barrier releases.

    Arrays are zero-filled on allocation, so memory is only committed for what a run records
    (16 bytes per state change, 88 per transfer, 24 per barrier).
    """

    capacity: int = 1 << 20
    dma_capacity: int = 1 << 20
    barrier_capacity: int = 1 << 16

    def __post_init__(self) -> None:
        for name in ("capacity", "dma_capacity", "barrier_capacity"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise MtemuError(f"trace option '{name}' must be a non-negative integer, got {v!r}")


@dataclass
class Trace:
    """Raw recording of one run (arrays as the machine filled them)."""

    clock_hz: float
    dsps: int
    cycles: int                 # makespan of the run
    dsp_end: np.ndarray         # (dsps,) cycle each DSP halted
    events: np.ndarray          # (dsps, capacity, 2) (cycle, state) changes
    event_counts: np.ndarray    # (dsps,) changes that happened (may exceed capacity)
    cut: np.ndarray             # (dsps,) cycle of the first dropped change, -1 if none
    dma: np.ndarray             # (dma_capacity, N_DMA_FIELDS) int64
    dma_times: np.ndarray       # (dma_capacity, 2) float64 start, end cycle on the server
    dma_total: int
    barriers: np.ndarray        # (barrier_capacity, 3) first arrival, release, DSPs waiting
    barrier_total: int

    # --- what was kept ------------------------------------------------------------------------
    @property
    def dropped(self) -> dict[str, int]:
        cap = self.events.shape[1]
        return {"state_changes": int(np.maximum(self.event_counts - cap, 0).sum()),
                "dma": max(self.dma_total - self.dma.shape[0], 0),
                "barriers": max(self.barrier_total - self.barriers.shape[0], 0)}

    @property
    def truncated(self) -> bool:
        return any(self.dropped.values())

    def dsp_spans(self, d: int) -> np.ndarray:
        """(k, 3) array of [start, end, state) spans of DSP d, in time order, all non-empty."""
        n = min(int(self.event_counts[d]), self.events.shape[1])
        ev = self.events[d, :n]
        end = int(self.cut[d]) if self.cut[d] >= 0 else int(self.dsp_end[d])
        out = np.empty((n, 3), np.int64)
        out[:, 0] = ev[:, 0]
        out[:-1, 1] = ev[1:, 0] if n else ev[:0, 0]
        if n:
            out[-1, 1] = end
        out[:, 2] = ev[:, 1]
        return out[out[:, 1] > out[:, 0]]

    def state_cycles(self) -> np.ndarray:
        """(dsps, states) cycles per DSP in each state, from the recorded spans."""
        out = np.zeros((self.dsps, len(TRACE_STATES)), np.int64)
        for d in range(self.dsps):
            s = self.dsp_spans(d)
            np.add.at(out[d], s[:, 2], s[:, 1] - s[:, 0])
        return out

    def transfers(self) -> tuple[np.ndarray, np.ndarray]:
        """(int fields, float start/end) of the recorded DMA transfers."""
        n = min(self.dma_total, self.dma.shape[0])
        return self.dma[:n], self.dma_times[:n]

    def barrier_spans(self) -> np.ndarray:
        return self.barriers[:min(self.barrier_total, self.barriers.shape[0])]

    def summary(self) -> dict:
        return {"dsps": self.dsps, "cycles": self.cycles, "state_changes": int(self.event_counts.sum()),
                "dma_transfers": self.dma_total, "barriers": self.barrier_total, "dropped": self.dropped}


# --------------------------------------------------------------------------------------------
# reference of the machine's recording rule
# --------------------------------------------------------------------------------------------
def merge_segments_reference(segments: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Spans from contiguous (start, end, state) segments: equal neighbours merge, empty ones vanish.

    The machine does this on the fly (``mtemu.machine._tr_state``); tests compare the two.
    """
    out: list[list[int]] = []
    for start, end, state in segments:
        if end <= start:
            continue
        if out and out[-1][2] == state and out[-1][1] == start:
            out[-1][1] = end
        else:
            out.append([start, end, state])
    return [tuple(s) for s in out]


# --------------------------------------------------------------------------------------------
# coarsening
# --------------------------------------------------------------------------------------------
@dataclass
class Groups:
    """Spans after coarsening: [start, end), member count and per-category cycles."""

    start: np.ndarray
    end: np.ndarray
    members: np.ndarray
    first: np.ndarray          # index of each group's first span
    weights: np.ndarray        # (groups, categories)


def coarsen(start: np.ndarray, end: np.ndarray, category: np.ndarray, ncat: int, resolution: int,
            keep: np.ndarray | None = None) -> Groups:
    """Merge consecutive spans shorter than ``resolution`` that start in the same bin of that width.

    Spans at least ``resolution`` long and spans with ``keep`` set stay alone. The result has at
    most (long spans + kept spans + 2 x bins touched) groups.
    """
    n = start.size
    length = end - start
    short = length < resolution
    if keep is not None:
        short &= ~keep
    b = np.floor_divide(start, resolution).astype(np.int64) if n else np.zeros(0, np.int64)
    new = np.ones(n, bool)
    if n > 1:
        new[1:] = ~(short[1:] & short[:-1] & (b[1:] == b[:-1]))
    gid = np.cumsum(new) - 1
    ng = int(gid[-1]) + 1 if n else 0
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, n - 1) if n else first
    weights = np.bincount(gid * ncat + category, weights=length, minlength=ng * ncat).reshape(ng, ncat) if n \
        else np.zeros((0, ncat))
    return Groups(start[first], np.maximum.accumulate(end)[last] if n else end[:0], np.diff(np.append(first, n)),
                  first, weights)


def coarsen_reference(spans: list[tuple[float, float, int]], resolution: int,
                      keep: list[bool] | None = None) -> list[tuple[float, float, int]]:
    """Plain-Python :func:`coarsen`: (start, end, members) per group."""
    out: list[list] = []
    prev_short_bin = None
    for i, (s, e, _c) in enumerate(spans):
        short = (e - s) < resolution and not (keep[i] if keep else False)
        b = math.floor(s / resolution)
        if short and prev_short_bin == b and out:
            out[-1][1] = max(out[-1][1], e)
            out[-1][2] += 1
        else:
            out.append([s, e, 1])
        prev_short_bin = b if short else None
    return [tuple(g) for g in out]


# --------------------------------------------------------------------------------------------
# Chrome trace
# --------------------------------------------------------------------------------------------
PID_DSPS, PID_DMA, PID_BARRIERS = 1, 2, 3


def parse_window(text: str) -> tuple[int, int]:
    """``START:END`` in cycles -> (start, end)."""
    parts = str(text).split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start, end = int(parts[0]), int(parts[1])
    except ValueError:
        raise MtemuError(f"--trace-window must be START:END in cycles (integers), got {text!r}") from None
    if start < 0 or end <= start:
        raise MtemuError(f"--trace-window {text!r}: need 0 <= START < END")
    return start, end


def server_name(server: int) -> str:
    return ("DDR", "GSM")[server] if server < 2 else f"local DSP {server - 2}"


class _Tracks:
    """Every track as (pid, tid, start, end, category, payload) arrays before coarsening."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.dsp = [trace.dsp_spans(d) for d in range(trace.dsps)]
        ints, times = trace.transfers()
        self.dma_ints, self.dma_times = ints, times
        self.servers = {}
        for srv in np.unique(ints[:, 1]) if ints.size else []:
            idx = np.flatnonzero(ints[:, 1] == srv)
            self.servers[int(srv)] = idx[np.argsort(times[idx, 0], kind="stable")]
        self.barriers = trace.barrier_spans()

    def raw_count(self) -> int:
        return sum(len(s) for s in self.dsp) + len(self.dma_ints) + len(self.barriers)

    def grouped(self, resolution: int, window: tuple[int, int] | None) -> dict:
        def keep(s, e):
            if window is None:
                return None
            return (s < window[1]) & (e > window[0])

        out = {"dsp": [], "dma": {}, "barrier": None}
        for spans in self.dsp:
            s, e = spans[:, 0], spans[:, 1]
            out["dsp"].append(coarsen(s, e, spans[:, 2], len(TRACE_STATES), resolution, keep(s, e)))
        for srv, idx in self.servers.items():
            s, e = self.dma_times[idx, 0], self.dma_times[idx, 1]
            out["dma"][srv] = coarsen(s, e, np.zeros(idx.size, np.int64), 1, resolution, keep(s, e))
        b = self.barriers
        out["barrier"] = coarsen(b[:, 0], b[:, 1], np.zeros(len(b), np.int64), 1, resolution, keep(b[:, 0], b[:, 1]))
        return out


def _count(groups: dict) -> int:
    return (sum(g.start.size for g in groups["dsp"]) + sum(g.start.size for g in groups["dma"].values())
            + groups["barrier"].start.size)


def choose_resolution(trace: Trace, window: tuple[int, int] | None = None,
                      max_events: int = DEFAULT_MAX_EVENTS) -> int:
    """Smallest power-of-two resolution (cycles) whose coarsened trace has at most ``max_events``."""
    tracks = _Tracks(trace)
    return _resolve(tracks, window, max_events)[0]


def _resolve(tracks: _Tracks, window, max_events: int) -> tuple[int, dict]:
    if max_events < 1:
        raise MtemuError(f"max_events must be positive, got {max_events}")
    res = 1
    groups = tracks.grouped(res, window)
    top = max(tracks.trace.cycles, 1)
    while _count(groups) > max_events and res < 2 * top:
        res *= 2
        groups = tracks.grouped(res, window)
    return res, groups


def chrome_trace(trace: Trace, window: tuple[int, int] | None = None,
                 max_events: int = DEFAULT_MAX_EVENTS) -> dict:
    """The Chrome trace-event JSON object of a recorded run."""
    tracks = _Tracks(trace)
    resolution, groups = _resolve(tracks, window, max_events)
    ns_per_cycle = 1e9 / trace.clock_hz

    def ts(cycle: float) -> float:
        return round(cycle * ns_per_cycle) / 1000.0

    events: list[dict] = []

    def meta(pid, tid, name, sort):
        if tid is None:
            events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": sort}})
        else:
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"sort_index": sort}})

    def span(pid, tid, name, start, end, args):
        t0, t1 = ts(start), ts(end)
        events.append({"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": t0,
                       "dur": round((t1 - t0) * 1000) / 1000.0, "args": args})

    meta(PID_DSPS, None, "DSPs", 0)
    for d, g in enumerate(groups["dsp"]):
        meta(PID_DSPS, d, f"DSP {d}", d)
        # plain lists: per-element NumPy scalars would dominate the writer's time
        starts, ends, members = g.start.tolist(), g.end.tolist(), g.members.tolist()
        state = tracks.dsp[d][g.first, 2].tolist()
        dominant = g.weights.argmax(axis=1).tolist() if len(starts) else []
        weights = g.weights.astype(np.int64).tolist()
        for j, (start, end) in enumerate(zip(starts, ends, strict=True)):
            if members[j] == 1:
                span(PID_DSPS, d, TRACE_STATES[state[j]], start, end, {"cycles": end - start})
            else:
                args = {TRACE_STATES[k]: w for k, w in enumerate(weights[j]) if w}
                args["merged_spans"] = members[j]
                span(PID_DSPS, d, TRACE_STATES[dominant[j]], start, end, args)
    meta(PID_DMA, None, "DMA servers", 1)
    for srv in sorted(groups["dma"]):
        g = groups["dma"][srv]
        meta(PID_DMA, srv, server_name(srv), srv)
        idx = tracks.servers[srv]
        for j in range(g.start.size):
            if g.members[j] == 1:
                k = idx[g.first[j]]
                f = tracks.dma_ints[k]
                src, dst = isa.SPACES[f[2]], isa.SPACES[f[3]]
                span(PID_DMA, srv, f"{src}->{dst}", g.start[j], g.end[j],
                     {"src": src, "dst": dst, "bytes": int(f[4]), "rows": int(f[5]), "dsp": int(f[6]),
                      "channel": int(f[7]), "mode": isa.DMA_MODES[f[8]], "issue_cycle": int(f[0]),
                      "start_cycle": float(tracks.dma_times[k, 0]), "end_cycle": float(tracks.dma_times[k, 1])})
            else:
                members = idx[g.first[j]:g.first[j] + g.members[j]]
                span(PID_DMA, srv, "transfers", g.start[j], g.end[j],
                     {"transfers": int(g.members[j]), "bytes": int(tracks.dma_ints[members, 4].sum()),
                      "busy_cycles": float(g.weights[j, 0])})
    meta(PID_BARRIERS, None, "Barriers", 2)
    meta(PID_BARRIERS, 0, "barriers", 0)
    g = groups["barrier"]
    for j in range(g.start.size):
        if g.members[j] == 1:
            b = tracks.barriers[g.first[j]]
            span(PID_BARRIERS, 0, "barrier", b[0], b[1], {"first_arrival": int(b[0]), "release": int(b[1]),
                                                          "dsps_waiting": int(b[2])})
        else:
            span(PID_BARRIERS, 0, "barriers", g.start[j], g.end[j], {"barriers": int(g.members[j])})
    other = {"clock_hz": trace.clock_hz, "cycles": trace.cycles, "resolution_cycles": resolution,
             "window_cycles": list(window) if window else None, "states": list(TRACE_STATES),
             "recorded": trace.summary()}
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def write_chrome_trace(trace: Trace, path: str | Path, window: tuple[int, int] | None = None,
                       max_events: int = DEFAULT_MAX_EVENTS) -> dict:
    """Write the Chrome trace atomically; returns what was written (events, resolution, bytes)."""
    obj = chrome_trace(trace, window, max_events)
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    atomic_write_bytes(path, data)
    spans = sum(1 for e in obj["traceEvents"] if e["ph"] == "X")
    return {"path": str(path), "spans": spans, "bytes": len(data),
            "resolution_cycles": obj["otherData"]["resolution_cycles"],
            "window_cycles": obj["otherData"]["window_cycles"],
            "dropped": trace.dropped}

"""Chrome trace export (chrome://tracing, Perfetto): one 'X' event per task.

pid = pipeline stage, tid = resource (0 compute, 1 ddr, 2 link; with offloading 3 d2h and 4 h2d,
the two directions of the host link, and 5 host, the host's cores); times in microseconds as the
format wants. With gradient buckets, tid 6 shows each bucket's waits: "waits on data" from its
first gradient to its last, "waits on link" from then until the link takes it. Written atomically.

With the step's costs given, the time an F or B waits on the link for the EP all-to-alls and the
CP K/V ring (``LayerCosts.exchange_forward_ms`` / ``exchange_backward_ms``, part of the task) is
drawn as an ``Exchange`` event on the link row, at the end of its task (the dispatch, combine and
ring steps fall inside the task; the event shows how much of it is link time, not where each
message sits).
"""
from __future__ import annotations

import json
import os
from typing import Iterable

from ratrain.sim.timeline import RESOURCES, Task
from rtcommon.fileio import atomic_write_text


def _name(t: Task) -> str:
    parts = [t.kind]
    if t.microbatch is not None:
        parts.append(f"m{t.microbatch}")
    if t.layer is not None:
        parts.append(f"L{t.layer}")
    return " ".join(parts)


BUCKET_TID = len(RESOURCES)


def chrome_trace(tasks: Iterable[Task], *, notes: list | None = None, step_time_ms: float | None = None,
                 buckets: list | None = None, costs=None) -> dict:
    """The trace as a JSON-able dict; ``notes`` (aligned with ``tasks``) become event args;
    ``buckets`` (``ratrain.sim.buckets.BucketRecord``) add each bucket's waits; ``costs`` (the step's
    PipelineCosts) adds the Exchange events (module docstring)."""
    tasks = list(tasks)
    events: list[dict] = []
    stages = sorted({t.stage for t in tasks})
    used = {t.resource for t in tasks}
    for p in stages:
        events.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": f"stage {p}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0, "args": {"sort_index": p}})
        for i, r in enumerate(RESOURCES):
            if i < 3 or r in used:       # the host side only where something offloads
                events.append({"ph": "M", "name": "thread_name", "pid": p, "tid": i, "args": {"name": r}})
        if buckets:
            events.append({"ph": "M", "name": "thread_name", "pid": p, "tid": BUCKET_TID,
                           "args": {"name": "gradient buckets"}})
    for b in buckets or ():
        args = {"bucket": b.index, "layers": list(b.layers), "bytes": b.nbytes}
        for label, a, z in (("waits on data", b.first_gradient_ms, b.ready_ms),
                            ("waits on link", b.ready_ms, b.start_ms)):
            if z > a:
                events.append({"name": f"bucket {b.index} {label}", "cat": "bucket", "ph": "X", "pid": b.stage,
                               "tid": BUCKET_TID, "ts": a * 1000.0, "dur": (z - a) * 1000.0, "args": args})
    for i, t in enumerate(tasks):
        args = {"microbatch": t.microbatch, "layer": t.layer}
        note = notes[i] if notes is not None else None
        if note is not None:
            if getattr(note, "hidden_by", None):
                args["hidden_by"] = note.hidden_by
                args["exposed_ms"] = note.exposed_ms
            if getattr(note, "peer", None) is not None:
                args["peer_stage"] = note.peer
        events.append({"name": _name(t), "cat": t.kind, "ph": "X", "pid": t.stage,
                       "tid": RESOURCES.index(t.resource), "ts": t.start_ms * 1000.0,
                       "dur": (t.end_ms - t.start_ms) * 1000.0, "args": args})
    if costs is not None:
        events += _exchange_events(tasks, costs)
    if step_time_ms is not None:
        for p in stages:
            events.append({"name": "step end", "ph": "i", "s": "p", "pid": p, "tid": 0,
                           "ts": step_time_ms * 1000.0})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _exchange_events(tasks: list[Task], costs) -> list[dict]:
    flat = [layer for stage in costs.stages for layer in stage]
    out = []
    for t in tasks:
        if t.kind not in ("F", "B") or t.layer is None:
            continue
        lc = flat[t.layer]
        ms = min(lc.exchange_forward_ms if t.kind == "F" else lc.exchange_backward_ms, t.end_ms - t.start_ms)
        if ms <= 0:
            continue
        out.append({"name": f"Exchange {_name(t)}", "cat": "Exchange", "ph": "X", "pid": t.stage,
                    "tid": RESOURCES.index("link"), "ts": (t.end_ms - ms) * 1000.0, "dur": ms * 1000.0,
                    "args": {"microbatch": t.microbatch, "layer": t.layer, "inside": t.kind,
                             "what": "EP all-to-all and CP K/V ring wait inside the task"}})
    return out


def write_chrome_trace(path: str | os.PathLike, result_or_tasks, costs=None) -> None:
    """Write a SimResult (or a plain task list) as a Chrome trace file; ``costs`` adds the Exchange events."""
    if hasattr(result_or_tasks, "tasks"):
        trace = chrome_trace(result_or_tasks.tasks, notes=result_or_tasks.notes,
                             step_time_ms=result_or_tasks.step_time_ms,
                             buckets=getattr(result_or_tasks, "buckets", None), costs=costs)
    else:
        trace = chrome_trace(result_or_tasks, costs=costs)
    atomic_write_text(path, json.dumps(trace, separators=(",", ":")) + "\n")


__all__ = ["chrome_trace", "write_chrome_trace"]

"""Plain-Python references of the simulator's post-processing (the code before it read the jobs'
arrays): ``result`` builds a step's task records, notes and summaries record by record,
``activation_residency`` sweeps dictionaries of task records. Tests compare the vectorised
``ratrain.sim.simulator`` versions with these for exact equality."""
from __future__ import annotations

from typing import Sequence

from ratrain.cost.tasks import PipelineCosts
from ratrain.sim.buckets import bucket_records
from ratrain.sim.offload import offload_report
from ratrain.sim.simulator import (
    _COMPUTE,
    _LINK,
    LIFECYCLE_KINDS,
    NRES,
    RES_NAMES,
    SimResult,
    TaskNote,
    _annotate,
    _clear_overlaps,
    _collector_paused,
    _live_spans,
    _summaries,
    peak_activation_sets,
    peak_inflight,
)
from ratrain.sim.timeline import HOST_TASK_KINDS, Task


def segments(jobs, P: int) -> list[list[list[tuple[float, float]]]]:
    segs = [[[] for _ in range(NRES)] for _ in range(P)]
    for j in jobs:
        if j.end > j.start:
            segs[j.stage][j.res % NRES].append((j.start, j.end))
            if j.res2 >= 0:
                segs[j.res2 // NRES][_LINK].append((j.start, j.end))
    for per in segs:
        for s in per:
            s.sort()
    return segs


def period(segs, lower: float) -> float:
    """``ratrain.sim.simulator._period`` as it was: each resource's starts and ends split on every pass."""
    T = lower
    changed = True
    while changed:
        changed = False
        for per in segs:
            for s in per:
                if not s:
                    continue
                T, moved = _clear_overlaps(s, [a for a, _ in s], [b for _, b in s], T)
                changed |= moved
    return T


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def result(sim, pipeline, mechanisms, T: float, last_b: float,
            segs, buckets=None, offload=None) -> SimResult:
    """The step's task records, annotations and per-stage summaries."""
    P, jobs = sim.P, sim.jobs

    # ---- tasks, ordered like the executor orders them
    tasks_notes: list[tuple[Task, TaskNote]] = []
    busy = []
    for p in range(P):
        comp = segs[p][_COMPUTE]
        merged = _merge([(a + k * T, b + k * T) for k in (-1, 0, 1) for a, b in comp])
        busy.append((merged, [a for a, _ in merged]))
    for j in jobs:
        rname = RES_NAMES[j.res % NRES]
        note = TaskNote()
        if j.kind in ("Send",):
            tasks_notes.append((Task(j.stage, "Send", j.mb, j.layer, "link", j.start, j.end), TaskNote(peer=j.peer)))
            tasks_notes.append((Task(j.peer, "Recv", j.mb, j.layer2, "link", j.start, j.end),
                                TaskNote(peer=j.stage)))
            continue
        if j.kind == "R" or j.kind in LIFECYCLE_KINDS:
            note = _annotate(j, rname, busy[j.stage], last_b, T)
        tasks_notes.append((Task(j.stage, j.kind, j.mb, j.layer, rname, j.start, j.end), note))
    rank = {k: i for i, k in enumerate(("F", "R", "B", "W", "Send", "Recv", "GradSync", "UpdateShard",
                                        "PrefetchW", "Update") + HOST_TASK_KINDS)}
    tasks_notes.sort(key=lambda tn: (tn[0].start_ms, tn[0].end_ms, rank[tn[0].kind], tn[0].stage,
                                     -1 if tn[0].layer is None else tn[0].layer,
                                     -1 if tn[0].microbatch is None else tn[0].microbatch))
    tasks = [t for t, _ in tasks_notes]
    notes = [n for _, n in tasks_notes]

    # ---- per-stage summary
    spans = _live_spans(tasks)                 # both peaks read the same spans: one pass over the tasks
    inflight = peak_inflight(tasks, P, spans=spans)
    act_sets = peak_activation_sets(tasks, P, spans=spans)
    by_kind: list[dict[str, float]] = [{} for _ in range(P)]
    res_busy = [[0.0] * NRES for _ in range(P)]
    rec = [[0.0, 0.0] for _ in range(P)]          # hidden, exposed
    res_index = {name: i for i, name in enumerate(RES_NAMES)}
    for t, n in tasks_notes:
        d = t.end_ms - t.start_ms
        k = by_kind[t.stage]
        k[t.kind] = k.get(t.kind, 0.0) + d
        res_busy[t.stage][res_index[t.resource]] += d
        if t.kind == "R":
            rec[t.stage][0] += d - n.exposed_ms
            rec[t.stage][1] += n.exposed_ms
    summaries = _summaries(sim, T, res_busy, by_kind, inflight, act_sets, rec)
    return SimResult(tasks=tasks, notes=notes, step_time_ms=T, exposed_tail_ms=T - last_b,
                     last_backward_end_ms=last_b, stages=summaries, schedule=pipeline.name, mechanisms=mechanisms,
                     next_forward_ms=dict(sorted(sim.first_f_start.items())), pipeline=pipeline,
                     stage_layers=sim.stage_layers, grad_buckets=buckets, buckets=bucket_records(sim),
                     offload=None if offload is None else offload_report(sim, offload, res_busy, RES_NAMES))


@_collector_paused()           # it builds an event per (layer, micro-batch): no cycles, many objects
def activation_residency(result: SimResult, costs: PipelineCosts,
                         weight_grad_bytes: int | Sequence[int] | None = None) -> list[int]:
    """``ratrain.sim.simulator.activation_residency`` (its docstring has the rules), record by record."""
    policy = result.mechanisms.policy
    P = costs.num_stages
    f: dict[tuple[int, int], Task] = {}
    b: dict[tuple[int, int], Task] = {}
    r: dict[tuple[int, int], Task] = {}
    w: dict[tuple[int, int], Task] = {}
    away: dict[tuple[int, int], list[float]] = {}      # offloaded: [end of ToHost, start of FromHost]
    for t in result.tasks:
        if t.kind in ("ToHost", "FromHost") and t.microbatch is not None:
            got = away.setdefault((t.layer, t.microbatch), [0.0, 0.0])
            got[0 if t.kind == "ToHost" else 1] = t.end_ms if t.kind == "ToHost" else t.start_ms
        if t.kind == "F":
            f[(t.layer, t.microbatch)] = t
        elif t.kind == "B":
            b[(t.layer, t.microbatch)] = t
        elif t.kind == "W":
            w[(t.layer, t.microbatch)] = t
        elif t.kind == "R":
            r[(t.layer, t.microbatch)] = t
    events: list[list[tuple[float, int]]] = [[] for _ in range(P)]
    for (layer_index, m), ft in f.items():
        bt = b[(layer_index, m)]
        wt = w.get((layer_index, m))
        end = bt.end_ms
        if wt is not None and weight_grad_bytes is None:
            end = wt.end_ms                       # upper bound: everything waits for W
        lc = costs.layer(layer_index)
        ev = events[ft.stage]

        def live(a: float, z: float, nbytes: int, ev: list = ev) -> None:
            if nbytes > 0:
                ev.append((a, nbytes))
                ev.append((z, -nbytes))

        if wt is not None and weight_grad_bytes is not None:
            nb = weight_grad_bytes if isinstance(weight_grad_bytes, int) else weight_grad_bytes[layer_index]
            live(bt.end_ms, wt.end_ms, int(nb))

        gap = away.get((layer_index, m))

        def saved(a: float, z: float, nbytes: int, gap: list | None = gap) -> None:
            if gap is None:
                live(a, z, nbytes)
            else:
                live(a, gap[0], nbytes)
                live(gap[1], z, nbytes)

        if policy == "full" or (policy == "fsr" and (layer_index, m) not in r):
            saved(ft.start_ms, end, lc.act_full_bytes)
            continue
        saved(ft.start_ms, end, lc.act_ckpt_bytes)
        live(ft.start_ms, ft.end_ms, max(0, lc.act_full_bytes - lc.act_ckpt_bytes))
        rec_start = r[(layer_index, m)].start_ms if policy == "fsr" else bt.start_ms
        live(rec_start, end, lc.recovery_bytes)
    out = []
    for ev in events:
        ev.sort(key=lambda e: (e[0], e[1]))   # frees first at the same instant
        cur = peak = 0
        for _, d in ev:
            cur += d
            peak = max(peak, cur)
        out.append(peak)
    return out



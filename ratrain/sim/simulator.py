"""Event-driven simulator of one pipeline-parallel training step with training-state lifecycles.

Model (see docs/CHOICES.md, "ratrain simulator", for the reasoning):

* Every stage p owns three resources: ``compute`` (the cluster's DSPs),
  ``ddr`` (its DDR/DMA engine) and ``link`` (its single inter-cluster port,
  shared by stage-boundary transfers, data-parallel GradSync and, when
  ``PipelineCosts.prefetch_resource`` / ``update_resource`` say ``link``,
  PrefetchW / UpdateShard, e.g. the ZeRO-1/2 all-gather of updated shards). A
  stage-boundary transfer occupies the ports of both ends at once (a ``Send``
  task on the sender and a ``Recv`` task on the receiver, same interval).
* The main path is the unchanged schedule order (``ratrain.sim.pipeline_order``:
  1f1b, gpipe, interleaved, zb-h1), one task per layer: F in forward layer
  order, B (and under zb-h1 the weight gradient W) in reverse. Under
  ``interleaved`` the model's layers (the stages of ``PipelineCosts`` read in
  order) are re-cut into P*v chunks, chunk c on stage c mod P; every chunk
  boundary between two stages is a transfer. Under ``zb-h1`` a layer's backward
  is split into B (input gradient, ``1 - weight_fraction`` of backward_ms, plus
  the recompute under ckpt) and W (weight gradient, the rest); the stage below
  waits only for B, and the layer's activations (or recovery buffer) stay until
  its W.
* Tasks are never preempted and never free: a task holds its resource for its
  whole duration (so each logical task is exactly one ``Task`` record).
  Priorities apply when a resource picks its next task: main path (F, B,
  Send/Recv, backward-time recovery) first, then FSR recovery, then lifecycle
  tasks. Low-priority work on ``compute`` and ``link`` is additionally only
  started if a lower bound on when the next main-path task there becomes
  ready says it will finish in time ("window fits"); that is how transfers
  keep priority over GradSync and how FSR recovery stays off the critical path.
* Activation policies: ``full`` (no recovery), ``ckpt`` (recompute at backward
  time: each B lasts backward_ms + recompute_ms, no R tasks), ``fsr`` (one R
  task per layer and micro-batch, started in idle windows after F(m, l) once
  fewer than ``fsr_lookahead`` micro-batches hold recovery buffers and the
  buffer (``fsr_buffer_layers`` layers) has a free slot; if B(m, l)
  is otherwise ready and R(m, l) is unfinished, R is promoted to main-path
  priority: backward-time fallback). Under zb-h1 the lookahead still counts
  micro-batches by their B, so a recovery buffer may outlive it until its W
  (``activation_residency`` measures that).
* Lifecycle (Eq. 2): GradSync(l) -> UpdateShard(l) -> PrefetchW(l). Layer-wise
  chains start when layer l's accumulation completes (its last backward in the
  stage order: under interleaved the last backward of its chunk, under zb-h1 its
  last W); the deadline is the next step's first Forward(l). Deadline-aware
  UpdateShard/PrefetchW are queued earliest-deadline-first on their resource;
  GradSync is FIFO unless a state task shares the link with it (then EDF too).
* Gradient buckets (``buckets``, ``ratrain.sim.buckets``): GradSync runs per bucket of layers
  instead of per layer, once the bucket's last gradient exists. Offloading (``offload``,
  ``ratrain.sim.offload``): transfers to and from host memory on each stage's ``d2h`` / ``h2d``
  resources and a host-side update on its ``host`` resource, joined to the graph before it runs;
  without either the graph is the one described above.
* Step time: the smallest period T at which the step's timeline repeats with
  no resource running two tasks at once and every next-step Forward(l) starting
  after PrefetchW(l) of this step (without deadline-aware update-prefetch:
  after all of its stage's state tasks). PrefetchW may therefore finish after T,
  overlapping the next step's first forwards. exposed_tail = T - end of the
  step's last backward (B or W).
"""
from __future__ import annotations

import gc
import heapq
import importlib
import sys
from bisect import bisect_left, bisect_right
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence

import numpy as np

from ratrain.cost.tasks import PipelineCosts
from ratrain.errors import ConfigError, RatrainError
from ratrain.sim import offload as offload_tasks
from ratrain.sim import simulation_memo
from ratrain.sim.buckets import (
    BucketRecord,
    GradBuckets,
    bucket_ms,
    bucket_records,
    bucket_summary,
    check_bucketable,
    group_layers,
)
from ratrain.sim.mechanisms import ABLATION_VARIANTS, ACTIVATIONS, Mechanisms
from ratrain.sim.offload import OffloadPlan, offload_report
from ratrain.sim.pipeline_order import PipelineSchedule
from ratrain.sim.pipeline_order import build as build_schedule
from ratrain.sim.timeline import HOST_TASK_KINDS, Task

LIFECYCLE_KINDS = ("GradSync", "UpdateShard", "PrefetchW", "Update")
# per stage: compute, DDR, the inter-cluster link, and the host side offloading uses (the two
# directions of the host link, and the host's cores); a stage without offload never uses the last three
RES_NAMES = ("compute", "ddr", "link", "d2h", "h2d", "host")
NRES = len(RES_NAMES)
_COMPUTE, _DDR, _LINK = 0, 1, 2
_RES_INDEX = {name: i for i, name in enumerate(RES_NAMES)}
_WAITING, _READY, _RUNNING, _DONE = 0, 1, 2, 3
_MAIN, _FSR, _LIFE = 0, 1, 2          # priority classes, lower runs first
_EPS = 1e-9
# Work bound of one simulation: the tasks it would create (per layer, per micro-batch a forward,
# a backward, a weight-gradient and a recomputation task; per layer four lifecycle tasks; per
# stage boundary and micro-batch two transfers). Each task costs ~1 KB and a few microseconds, so
# the bound keeps a run under ~5 GB and a few minutes; the paper's largest runs need < 10**6.
MAX_SIM_TASKS = 5_000_000
# Which event loop runs a simulation (_Sim.run): the compiled one (ratrain.sim.event_loop, Numba) for
# graphs of at least COMPILED_LOOP_MIN_JOBS jobs in a process that has imported Numba already, or whose
# simulations (this one included) have reached COMPILED_LOOP_FIRST_JOBS jobs in all; else
# _Sim.run_python, its reference (the same events, the same result to the bit). Measured on a shared
# 2-core machine: the compiled loop, with the conversion of the graph to arrays and back, costs about
# 5 us per job against Python's 8-9 us, and is already the faster at about 2,700 jobs; a process without
# Numba pays about 1.5 CPU-s once (Numba's import and start, the loop loaded from its cache; about 11 CPU-s
# to compile it on an empty cache), which about half a million jobs repay. So a command that simulates a
# few steps (``ratrain simulate``, ``ratrain plan``) never loads Numba; the main job, which has imported it
# for the emulator, runs its steps compiled, and a worker that only simulates switches once it has
# simulated that much. 0 compiles every run; a value above MAX_SIM_TASKS keeps every run in Python.
COMPILED_LOOP_MIN_JOBS = 2_000
COMPILED_LOOP_FIRST_JOBS = 500_000
_JOBS_SIMULATED = [0]          # jobs this process has simulated (the first threshold's count)


@dataclass(frozen=True)
class TaskNote:
    """Per-task annotation (aligned with SimResult.tasks).

    hidden_by: for R and lifecycle tasks, what let it run: 'bubble' (the stage's
    compute sat idle in a pipeline bubble), '<res>-idle during compute' (it used
    an otherwise idle link/ddr while compute worked, possibly the next step's
    forward), 'compute-idle while waiting on <res>' (it ran in the exposed tail),
    'backward critical path' (FSR fallback: its backward was waiting for it).
    exposed_ms: the part of it that was not hidden that way. peer: the other
    stage of a Send/Recv.
    """
    hidden_by: str | None = None
    exposed_ms: float = 0.0
    peer: int | None = None


@dataclass
class StageSummary:
    stage: int
    compute_busy_ms: float
    compute_idle_ms: float          # step_time - compute busy
    ddr_busy_ms: float
    link_busy_ms: float
    busy_by_kind_ms: dict[str, float]
    peak_inflight: int              # micro-batches with live activations, measured
    peak_activation_sets: float     # live (layer, micro-batch) activations / the stage's layers, measured
    hidden_recovery_ms: float
    exposed_recovery_ms: float
    lifecycle_end_ms: float | None  # end of the stage's last state task

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class SimResult:
    tasks: list[Task]
    notes: list[TaskNote]
    step_time_ms: float
    exposed_tail_ms: float
    last_backward_end_ms: float
    stages: list[StageSummary]
    schedule: str
    mechanisms: Mechanisms
    next_forward_ms: dict[int, float] = field(default_factory=dict)   # layer -> first F start (deadline offset)
    pipeline: PipelineSchedule = field(default_factory=PipelineSchedule)
    stage_layers: list[list[int]] = field(default_factory=list)        # per stage, its layers in model order
    grad_buckets: GradBuckets | None = None                            # gradient bucketing, if asked for
    buckets: list[BucketRecord] = field(default_factory=list)          # each bucket: when it waited on what
    offload: dict | None = None                                        # what moved to and from the host

    def __getattr__(self, name: str):
        # a simulated step keeps its task records as arrays (``_Timeline``): the ``tasks`` and ``notes``
        # lists are built the first time either is read
        timeline = self.__dict__.get("_timeline")
        if name in ("tasks", "notes") and timeline is not None:
            self.__dict__["tasks"], self.__dict__["notes"] = timeline.records()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def virtual_stages(self) -> int:
        return self.pipeline.virtual_stages

    @property
    def stage_idle_ms(self) -> list[float]:
        """Per stage, the time its compute sits idle in one step period."""
        return [s.compute_idle_ms for s in self.stages]

    @property
    def hidden_by(self) -> list[str | None]:
        return [n.hidden_by for n in self.notes]

    @property
    def peak_inflight(self) -> list[int]:
        return [s.peak_inflight for s in self.stages]

    @property
    def peak_activation_sets(self) -> list[float]:
        return [s.peak_activation_sets for s in self.stages]

    def to_json(self, timeline: bool = True) -> dict:
        out = {
            "schedule": self.schedule,
            "pipeline": self.pipeline.to_json(),
            "virtual_stages": self.virtual_stages,
            "stage_layers": self.stage_layers,
            "mechanisms": self.mechanisms.to_json(),
            "step_time_ms": self.step_time_ms,
            "exposed_tail_ms": self.exposed_tail_ms,
            "last_backward_end_ms": self.last_backward_end_ms,
            "peak_inflight": self.peak_inflight,
            "peak_activation_sets": self.peak_activation_sets,
            "stage_idle_ms": self.stage_idle_ms,
            "stages": [s.to_json() for s in self.stages],
        }
        if self.grad_buckets is not None:
            last_b = [max((t.end_ms for t in self.tasks if t.stage == p and t.kind in ("B", "W")), default=0.0)
                      for p in range(len(self.stages))]
            out["gradient_buckets"] = {**self.grad_buckets.to_json(), **bucket_summary(self.buckets, last_b),
                                       "buckets": [b.to_json() for b in self.buckets]}
        if self.offload is not None:
            out["offload"] = self.offload
        if timeline:
            out["timeline"] = [t.to_json() for t in self.tasks]
            out["notes"] = [asdict(n) for n in self.notes]
        return out


class _Job:
    __slots__ = ("idx", "stage", "kind", "mb", "layer", "res", "res2", "dur", "cls", "key", "npred",
                 "preds", "succs", "state", "start", "end", "fsr_r", "other", "promoted_at", "peer",
                 "layer2", "order_hint", "main")

    def __init__(self, idx, stage, kind, mb, layer, res, dur, cls, key=(), res2=-1):
        self.idx = idx
        self.stage = stage
        self.kind = kind
        self.mb = mb
        self.layer = layer
        self.res = res
        self.res2 = res2
        self.dur = dur
        self.cls = cls
        self.key = key
        self.npred = 0
        self.preds: list[_Job] = []
        self.succs: list[_Job] = []
        self.state = _WAITING
        self.start = 0.0
        self.end = 0.0
        self.fsr_r: _Job | None = None   # for B: its FSR recovery task
        self.other = 0                   # for B: unfinished predecessors other than fsr_r
        self.promoted_at: float | None = None
        self.peer = None                 # for transfers: receiving stage
        self.layer2 = None               # for transfers: consuming layer on the receiver
        self.order_hint = 0
        self.main = cls == _MAIN


def _edge(a: _Job, b: _Job) -> None:
    a.succs.append(b)
    b.preds.append(a)
    b.npred += 1


class _Sim:
    def __init__(self, costs: PipelineCosts, schedule: PipelineSchedule, mech: Mechanisms,
                 buckets: GradBuckets | None = None, offload: OffloadPlan | None = None):
        self.costs, self.sched, self.mech = costs, schedule, mech
        self.buckets, self.offload = buckets, offload
        self.P, self.A = costs.num_stages, costs.microbatches
        self.flat = [lc for layers in costs.stages for lc in layers]     # model order
        self.v = schedule.virtual_stages if schedule.name == "interleaved" else 1
        if self.v > 1:       # the model's layers re-cut into P*v chunks
            self.chunks = [list(r) for r in schedule.chunks(len(self.flat), self.P)]
        else:                # the stages of the costs as they are
            self.chunks = [list(costs.layer_range(p)) for p in range(self.P)]
        if schedule.splits_backward and isinstance(schedule.weight_fraction, tuple) \
                and len(schedule.weight_fraction) != len(self.flat):
            raise ConfigError(f"schedule: weight_fraction has {len(schedule.weight_fraction)} entries for "
                              f"{len(self.flat)} layers")
        # global chunk g runs on stage g mod P
        self.stage_layers = [sorted(layer for g in range(p, self.P * self.v, self.P) for layer in self.chunks[g])
                             for p in range(self.P)]
        self.jobs: list[_Job] = []
        self.now = 0.0
        self.seq = 0
        nres = NRES * self.P
        self.running: list[_Job | None] = [None] * nres
        self.heaps: list[list] = [[] for _ in range(nres)]
        self.events: list = []
        self.instant: deque[_Job] = deque()
        self.dirty: set[int] = set()
        self.waiting_fillers: set[int] = set()
        self.memo: dict[int, float] = {}
        self.edge_log: list[int] = []        # a, b of every edge _edge made, in order
        # UpdateShard/PrefetchW with work on a stage's link compete with GradSync there: then
        # GradSync joins the earliest-deadline-first order too (one key axis per queue); alone on
        # the link (zero-length state tasks occupy nothing) it stays FIFO
        self.link_shared = [mech.deadline_aware and any(
            (costs.update_resource == "link" and self.flat[i].update_ms > 0) or
            (costs.prefetch_resource == "link" and self.flat[i].prefetch_ms > 0) for i in layers)
            for layers in self.stage_layers]
        self._build()

    # ------------------------------------------------------------ graph construction
    def host_res(self, stage: int) -> int:
        return NRES * stage + RES_NAMES.index("host")

    def _job(self, stage, kind, mb, layer, resname, dur, cls, key=(), res2=-1) -> _Job:
        j = _Job(len(self.jobs), stage, kind, mb, layer, NRES * stage + _RES_INDEX[resname], dur, cls,
                 key, res2)
        self.jobs.append(j)
        return j

    def _edge(self, a: _Job, b: _Job) -> None:
        """The edge a -> b, also logged in the order edges are made (the compiled loop reads its edges from
        the log; each job's lists keep that order too)."""
        a.succs.append(b)
        b.preds.append(a)
        b.npred += 1
        self.edge_log += (a.idx, b.idx)

    def _durations(self, layer_index: int, policy: str) -> dict[str, float]:
        lc = self.flat[layer_index]
        w = lc.backward_ms * self.sched.layer_weight_fraction(layer_index)
        rec = lc.recompute_ms if policy == "ckpt" else 0.0
        return {"F": lc.forward_ms, "B": lc.backward_ms - w + rec, "W": w}

    def _neighbour_resources(self, p: int) -> tuple[int, ...]:
        """The compute and link resources of stage p and its neighbours (a completion there may let them start)."""
        return tuple(NRES * q + r for q in range(max(0, p - 1), min(self.P, p + 2)) for r in (_COMPUTE, _LINK))

    def _build(self) -> None:
        c, m_, P, A = self.costs, self.mech, self.P, self.A
        policy = m_.policy
        self.orders = build_schedule(self.sched, P, A)
        # each layer's F, B and W durations, computed once (not once per micro-batch)
        durations = [self._durations(i, policy) for i in range(len(self.flat))]
        # (global chunk, m) -> jobs in layer order (B and W run in reverse)
        self.F: dict[tuple[int, int], list[_Job]] = {}
        self.B: dict[tuple[int, int], list[_Job]] = {}
        self.W: dict[tuple[int, int], list[_Job]] = {}
        store = {"F": self.F, "B": self.B, "W": self.W}
        self.main_chain: list[list[_Job]] = []
        for p in range(P):
            chain: list[_Job] = []
            for op, m, local in self.orders[p]:
                g = local * P + p
                layers = self.chunks[g] if op == "F" else self.chunks[g][::-1]
                jobs = []
                for layer_index in layers:
                    dur = durations[layer_index][op]
                    if c.microbatch_scales is not None:     # unequal micro-batches (ratrain.spec.lengths)
                        dur *= c.microbatch_scales[m]
                    j = self._job(p, op, m, layer_index, "compute", dur, _MAIN)
                    if chain:
                        self._edge(chain[-1], j)
                    chain.append(j)
                    jobs.append(j)
                store[op][(g, m)] = jobs if op == "F" else jobs[::-1]
            self.main_chain.append(chain)
        G = P * self.v
        # the loss: the model's last layer turns around; W after its own B (the chain implies
        # both on one stage, the edges keep the graph honest for any order)
        for m in range(A):
            self._edge(self.F[(G - 1, m)][-1], self.B[(G - 1, m)][-1])
        for key, ws in self.W.items():
            for b, w in zip(self.B[key], ws, strict=True):
                self._edge(b, w)
        # chunk boundaries: a transfer (joint job on both ports) between stages, an edge within one
        X = c.transfer_ms
        self.link_streams: list[list[list[_Job]]] = [[] for _ in range(P)]
        for g in range(G - 1):
            p, q = g % P, (g + 1) % P
            if p == q:
                for m in range(A):
                    self._edge(self.F[(g, m)][-1], self.F[(g + 1, m)][0])
                    self._edge(self.B[(g + 1, m)][0], self.B[(g, m)][-1])
                continue
            fwd, bwd = [], []
            for m in range(A):
                t = self._job(p, "Send", m, self.chunks[g][-1], "link", X, _MAIN, res2=NRES * q + _LINK)
                t.peer, t.layer2 = q, self.chunks[g + 1][0]
                self._edge(self.F[(g, m)][-1], t)
                self._edge(t, self.F[(g + 1, m)][0])
                fwd.append(t)
                t = self._job(q, "Send", m, self.chunks[g + 1][0], "link", X, _MAIN, res2=NRES * p + _LINK)
                t.peer, t.layer2 = p, self.chunks[g][-1]
                self._edge(self.B[(g + 1, m)][0], t)
                self._edge(t, self.B[(g, m)][-1])
                bwd.append(t)
            self.link_streams[p] += [fwd, bwd]
            self.link_streams[q] += [fwd, bwd]
        self.stream_pos = [[0] * len(s) for s in self.link_streams]
        # FSR recovery tasks
        if policy == "fsr":
            for p in range(P):
                order = self.orders[p]
                b_ops = [(m, local * P + p) for op, m, local in order if op == "B"]
                adjacent = {(m, local * P + p) for i, (op, m, local) in enumerate(order[:-1])
                            if op == "F" and order[i + 1] == ("B", m, local)}
                consumed: list[_Job] = []   # B tasks that free a recovery buffer, in backward order
                for bi, (m, g) in enumerate(b_ops):
                    if m_.fsr_skip_adjacent and (m, g) in adjacent:
                        continue
                    gate = None
                    if bi >= m_.fsr_lookahead:
                        gm, gg = b_ops[bi - m_.fsr_lookahead]
                        gate = self.B[(gg, gm)][0]
                    for i, layer_index in enumerate(self.chunks[g]):
                        lc = self.flat[layer_index]
                        r = self._job(p, "R", m, layer_index, c.recovery_resource,
                                      lc.recompute_ms * c.microbatch_scale(m), _FSR,
                                      key=(bi, -layer_index))
                        self._edge(self.F[(g, m)][i], r)
                        if gate is not None:
                            self._edge(gate, r)
                        b = self.B[(g, m)][i]
                        b.other = b.npred
                        b.fsr_r = r
                        self._edge(r, b)
                    cap = m_.fsr_buffer_layers
                    if cap is not None:
                        # a bounded recovery buffer: the k-th recovery (in backward order) waits until
                        # the backward that consumed the (k - cap)-th has ended and freed its slot
                        for b in reversed(self.B[(g, m)]):
                            if len(consumed) >= cap:
                                self._edge(consumed[-cap], b.fsr_r)
                            consumed.append(b)
        # lifecycle tasks
        self.life: list[list[_Job]] = []
        self.prefetch: list[dict[int, _Job]] = []
        # per stage, layer -> the job completing its gradient, its GradSync (bucket) and its update
        self.acc_done: list[dict[int, _Job]] = []
        self.gradsync_of: list[dict[int, _Job]] = []
        self.update_of: list[dict[int, _Job]] = []
        self.bucket_jobs: list[tuple[int, int, list[int], _Job]] = []     # (stage, index, layers, job)
        acc_kind = "W" if self.sched.splits_backward else "B"
        for p in range(P):
            layers = self.stage_layers[p]
            # the job that completes each layer's gradient accumulation: its last B (or W) on the stage
            acc_done: dict[int, _Job] = {}
            for op, m, local in self.orders[p]:
                if op == acc_kind:
                    for j in store[op][(local * P + p, m)]:
                        acc_done[j.layer] = j
            final = self.main_chain[p][-1]
            gs, us, pw, life = {}, {}, {}, []
            if self.buckets is not None:
                gs = self._bucket_jobs(p, layers, acc_done, final)
            for layer_index in layers if self.buckets is None else ():
                lc = self.flat[layer_index]
                g = self._job(p, "GradSync", None, layer_index, "link", lc.gradsync_ms, _LIFE)
                g.order_hint = -layer_index
                self._edge(acc_done[layer_index] if m_.layerwise else final, g)
                gs[layer_index] = g
            bulk_update = None
            if not m_.deadline_aware and c.bulk_update_ms is not None:
                bulk_update = self._job(p, "Update", None, None, c.update_resource, c.bulk_update_ms, _LIFE)
                for g in dict.fromkeys(gs.values()):
                    self._edge(g, bulk_update)
            for layer_index in layers:
                lc = self.flat[layer_index]
                if bulk_update is None:
                    u = self._job(p, "UpdateShard", None, layer_index, c.update_resource, lc.update_ms, _LIFE)
                    u.order_hint = layer_index
                    for g in ([gs[layer_index]] if m_.deadline_aware else dict.fromkeys(gs.values())):
                        self._edge(g, u)
                    us[layer_index] = u
            for layer_index in layers:
                lc = self.flat[layer_index]
                w = self._job(p, "PrefetchW", None, layer_index, c.prefetch_resource, lc.prefetch_ms, _LIFE)
                w.order_hint = layer_index
                if bulk_update is not None:
                    self._edge(bulk_update, w)
                else:
                    for u in ([us[layer_index]] if m_.deadline_aware else us.values()):
                        self._edge(u, w)
                pw[layer_index] = w
            life = list(dict.fromkeys(gs.values())) + ([bulk_update] if bulk_update else []) + list(us.values()) \
                + list(pw.values())
            self.life.append(life)
            self.prefetch.append(pw)
            self.acc_done.append(acc_done)
            self.gradsync_of.append(gs)
            self.update_of.append({layer: us.get(layer, bulk_update) for layer in layers})
        if self.offload is not None:
            self.host_records = offload_tasks.attach(self, self.offload, _MAIN, _LIFE)
        self.next_main = [0] * P
        self.neighbours = [self._neighbour_resources(p) for p in range(P)]
        self.first_f_start: dict[int, float] = {}
        self._check_acyclic()

    def _bucket_jobs(self, p: int, layers: list[int], acc_done: dict[int, _Job], final: _Job) -> dict[int, _Job]:
        """One GradSync per gradient bucket (``ratrain.sim.buckets``); layer -> its bucket's job."""
        grad = {layer: self.flat[layer].grad_bytes for layer in layers}
        sync = {layer: self.flat[layer].gradsync_ms for layer in layers}
        launch = self.costs.gradsync_launch_ms
        check_bucketable(p, layers, grad, sync, launch)
        order = sorted(layers, key=lambda layer: acc_done[layer].idx)     # the order gradients complete
        gs: dict[int, _Job] = {}
        for k, group in enumerate(group_layers(order, grad, self.buckets.bucket_bytes)):
            g = self._job(p, "GradSync", None, group[-1], "link", bucket_ms(group, sync, launch), _LIFE)
            g.order_hint = -group[-1]
            for q in dict.fromkeys(acc_done[layer] if self.mech.layerwise else final for layer in group):
                self._edge(q, g)
            for layer in group:
                gs[layer] = g
            self.bucket_jobs.append((p, k, group, g))
        return gs

    def _check_acyclic(self) -> None:
        """A cycle (an order whose stages wait on each other) would never run: refuse it up front."""
        indeg = [j.npred for j in self.jobs]
        ready = [j for j in self.jobs if j.npred == 0]
        seen = 0
        while ready:
            j = ready.pop()
            seen += 1
            for s_ in j.succs:
                indeg[s_.idx] -= 1
                if indeg[s_.idx] == 0:
                    ready.append(s_)
        if seen != len(self.jobs):
            stuck = next(j for j in self.jobs if indeg[j.idx] > 0)
            raise RatrainError(f"schedule {self.sched.name!r} deadlocks: {len(self.jobs) - seen} tasks wait on each "
                               f"other, first {stuck.kind}(stage {stuck.stage}, mb {stuck.mb}, layer {stuck.layer})")

    def release(self) -> None:
        """Unlink the task graph (edges, recovery links) once its times are read, so the jobs are freed
        by reference counting rather than left to the cyclic collector."""
        for j in self.jobs:
            j.preds = j.succs = None
            j.fsr_r = None
        self.edge_log = []

    # ------------------------------------------------------------ lower bounds ("window fits")
    def _lb_end(self, root: _Job) -> float:
        """Lower bound on when a main-path job will finish, from what is known now."""
        memo, now = self.memo, self.now
        got = memo.get(root.idx)
        if got is not None:
            return got
        stack = [root]
        while stack:
            j = stack[-1]
            if j.idx in memo:
                stack.pop()
                continue
            if j.state >= _RUNNING:
                memo[j.idx] = j.end
                stack.pop()
                continue
            todo = [q for q in j.preds if q.idx not in memo and q.state < _RUNNING]
            if todo:
                stack.extend(todo)
                continue
            start = now
            for q in j.preds:
                v = memo[q.idx] if q.state < _RUNNING else q.end
                if v > start:
                    start = v
            memo[j.idx] = start + j.dur
            stack.pop()
        return memo[root.idx]

    def _compute_window_ok(self, p: int, cand: _Job) -> bool:
        chain = self.main_chain[p]
        i = self.next_main[p]
        if i >= len(chain):
            return True
        nxt = chain[i]
        if cand in nxt.preds:
            return True                 # the next main task waits for it anyway: running it early is free
        other, need = self.now, 0.0
        for q in nxt.preds:
            if q.state == _DONE:
                continue
            if q.kind == "R" and q.res == cand.res and q.state < _RUNNING:
                need += q.dur           # it must still run on this resource before nxt
                continue
            v = self._lb_end(q)
            if v > other:
                other = v
        return self.now + cand.dur + need <= other + _EPS

    def _link_window_ok(self, p: int, cand: _Job) -> bool:
        end = self.now + cand.dur
        streams, pos = self.link_streams[p], self.stream_pos[p]
        for k, s in enumerate(streams):
            i = pos[k]
            while i < len(s) and s[i].state >= _RUNNING and (s[i].state == _DONE or s[i].end <= self.now):
                i += 1
            pos[k] = i
            if i >= len(s):
                continue
            t = s[i]
            if t.state == _RUNNING:   # the port is (or will be) busy with it; it ends before any later one
                continue
            ready = self.now
            for q in t.preds:
                v = self._lb_end(q)
                if v > ready:
                    ready = v
            if end > ready + _EPS:
                return False
        return True

    # ------------------------------------------------------------ event loop
    def _push(self, job: _Job, res: int) -> None:
        self.seq += 1
        heapq.heappush(self.heaps[res], (job.cls, job.key, self.seq, job))
        self.dirty.add(res)

    def _make_ready(self, job: _Job) -> None:
        if job.dur == 0.0:
            self.instant.append(job)
            return
        job.state = _READY
        if job.cls == _LIFE:
            if self.mech.deadline_aware and (job.kind != "GradSync" or self.link_shared[job.stage]):
                job.key = (self.first_f_start[job.layer], job.layer)   # earliest deadline first
            else:
                job.key = (self.now, job.order_hint)
        self._push(job, job.res)
        if job.res2 >= 0:
            self._push(job, job.res2)

    def _start(self, job: _Job) -> None:
        job.state = _RUNNING
        job.start = self.now
        job.end = self.now + job.dur
        if job.kind == "F" and job.layer not in self.first_f_start:
            self.first_f_start[job.layer] = job.start
        self.running[job.res] = job
        if job.res2 >= 0:
            self.running[job.res2] = job
        self.seq += 1
        heapq.heappush(self.events, (job.end, self.seq, job))

    def _promote(self, r: _Job) -> None:
        if r.promoted_at is not None or r.state == _DONE:
            return
        r.promoted_at = self.now
        r.cls = _MAIN
        if r.state == _READY:
            self._push(r, r.res)

    def _complete(self, job: _Job) -> None:
        job.state = _DONE
        if job.dur > 0.0:
            self.running[job.res] = None
            self.dirty.add(job.res)
            if job.res2 >= 0:
                self.running[job.res2] = None
                self.dirty.add(job.res2)
        p = job.stage
        if job.main and job.res % NRES == _COMPUTE:
            self.next_main[p] += 1
        self.dirty.update(self.neighbours[p])
        for s in job.succs:
            s.npred -= 1
            if s.fsr_r is not None and s.fsr_r is not job:
                s.other -= 1
                if s.other == 0 and s.fsr_r.state != _DONE:
                    self._promote(s.fsr_r)
            if s.npred == 0:
                self._make_ready(s)

    def _drain_instant(self) -> None:
        while self.instant:
            job = self.instant.popleft()
            job.start = job.end = self.now
            if job.kind == "F" and job.layer not in self.first_f_start:
                self.first_f_start[job.layer] = job.start
            self._complete(job)

    def _dispatch(self, r: int) -> None:
        if self.running[r] is not None:
            return
        heap = self.heaps[r]
        kind = r % NRES
        skipped = []
        while heap:
            ent = heapq.heappop(heap)
            cls, _, _, job = ent
            if job.state != _READY or cls != job.cls:
                continue                              # stale entry
            if job.res2 >= 0:
                other = job.res2 if job.res == r else job.res
                if self.running[other] is not None:
                    skipped.append(ent)               # other port busy: let something else use this one
                    continue
            elif cls != _MAIN and kind in (_COMPUTE, _LINK):
                ok = (self._compute_window_ok(r // NRES, job) if kind == _COMPUTE
                      else self._link_window_ok(r // NRES, job))
                if not ok:
                    skipped.append(ent)
                    self.waiting_fillers.add(r)
                    continue
            self._start(job)
            break
        for ent in skipped:
            heapq.heappush(heap, ent)

    def run(self) -> None:
        """The event loop: the compiled one from ``COMPILED_LOOP_MIN_JOBS`` jobs where Numba is loaded or
        this process has simulated ``COMPILED_LOOP_FIRST_JOBS`` jobs (imported only then), else :meth:`run_python`."""
        n = len(self.jobs)
        _JOBS_SIMULATED[0] += n
        if n >= COMPILED_LOOP_MIN_JOBS and ("numba" in sys.modules or _JOBS_SIMULATED[0] >= COMPILED_LOOP_FIRST_JOBS):
            importlib.import_module("ratrain.sim.event_loop").run(self)
        else:
            self.run_python()

    def run_python(self) -> None:
        """The event loop in Python: the reference of the compiled one."""
        for j in self.jobs:
            if j.npred == 0:
                self._make_ready(j)
        self._drain_instant()
        self._dispatch_dirty()
        events = self.events
        while events:
            t = events[0][0]
            self.now = t
            while events and events[0][0] == t:
                job = heapq.heappop(events)[2]
                self._complete(job)
                self._drain_instant()
            self._dispatch_dirty()
        stuck = [j for j in self.jobs if j.state != _DONE]
        if stuck:
            j = stuck[0]
            raise RatrainError(f"simulator deadlock: {len(stuck)} tasks never ran, first "
                               f"{j.kind}(stage {j.stage}, mb {j.mb}, layer {j.layer})")

    def _dispatch_dirty(self) -> None:
        self.memo.clear()
        dirty = self.dirty | self.waiting_fillers
        self.waiting_fillers = set()
        self.dirty = set()
        running, heaps = self.running, self.heaps
        for r in sorted(dirty):     # dispatching only starts tasks; it never marks anything dirty
            if running[r] is None and heaps[r]:      # else _dispatch has nothing to do
                self._dispatch(r)


# ------------------------------------------------------------ step time and annotations

def _segments(jobs: list[_Job], P: int) -> list[list[list[tuple[float, float]]]]:
    """Per stage and resource, the (start, end) of the jobs that occupy it (a transfer both ports), sorted."""
    start = np.array([j.start for j in jobs], np.float64)
    end = np.array([j.end for j in jobs], np.float64)
    stage = np.array([j.stage for j in jobs], np.int64)
    res = np.array([j.res for j in jobs], np.int64)
    res2 = np.array([j.res2 for j in jobs], np.int64)
    busy = end > start
    two = busy & (res2 >= 0)
    group = np.concatenate(((stage * NRES + res % NRES)[busy], (res2 // NRES * NRES + _LINK)[two]))
    a = np.concatenate((start[busy], start[two]))
    z = np.concatenate((end[busy], end[two]))
    order = np.lexsort((z, a, group))
    group, a, z = group[order], a[order], z[order]
    bounds = np.searchsorted(group, np.arange(P * NRES + 1)).tolist()
    a, z = a.tolist(), z.tolist()
    return [[list(zip(a[bounds[g]:bounds[g + 1]], z[bounds[g]:bounds[g + 1]], strict=True))
             for g in range(p * NRES, (p + 1) * NRES)] for p in range(P)]


def _period(segs, lower: float) -> float:
    """Smallest T >= lower such that no resource's intervals overlap the same intervals shifted by T."""
    T = lower
    # each resource's intervals with their starts and ends apart (they do not change with T)
    lists = [(s, [a for a, _ in s], [b for _, b in s]) for per in segs for s in per if s]
    changed = True
    while changed:
        changed = False
        for s, starts, ends in lists:
            T, moved = _clear_overlaps(s, starts, ends, T)
            changed |= moved
    return T


def _clear_overlaps(s: list[tuple[float, float]], starts: list[float], ends: list[float],
                    T: float) -> tuple[float, bool]:
    """One pass over a resource's intervals (last first), raising T past each overlap of an
    interval with the intervals shifted by T: (the new T, whether it moved)."""
    moved = False
    first = starts[0]
    for k in range(len(s) - 1, -1, -1):
        a0, a1 = s[k]
        if a1 <= T + first + _EPS:
            break
        hi = bisect_left(starts, a1 - T - _EPS)
        lo = bisect_right(ends, a0 - T + _EPS)
        if lo < hi:
            T = a1 - starts[lo]
            moved = True
    return T, moved


def _overlap(merged: list[tuple[float, float]], starts: list[float], a: float, b: float) -> float:
    if b <= a:
        return 0.0
    i = max(0, bisect_right(starts, a) - 1)
    tot = 0.0
    while i < len(merged) and merged[i][0] < b:
        lo, hi = max(a, merged[i][0]), min(b, merged[i][1])
        if hi > lo:
            tot += hi - lo
        i += 1
    return tot


def simulate(costs: PipelineCosts, *, schedule: str | PipelineSchedule = "1f1b",
             mechanisms: Mechanisms = Mechanisms(), buckets: GradBuckets | None = None,
             offload: OffloadPlan | None = None) -> SimResult:
    """Simulate one training step; see the module docstring for the model.

    ``schedule``: a name from ``ratrain.sim.pipeline_order.SCHEDULES`` (defaults for
    the rest) or a ``PipelineSchedule`` (virtual stages, weight-gradient share).
    ``buckets``: GradSync in gradient buckets (``ratrain.sim.buckets``) instead of one per layer;
    ``offload``: state or activations in host memory (``ratrain.sim.offload``).
    """
    # the run memo holds runs of the default lifecycle only (what the reproduction repeats)
    plain = buckets is None and offload is None
    key, hit = simulation_memo.find(costs, schedule, mechanisms, full=True) if plain else (None, None)
    if hit is not None:
        return hit
    with _collector_paused():
        sim, pipeline, T, last_b, segs = _run_step(costs, schedule, mechanisms, "simulate", buckets, offload)
        result = _result(sim, pipeline, mechanisms, T, last_b, segs, buckets, offload)
        sim.release()
    simulation_memo.keep(key, result, (T, last_b))
    return result


def simulate_step_time(costs: PipelineCosts, *, schedule: str | PipelineSchedule = "1f1b",
                       mechanisms: Mechanisms = Mechanisms(), buckets: GradBuckets | None = None,
                       offload: OffloadPlan | None = None) -> tuple[float, float]:
    """``(step_time_ms, last_backward_end_ms)`` of ``simulate`` on the same inputs, bit for bit: the
    same event simulation and period search, without building the step's task records and summaries."""
    plain = buckets is None and offload is None
    key, hit = simulation_memo.find(costs, schedule, mechanisms, full=False) if plain else (None, None)
    if hit is not None:
        return hit
    with _collector_paused():
        sim, _, T, last_b, _ = _run_step(costs, schedule, mechanisms, "simulate_step_time", buckets, offload)
        sim.release()
    simulation_memo.keep(key, None, (T, last_b))
    return T, last_b


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for one simulation: a step builds up to ~10**6 linked
    task objects, and every full collection while they live walks all of them (and every result the
    run memo holds), which cost about as much as the simulation itself. ``_Sim.release`` unlinks the
    graph afterwards, so reference counting frees it without the collector."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            # what was allocated meanwhile (the graph, until its caller drops it) goes to the oldest
            # generation in O(1) (freeze, then unfreeze), instead of being walked by the first young
            # collection after the collector is back on; it is freed by reference counting as before,
            # and any cycle among it is still found by the next full collection
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def _run_step(costs: PipelineCosts, schedule: str | PipelineSchedule, mechanisms: Mechanisms, caller: str,
              buckets: GradBuckets | None = None, offload: OffloadPlan | None = None):
    """The event simulation of one step and its period: (sim, pipeline, T, last_b, segments)."""
    if not isinstance(costs, PipelineCosts):
        raise ConfigError(f"{caller}: costs must be a PipelineCosts, got {type(costs).__name__}")
    if not isinstance(mechanisms, Mechanisms):
        raise ConfigError(f"{caller}: mechanisms must be a Mechanisms, got {type(mechanisms).__name__}")
    pipeline = PipelineSchedule.of(schedule)
    layers = sum(len(stage) for stage in costs.stages)
    work = layers * (4 * costs.microbatches + 4) + 2 * len(costs.stages) * costs.microbatches
    if work > MAX_SIM_TASKS:
        raise ConfigError(f"{caller}: {layers} layers x {costs.microbatches} micro-batches make about {work:,} "
                          f"tasks, above the simulator's bound of {MAX_SIM_TASKS:,} "
                          "(ratrain.sim.simulator.MAX_SIM_TASKS); use fewer layers or micro-batches")
    if buckets is not None and not isinstance(buckets, GradBuckets):
        raise ConfigError(f"{caller}: buckets must be a GradBuckets, got {type(buckets).__name__}")
    if offload is not None and not isinstance(offload, OffloadPlan):
        raise ConfigError(f"{caller}: offload must be an OffloadPlan, got {type(offload).__name__}")
    sim = _Sim(costs, pipeline, mechanisms, buckets, offload)
    sim.run()
    P, jobs = sim.P, sim.jobs

    # ---- step time (periodic steady state)
    last_b = max(j.end for j in jobs if j.kind in ("B", "W"))
    lower = last_b
    stage_first_f = [sim.main_chain[p][0].start for p in range(P)]
    for p in range(P):
        if mechanisms.deadline_aware:
            for layer_index, w in sim.prefetch[p].items():
                lower = max(lower, w.end - sim.first_f_start[layer_index])
        else:
            lower = max(lower, max(j.end for j in sim.life[p]) - stage_first_f[p])
    segs = _segments(jobs, P)
    return sim, pipeline, _period(segs, lower), last_b, segs


# the kinds in the order the executor runs tasks with the same start and end (the task records' sort
# key after the times); a kind's code is its place here
_KIND_ORDER = ("F", "R", "B", "W", "Send", "Recv", "GradSync", "UpdateShard", "PrefetchW", "Update") + HOST_TASK_KINDS
_KIND_CODE = {k: i for i, k in enumerate(_KIND_ORDER)}
_F, _R, _B, _W, _SEND, _RECV = range(6)
_NO_NOTE = TaskNote()          # the note of a task nothing annotates (frozen, so one serves them all)
# what hid a recovery on compute (``_annotate``'s labels for it)
_RECOVERY_LABELS = ("backward critical path", "bubble", "compute-idle while waiting on compute")


class _Timeline:
    """A simulated step's task records as arrays, in the records' order (start, end, kind's rank,
    stage, layer, micro-batch, then the order the jobs were built in, each Recv after its Send):
    what ``SimResult.tasks`` and ``notes`` are built from when first read, and what the step's
    summaries and ``activation_residency`` read without building them. ``mb`` and ``layer`` hold
    -1 for None; ``peer`` the other stage of a Send or Recv, else -1; ``notes`` the annotated
    records' notes by position, ``recovery`` those of recovery on compute as arrays (positions,
    ``_RECOVERY_LABELS`` index, exposed ms)."""

    def __init__(self, stage, kind, mb, layer, res, start, end, peer, notes: dict[int, TaskNote],
                 recovery: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None):
        self.stage, self.kind, self.mb, self.layer, self.res = stage, kind, mb, layer, res
        self.start, self.end, self.peer, self.notes = start, end, peer, notes
        self.recovery = recovery

    def __len__(self) -> int:
        return len(self.start)

    def records(self) -> tuple[list[Task], list[TaskNote]]:
        kinds = [_KIND_ORDER[k] for k in self.kind.tolist()]
        tasks = list(map(Task, self.stage.tolist(), kinds, [None if m < 0 else m for m in self.mb.tolist()],
                         [None if x < 0 else x for x in self.layer.tolist()],
                         [RES_NAMES[r] for r in self.res.tolist()], self.start.tolist(), self.end.tolist()))
        notes = [_NO_NOTE] * len(tasks)
        for i in np.flatnonzero(self.peer >= 0).tolist():
            notes[i] = TaskNote(peer=int(self.peer[i]))
        for i, note in self.notes.items():
            notes[i] = note
        if self.recovery is not None:
            for i, label, exposed in zip(*(a.tolist() for a in self.recovery), strict=True):
                notes[i] = TaskNote(hidden_by=_RECOVERY_LABELS[label], exposed_ms=exposed)
        return tasks, notes


def _timeline_of(tasks: Sequence[Task]) -> _Timeline:
    """The arrays of task records given as a list (kinds the simulator does not make get code -1)."""
    def col(values, dtype=np.int64):
        return np.array(values, dtype=dtype) if values else np.zeros(0, dtype)
    return _Timeline(col([t.stage for t in tasks]), col([_KIND_CODE.get(t.kind, -1) for t in tasks]),
                     col([-1 if t.microbatch is None else t.microbatch for t in tasks]),
                     col([-1 if t.layer is None else t.layer for t in tasks]),
                     col([_RES_INDEX.get(t.resource, -1) for t in tasks]),
                     col([t.start_ms for t in tasks], np.float64), col([t.end_ms for t in tasks], np.float64),
                     col([-1] * len(tasks)), {})


def _records(result: SimResult) -> _Timeline:
    """``result``'s task records as arrays: its own until its task list has been built (from then on the
    list may have been changed, so it is read)."""
    timeline = result.__dict__.get("_timeline")
    if timeline is not None and "tasks" not in result.__dict__:
        return timeline
    return _timeline_of(result.tasks)


def stage_task_counts(result: SimResult, kinds: Sequence[str]) -> list[int]:
    """Per stage, how many of ``result``'s task records are of one of ``kinds``."""
    tl = _records(result)
    codes = [_KIND_CODE[k] for k in kinds if k in _KIND_CODE]
    hit = np.isin(tl.kind, codes)
    return np.bincount(tl.stage[hit], minlength=len(result.stages)).tolist()


def _busy_intervals(comp: list[tuple[float, float]], T: float) -> tuple[list[tuple[float, float]], list[float]]:
    """A stage's compute intervals of this step and of the steps before and after (shifted by -T, +T),
    merged: (the merged intervals, their starts)."""
    if not comp:
        return [], []
    a = np.array([x for x, _ in comp])
    b = np.array([y for _, y in comp])
    a = np.concatenate((a + -T, a + 0.0 * T, a + T))    # as a + k * T for k = -1, 0, 1
    b = np.concatenate((b + -T, b + 0.0 * T, b + T))
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    reach = np.maximum.accumulate(b)                    # the end of the merged interval so far
    first = np.flatnonzero(np.concatenate(([True], a[1:] > reach[:-1])))
    last = np.concatenate((first[1:] - 1, [len(a) - 1]))
    starts = a[first].tolist()
    return list(zip(starts, reach[last].tolist(), strict=True)), starts


def _stage_peaks(stage: np.ndarray, time: np.ndarray, delta: np.ndarray, P: int) -> list[int]:
    """Per stage, the peak of the running sum of ``delta`` over its events in time order, frees
    (negative) before allocations at the same instant, at least 0: integers, exact."""
    order = np.lexsort((delta, time, stage))
    stage, running = stage[order], np.cumsum(delta[order])
    bounds = np.searchsorted(stage, np.arange(P + 1))
    out = []
    for p in range(P):
        lo, hi = int(bounds[p]), int(bounds[p + 1])
        base = int(running[lo - 1]) if lo else 0
        out.append(max(0, int(running[lo:hi].max()) - base) if hi > lo else 0)
    return out


def _groups(*columns: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Rows grouped by their values in ``columns`` (non-negative integers): each row's group, and
    each group's values, groups in sorted order."""
    key = np.zeros(len(columns[0]), np.int64)
    for c in columns:
        key = key * (int(c.max()) + 1) + c
    uniq, inverse = np.unique(key, return_inverse=True)
    values = []
    for c in reversed(columns):
        radix = int(c.max()) + 1
        values.append(uniq % radix)
        uniq = uniq // radix
    return inverse.reshape(-1), values[::-1]


def _peaks(tl: _Timeline, P: int) -> tuple[list[int], list[float]]:
    """``peak_inflight`` and ``peak_activation_sets`` of the records, from their arrays."""
    fbw = np.flatnonzero(((tl.kind == _F) | (tl.kind == _B) | (tl.kind == _W)) & (tl.mb >= 0))
    if not len(fbw):
        return [0] * P, [0.0] * P
    # per (stage, layer, micro-batch): live from the start of its F to the end of its last B or W
    span, (stage, layer, mb) = _groups(tl.stage[fbw], tl.layer[fbw] + 1, tl.mb[fbw])
    is_f = tl.kind[fbw] == _F
    a = np.full(len(stage), np.inf)
    np.minimum.at(a, span[is_f], tl.start[fbw][is_f])
    z = np.full(len(stage), -np.inf)
    np.maximum.at(z, span[~is_f], tl.end[fbw][~is_f])

    def sweep(st, a, z):
        ones = np.ones(len(st), np.int64)
        return _stage_peaks(np.concatenate((st, st)), np.concatenate((a, z)), np.concatenate((ones, -ones)), P)

    sets = sweep(stage, a, z)
    layers = np.bincount(_groups(stage, layer)[1][0], minlength=P)
    # per (stage, micro-batch): from its first F to its last B or W on the stage
    per, (pst, _) = _groups(stage, mb)
    pa = np.full(len(pst), np.inf)
    np.minimum.at(pa, per, a)
    pz = np.full(len(pst), -np.inf)
    np.maximum.at(pz, per, z)
    return sweep(pst, pa, pz), [s / max(1, int(n)) for s, n in zip(sets, layers.tolist(), strict=True)]


def _ordered_sums(groups: np.ndarray, values: np.ndarray, n: int) -> list[float]:
    """Per group, 0.0 plus its values added one by one in array order (a Python loop's sum, bit for bit)."""
    return np.bincount(groups, weights=values, minlength=n).tolist() if len(groups) else [0.0] * n


def _summaries(sim: "_Sim", T: float, res_busy: list[list[float]], by_kind: list[dict[str, float]],
               inflight: list[int], act_sets: list[float], rec: list[tuple[float, float]]) -> list[StageSummary]:
    """Per stage, its summary from its sums (``rec``: hidden and exposed recovery) and peaks."""
    out = []
    for p in range(sim.P):
        life_end = max((j.end for j in sim.life[p]), default=None)
        out.append(StageSummary(stage=p, compute_busy_ms=res_busy[p][0], compute_idle_ms=T - res_busy[p][0],
                                ddr_busy_ms=res_busy[p][1], link_busy_ms=res_busy[p][2], busy_by_kind_ms=by_kind[p],
                                peak_inflight=inflight[p], peak_activation_sets=act_sets[p],
                                hidden_recovery_ms=rec[p][0], exposed_recovery_ms=rec[p][1], lifecycle_end_ms=life_end))
    return out


def _result(sim: "_Sim", pipeline: PipelineSchedule, mechanisms: Mechanisms, T: float, last_b: float,
            segs, buckets: GradBuckets | None = None, offload: OffloadPlan | None = None) -> SimResult:
    """The step's task records (as arrays: ``SimResult.tasks`` and ``notes`` are built when first read),
    annotations and per-stage summaries."""
    P, jobs = sim.P, sim.jobs
    n = len(jobs)
    kind = np.array([_KIND_CODE[j.kind] for j in jobs], np.int64)
    stage = np.array([j.stage for j in jobs], np.int64)
    mb = np.array([-1 if j.mb is None else j.mb for j in jobs], np.int64)
    layer = np.array([-1 if j.layer is None else j.layer for j in jobs], np.int64)
    res = np.array([j.res for j in jobs], np.int64) % NRES
    start = np.array([j.start for j in jobs], np.float64)
    end = np.array([j.end for j in jobs], np.float64)
    # each Send also makes the receiver's Recv record, right after it
    send = np.flatnonzero(kind == _SEND)
    peer = np.array([jobs[i].peer for i in send.tolist()], np.int64)
    layer2 = np.array([-1 if jobs[i].layer2 is None else jobs[i].layer2 for i in send.tolist()], np.int64)
    ns = len(send)
    r_stage = np.concatenate((stage, peer))
    r_kind = np.concatenate((kind, np.full(ns, _RECV, np.int64)))
    r_mb = np.concatenate((mb, mb[send]))
    r_layer = np.concatenate((layer, layer2))
    r_res = np.concatenate((res, np.full(ns, _LINK, np.int64)))
    r_start = np.concatenate((start, start[send]))
    r_end = np.concatenate((end, end[send]))
    r_peer = np.full(n + ns, -1, np.int64)
    r_peer[send] = peer
    r_peer[n:] = stage[send]
    built = np.concatenate((2 * np.arange(n), 2 * send + 1))
    order = np.lexsort((built, r_mb, r_layer, r_stage, r_kind, r_end, r_start))
    position = np.empty(n + ns, np.int64)
    position[order] = np.arange(n + ns)

    # ---- annotations (recovery and lifecycle tasks)
    busy: dict[int, tuple] = {}
    notes: dict[int, TaskNote] = {}
    exposed = np.zeros(n + ns)
    # recovery on compute, the most of them, as arrays: _annotate's arithmetic on every one at once
    rc = np.flatnonzero((kind == _R) & (res == _COMPUTE))
    promoted_at = np.array([jobs[i].promoted_at for i in rc.tolist()], np.float64)   # None -> nan
    promoted = ~np.isnan(promoted_at)
    d_r = end[rc] - start[rc]
    behind = end[rc] - np.maximum(start[rc], np.where(promoted, promoted_at, 0.0))
    tail = np.maximum(0.0, np.minimum(end[rc], T) - np.maximum(start[rc], last_b))
    exposed[rc] = np.where(promoted, behind, tail)
    label = np.where(promoted, np.where(behind >= 0.5 * d_r, 0, 1),
                     np.where((d_r > 0) & (tail > 0.5 * d_r), 2, 1))
    recovery = (position[rc], label, exposed[rc])
    for i in np.flatnonzero(((kind == _R) & (res != _COMPUTE))
                            | np.isin(kind, [_KIND_CODE[k] for k in LIFECYCLE_KINDS])).tolist():
        j = jobs[i]
        rname = RES_NAMES[res[i]]
        if rname != "compute" and j.stage not in busy:
            busy[j.stage] = _busy_intervals(segs[j.stage][_COMPUTE], T)
        note = _annotate(j, rname, busy.get(j.stage), last_b, T)
        notes[int(position[i])] = note
        exposed[i] = note.exposed_ms
    tl = _Timeline(r_stage[order], r_kind[order], r_mb[order], r_layer[order], r_res[order], r_start[order],
                   r_end[order], r_peer[order], notes, recovery)

    # ---- per-stage summary: sums in the records' order
    d = tl.end - tl.start
    nk = len(_KIND_ORDER)
    kind_group = tl.stage * nk + tl.kind
    kind_ms = _ordered_sums(kind_group, d, P * nk)
    present, first = np.unique(kind_group, return_index=True)
    by_kind: list[dict[str, float]] = [{} for _ in range(P)]
    for g in present[np.argsort(first, kind="stable")].tolist():
        by_kind[g // nk][_KIND_ORDER[g % nk]] = kind_ms[g]
    flat = _ordered_sums(tl.stage * NRES + tl.res, d, P * NRES)
    res_busy = [flat[p * NRES:(p + 1) * NRES] for p in range(P)]
    is_r = tl.kind == _R
    e = exposed[order][is_r]
    hidden = _ordered_sums(tl.stage[is_r], d[is_r] - e, P)
    shown = _ordered_sums(tl.stage[is_r], e, P)
    summaries = _summaries(sim, T, res_busy, by_kind, *_peaks(tl, P), list(zip(hidden, shown, strict=True)))
    result = SimResult(tasks=[], notes=[], step_time_ms=T, exposed_tail_ms=T - last_b,
                       last_backward_end_ms=last_b, stages=summaries, schedule=pipeline.name, mechanisms=mechanisms,
                       next_forward_ms=dict(sorted(sim.first_f_start.items())), pipeline=pipeline,
                       stage_layers=sim.stage_layers, grad_buckets=buckets, buckets=bucket_records(sim),
                       offload=None if offload is None else offload_report(sim, offload, res_busy, RES_NAMES))
    del result.tasks, result.notes           # built from the timeline when first read
    result._timeline = tl
    return result


def _annotate(j: _Job, rname: str, busy, last_b: float, T: float) -> TaskNote:
    d = j.end - j.start
    if j.kind == "R" and j.promoted_at is not None:
        exposed = j.end - max(j.start, j.promoted_at)
        if exposed >= 0.5 * d:
            return TaskNote(hidden_by="backward critical path", exposed_ms=exposed)
        hidden_label = "bubble" if rname == "compute" else f"{rname}-idle during compute"
        return TaskNote(hidden_by=hidden_label, exposed_ms=exposed)
    tail_a, tail_b = max(j.start, last_b), min(j.end, T)
    tail = max(0.0, tail_b - tail_a)
    if rname == "compute":
        if d > 0 and tail > 0.5 * d:
            return TaskNote(hidden_by="compute-idle while waiting on compute", exposed_ms=tail)
        return TaskNote(hidden_by="bubble", exposed_ms=tail)
    merged, starts = busy
    during = _overlap(merged, starts, j.start, j.end)
    tail_busy = _overlap(merged, starts, tail_a, tail_b) if tail > 0 else 0.0
    exposed = tail - tail_busy
    bubble = d - during - exposed
    parts = {f"{rname}-idle during compute": during, "bubble": bubble,
             f"compute-idle while waiting on {rname}": exposed}
    label = max(parts, key=lambda k: (parts[k], k == "bubble")) if d > 0 else \
        (f"compute-idle while waiting on {rname}" if j.start >= last_b and j.start < T else "bubble")
    return TaskNote(hidden_by=label, exposed_ms=max(0.0, exposed))


# ------------------------------------------------------------ measurements from the timeline

def _live_spans(tasks: list[Task]) -> dict[tuple[int, int, int], list[float]]:
    """(stage, layer, micro-batch) -> [start of its F, end of its last B or W]."""
    spans: dict[tuple[int, int, int], list[float]] = {}
    for t in tasks:
        if t.kind not in ("F", "B", "W") or t.microbatch is None:
            continue
        key = (t.stage, -1 if t.layer is None else t.layer, t.microbatch)
        got = spans.setdefault(key, [float("inf"), float("-inf")])
        if t.kind == "F":
            got[0] = min(got[0], t.start_ms)
        else:
            got[1] = max(got[1], t.end_ms)
    return spans


def _peak(events: list[tuple[float, float]]) -> float:
    events.sort()                      # frees (negative) sort before allocations at the same instant
    cur = peak = 0.0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def peak_inflight(tasks: list[Task], stages: int, costs: PipelineCosts | None = None,
                  spans: dict[tuple[int, int, int], list[float]] | None = None) -> list[int]:
    """Per stage, the most micro-batches alive at once: from the start of their first F on the stage
    to the end of their last B (or W) there. ``costs`` is accepted for compatibility, unused;
    ``spans``: the tasks' :func:`_live_spans`, where the caller has them."""
    per: dict[tuple[int, int], list[float]] = {}
    for (p, _, m), (a, z) in (_live_spans(tasks) if spans is None else spans).items():
        got = per.setdefault((p, m), [a, z])
        got[0], got[1] = min(got[0], a), max(got[1], z)
    events: list[list[tuple[float, float]]] = [[] for _ in range(stages)]
    for (p, _), (a, z) in per.items():
        events[p] += [(a, 1.0), (z, -1.0)]
    return [int(_peak(ev)) for ev in events]


def peak_activation_sets(tasks: list[Task], stages: int,
                         spans: dict[tuple[int, int, int], list[float]] | None = None) -> list[float]:
    """Per stage, the peak of live (layer, micro-batch) activation sets divided by the stage's layer
    count: whole-stage micro-batches' worth of activations (a (layer, micro-batch) is live from the
    start of its F to the end of its B, or of its W when the backward is split)."""
    events: list[list[tuple[float, float]]] = [[] for _ in range(stages)]
    layers: list[set[int]] = [set() for _ in range(stages)]
    for (p, layer, _), (a, z) in (_live_spans(tasks) if spans is None else spans).items():
        events[p] += [(a, 1.0), (z, -1.0)]
        layers[p].add(layer)
    return [_peak(ev) / max(1, len(ls)) for ev, ls in zip(events, layers, strict=True)]


def _last_rows(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``keys`` among ``rows`` (sorted) and, per key, the last of ``rows`` with it."""
    uniq, first = np.unique(keys[rows][::-1], return_index=True)
    return uniq, rows[::-1][first]


def _find(uniq: np.ndarray, rows: np.ndarray, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``want``: whether ``uniq`` holds it, and its row there (0 where not)."""
    if not len(uniq):
        return np.zeros(len(want), bool), np.zeros(len(want), np.int64)
    at = np.minimum(np.searchsorted(uniq, want), len(uniq) - 1)
    found = uniq[at] == want
    return found, np.where(found, rows[at], 0)


def activation_residency(result: SimResult, costs: PipelineCosts,
                         weight_grad_bytes: int | Sequence[int] | None = None) -> list[int]:
    """Per stage, the peak bytes of live activations, checkpoints and recovery buffers over the step.

    full: a layer's full activations live from the start of F(m, l) to the end of
    B(m, l). ckpt/fsr: its checkpoint lives that long; its full intermediates
    exist transiently during F(m, l); the recovery buffer lives from the start of
    R(m, l) (ckpt: of B(m, l)) to the end of B(m, l). Under FSR a (layer,
    micro-batch) without an R task kept its full activations.

    Split backward (zb-h1): W(m, l) still reads tensors after B(m, l) ends. With
    ``weight_grad_bytes`` (per layer, or one number for all: what W reads, e.g.
    ``ratrain.sim.weight_split.weight_gradient_bytes``) everything else is freed
    at the end of B and those bytes live until the end of W; without it every
    set above lives until the end of W (an upper bound).

    Offloaded activations (``ToHost``/``FromHost`` of the (layer, micro-batch)): the saved set lives
    from the start of F to the end of its transfer to the host, and again from the start of its
    transfer back to the end of its last use.
    """
    policy = result.mechanisms.policy
    P = costs.num_stages
    tl = _records(result)
    radix = int(tl.mb.max()) + 2 if len(tl.mb) else 1
    keys = (tl.layer + 1) * radix + (tl.mb + 1)        # one integer per (layer, micro-batch)
    # a (layer, micro-batch) with several records of one kind: the last one counts
    fk, fi = _last_rows(keys, np.flatnonzero(tl.kind == _F))
    has_b, bi = _find(*_last_rows(keys, np.flatnonzero(tl.kind == _B)), fk)
    if not has_b.all():
        missing = int(fk[~has_b][0])
        raise KeyError((missing // radix - 1, missing % radix - 1))
    has_w, wi = _find(*_last_rows(keys, np.flatnonzero(tl.kind == _W)), fk)
    has_r, ri = _find(*_last_rows(keys, np.flatnonzero(tl.kind == _R)), fk)
    # offloaded: [end of its last ToHost, start of its last FromHost] (0.0 for a missing one)
    to_host, from_host = (np.flatnonzero((tl.kind == _KIND_CODE[k]) & (tl.mb >= 0)) for k in ("ToHost", "FromHost"))
    gap = np.isin(fk, keys[np.concatenate((to_host, from_host))])
    got0, at0 = _find(*_last_rows(keys, to_host), fk)
    got1, at1 = _find(*_last_rows(keys, from_host), fk)
    gap0 = np.where(got0, tl.end[at0], 0.0)
    gap1 = np.where(got1, tl.start[at1], 0.0)
    layers = keys[fi] // radix - 1
    n = len(fk)
    if not n:
        return [0] * P
    flat = [lc for stage in costs.stages for lc in stage]
    for layer_index in set(layers.tolist()):
        if not 0 <= layer_index < len(flat):
            costs.layer(layer_index)                    # its error
    full_b = np.array([lc.act_full_bytes for lc in flat], np.int64)[layers]
    ckpt_b = np.array([lc.act_ckpt_bytes for lc in flat], np.int64)[layers]
    rec_b = np.array([lc.recovery_bytes for lc in flat], np.int64)[layers]
    st = tl.stage[fi]
    f_start, f_end, b_end = tl.start[fi], tl.end[fi], tl.end[bi]
    w_end = np.where(has_w, tl.end[wi], 0.0)
    end = np.where(has_w, w_end, b_end) if weight_grad_bytes is None else b_end
    if policy == "fsr":
        rec_start = np.where(has_r, tl.start[ri], 0.0)
    else:
        has_r = np.zeros(n, bool)
        rec_start = tl.start[bi]
    kept = np.full(n, True) if policy == "full" else (~has_r if policy == "fsr" else np.zeros(n, bool))

    ev_stage, ev_time, ev_delta = [], [], []

    def live(mask, a, z, nbytes) -> None:
        mask = mask & (nbytes > 0)
        ev_stage.extend((st[mask], st[mask]))
        ev_time.extend((a[mask], z[mask]))
        ev_delta.extend((nbytes[mask], -nbytes[mask]))

    def saved(mask, a, z, nbytes) -> None:
        live(mask & ~gap, a, z, nbytes)
        live(mask & gap, a, gap0, nbytes)
        live(mask & gap, gap1, z, nbytes)

    if weight_grad_bytes is not None:
        if isinstance(weight_grad_bytes, int):
            nb = np.full(n, int(weight_grad_bytes), np.int64)
        else:           # read only where there is a W, as a lookup per (layer, micro-batch) would
            nb = np.array([int(weight_grad_bytes[x]) if h else 0 for x, h in zip(layers.tolist(), has_w.tolist(),
                                                                               strict=True)], np.int64)
        live(has_w, b_end, w_end, nb)
    saved(kept, f_start, end, full_b)
    saved(~kept, f_start, end, ckpt_b)
    live(~kept, f_start, f_end, np.maximum(0, full_b - ckpt_b))
    live(~kept, rec_start, end, rec_b)
    return _stage_peaks(np.concatenate(ev_stage), np.concatenate(ev_time), np.concatenate(ev_delta), P)


__all__ = ["ABLATION_VARIANTS", "ACTIVATIONS", "LIFECYCLE_KINDS", "Mechanisms", "SimResult", "StageSummary",
           "TaskNote", "activation_residency", "peak_activation_sets", "peak_inflight", "simulate",
           "simulate_step_time", "stage_task_counts"]

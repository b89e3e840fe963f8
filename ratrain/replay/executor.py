"""Replay a simulated timeline on the tiny model, checking the training-state lifecycle.

``execute_step`` takes the simulator's task list for one training step
(``ratrain.sim.timeline.Task``) and really runs it, in one process, for P pipeline
stages (layers split contiguously), D data-parallel replicas and A
micro-batches:

* F(l, m) / B(l, m): forward / backward of layer l for micro-batch m, on every
  replica. A task with ``layer=None`` means "all layers of the stage" (forward
  order for F and R, reverse order for B; under an interleaved placement that
  is every chunk of the stage, so interleaved timelines name their layers).
* W(l, m): the weight gradient of a split backward (zb-h1). A task list with W
  tasks splits every backward: B(l, m) passes the input gradient down and W(l,
  m) accumulates the parameter gradients. The tiny model computes both in one
  backward call, so B computes them and parks the parameter gradients with the
  layer's activations until W; the accumulation (the state change GradSync
  reads), the activation release and every check happen at W's time.
* R(l, m): activation recovery (FSR): rebuild layer l's internals for m from its
  checkpoint into a recovery buffer that the later B consumes. A B of a
  checkpointed layer that finds no recovered buffer recomputes at backward
  time (Baseline-1F1B's behaviour, and FSR's fallback).
* Layer placement: contiguous stages, or with ``ExecPlan.virtual_stages`` v > 1
  the interleaved placement (P*v chunks, chunk c on stage c mod P), as the
  simulator places them.
* GradSync(l): average layer l's accumulated gradients over the D replicas in
  replica order 0..D-1 (a fixed order, so every schedule sums identically).
* UpdateShard(l): Adam step of layer l's FP32 master (element-wise, so a ZeRO
  shard split would give the same bits; one copy stands for all replicas,
  which hold identical parameters after the average).
* PrefetchW(l): cast the master to the FP16 working view the next step's
  forward uses.
* Update: bulk step-end finalisation for the stage's layers (or one layer):
  GradSync, UpdateShard, PrefetchW for every layer not already finalised by
  per-layer tasks.
* Send / Recv: no-ops. In one process the tensor is handed over through the
  per-micro-batch activation table; readiness is checked where it is consumed.

Order: tasks run by (start_ms, end_ms, kind rank, stage, layer, microbatch),
kind rank F < R < B < W < Send < Recv < GradSync < UpdateShard < PrefetchW < Update.
Sorting on end_ms second puts a zero-length task before a longer one starting
at the same instant; the rank keeps a zero-length GradSync -> UpdateShard ->
PrefetchW chain in dependency order. Whatever the order, every dependency is
checked when the task runs.

Time: a task computes when it starts but its results count as available only
from its end_ms. Every read checks that its producer has ended by the reader's
start (F(l-1, m) before F(l, m); B(l+1, m) before B(l, m); F or R before B;
all B(l, .) (all W(l, .) when split) before GradSync(l); B(l, m) before W(l, m);
GradSync -> UpdateShard -> PrefetchW(l); the
previous step's PrefetchW(l) before F(l)). ``execute_steps`` with a period
lays consecutive steps on one time axis (step k shifted by k * period), so a
PrefetchW that the simulator lets spill past the step boundary is checked
against the next step's forwards.

Lifecycle checks (``LifecycleError``): a forward of step k that would use
weights other than version k (the layer's previous-step UpdateShard has not
run, or ran but PrefetchW has not re-materialised the view); weights that
change between a micro-batch's F and its R/B; GradSync/UpdateShard of a layer
before all A backwards of that layer; PrefetchW before UpdateShard; UpdateShard
before GradSync when D > 1; a layer updated twice or not at all in a step; a
backward accumulating into an earlier step's unsynchronised gradients; any
read that starts before its producer ends (see Time). With
``fault_injection=True`` these are recorded in the step's stats instead and
the step runs on with the wrong state (this is the "teeth" of the correctness
check). Structural errors (a B with neither saved, checkpointed nor recovered
activations, a forward without its input, a malformed task) always raise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from ratrain.errors import ConfigError, RatrainError
from ratrain.replay.tinymodel import (
    AdamConfig,
    LayerCache,
    LayerOptState,
    TinyConfig,
    adam_update,
    init_params,
    layer_backward,
    layer_forward,
    make_view,
    new_opt_state,
    recompute,
)
from ratrain.sim.pipeline_order import chunk_layers, interleaved_chunks
from ratrain.sim.timeline import TASK_KINDS, Task

ACTIVATION_POLICIES = ("full", "ckpt", "fsr")
KIND_RANK = {k: i for i, k in enumerate(
    ("F", "R", "B", "W", "Send", "Recv", "GradSync", "UpdateShard", "PrefetchW", "Update"))}
assert set(KIND_RANK) == set(TASK_KINDS)

_TIME_EPS = 1e-6   # ms; simulator times are sums of floats

BatchFn = Callable[[int, int, int], tuple[np.ndarray, np.ndarray]]


class LifecycleError(RatrainError):
    """A task list breaks the training-state lifecycle (would change what is learned)."""


@dataclass(frozen=True)
class ExecPlan:
    """How the step is laid out: P stages x D replicas x A micro-batches, and the activation policy.

    ``activation``: "full" (F keeps every intermediate), "ckpt" (F keeps the
    layer input, B recomputes) or "fsr" (F keeps the layer input, R tasks
    recover before B; B without R falls back to recomputing).
    ``virtual_stages``: 1 for contiguous stages; v > 1 for the interleaved
    placement (``ratrain.sim.pipeline_order.interleaved_chunks``).
    """
    stages: int
    dp: int
    microbatches: int
    layers: int
    activation: str = "ckpt"
    virtual_stages: int = 1

    def __post_init__(self) -> None:
        for name in ("stages", "dp", "microbatches", "layers", "virtual_stages"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ExecPlan.{name} must be >= 1, got {getattr(self, name)}")
        if self.layers < self.stages:
            raise ConfigError(f"ExecPlan: {self.layers} layers cannot fill {self.stages} stages")
        if self.activation not in ACTIVATION_POLICIES:
            raise ConfigError(f"ExecPlan.activation must be one of {ACTIVATION_POLICIES}, "
                              f"got {self.activation!r}")
        if self.virtual_stages > 1:
            chunks = interleaved_chunks(self.layers, self.stages, self.virtual_stages)
            placement = [sorted(x for g in range(p, len(chunks), self.stages) for x in chunks[g])
                         for p in range(self.stages)]
        else:
            placement = chunk_layers(self.layers, self.stages)
        object.__setattr__(self, "_placement", placement)
        object.__setattr__(self, "_stage_of", {x: p for p, layers in enumerate(placement) for x in layers})

    def stage_layers(self, stage: int) -> range | list[int]:
        """The stage's layers in model order. Contiguous split (v = 1): the first ``layers % stages``
        stages get one extra layer; interleaved (v > 1): the layers of chunks stage, stage + P, ..."""
        if not 0 <= stage < self.stages:
            raise ConfigError(f"stage {stage} out of range 0..{self.stages - 1}")
        return self._placement[stage]

    def stage_of(self, layer: int) -> int:
        got = self._stage_of.get(layer)
        if got is None:
            raise ConfigError(f"layer {layer} out of range 0..{self.layers - 1}")
        return got


@dataclass
class StepStats:
    tasks: dict[str, int] = field(default_factory=dict)
    recovered_by_r: int = 0              # per replica x layer x micro-batch
    recomputed_at_backward: int = 0
    peak_live_full: list[int] = field(default_factory=list)   # per stage, one replica
    violations: list[str] = field(default_factory=list)       # only with fault_injection


@dataclass
class ModelState:
    """Everything that lives across steps: master, FP16 views, Adam state, gradient buffers."""
    cfg: TinyConfig
    opt: AdamConfig
    master: list[dict[str, np.ndarray]]
    view: list[dict[str, np.ndarray]]
    opt_state: list[LayerOptState]
    master_version: list[int]
    view_version: list[int]
    grads: list[list[dict[str, np.ndarray] | None]]   # [replica][layer], fp32 accumulation buffers
    grads_step: list[list[int]]                        # [replica][layer]: step the buffer belongs to
    step: int = 0                                      # steps finished
    clock_ms: float = 0.0                              # where the next back-to-back step starts
    view_ready_ms: list[float] | None = None           # [layer]: end of the PrefetchW that made the view
    last_stats: StepStats | None = None

    def __post_init__(self) -> None:
        if self.view_ready_ms is None:
            self.view_ready_ms = [-np.inf] * len(self.master)

    @classmethod
    def create(cls, cfg: TinyConfig, opt: AdamConfig, seed: int, dp: int) -> "ModelState":
        master = init_params(cfg, seed)
        return cls(cfg=cfg, opt=opt, master=master, view=[make_view(m, cfg) for m in master],
                   opt_state=[new_opt_state(m) for m in master],
                   master_version=[0] * cfg.layers, view_version=[0] * cfg.layers,
                   grads=[[None] * cfg.layers for _ in range(dp)],
                   grads_step=[[-1] * cfg.layers for _ in range(dp)])


# ------------------------------------------------------------ shared arithmetic
# The single-stage reference loop uses these same helpers, so both paths sum
# in the same order.

def accumulate(buf: dict[str, np.ndarray] | None, g: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if buf is None:
        return {k: v.copy() for k, v in g.items()}
    for k, v in g.items():
        buf[k] += v
    return buf


def dp_average(per_replica: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Average over replicas in replica order 0..D-1."""
    out = {k: v.copy() for k, v in per_replica[0].items()}
    for g in per_replica[1:]:
        for k, v in g.items():
            out[k] += v
    d = len(per_replica)
    if d > 1:
        for k in out:
            out[k] /= d
    return out


def microbatch_dloss(opt: AdamConfig, microbatches: int) -> float:
    """d(objective)/d(micro-batch loss): objective is the mean over micro-batches, loss-scaled."""
    return opt.loss_scale / microbatches


def order_tasks(tasks: Iterable[Task]) -> list[Task]:
    """The execution order (see module docstring)."""
    def key(t: Task):
        return (t.start_ms, t.end_ms, KIND_RANK.get(t.kind, 99), t.stage,
                -1 if t.layer is None else t.layer, -1 if t.microbatch is None else t.microbatch)
    return sorted(tasks, key=key)


# ------------------------------------------------------------ one step

@dataclass
class _Run:
    step: int
    outputs: dict = field(default_factory=dict)     # (r, l, m) -> layer output (input of l+1)
    targets: dict = field(default_factory=dict)     # (r, m) -> targets
    caches: dict = field(default_factory=dict)      # (r, l, m) -> LayerCache (full or checkpoint)
    recovered: dict = field(default_factory=dict)   # (r, l, m) -> full LayerCache from R
    douts: dict = field(default_factory=dict)       # (r, l, m) -> d objective / d output of l
    losses: dict = field(default_factory=dict)      # (r, m) -> loss
    f_done: set = field(default_factory=set)        # (l, m)
    b_done: dict = field(default_factory=dict)      # l -> set of m
    w_done: dict = field(default_factory=dict)      # l -> set of m (split backward)
    pending_w: dict = field(default_factory=dict)   # (r, l, m) -> parameter grads waiting for W
    f_version: dict = field(default_factory=dict)   # (l, m) -> view version used by F
    synced: dict = field(default_factory=dict)      # l -> averaged grads
    updated: set = field(default_factory=set)
    live_full: list = field(default_factory=list)   # per stage
    ready: dict = field(default_factory=dict)       # ("F"|"B"|"R", l, m) / ("GradSync"|"UpdateShard", l) -> end


class _Executor:
    def __init__(self, state: ModelState, plan: ExecPlan, batches: BatchFn, fault_injection: bool,
                 step: int | None = None, offset_ms: float = 0.0, split: bool = False):
        if plan.layers != state.cfg.layers:
            raise ConfigError(f"ExecPlan.layers={plan.layers} but the model has {state.cfg.layers} layers")
        if len(state.grads) != plan.dp:
            raise ConfigError(f"ExecPlan.dp={plan.dp} but the model state holds {len(state.grads)} replicas")
        self.s, self.plan, self.batches, self.fault = state, plan, batches, fault_injection
        self.split = split                   # backward split into B (input grad) and W (weight grad)
        self.acc = "W" if split else "B"     # the kind whose end completes a gradient contribution
        self.cfg = state.cfg
        self.stats = StepStats(peak_live_full=[0] * plan.stages)
        self.run = _Run(step=state.step if step is None else step, live_full=[0] * plan.stages)
        self.offset = offset_ms
        self.t0 = self.t1 = 0.0              # current task's start / end on the global time axis
        self.task_keys: set = set()          # what the current task itself produced
        self.max_end = offset_ms

    # -- helpers
    def violation(self, msg: str) -> None:
        msg = f"step {self.run.step}: {msg}"
        if not self.fault:
            raise LifecycleError(msg)
        self.stats.violations.append(msg)

    def _live(self, layer: int, delta: int, replica: int) -> None:
        if replica:   # replicas are identical: count replica 0's device only
            return
        st = self.plan.stage_of(layer)
        self.run.live_full[st] += delta
        self.stats.peak_live_full[st] = max(self.stats.peak_live_full[st], self.run.live_full[st])

    def layers_of(self, task: Task, reverse: bool = False) -> list[int]:
        if task.stage < 0 or task.stage >= self.plan.stages:
            raise ConfigError(f"task {task.kind} has stage {task.stage}, plan has {self.plan.stages} stages")
        own = self.plan.stage_layers(task.stage)
        if task.layer is None:
            ls = list(own)
        else:
            if task.layer not in own:
                raise ConfigError(f"task {task.kind} on stage {task.stage} names layer {task.layer}, "
                                  f"which lives on stage {self.plan.stage_of(task.layer)} when "
                                  f"{self.plan.layers} layers are split over {self.plan.stages} stages")
            ls = [task.layer]
        return ls[::-1] if reverse else ls

    def mb_of(self, task: Task) -> int:
        m = task.microbatch
        if m is None or not 0 <= m < self.plan.microbatches:
            raise ConfigError(f"task {task.kind} on stage {task.stage} layer {task.layer} has microbatch "
                              f"{m}, expected 0..{self.plan.microbatches - 1}")
        return m

    # -- timing: a task reads its inputs at its start and publishes its outputs at its end
    def _produce(self, key: tuple) -> None:
        self.run.ready[key] = self.t1
        self.task_keys.add(key)

    def _need(self, key: tuple, reader: str, what: str) -> None:
        if key in self.task_keys:   # produced earlier inside this same (stage-level) task
            return
        t = self.run.ready.get(key)
        if t is not None and t > self.t0 + _TIME_EPS:
            self.violation(f"{reader} starts at {self.t0 - self.offset:.4g} ms but {what} ends at "
                           f"{t - self.offset:.4g} ms (step-relative times)")

    def _need_b_all(self, layer_index: int, reader: str) -> None:
        k = self.acc
        ends = [(self.run.ready.get((k, layer_index, m), -np.inf), m) for m in range(self.plan.microbatches)]
        t, m = max(ends)
        if (k, layer_index, m) not in self.task_keys and t > self.t0 + _TIME_EPS:
            self.violation(f"{reader} starts at {self.t0 - self.offset:.4g} ms but {k}(layer {layer_index}, mb {m}) "
                           "ends at "
                           f"{t - self.offset:.4g} ms (step-relative times)")

    # -- tasks
    def forward(self, layer_index: int, m: int) -> None:
        cfg, run, s = self.cfg, self.run, self.s
        if (layer_index, m) in run.f_done:
            raise LifecycleError(f"step {run.step}: F(layer {layer_index}, mb {m}) appears twice")
        # Every step updates every layer once, so step k's forward needs version k.
        if s.master_version[layer_index] < run.step:
            self.violation(f"F(layer {layer_index}, mb {m}) ran before UpdateShard({layer_index}) of step "
                           f"{run.step - 1} "
                           f"(master v{s.master_version[layer_index]})")
        elif s.view_version[layer_index] != s.master_version[layer_index]:
            self.violation(f"F(layer {layer_index}, mb {m}) would use a stale weight view: master v"
                           f"{s.master_version[layer_index]} was updated but PrefetchW({layer_index}) has not "
                           f"materialised it (view v{s.view_version[layer_index]})")
        elif s.view_ready_ms[layer_index] > self.t0 + _TIME_EPS:
            self.violation(f"F(layer {layer_index}, mb {m}) starts at {self.t0 - self.offset:.4g} ms but the "
                           f"PrefetchW({layer_index}) that makes its view ends at "
                           f"{s.view_ready_ms[layer_index] - self.offset:.4g} ms "
                           f"(step-relative times)")
        if layer_index > 0:
            self._need(("F", layer_index - 1, m), f"F(layer {layer_index}, mb {m})",
                       f"F(layer {layer_index - 1}, mb {m}) producing its input")
        save = "full" if self.plan.activation == "full" else "ckpt"
        last = layer_index == cfg.layers - 1
        for r in range(self.plan.dp):
            if layer_index == 0:
                tokens, targets = self.batches(run.step, r, m)
                run.targets[(r, m)] = targets
                inp = tokens
            else:
                if (r, layer_index - 1, m) not in run.outputs:
                    raise LifecycleError(f"step {run.step}: F(layer {layer_index}, mb {m}) ran before "
                                         f"F(layer {layer_index - 1}, mb {m}) produced its input")
                inp = run.outputs.pop((r, layer_index - 1, m))
            out, cache = layer_forward(s.view[layer_index], cfg, layer_index, inp, run.targets[(r,
                                                                                                m)] if last else None,
                                       save=save)
            run.caches[(r, layer_index, m)] = cache
            if cache.full:
                self._live(layer_index, 1, r)
            if last:
                run.losses[(r, m)] = out
            else:
                run.outputs[(r, layer_index, m)] = out
        run.f_done.add((layer_index, m))
        run.f_version[(layer_index, m)] = s.view_version[layer_index]
        self._produce(("F", layer_index, m))

    def _check_same_weights(self, what: str, layer_index: int, m: int) -> None:
        if self.run.f_version.get((layer_index, m)) != self.s.view_version[layer_index]:
            self.violation(f"{what}(layer {layer_index}, mb {m}) would use weights "
                           f"v{self.s.view_version[layer_index]} but "
                           f"its forward used v{self.run.f_version.get((layer_index, m))} (layer updated mid-step)")

    def recover(self, layer_index: int, m: int) -> None:
        run = self.run
        if self.plan.activation != "fsr":
            raise LifecycleError(f"step {run.step}: R(layer {layer_index}, mb {m}) in a plan with activation "
                                 f"policy {self.plan.activation!r} (only 'fsr' recovers in R slots)")
        if (layer_index, m) not in run.f_done or m in run.b_done.get(layer_index, ()):
            raise LifecycleError(f"step {run.step}: R(layer {layer_index}, mb {m}) has no checkpoint to recover "
                                 f"from (its F has not run, or its B already consumed it)")
        if (0, layer_index, m) in run.recovered:
            raise LifecycleError(f"step {run.step}: R(layer {layer_index}, mb {m}) appears twice")
        self._check_same_weights("R", layer_index, m)
        self._need(("F", layer_index, m), f"R(layer {layer_index}, mb {m})",
                   f"F(layer {layer_index}, mb {m}) saving its checkpoint")
        for r in range(self.plan.dp):
            cache = run.caches[(r, layer_index, m)]
            run.recovered[(r, layer_index, m)] = recompute(self.s.view[layer_index], self.cfg, cache)
            self._live(layer_index, 1, r)
        self.stats.recovered_by_r += self.plan.dp
        self._produce(("R", layer_index, m))

    def backward(self, layer_index: int, m: int) -> None:
        cfg, run, s = self.cfg, self.run, self.s
        done = run.b_done.setdefault(layer_index, set())
        if m in done:
            raise LifecycleError(f"step {run.step}: B(layer {layer_index}, mb {m}) appears twice")
        last = layer_index == cfg.layers - 1
        if last and (layer_index, m) not in run.f_done:
            raise LifecycleError(f"step {run.step}: B(layer {layer_index}, mb {m}) before its forward produced a loss")
        if not last and (0, layer_index, m) not in run.douts:
            raise LifecycleError(f"step {run.step}: B(layer {layer_index}, mb {m}) ran before B(layer "
                                 f"{layer_index + 1}, mb {m}) "
                                 f"produced its output gradient")
        if (0, layer_index, m) not in run.recovered and (0, layer_index, m) not in run.caches:
            raise LifecycleError(f"step {run.step}: B(layer {layer_index}, mb {m}) has neither saved nor recovered "
                                 f"activations (no F ran for it)")
        self._check_same_weights("B", layer_index, m)
        who = f"B(layer {layer_index}, mb {m})"
        if last:
            self._need(("F", layer_index, m), who, f"F(layer {layer_index}, mb {m}) producing the loss")
        else:
            self._need(("B", layer_index + 1, m), who,
                       f"B(layer {layer_index + 1}, mb {m}) producing its output gradient")
        if (0, layer_index, m) in run.recovered:
            self._need(("R", layer_index, m), who, f"R(layer {layer_index}, mb {m}) recovering its activations")
        else:
            self._need(("F", layer_index, m), who, f"F(layer {layer_index}, mb {m}) saving its activations")
        if not self.split:
            self._check_fresh_grads(who, layer_index)
        dloss = microbatch_dloss(s.opt, self.plan.microbatches)
        for r in range(self.plan.dp):
            cache: LayerCache | None = run.recovered.pop((r, layer_index, m), None)
            ckpt = run.caches.pop((r, layer_index, m), None)
            if cache is None:
                cache = ckpt
                if not cache.full:   # backward-time recovery: a transient full set
                    self.stats.recomputed_at_backward += 1
                    self._live(layer_index, 1, r)
            dout = dloss if last else run.douts.pop((r, layer_index, m))
            dx, grads = layer_backward(s.view[layer_index], cfg, cache, dout)
            if self.split:                # W accumulates them and releases the activations
                run.pending_w[(r, layer_index, m)] = grads
            else:
                self._live(layer_index, -1, r)
                s.grads[r][layer_index] = accumulate(s.grads[r][layer_index], grads)
                s.grads_step[r][layer_index] = run.step
            if layer_index > 0:
                run.douts[(r, layer_index - 1, m)] = dx
        done.add(m)
        self._produce(("B", layer_index, m))

    def _check_fresh_grads(self, who: str, layer_index: int) -> None:
        tag = self.s.grads_step[0][layer_index]
        if self.s.grads[0][layer_index] is not None and tag != self.run.step:
            self.violation(f"{who} would accumulate into step {tag}'s gradients "
                           f"(GradSync({layer_index}) of step {tag} has not consumed them)")

    def weight(self, layer_index: int, m: int) -> None:
        """W(l, m): accumulate the parameter gradients B(l, m) computed; release its activations."""
        run, s = self.run, self.s
        who = f"W(layer {layer_index}, mb {m})"
        if not self.split:
            raise LifecycleError(f"step {run.step}: {who} in a task list without split backward")
        done = run.w_done.setdefault(layer_index, set())
        if m in done:
            raise LifecycleError(f"step {run.step}: {who} appears twice")
        if (0, layer_index, m) not in run.pending_w:
            raise LifecycleError(f"step {run.step}: {who} ran before B(layer {layer_index}, mb {m}) "
                                 "computed its gradients")
        self._check_same_weights("W", layer_index, m)
        self._need(("B", layer_index, m), who, f"B(layer {layer_index}, mb {m}) computing them")
        self._check_fresh_grads(who, layer_index)
        for r in range(self.plan.dp):
            grads = run.pending_w.pop((r, layer_index, m))
            self._live(layer_index, -1, r)
            s.grads[r][layer_index] = accumulate(s.grads[r][layer_index], grads)
            s.grads_step[r][layer_index] = run.step
        done.add(m)
        self._produce(("W", layer_index, m))

    def _missing_b(self, layer_index: int) -> list[int]:
        """Micro-batches whose gradient contribution to the layer is not in yet (B, or W when split)."""
        done = self.run.w_done if self.split else self.run.b_done
        return sorted(set(range(self.plan.microbatches)) - done.get(layer_index, set()))

    def gradsync(self, layer_index: int) -> None:
        run, s = self.run, self.s
        if layer_index in run.synced:
            self.violation(f"GradSync({layer_index}) runs twice")
            return
        missing = self._missing_b(layer_index)
        if missing:
            self.violation(f"GradSync({layer_index}) before the {'weight gradient' if self.split else 'backward'} "
                           f"of micro-batches {missing} for layer {layer_index}")
        else:
            self._need_b_all(layer_index, f"GradSync({layer_index})")
        bufs = [s.grads[r][layer_index] for r in range(self.plan.dp)]
        if any(b is None for b in bufs):
            raise LifecycleError(f"step {run.step}: GradSync({layer_index}) has no gradients to average")
        run.synced[layer_index] = dp_average(bufs)
        for r in range(self.plan.dp):
            s.grads[r][layer_index] = None
        self._produce(("GradSync", layer_index))

    def update_shard(self, layer_index: int) -> None:
        run, s = self.run, self.s
        if layer_index in run.updated:
            self.violation(f"UpdateShard({layer_index}) runs twice")
            return
        missing = self._missing_b(layer_index)
        if missing:
            self.violation(f"UpdateShard({layer_index}) before the {'weight gradient' if self.split else 'backward'} "
                           f"of micro-batches {missing} for layer {layer_index}")
        if layer_index not in run.synced:
            if self.plan.dp > 1:
                self.violation(f"UpdateShard({layer_index}) before GradSync({layer_index}) with {self.plan.dp} "
                               "replicas")
            self.gradsync(layer_index)   # D == 1: the average of one replica is its own gradient
        self._need(("GradSync", layer_index), f"UpdateShard({layer_index})", f"GradSync({layer_index})")
        adam_update(s.master[layer_index], run.synced[layer_index], s.opt_state[layer_index], s.opt)
        s.master_version[layer_index] += 1
        run.updated.add(layer_index)
        self._produce(("UpdateShard", layer_index))

    def prefetch(self, layer_index: int) -> None:
        run, s = self.run, self.s
        if layer_index not in run.updated:
            self.violation(f"PrefetchW({layer_index}) before UpdateShard({layer_index}): it would materialise the "
                           "old weights")
        self._need(("UpdateShard", layer_index), f"PrefetchW({layer_index})", f"UpdateShard({layer_index})")
        s.view[layer_index] = make_view(s.master[layer_index], self.cfg)
        s.view_version[layer_index] = s.master_version[layer_index]
        s.view_ready_ms[layer_index] = self.t1

    def bulk_update(self, layer_index: int) -> None:
        if layer_index not in self.run.updated:
            if layer_index not in self.run.synced:
                self.gradsync(layer_index)
            self.update_shard(layer_index)
        if self.s.view_version[layer_index] != self.s.master_version[layer_index]:
            self.prefetch(layer_index)

    def execute(self, tasks: list[Task]) -> float:
        for task in order_tasks(tasks):
            self.run_task(task)
        return self.finish()

    def run_task(self, task: Task) -> None:
        plan = self.plan
        kind = task.kind
        if kind not in KIND_RANK:
            raise ConfigError(f"task kind {kind!r} is not one of {TASK_KINDS}")
        self.stats.tasks[kind] = self.stats.tasks.get(kind, 0) + 1
        self.t0, self.t1 = task.start_ms + self.offset, task.end_ms + self.offset
        if not self.t1 >= self.t0:
            raise ConfigError(f"task {kind} on stage {task.stage} ends ({task.end_ms}) before it starts "
                              f"({task.start_ms})")
        self.max_end = max(self.max_end, self.t1)
        self.task_keys = set()
        if kind == "F":
            m = self.mb_of(task)
            for layer_index in self.layers_of(task):
                self.forward(layer_index, m)
        elif kind == "R":
            m = self.mb_of(task)
            for layer_index in self.layers_of(task):
                self.recover(layer_index, m)
        elif kind == "B":
            m = self.mb_of(task)
            for layer_index in self.layers_of(task, reverse=True):
                self.backward(layer_index, m)
        elif kind == "W":
            m = self.mb_of(task)
            for layer_index in self.layers_of(task, reverse=True):
                self.weight(layer_index, m)
        elif kind == "GradSync":
            for layer_index in self.layers_of(task, reverse=True):
                self.gradsync(layer_index)
        elif kind == "UpdateShard":
            for layer_index in self.layers_of(task, reverse=True):
                self.update_shard(layer_index)
        elif kind == "PrefetchW":
            for layer_index in self.layers_of(task, reverse=True):
                self.prefetch(layer_index)
        elif kind == "Update":
            for layer_index in self.layers_of(task, reverse=True):
                self.bulk_update(layer_index)
        else:   # Send / Recv: hand-over is implicit, see module docstring
            if not 0 <= task.stage < plan.stages:
                raise ConfigError(f"task {kind} has stage {task.stage}, plan has {plan.stages} stages")

    def finish(self) -> float:
        """Step-end invariants; returns the step loss."""
        s, run, plan = self.s, self.run, self.plan
        want = {(layer_index, m) for layer_index in range(plan.layers) for m in range(plan.microbatches)}
        if run.f_done != want:
            raise LifecycleError(f"step {run.step}: forward never ran for (layer, mb) "
                                 f"{sorted(want - run.f_done)[:6]}")
        missing_b = sorted((layer_index, m) for layer_index, m in want if m not in run.b_done.get(layer_index, set()))
        if missing_b:
            raise LifecycleError(f"step {run.step}: backward never ran for (layer, mb) {missing_b[:6]}")
        if self.split:
            missing_w = sorted((layer_index, m) for layer_index, m in want
                               if m not in run.w_done.get(layer_index, set()))
            if missing_w:
                raise LifecycleError(f"step {run.step}: weight gradient W never ran for (layer, mb) {missing_w[:6]}")
        not_updated = sorted(set(range(plan.layers)) - run.updated)
        if not_updated:
            self.violation(f"layers {not_updated} were never updated in this step")
        s.step = max(s.step, run.step + 1)
        s.clock_ms = max(s.clock_ms, self.max_end)
        s.last_stats = self.stats
        losses = [run.losses[(r, m)] for r in range(plan.dp) for m in range(plan.microbatches)]
        return float(np.mean(np.asarray(losses, dtype=np.float64)))


def splits_backward(tasks: Iterable[Task]) -> bool:
    """Whether a task list splits the backward into B and W (it has W tasks)."""
    return any(t.kind == "W" for t in tasks)


def execute_step(model_state: ModelState, tasks: list[Task], plan: ExecPlan, batch_provider: BatchFn,
                 *, fault_injection: bool = False) -> float:
    """Run one training step's task list; return the step loss (mean over replicas x micro-batches).

    ``batch_provider(step, replica, microbatch) -> (tokens, targets)``. The
    step's stats (task counts, recoveries, peak live activation sets,
    violations under fault injection) land in ``model_state.last_stats``.
    """
    tasks = list(tasks)
    return _Executor(model_state, plan, batch_provider, fault_injection, offset_ms=model_state.clock_ms,
                     split=splits_backward(tasks)).execute(tasks)


def execute_steps(model_state: ModelState, tasks: list[Task], plan: ExecPlan, batch_provider: BatchFn,
                  steps: int, *, period_ms: float | None = None, fault_injection: bool = False,
                  on_step: Callable[[int], None] | None = None) -> tuple[list[float], list[StepStats]]:
    """Run ``steps`` steps of the same one-step timeline; return losses and per-step stats.

    ``period_ms=None`` runs the steps back to back. With the simulator's step
    time as ``period_ms``, step k's tasks are shifted by k * period_ms and all
    steps are replayed on one time axis, so a PrefetchW that the simulator lets
    spill past the step boundary really runs after the next step's first
    forwards; the version checks then verify that every forward still sees its
    layer's updated view. Order key: (start, end, step, kind rank, ...).
    ``on_step(n)`` is called whenever n steps have finished.
    """
    if steps < 1:
        raise ConfigError(f"execute_steps: steps must be >= 1, got {steps}")
    if period_ms is None:
        losses, stats = [], []
        for _ in range(steps):
            losses.append(execute_step(model_state, tasks, plan, batch_provider,
                                       fault_injection=fault_injection))
            stats.append(model_state.last_stats)
            if on_step:
                on_step(len(losses))
        return losses, stats
    if not period_ms > 0:
        raise ConfigError(f"execute_steps: period_ms must be positive, got {period_ms}")
    first, t0 = model_state.step, model_state.clock_ms
    split = splits_backward(tasks)
    execs = [_Executor(model_state, plan, batch_provider, fault_injection, step=first + k,
                       offset_ms=t0 + k * period_ms, split=split) for k in range(steps)]
    base = order_tasks(tasks)   # fixes the within-step order of exact ties
    merged = []
    for k in range(steps):
        off = t0 + k * period_ms
        for i, t in enumerate(base):
            merged.append((t.start_ms + off, t.end_ms + off, k, i, t))
    merged.sort(key=lambda e: e[:4])
    remaining = [len(base)] * steps
    losses: list[float | None] = [None] * steps
    finished = 0
    for _, _, k, _, t in merged:
        execs[k].run_task(t)
        remaining[k] -= 1
        if remaining[k] == 0:
            losses[k] = execs[k].finish()
            finished += 1
            if on_step:
                on_step(finished)
    return [float(x) for x in losses], [e.stats for e in execs]


# ------------------------------------------------------------ fault injection

FAULTS = ("early-update", "stale-view")


def inject_fault(tasks: list[Task], plan: ExecPlan, kind: str, layer: int) -> list[Task]:
    """A copy of ``tasks`` with one deliberate lifecycle bug for ``layer``.

    * "early-update": GradSync/UpdateShard/PrefetchW(layer) run just before the
      last micro-batch's B (W when the backward is split) of that layer (its
      gradient misses the step, and the last backward sees new weights).
    * "stale-view": PrefetchW(layer) runs just before UpdateShard(layer), so the
      next step's forward uses the old weights.
    """
    if kind not in FAULTS:
        raise ConfigError(f"fault kind must be one of {FAULTS}, got {kind!r}")
    stage = plan.stage_of(layer)

    def touches(t: Task) -> bool:
        return t.stage == stage and (t.layer is None or t.layer == layer)

    if kind == "early-update":
        acc = "W" if splits_backward(tasks) else "B"
        bs = [t for t in tasks if t.kind == acc and touches(t)]
        if not bs:
            raise ConfigError(f"no {acc} task for layer {layer} to inject an early update before")
        last_b = max(bs, key=lambda t: (t.start_ms, t.microbatch or 0))
        at = last_b.start_ms - 1e-6
        keep = [t for t in tasks if not (t.kind in ("GradSync", "UpdateShard", "PrefetchW")
                                         and t.layer == layer)]
        chain = [Task(stage, k, None, layer, "ddr", at, at) for k in ("GradSync", "UpdateShard", "PrefetchW")]
        return keep + chain
    ups = [t for t in tasks if t.kind == "UpdateShard" and t.layer == layer]
    if not ups:
        raise ConfigError(f"stale-view fault needs an UpdateShard({layer}) task (layer-wise schedule)")
    at = ups[0].start_ms - 1e-6
    keep = [t for t in tasks if not (t.kind == "PrefetchW" and t.layer == layer)]
    return keep + [Task(stage, "PrefetchW", None, layer, "ddr", at, at)]


__all__ = ["ACTIVATION_POLICIES", "ExecPlan", "FAULTS", "LifecycleError", "ModelState", "StepStats",
           "accumulate", "dp_average", "execute_step", "execute_steps", "inject_fault", "microbatch_dloss",
           "order_tasks", "splits_backward"]

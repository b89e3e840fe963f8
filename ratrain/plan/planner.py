"""Resource-aware configuration planner (paper Algorithm 2, Eq. 8, 10-13).

For a model, a cluster count N, a global batch G (sequences per step) and a sequence length,
enumerate c = (P, D, Z, T, b, A, pi_act, pi_pref) with P * D * T = N and D * b * A = G; prune
every candidate whose worst stage exceeds the memory budget (Eq. 10) BEFORE any timing; time
the rest analytically (``ratrain.plan.estimator.step_breakdown``: T_1F1B + E_comm + E_upd + E_pref
+ E_rec, Eq. 12, no simulation); return the argmin (Eq. 13) and a ranked list.

Methods (baselines on the same backend, same profiles, same constants):
  ratrain       full search, every lifecycle mechanism on
  tp-heavy      T = 2 forced                      (mechanisms on)
  zero3-heavy   Z = 3 forced                      (mechanisms on)
  backward-ckpt activation checkpointing forced   (mechanisms on: layer-wise state pipeline)
  full-save     full activations forced           (usually OOM)
  tuned         full search, lifecycle mechanisms off: bulk step-end GradSync/update/prefetch
                and backward-time recomputation (FSR off, so only full/ckpt are distinct)

Memory pruning uses a fast transcription of ``ratrain.spec.memory.stage_memory`` (partitions
cached per P); tests/test_planner.py checks it equals ``max_peak(stage_memory(...))`` exactly,
and every configuration the planner returns is re-checked with ``stage_memory`` itself.

The analytic pass (memory check, cost terms, main-path bound) runs over arrays of every 1F1B candidate
at once (``ratrain.plan.vectorised``, bit-identical to the scalar functions) for a dense model at
EP = CP = 1 with recovery on compute; the lifecycle chains of the candidates that can still enter the
top run one at a time as before. The other schedules' candidates, and other searches (MoE, CP,
recovery on DDR), take the scalar loop; both lists are taken in one bound order, and the top is the
best by (step, peak, point, schedule) whatever that order.
"""
from __future__ import annotations

import gc
import math
import time
from bisect import insort
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from heapq import merge
from operator import itemgetter
from typing import Callable, Iterator

import numpy as np

import mtemu  # a lazy package: the tuner and Numba load only where kernels are emulated
from ratrain.cost.profile import build_profiles, unbuilt_profiles
from ratrain.cost.terms import (
    PROFILE_SOURCES,
    CostTerms,
    cost_terms,
    load_profile,
    pipeline_costs,
    stage_kinds,
)
from ratrain.errors import ConfigError
from ratrain.plan.choices import MAX_MICRO_BATCH, MAX_TP, METHODS
from ratrain.plan.estimator import (
    StepBreakdown,
    lifecycle_tail,
    main_path,
    schedule_main_path,
    schedule_tail,
    step_breakdown,
)
from ratrain.plan.schedule_search import (
    ONE_F_ONE_B,
    ScheduleMemory,
    check_schedules,
    chunk_kinds,
    runnable,
    weight_shares,
)
from ratrain.plan.vectorised import (
    Grid,
    kind_arrays,
    main_path_ms,
    peak_bytes,
    stacked_kind_arrays,
    vectorisable_terms,
)
from ratrain.sim.pipeline_order import PipelineSchedule, interleaved_chunk_sizes
from ratrain.sim.simulator import Mechanisms, simulate
from ratrain.sim.weight_split import weight_fractions
from ratrain.spec.lengths import LengthDistribution
from ratrain.spec.memory import (
    DEFAULT_CONSTANTS,
    MemoryConstants,
    PeakMemory,
    _layer_bytes,
    max_peak,
    stage_memory,
)
from ratrain.spec.models import (
    ModelSpec,
)
from ratrain.spec.parallel import (
    ACTIVATION_POLICIES,
    PREFETCH_POLICIES,
    ParallelConfig,
    _stage_counts,
)
from ratrain.spec.platform import GIB, TrainingPlatform
from rtcommon.progress import Progress


def mechanisms_for(method: str, activation: str, prefetch: str = "layerwise") -> Mechanisms:
    """The simulator's ``Mechanisms`` for a method and configuration."""
    _check_method(method)
    if method == "tuned":
        return Mechanisms(layerwise=False, update_prefetch=False, fsr=False, activation=activation)
    return Mechanisms(layerwise=True, update_prefetch=prefetch == "layerwise", fsr=True, activation=activation)


def clear_memos() -> None:
    """Forget the process-wide memos a plan fills (the partitions' layer counts, the layer sizes), as a new
    process starts without them: to measure a first plan in a process that has planned before."""
    _stage_counts.cache_clear()
    _layer_bytes.cache_clear()


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


# ---------------------------------------------------------------- candidates and results

@dataclass
class Candidate:
    config: ParallelConfig
    method: str
    step_ms: float
    breakdown: StepBreakdown
    peak_bytes: int
    stages: list | None = None          # per-stage StageMemory (filled for returned candidates)
    kernels: str = "emulated"           # latency source of step_ms: "emulated", "bound" or "roofline"
    fast_step_ms: float | None = None   # the fast model's estimate, for a confirmed finalist
    schedule: PipelineSchedule = ONE_F_ONE_B   # the pipeline schedule (and v) the step and peak are for
    simulated_step_ms: float | None = None   # the simulator's step, for a finalist confirmed by simulation

    @property
    def tokens_per_s(self) -> float:
        return self.config.global_batch * self.config.seq / (self.step_ms / 1e3)

    def to_json(self) -> dict:
        oom = math.isinf(self.step_ms)          # evaluate() of a layout that does not fit
        out = {
            "config": self.config.to_json(), "label": self.config.describe(), "method": self.method,
            "oom": oom, "step_ms": None if oom else self.step_ms, "step_s": None if oom else self.step_ms / 1e3,
            "tokens_per_s": None if oom else self.tokens_per_s,
            "peak_bytes": self.peak_bytes, "peak_gb": self.peak_bytes / GIB,
            "breakdown": self.breakdown.to_json(), "kernels": self.kernels,
            "fast_step_s": None if self.fast_step_ms is None else self.fast_step_ms / 1e3,
            "schedule": {"name": self.schedule.name, "virtual_stages": self.schedule.virtual_stages},
            "simulated_step_s": None if self.simulated_step_ms is None else self.simulated_step_ms / 1e3,
        }
        if self.stages is not None:
            out["memory"] = [{"stage": s.stage, "layers": [s.layers.start, s.layers.stop], "n_act": s.n_act,
                              "state_bytes": s.state_bytes, "activation_bytes": s.activation_bytes,
                              "buffer_bytes": s.buffer_bytes, "peak_bytes": s.peak_bytes} for s in self.stages]
        return out


@dataclass
class PlanResult:
    model: str
    method: str
    clusters: int
    global_batch: int
    seq: int
    best: Candidate | None
    ranked: list[Candidate]
    enumerated: int
    pruned_by_memory: int
    timed: int
    elapsed_s: float
    grid: dict = field(default_factory=dict)
    profile_s: float = 0.0          # part of elapsed_s spent building/loading latency profiles
    kernel_model: str = "emulated"  # what ranked every candidate ("bound": the fast fitted model)
    confirmed: int = 0              # finalists re-estimated on emulated kernels
    reordered: bool = False         # emulation changed the finalists' order
    fast_error: float | None = None  # max |fast - emulated| / emulated over the confirmed finalists
    schedules: list[str] = field(default_factory=lambda: ["1f1b"])   # the schedules searched
    simulated: int = 0               # finalists confirmed by simulation (when schedules were searched)
    sim_error: float | None = None   # max |estimate - simulated| / simulated over them
    # part of elapsed_s: the analytic pass, Eq. 10's memory check and the main-path bound (a lower bound of
    # the step) of every enumerated configuration, profiles aside; the rest is the finalists' lifecycle chains,
    # their confirmation and the ranked list's stage memory
    analytic_s: float = 0.0

    @property
    def configs_per_s(self) -> float:
        """Search speed: enumerated configurations per second, profile building excluded."""
        search = self.elapsed_s - self.profile_s
        return self.enumerated / search if search > 0 else float("inf")

    @property
    def analytic_configs_per_s(self) -> float:
        """The analytic pass's speed: enumerated configurations per second of ``analytic_s``."""
        return self.enumerated / self.analytic_s if self.analytic_s > 0 else float("inf")

    def to_json(self) -> dict:
        return {
            "model": self.model, "method": self.method, "clusters": self.clusters,
            "global_batch": self.global_batch, "seq": self.seq,
            "oom": self.best is None,
            "best": self.best.to_json() if self.best else None,
            "ranked": [c.to_json() for c in self.ranked],
            "counts": {"enumerated": self.enumerated, "pruned_by_memory": self.pruned_by_memory,
                       "timed": self.timed},
            "elapsed_s": self.elapsed_s, "profile_s": self.profile_s, "configs_per_s": self.configs_per_s,
            "analytic_s": self.analytic_s, "analytic_configs_per_s": self.analytic_configs_per_s,
            "grid": self.grid, "kernel_model": self.kernel_model, "confirmed": self.confirmed,
            "reordered": self.reordered, "fast_error": self.fast_error,
            "schedules": self.schedules, "simulated": self.simulated, "sim_error": self.sim_error,
        }


# ---------------------------------------------------------------- enumeration

def _divisors(n: int) -> list[int]:
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def _tp_ok(model: ModelSpec, t: int) -> bool:
    return all(v % t == 0 for v in (model.heads, model.kv_heads, model.ffn, model.vocab))


def _search_axes(model: ModelSpec, clusters: int, global_batch: int, method: str, micro_batches, tp_degrees,
                 zero_stages) -> tuple[list[tuple[int, int, int, int, int]], tuple[int, ...], tuple[str, ...]]:
    """``search_space``'s layouts (P, D, T, b, A) in order, and the ZeRO stages and activation policies every
    layout is tried with (then each prefetch policy)."""
    _check_method(method)
    tps = [t for t in _divisors(clusters) if t <= MAX_TP and _tp_ok(model, t)]
    if tp_degrees is not None:
        tps = [t for t in tps if t in set(tp_degrees)]
    if method == "tp-heavy":
        tps = [t for t in tps if t == 2]
    bs = None if micro_batches is None else set(micro_batches)
    zeros = (3,) if method == "zero3-heavy" else (0, 1, 2, 3)
    if zero_stages is not None:
        zeros = tuple(z for z in zeros if z in set(zero_stages))
    acts = {"backward-ckpt": ("ckpt",), "full-save": ("full",), "tuned": ("full", "ckpt")}.get(
        method, ACTIVATION_POLICIES)
    layouts = []
    for t in tps:
        for p in _divisors(clusters // t):
            if p > model.layers:
                continue
            d = clusters // (t * p)
            if global_batch % d:
                continue
            per_replica = global_batch // d
            for b in _divisors(per_replica):
                if bs is None and b > MAX_MICRO_BATCH:
                    break
                if bs is not None and b not in bs:
                    continue
                layouts.append((p, d, t, b, per_replica // b))
    return layouts, zeros, acts


def search_space(model: ModelSpec, clusters: int, global_batch: int, method: str = "ratrain", *,
                 micro_batches=None, tp_degrees=None, zero_stages=None):
    """Yield (P, D, T, Z, b, A, activation, prefetch) in a fixed order (Eq. 8).

    ``micro_batches`` / ``tp_degrees`` / ``zero_stages`` restrict b, T and Z (default: b any
    divisor of G/D up to MAX_MICRO_BATCH; T any divisor of N up to MAX_TP that divides heads,
    kv_heads, ffn, vocab; Z 0..3)."""
    layouts, zeros, acts = _search_axes(model, clusters, global_batch, method, micro_batches, tp_degrees, zero_stages)
    for p, d, t, b, a in layouts:
        for z in zeros:
            for act in acts:
                for pref in PREFETCH_POLICIES:
                    yield p, d, t, z, b, a, act, pref


def search_grid(model: ModelSpec, clusters: int, global_batch: int, seq: int, method: str = "ratrain", *,
                micro_batches=None, tp_degrees=None, zero_stages=None) -> Grid:
    """``search_space`` as a ``Grid``: the same points in the same order (``Grid.of(list(search_space(...)))``),
    built as columns."""
    layouts, zeros, acts = _search_axes(model, clusters, global_batch, method, micro_batches, tp_degrees, zero_stages)
    inner = [(z, ACTIVATION_POLICIES.index(act), PREFETCH_POLICIES.index(pref))
             for z in zeros for act in acts for pref in PREFETCH_POLICIES]
    outer = np.array(layouts, dtype=np.int64).reshape(-1, 5)
    per = np.array(inner, dtype=np.int64).reshape(-1, 3)
    rows = np.repeat(outer, len(per), axis=0)
    each = np.tile(per, (len(outer), 1))
    p, d, t, b, a = rows.T.copy()
    z, act, pref = each.T.copy()
    # the rows are the product of the layouts and the inner choices, in that order: peak_bytes works per layout
    product = (outer, tuple(zeros), tuple(ACTIVATION_POLICIES.index(x) for x in acts))
    return Grid(p, d, t, z, b, a, act, pref, seq, product)


class Planner:
    """Algorithm 2 for one model on one platform. Profiles are cached per (source, b, seq, T).

    With emulated profiles, ``plan`` ranks every memory-feasible candidate on the fast kernel
    model (profile source ``bound``: closed-form GEMM bounds scaled by the efficiency the
    emulated micro-batch-1 kernels reach) and re-estimates only the ``confirm`` best on emulated
    kernels; ``PlanResult.reordered`` says whether emulation changed their order."""

    def __init__(self, model: ModelSpec, platform: TrainingPlatform | None = None, *,
                 profile_source: str = "emulated", profile_fn: Callable | None = None,
                 partition: str = "balanced", constants: MemoryConstants = DEFAULT_CONSTANTS,
                 recovery_resource: str = "compute", progress: bool | None = None,
                 lengths: LengthDistribution | None = None, moe_cp: dict | None = None, workers: int = 1):
        if recovery_resource not in ("compute", "ddr"):
            raise ConfigError(f"recovery_resource must be 'compute' or 'ddr', got {recovery_resource!r}")
        if profile_source not in PROFILE_SOURCES:
            raise ConfigError(f"profile source must be one of {', '.join(PROFILE_SOURCES)}, got {profile_source!r}")
        self.model = model
        self.platform = platform or TrainingPlatform()
        self.profile_source = profile_source
        self.profile_fn = profile_fn
        self.partition = partition
        self.constants = constants
        self.recovery_resource = recovery_resource
        self.progress = progress
        # local processes that emulate the kernels of emulated profiles no file holds yet (a first run)
        self.workers = workers
        # a length distribution: the finalists are simulated on it and re-ranked (the analytic
        # estimate and the memory check are the uniform step's at the target length)
        self.lengths = lengths
        # EP, CP and the routing every candidate takes (ParallelConfig fields; empty: today's search)
        self.moe_cp = dict(moe_cp or {})
        self.memory = PeakMemory(model, partition, constants)
        self.schedule_memory = ScheduleMemory(model, partition, constants)
        self._profiles: dict[tuple, object] = {}
        self._terms: dict[tuple, CostTerms] = {}
        self._parts: dict[int, list[range]] = {}
        self.profile_s = 0.0
        self._pool = None            # the local workers of the plan running now (plan)

    # -- caches
    def profile(self, micro_batch: int, seq: int, tp: int, source: str | None = None):
        source = source or self.profile_source
        key = (source, micro_batch, seq, tp)
        got = self._profiles.get(key)
        if got is None:
            t0 = time.perf_counter()
            with _collector_resumed():          # loading may emulate kernels: minutes of allocation
                if self.profile_fn is not None:
                    got = self.profile_fn(self.model, micro_batch, seq, tp, source=source)
                else:
                    got = load_profile(self.model, micro_batch, seq, tp, source=source, platform=self.platform,
                                       progress=self.progress)
            self._profiles[key] = got
            self.profile_s += time.perf_counter() - t0
        return got

    def _emulate_ahead(self, shapes: list[tuple[int, int]], seq: int) -> None:
        """The kernels of the emulated (b, T) profiles of ``shapes`` that no stored profile holds, emulated on
        ``workers`` local processes before the profiles load (one after another otherwise: minutes on a first
        run); the profiles are the same, bit for bit (``build_profiles``)."""
        if (self.workers <= 1 or self.profile_fn is not None or self.profile_source == "roofline"
                or not isinstance(self.platform, TrainingPlatform)):
            return
        t0 = time.perf_counter()
        todo = unbuilt_profiles([(self.model, b, seq, t) for b, t in dict.fromkeys(shapes)], self.platform)
        if todo:
            if self._pool is None:
                # one set of local workers for the reference profile and then the finalists', which reuse
                # what the workers built for the reference (micro-kernels, schedules); started only when
                # there is something to emulate (the emulator's tuner, which holds it, loads Numba)
                self._pool = mtemu.LocalPool(self.workers)
            with _collector_resumed():
                build_profiles(todo, platform=self.platform, workers=self.workers,
                               progress=Progress(self.progress is True), pool=self._pool)
        self.profile_s += time.perf_counter() - t0

    def stage_layers(self, pp: int) -> list[range]:
        """``partition_model``'s stages, from the layer counts the memory check already partitioned."""
        got = self._parts.get(pp)
        if got is None:
            got, start = [], 0
            for count in self.memory.counts(pp):
                got.append(range(start, start + count))
                start += count
            self._parts[pp] = got
        return got

    def terms(self, cfg: ParallelConfig, source: str | None = None) -> CostTerms:
        source = source or self.profile_source
        # cost_terms depends on P only through whether the tied head needs its own copy
        tied_split = self.model.tied_embeddings and cfg.pp > 1
        key = (source, cfg.tp, cfg.micro_batch, cfg.seq, cfg.dp, cfg.zero, cfg.activation, cfg.prefetch, tied_split,
               cfg.ep, cfg.cp, cfg.capacity_factor, cfg.hot_share, cfg.hot_load)
        got = self._terms.get(key)
        if got is None:
            prof = self.profile(cfg.micro_batch, cfg.seq, cfg.tp, source)
            got = self._terms[key] = cost_terms(self.model, cfg, prof, self.platform)
        return got

    # -- one configuration
    def estimate(self, cfg: ParallelConfig, method: str = "ratrain", source: str | None = None,
                 schedule: PipelineSchedule = ONE_F_ONE_B) -> StepBreakdown:
        """Analytic T_step of ``cfg`` under ``method``'s mechanisms in ``schedule`` order (no simulation)."""
        _check_method(method)
        _, finish = self.bounded(cfg, method, source, schedule)
        return finish()

    def bounded(self, cfg: ParallelConfig, method: str = "ratrain", source: str | None = None,
                schedule: PipelineSchedule = ONE_F_ONE_B, chains: dict | None = None
                ) -> tuple[float, Callable[[], StepBreakdown]]:
        """``estimate`` in two halves: the main path's time, a lower bound of the step (the lifecycle
        chains only add to it), and the call that finishes the estimate (the chains, the costly half;
        ``chains``: the memo of stage chains ``lifecycle_tail`` shares between the estimates given it)."""
        terms = self.terms(cfg, source)
        mech = self._mechanisms(cfg, method)
        main_kw = dict(activation=mech["activation"], fsr=mech["fsr"], recovery_resource=mech["recovery_resource"],
                       fsr_buffer_layers=mech["fsr_buffer_layers"])
        tail_kw = dict(layerwise=mech["layerwise"], update_prefetch=mech["update_prefetch"],
                       recovery_resource=mech["recovery_resource"])
        if schedule == ONE_F_ONE_B:
            one = main_path(stage_kinds(terms, self.stage_layers(cfg.pp)), terms.transfer, cfg.accum, **main_kw)
            return one.t_main_ms, lambda: lifecycle_tail(one, **tail_kw, chains=chains)
        chunks = self.schedule_memory.chunks(cfg.pp, schedule)
        kinds = chunk_kinds(terms, chunks, self.model.layers)
        weight = None
        if schedule.name == "zb-h1":
            layers_of = [[i for r in stage for i in r] for stage in chunks]
            weight = weight_shares(self.profile(cfg.micro_batch, cfg.seq, cfg.tp, source), kinds, layers_of)
        one = main_path(kinds, terms.transfer, cfg.accum, **main_kw)
        main, slot = schedule_main_path(one, cfg.accum, schedule, weight)
        # the step is main + (1F1B's step - its main path, which StepBreakdown rounds as t_1f1b + e_rec):
        # that difference is >= 0 but for an ulp, which the bound's margin covers
        return main - abs(main) * 1e-12, lambda: schedule_tail(one, main, slot, schedule, **tail_kw)

    def _mechanisms(self, cfg: ParallelConfig, method: str) -> dict:
        on = method != "tuned"
        return dict(activation=cfg.activation, layerwise=on, update_prefetch=on and cfg.prefetch == "layerwise",
                    fsr=on, recovery_resource=self.recovery_resource,
                    fsr_buffer_layers=self.constants.fsr_buffer_layers)

    def schedule_peak(self, cfg: ParallelConfig, schedule: PipelineSchedule) -> int:
        """Eq. 10's left side under ``schedule`` (``ScheduleMemory``; 1F1B: ``PeakMemory``)."""
        if schedule == ONE_F_ONE_B:
            extra = {k: getattr(cfg, k) for k in ("ep", "cp", "capacity_factor", "hot_share", "hot_load")}
            return self.memory.peak(cfg.pp, cfg.dp, cfg.tp, cfg.zero, cfg.micro_batch, cfg.accum, cfg.seq,
                                    cfg.activation, cfg.prefetch, moe_cp=extra)
        return self.schedule_memory.peak(schedule, cfg.pp, cfg.dp, cfg.tp, cfg.zero, cfg.micro_batch, cfg.accum,
                                         cfg.seq, cfg.activation, cfg.prefetch)

    def evaluate(self, cfg: ParallelConfig, method: str = "ratrain",
                 schedule: PipelineSchedule = ONE_F_ONE_B) -> Candidate:
        """Memory (stage_memory; other schedules: ScheduleMemory) and analytic time of one configuration;
        ``step_ms`` is inf if OOM."""
        if schedule == ONE_F_ONE_B:
            stages = stage_memory(self.model, cfg, self.platform, self.constants)
            peak = max_peak(stages)
        else:
            if not runnable(schedule, self.model.layers, cfg.pp, cfg.accum):
                raise ConfigError(f"schedule {schedule.label()} cannot run {cfg.describe()} (interleaved: P*v <= "
                                  "layers, and A a multiple of P when A > P)")
            stages, peak = None, self.schedule_peak(cfg, schedule)
        bd = self.estimate(cfg, method, schedule=schedule)
        step = bd.step_ms if peak <= self.platform.memory_budget_bytes else math.inf
        return Candidate(cfg, method, step, bd, peak, stages, schedule=schedule)

    def simulate(self, cand: Candidate) -> float:
        """The simulator's step (ms) of a candidate under its schedule, on the planner's profiles."""
        cfg = cand.config
        prof = self.profile(cfg.micro_batch, cfg.seq, cfg.tp)
        plan = self.lengths.plan(cfg.seq, cfg.micro_batch, cfg.accum) if self.lengths is not None else None
        costs = pipeline_costs(self.model, cfg, prof, self.platform, recovery_resource=self.recovery_resource,
                               lengths=plan)
        order = layout_schedule(cand.schedule, self.model, cfg, costs, prof)
        mech = replace(mechanisms_for(cand.method, cfg.activation, cfg.prefetch),
                       fsr_buffer_layers=self.constants.fsr_buffer_layers)
        return simulate(costs, schedule=order, mechanisms=mech).step_time_ms

    # -- the analytic pass over arrays (ratrain.plan.vectorised)
    def _vectorisable(self, choices: tuple) -> bool:
        """1F1B among the schedules, dense layers at EP = CP = 1 and recovery on compute: the closed forms
        over arrays hold for the 1F1B candidates (the other schedules, and other searches, take the scalar
        loop, the same numbers one configuration at a time)."""
        return (ONE_F_ONE_B in choices and not self.moe_cp and self.model.moe is None
                and self.recovery_resource == "compute")

    def _analytic_pass(self, grid: Grid, method: str, source: str | None, budget: int, chains: dict,
                       schedule_index: int = 0) -> tuple[int, int, int, Iterator[tuple]]:
        """The scalar loop's 1F1B memory check and main-path bound on every point at once: (enumerated, pruned,
        feasible, the feasible points as (bound, peak, point, schedule_index, make) in bound order, stable). The
        points are made as the search takes them: it stops after the top's and a few more."""
        seq = grid.seq
        peaks = peak_bytes(self.memory, grid)
        fit = np.flatnonzero(peaks <= budget)
        sub = grid.take(fit)
        if vectorisable_terms(self.model, self.platform):
            kinds = kind_arrays(self.model, self.platform, sub,
                                lambda b, t: self.profile(b, seq, t, source))
        else:
            kinds = stacked_kind_arrays([self.terms(self._config(grid.point(i), seq), source) for i in fit])
        bounds = main_path_ms(kinds, sub, lambda pp: [len(r) for r in self.stage_layers(pp)],
                              fsr=method != "tuned", fsr_buffer_layers=self.constants.fsr_buffer_layers)
        order = np.argsort(bounds, kind="stable")

        on = method != "tuned"

        def make(k: int, point: tuple):
            # the configuration itself is made only for the ranked (``plan`` makes it from the point)
            pp, accum, activation, prefetch = point[0], point[5], point[6], point[7]
            terms = kinds.terms(k)
            one = main_path(stage_kinds(terms, self.stage_layers(pp)), terms.transfer, accum,
                            activation=activation, fsr=on, recovery_resource="compute",
                            fsr_buffer_layers=self.constants.fsr_buffer_layers)
            return None, lambda: lifecycle_tail(one, layerwise=on, update_prefetch=on and prefetch == "layerwise",
                                                recovery_resource="compute", chains=chains)

        def waiting() -> Iterator[tuple]:
            for k in order.tolist():
                point = sub.point(k)
                yield (float(bounds[k]), int(peaks[fit[k]]), point, schedule_index,
                       lambda k=k, point=point: make(k, point))

        return len(grid), len(grid) - len(fit), len(fit), waiting()

    def _config(self, point: tuple, seq: int) -> ParallelConfig:
        p, d, t, z, b, a, act, pref = point
        return ParallelConfig(pp=p, dp=d, tp=t, zero=z, micro_batch=b, accum=a, seq=seq, activation=act,
                              prefetch=pref, partition=self.partition, **self.moe_cp)

    # -- the search
    def plan(self, clusters: int, global_batch: int, seq: int = 2048, method: str = "ratrain",
             top: int = 10, *, micro_batches=None, tp_degrees=None, zero_stages=None, confirm: int = 3,
             schedules=("1f1b",)) -> PlanResult:
        """Algorithm 2 with the pipeline schedule as one more dimension (``schedules``: names or
        PipelineSchedule, name and v; interleaved by name has v = 2). Memory first per schedule; with more than 1F1B
        the ``confirm`` finalists are also simulated under their schedule and re-ranked on that."""
        with _collector_paused():
            try:
                return self._search(clusters, global_batch, seq, method, top, micro_batches=micro_batches,
                                    tp_degrees=tp_degrees, zero_stages=zero_stages, confirm=confirm,
                                    schedules=schedules)
            finally:
                if self._pool is not None:
                    self._pool.close()
                    self._pool = None

    def _search(self, clusters: int, global_batch: int, seq: int, method: str, top: int, *, micro_batches,
                tp_degrees, zero_stages, confirm: int, schedules) -> PlanResult:
        _check_method(method)
        choices = check_schedules(schedules)
        if isinstance(confirm, bool) or not isinstance(confirm, int) or confirm < 0:
            raise ConfigError(f"plan: confirm must be a non-negative integer, got {confirm!r}")
        # rank on the fast model when kernels are emulated (and the profiles come from the platform)
        fast = "bound" if self.profile_source == "emulated" and self.profile_fn is None else None
        for name, value in (("clusters", clusters), ("global_batch", global_batch), ("seq", seq), ("top", top)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"plan: {name} must be a positive integer, got {value!r}")
        ep, cp = self.moe_cp.get("ep", 1), self.moe_cp.get("cp", 1)
        if (ep > 1 or cp > 1) and choices != (ONE_F_ONE_B,):
            raise ConfigError("plan: with EP or CP above 1 only the 1f1b schedule is searched")
        if clusters % cp:
            raise ConfigError(f"plan: context parallelism CP={cp} must divide the {clusters} clusters")
        if seq % cp:
            raise ConfigError(f"plan: context parallelism CP={cp} must divide the sequence length {seq}")
        if ep > 1 and self.model.moe is None:
            raise ConfigError(f"plan: expert parallelism EP={ep} needs a MoE model; {self.model.name} is dense")
        t0 = time.perf_counter()
        p0 = self.profile_s
        budget = self.platform.memory_budget_bytes
        enumerated = pruned = feasible = 0
        # the `top` best (step, peak, grid point, schedule) so far; candidates wait on their main path,
        # a lower bound of their step, and only those that can still enter the top run their lifecycle chains
        timed: list[tuple[float, int, tuple, int, ParallelConfig, StepBreakdown]] = []
        # (bound, peak, grid point, schedule, the call that makes its configuration and finishing call)
        waiting: list[tuple[float, int, tuple, int, Callable]] = []
        plain_1f1b = [c == ONE_F_ONE_B for c in choices]
        # one stage: every schedule runs the same step and 1F1B keeps the fewest activations alive,
        # so the others would only repeat it lower in the ranking
        one_stage_1f1b_only = any(plain_1f1b)
        chains: dict = {}           # the finalists' stage chains by their inputs (this search's only)
        say = Progress(self.progress is True)
        arrays = self._vectorisable(choices)
        ordered: Iterator[tuple] = iter(())
        if arrays:
            # the 1F1B candidates over arrays; the other schedules' below, one at a time
            grid = search_grid(self.model, clusters // cp, global_batch, seq, method, micro_batches=micro_batches,
                               tp_degrees=tp_degrees, zero_stages=zero_stages)
            if len(grid) and not self._profiles:
                say(f"plan: {len(grid):,} configurations; loading their latency profiles (the first run after "
                    "installing compiles the emulator for them first: a minute or two)")
        self._emulate_ahead([(1, 1)], seq)          # what the fast model (or an emulated search) starts from
        if arrays:
            enumerated, pruned, feasible, ordered = self._analytic_pass(grid, method, fast, budget, chains,
                                                                        choices.index(ONE_F_ONE_B))
        if not arrays or len(choices) > 1:
            points = search_space(self.model, clusters // cp, global_batch, method, micro_batches=micro_batches,
                                  tp_degrees=tp_degrees, zero_stages=zero_stages)
            for c in points:
                p, d, t, z, b, a, act, pref = c
                if (d * cp) % ep or (self.model.moe is not None and self.model.moe.experts % ep):
                    continue            # EP divides the data ranks and the experts
                for si, choice in enumerate(choices):
                    plain = plain_1f1b[si]
                    if plain and arrays:
                        continue        # searched over arrays above
                    if not plain and (not runnable(choice, self.model.layers, p, a)
                                      or (p == 1 and one_stage_1f1b_only)):
                        continue
                    enumerated += 1
                    # Eq. 10 first: nothing is timed (or profiled) unless it fits
                    if plain:
                        peak = self.memory.peak(p, d, t, z, b, a, seq, act, pref, moe_cp=self.moe_cp)
                    else:
                        peak = self.schedule_memory.peak(choice, p, d, t, z, b, a, seq, act, pref)
                    if peak > budget:
                        pruned += 1
                        continue
                    feasible += 1
                    cfg = ParallelConfig(pp=p, dp=d, tp=t, zero=z, micro_batch=b, accum=a, seq=seq, activation=act,
                                         prefetch=pref, partition=self.partition, **self.moe_cp)
                    bound, finish = self.bounded(cfg, method, fast, choice, chains)
                    waiting.append((bound, peak, c, si, lambda cfg=cfg, finish=finish: (cfg, finish)))
            waiting.sort(key=lambda x: x[0])
            # the top is the best by (step, peak, point, schedule) whatever order the bounds are taken in:
            # the two lists in one bound order
            ordered = merge(ordered, waiting, key=itemgetter(0))
        analytic = time.perf_counter() - t0 - (self.profile_s - p0)
        for bound, peak, c, si, make in ordered:
            if len(timed) >= top and bound > timed[-1][0]:
                break           # this step and every later one exceed the whole top's
            cfg, finish = make()
            bd = finish()
            insort(timed, (bd.step_ms, peak, c, si, cfg, bd), key=_rank_key)
            del timed[top:]
        ranked: list[Candidate] = []
        for step, peak, c, si, cfg, bd in timed:
            cfg = cfg or self._config(c, seq)
            if choices[si] == ONE_F_ONE_B:
                stages = stage_memory(self.model, cfg, self.platform, self.constants)
                peak = max_peak(stages)
            else:
                stages = None
            ranked.append(Candidate(cfg, method, step, bd, peak, stages, fast or self.profile_source,
                                    schedule=choices[si]))
        reordered, fast_error, confirmed = False, None, 0
        if fast is not None and ranked and confirm > 0:
            # the finalists on emulated kernels: only their (b, seq, T) profiles are emulated
            finalists = ranked[:confirm]
            say(f"plan: searched {enumerated:,} configurations; confirming the {len(finalists)} best on emulated "
                "kernels")
            self._emulate_ahead([(c.config.micro_batch, c.config.tp) for c in finalists], seq)
            for cand in finalists:
                # the finalists share the memo of stage chains (keyed by everything a chain reads)
                emulated = self.bounded(cand.config, method, schedule=cand.schedule, chains=chains)[1]()
                cand.fast_step_ms, cand.step_ms, cand.breakdown = cand.step_ms, emulated.step_ms, emulated
                cand.kernels = "emulated"
            confirmed = len(finalists)
            fast_error = max(abs(c.fast_step_ms - c.step_ms) / c.step_ms for c in finalists)
            order = sorted(range(confirmed), key=lambda i: (finalists[i].step_ms, i))
            reordered = order != list(range(confirmed))
            ranked = [finalists[i] for i in order] + ranked[confirmed:]
        simulated, sim_error = 0, None
        if (choices != (ONE_F_ONE_B,) or self.lengths is not None) and ranked and confirm > 0:
            # the schedule estimates are rougher than 1F1B's: the simulator orders the finalists
            finalists = ranked[:confirm]
            for cand in finalists:
                cand.simulated_step_ms = self.simulate(cand)
            simulated = len(finalists)
            sim_error = max(abs(c.step_ms - c.simulated_step_ms) / c.simulated_step_ms for c in finalists)
            order = sorted(range(simulated), key=lambda i: (finalists[i].simulated_step_ms, i))
            reordered = reordered or order != list(range(simulated))
            ranked = [finalists[i] for i in order] + ranked[simulated:]
        elapsed = time.perf_counter() - t0
        grid = {"tp": list(tp_degrees) if tp_degrees else
                f"divisors of clusters <= {MAX_TP} dividing heads, kv_heads, ffn, vocab",
                "pp": "divisors of clusters/T up to the layer count", "dp": "clusters/(P*T), must divide global batch",
                "micro_batch": list(micro_batches) if micro_batches else
                f"divisors of global_batch/D up to {MAX_MICRO_BATCH}",
                "zero": [z for z in ((3,) if method == "zero3-heavy" else (0, 1, 2, 3))
                         if zero_stages is None or z in zero_stages],
                "prefetch": list(PREFETCH_POLICIES), "partition": self.partition}
        return PlanResult(self.model.name, method, clusters, global_batch, seq, ranked[0] if ranked else None,
                          ranked, enumerated, pruned, feasible, elapsed, grid, self.profile_s - p0,
                          fast or self.profile_source, confirmed, reordered, fast_error,
                          [c.label() for c in choices], simulated, sim_error, analytic)


# The search makes tens of thousands of short-lived objects and no cycles that must go before it ends; in a new
# process the cyclic collector's passes over them took a sixth to a quarter of a search. It is paused for the
# search and resumed while profiles load or build (that can emulate kernels for minutes).
_paused_by_search = False


@contextmanager
def _collector_paused():
    global _paused_by_search
    if _paused_by_search or not gc.isenabled():
        yield
        return
    gc.disable()
    _paused_by_search = True
    try:
        yield
    finally:
        _paused_by_search = False
        gc.enable()


@contextmanager
def _collector_resumed():
    global _paused_by_search
    if not _paused_by_search:
        yield
        return
    gc.enable()
    _paused_by_search = False
    try:
        yield
    finally:
        gc.disable()
        _paused_by_search = True


def _rank_key(x: tuple) -> tuple:
    """The planner's order: step, then peak memory, then the grid point and schedule (deterministic)."""
    return x[0], x[1], x[2], x[3]


def plan(model: ModelSpec, clusters: int, global_batch: int, seq: int = 2048, *, method: str = "ratrain",
         top: int = 10, platform: TrainingPlatform | None = None, profile_source: str = "emulated",
         profile_fn: Callable | None = None, partition: str = "balanced", micro_batches=None,
         tp_degrees=None, zero_stages=None, confirm: int = 3, progress: bool | None = None,
         schedules=("1f1b",)) -> PlanResult:
    """Algorithm 2: the best configuration of ``model`` on ``clusters`` clusters (see module doc)."""
    return Planner(model, platform, profile_source=profile_source, profile_fn=profile_fn,
                   partition=partition, progress=progress).plan(clusters, global_batch, seq, method, top,
                                                                micro_batches=micro_batches, tp_degrees=tp_degrees,
                                                                zero_stages=zero_stages, confirm=confirm,
                                                                schedules=schedules)


def layout_schedule(schedule: PipelineSchedule, model: ModelSpec, cfg: ParallelConfig, costs, profile
                    ) -> PipelineSchedule:
    """``schedule`` (name and v) as a model-driven step of layout ``cfg`` runs it: under zb-h1 each
    layer's W share from the profile's dW GEMMs (``weight_fractions`` of ``costs``), under interleaved
    (v > 1) the chunks cut by the layout's partition rule (``interleaved_chunk_sizes``)."""
    v = schedule.chunks_per_stage
    return PipelineSchedule(schedule.name, virtual_stages=schedule.virtual_stages,
                            weight_fraction=weight_fractions(costs, profile) if schedule.splits_backward
                            else schedule.weight_fraction,
                            chunk_sizes=interleaved_chunk_sizes(model, cfg, v) if v > 1 else None)


# ---------------------------------------------------------------- predicted vs simulated

@dataclass
class SimCheck:
    config: ParallelConfig
    method: str
    predicted_ms: float
    simulated_ms: float
    breakdown: StepBreakdown
    result: object          # ratrain.sim.simulator.SimResult
    costs: object           # ratrain.cost.tasks.PipelineCosts

    @property
    def error(self) -> float:
        """(predicted - simulated) / simulated."""
        return (self.predicted_ms - self.simulated_ms) / self.simulated_ms

    def to_json(self, timeline: bool = False) -> dict:
        return {"config": self.config.to_json(), "label": self.config.describe(), "method": self.method,
                "predicted_s": self.predicted_ms / 1e3, "simulated_s": self.simulated_ms / 1e3,
                "error": self.error, "breakdown": self.breakdown.to_json(),
                "simulated": self.result.to_json(timeline=timeline)}


def simulate_config(model: ModelSpec, cfg: ParallelConfig, *, method: str = "ratrain",
                    platform: TrainingPlatform | None = None, profile=None, profile_source: str = "emulated",
                    profile_fn: Callable | None = None, recovery_resource: str = "compute",
                    mechanisms=None, schedule: str | PipelineSchedule = "1f1b", buckets=None,
                    offload=None, lengths: LengthDistribution | None = None) -> SimCheck:
    """Build PipelineCosts for ``cfg`` and run ``ratrain.sim.simulator.simulate`` with the method's
    Mechanisms (or ``mechanisms``) in ``schedule`` order, gradient ``buckets`` and ``offload`` as
    ``simulate`` takes them; also returns the planner's analytic prediction (which has neither).
    ``lengths``: the step's micro-batches from a length distribution (the simulation scales each one;
    the analytic prediction stays the uniform step's)."""
    platform = platform or TrainingPlatform()
    planner = Planner(model, platform, profile_source=profile_source, profile_fn=profile_fn,
                      partition=cfg.partition, recovery_resource=recovery_resource)
    if profile is not None:
        planner._profiles[(profile_source, cfg.micro_batch, cfg.seq, cfg.tp)] = profile
    prof = planner.profile(cfg.micro_batch, cfg.seq, cfg.tp)
    mech = mechanisms if mechanisms is not None else mechanisms_for(method, cfg.activation, cfg.prefetch)
    plan = lengths.plan(cfg.seq, cfg.micro_batch, cfg.accum) if lengths is not None else None
    costs = pipeline_costs(model, cfg, prof, platform, recovery_resource=recovery_resource, lengths=plan)
    result = simulate(costs, schedule=schedule, mechanisms=mech, buckets=buckets, offload=offload)
    terms = planner.terms(cfg)
    bd = step_breakdown(stage_kinds(terms, planner.stage_layers(cfg.pp)), terms.transfer, cfg.accum,
                        activation=mech.activation, layerwise=mech.layerwise, update_prefetch=mech.update_prefetch,
                        fsr=mech.fsr, recovery_resource=recovery_resource,
                        fsr_buffer_layers=mech.fsr_buffer_layers)
    return SimCheck(cfg, method, bd.step_ms, result.step_time_ms, bd, result, costs)


__all__ = ["Candidate", "METHODS", "PlanResult", "Planner", "SimCheck", "clear_memos", "layout_schedule",
           "mechanisms_for", "plan", "search_space", "simulate_config"]

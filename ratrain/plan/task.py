"""A training task and its completion time on a scheme (a platform and a device count).

The task: a model, D effective tokens, sequences of S tokens, a global batch of B sequences per
step, a deadline of T days and a planned stall T0 (days reserved for start-up, evaluation and
pauses). On a scheme:

* iterations = ceil(D / (B S)); the per-step budget (T - T0) / (iterations (1 + L));
* the step: simulated (``ratrain.plan.planner.simulate_config``: the event simulator on the
  layout given, or on the planner's pick for the device count; per-device compute and the
  communication left exposed), or from a fixed MFU, t = 6 N B S / (p x peak x MFU) with N the
  model's parameters, p devices and peak one device's dense FP16 FLOP/s; plus the per-step input
  wait (given, or from ``ratrain.plan.input_pipeline``);
* L, the save/redo/restart share: the first-order model of ``ratrain.plan.time_to_train`` over p
  devices (synchronous saves), or its asynchronous extension (``ratrain.plan.checkpoints``);
* completion = T0 + iterations x t x (1 + L); margin = T - completion, in days and per step;
* feasibility: the layout's worst stage fits the device memory and the deadline is met;
* affordable slack: the per-step margin is what exposed communication or input wait could still
  add, and the compute could run that much slower (the lowest MFU that still meets the deadline).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ratrain.errors import ConfigError
from ratrain.plan.checkpoints import AsyncSave, async_optimal_interval, async_overhead
from ratrain.plan.input_pipeline import InputPipeline
from ratrain.plan.planner import Planner, search_space, simulate_config
from ratrain.plan.time_to_train import Overhead, Reliability, job_mtbf_s, time_to_train
from ratrain.spec.gpu import GpuPlatform
from ratrain.spec.memory import max_peak, stage_memory
from ratrain.spec.models import ModelSpec, parameter_count
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import GIB, TrainingPlatform
from ratrain.spec.platforms import AnyPlatform

DAY_S = 86400.0
FLOPS_PER_PARAM_TOKEN = 6      # forward 2 + backward 4 FLOPs per parameter and token (no attention term)


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={value!r}: must be a positive finite number")
    return float(value)


def _non_negative(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}={value!r}: must be a non-negative finite number")
    return float(value)


def _whole(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r}: must be a positive integer")
    return value


@dataclass(frozen=True)
class TrainingTask:
    model: ModelSpec
    tokens: float
    seq: int
    global_batch: int               # sequences per step
    deadline_days: float
    reserve_days: float = 0.0       # planned stall T0

    def __post_init__(self) -> None:
        _positive("tokens", self.tokens)
        _whole("seq", self.seq)
        _whole("global_batch", self.global_batch)
        _positive("deadline_days", self.deadline_days)
        _non_negative("reserve_days", self.reserve_days)
        if self.reserve_days >= self.deadline_days:
            raise ConfigError(f"reserve_days={self.reserve_days:g} leaves no time before deadline_days="
                              f"{self.deadline_days:g}: the planned stall must be shorter than the deadline")

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq

    @property
    def iterations(self) -> int:
        return math.ceil(self.tokens / self.tokens_per_step)

    @property
    def available_s(self) -> float:
        """Training time the deadline leaves after the planned stall."""
        return (self.deadline_days - self.reserve_days) * DAY_S

    @property
    def parameters(self) -> int:
        return parameter_count(self.model)

    @property
    def flops_per_step(self) -> float:
        return FLOPS_PER_PARAM_TOKEN * self.parameters * self.tokens_per_step

    def to_json(self) -> dict:
        return {"model": self.model.name, "parameters": self.parameters, "tokens": self.tokens, "seq": self.seq,
                "global_batch": self.global_batch, "tokens_per_step": self.tokens_per_step,
                "iterations": self.iterations, "deadline_days": self.deadline_days,
                "reserve_days": self.reserve_days}


@dataclass(frozen=True)
class Failures:
    """Per-device failures and checkpoints; ``async_save`` replaces the synchronous pause."""
    mtbf_hours: float | None = None       # one device's mean time between failures (None: no failures)
    checkpoint_s: float = 0.0
    restart_s: float = 0.0
    interval_s: float | None = None       # work between checkpoints (None: the optimum)
    async_save: AsyncSave | None = None

    def __post_init__(self) -> None:
        if self.mtbf_hours is not None:
            _positive("mtbf_hours", self.mtbf_hours)
        _non_negative("checkpoint_s", self.checkpoint_s)
        _non_negative("restart_s", self.restart_s)
        if self.interval_s is not None:
            _positive("interval_s", self.interval_s)


@dataclass(frozen=True)
class Layout:
    """A layout the user fixes; a field left None takes its default on the scheme."""
    tp: int = 1
    pp: int = 1
    dp: int | None = None            # default: devices / (tp pp)
    zero: int = 1
    micro_batch: int = 1
    activation: str | None = None    # default: fsr on MT-3000, ckpt (Megatron's) on GPU clusters


def device_peak_flops(platform: AnyPlatform) -> float:
    """One device's dense FP16 FLOP/s (an MT-3000 cluster: 2 x its MAC/s)."""
    return platform.peak_flops if isinstance(platform, GpuPlatform) else 2.0 * platform.peak_mac_per_s


def default_activation(platform: AnyPlatform) -> str:
    return "ckpt" if isinstance(platform, GpuPlatform) else "fsr"


def layout_config(task: TrainingTask, devices: int, layout: Layout, platform: AnyPlatform) -> ParallelConfig:
    """The ParallelConfig of a user layout on ``devices`` devices (accumulation from the global batch)."""
    per = layout.tp * layout.pp
    if devices % per:
        raise ConfigError(f"--devices={devices} is not a multiple of tp x pp = {per}")
    dp = layout.dp if layout.dp is not None else devices // per
    if dp * per != devices:
        raise ConfigError(f"layout tp={layout.tp} x pp={layout.pp} x dp={dp} uses {dp * per} devices, "
                          f"not --devices={devices}")
    replica = dp * layout.micro_batch
    if task.global_batch % replica:
        raise ConfigError(f"--global-batch={task.global_batch} is not a multiple of dp x micro-batch = {replica}")
    return ParallelConfig(pp=layout.pp, dp=dp, tp=layout.tp, zero=layout.zero, micro_batch=layout.micro_batch,
                          accum=task.global_batch // replica, seq=task.seq,
                          activation=layout.activation or default_activation(platform))


def smallest_need(task: TrainingTask, platform: AnyPlatform, devices: int) -> tuple[int, tuple | None]:
    """The smallest worst-stage peak over every layout the planner would search (bytes, its layout)."""
    planner = Planner(task.model, platform)
    best, where = None, None
    for c in search_space(task.model, devices, task.global_batch):
        p, d, t, z, b, a, act, pref = c
        peak = planner.memory.peak(p, d, t, z, b, a, task.seq, act, pref)
        if best is None or peak < best:
            best, where = peak, c
    if best is None:
        raise ConfigError(f"no layout of {devices} devices divides the global batch {task.global_batch} "
                          f"(P x D x T = devices, D must divide the batch)")
    return best, where


def _no_fit(task: TrainingTask, platform: AnyPlatform, devices: int, need: int) -> ConfigError:
    return ConfigError(f"platform {platform.name!r}: no layout of {task.model.name} on {devices} devices fits "
                       f"{platform.memory_budget_bytes / GIB:.1f} GiB per device; the smallest need is "
                       f"{need / GIB:.1f} GiB")


@dataclass
class StepTime:
    source: str                          # "simulated" or "mfu"
    train_s: float                       # the step without input wait
    input_wait_s: float
    config: ParallelConfig | None
    peak_bytes: int | None
    check: object | None = None          # the planner's SimCheck of a simulated step
    profile: object | None = None        # the latency profile it was simulated on
    kernels: str = "emulated"            # that profile's source

    @property
    def total_s(self) -> float:
        return self.train_s + self.input_wait_s


def step_time(task: TrainingTask, platform: AnyPlatform, devices: int, *, layout: Layout | None = None,
              mfu: float | None = None, input_wait_s: float | None = None, pipeline: InputPipeline | None = None,
              kernels: str = "emulated", progress=None) -> StepTime:
    """The per-step time of ``task`` on ``devices`` devices of ``platform`` (module docstring)."""
    devices = _whole("devices", devices)
    if input_wait_s is not None and pipeline is not None:
        raise ConfigError("input wait: give a fixed wait or an input pipeline, not both")
    cfg = None if layout is None else layout_config(task, devices, layout, platform)
    peak = None
    if cfg is not None:
        peak = max_peak(stage_memory(task.model, cfg, platform if isinstance(platform, TrainingPlatform) else None))
    if mfu is not None:
        mfu = _positive("mfu", mfu)
        if mfu > 1:
            raise ConfigError(f"mfu={mfu:g}: a model FLOPs utilisation is at most 1")
        if cfg is None:
            peak, where = smallest_need(task, platform, devices)
            if peak > platform.memory_budget_bytes:
                raise _no_fit(task, platform, devices, peak)
        train = task.flops_per_step / (devices * device_peak_flops(platform) * mfu)
        check = prof = None
    else:
        planner = Planner(task.model, platform, profile_source=kernels, progress=progress)
        if cfg is None:
            result = planner.plan(devices, task.global_batch, task.seq, top=1, confirm=0)
            if result.best is None:
                need, _ = smallest_need(task, platform, devices)
                raise _no_fit(task, platform, devices, need)
            cfg, peak = result.best.config, result.best.peak_bytes
        prof = planner.profile(cfg.micro_batch, cfg.seq, cfg.tp)
        check = simulate_config(task.model, cfg, platform=platform, profile=prof, profile_source=kernels)
        train = check.simulated_ms / 1e3
    if pipeline is not None:
        wait = pipeline.wait_s(task.tokens_per_step, train)
    else:
        wait = _non_negative("input_wait_s", input_wait_s or 0.0)
    return StepTime("mfu" if mfu is not None else "simulated", train, wait, cfg, peak, check, prof, kernels)


def failure_overhead(failures: Failures, devices: int, step_s: float, steps: int) -> tuple[Overhead, dict]:
    """L's parts over ``devices`` devices and the interval it was taken at."""
    if failures.mtbf_hours is None:
        return Overhead(0.0, 0.0, 0.0), {"job_mtbf_s": None, "interval_s": None, "save_model": "no failures"}
    if failures.async_save is not None:
        m = job_mtbf_s(failures.mtbf_hours, devices)
        x = failures.interval_s or async_optimal_interval(failures.async_save, m)
        return async_overhead(x, failures.async_save, failures.restart_s, m), \
            {"job_mtbf_s": m, "interval_s": x, "save_model": "asynchronous save"}
    rel = Reliability(mtbf_hours=failures.mtbf_hours, checkpoint_s=failures.checkpoint_s, restart_s=failures.restart_s)
    ttt = time_to_train(step_s, steps, devices, None, rel, failures.interval_s)
    return ttt.overhead, {"job_mtbf_s": ttt.job_mtbf_s, "interval_s": ttt.interval_s, "save_model": "synchronous save"}


@dataclass
class SchemeResult:
    platform: str
    devices: int
    task: TrainingTask
    step: StepTime
    overhead: Overhead
    failure: dict
    memory_budget_bytes: int
    peak_flops: float
    extra: dict = field(default_factory=dict)

    @property
    def iterations(self) -> int:
        return self.task.iterations

    @property
    def progress_possible(self) -> bool:
        return self.overhead.progress_possible

    @property
    def base_s(self) -> float:
        return self.iterations * self.step.total_s

    @property
    def completion_s(self) -> float | None:
        if not self.progress_possible:
            return None
        return self.task.reserve_days * DAY_S + self.base_s * (1.0 + self.overhead.total)

    @property
    def memory_fits(self) -> bool:
        return self.step.peak_bytes is None or self.step.peak_bytes <= self.memory_budget_bytes

    @property
    def meets_deadline(self) -> bool:
        done = self.completion_s
        return self.memory_fits and done is not None and done <= self.task.deadline_days * DAY_S

    @property
    def step_budget_s(self) -> float | None:
        """The longest step that still meets the deadline."""
        if not self.progress_possible:
            return None
        return self.task.available_s / (self.iterations * (1.0 + self.overhead.total))

    @property
    def achieved_mfu(self) -> float:
        return self.task.flops_per_step / (self.devices * self.peak_flops * self.step.total_s)

    def affordable(self) -> dict | None:
        """What each step could still absorb and meet the deadline (None when it cannot progress)."""
        budget = self.step_budget_s
        if budget is None:
            return None
        margin = budget - self.step.total_s
        compute = self.extra.get("compute_s", self.step.train_s)
        return {"step_budget_s": budget, "margin_per_step_s": margin,
                "extra_exposed_communication_s": max(0.0, margin),
                "input_wait_s": max(0.0, self.step.input_wait_s + margin),
                "compute_slowdown": (compute + margin) / compute if compute > 0 else None,
                "min_mfu": self.task.flops_per_step / (self.devices * self.peak_flops * budget)}

    def to_json(self) -> dict:
        done = self.completion_s
        cfg = self.step.config
        out = {"platform": self.platform, "devices": self.devices, "iterations": self.iterations,
               "step_source": self.step.source, "step_time_s": self.step.total_s, "train_step_s": self.step.train_s,
               "input_wait_s": self.step.input_wait_s, "overhead_share": self.overhead.total,
               "overhead": self.overhead.to_json(), **self.failure,
               "progress_possible": self.progress_possible,
               "base_days": self.base_s / DAY_S,
               "save_and_recovery_days": self.base_s * self.overhead.total / DAY_S if self.progress_possible else None,
               "reserve_days": self.task.reserve_days, "deadline_days": self.task.deadline_days,
               "completion_days": None if done is None else done / DAY_S,
               "margin_days": None if done is None else self.task.deadline_days - done / DAY_S,
               "memory_fits": self.memory_fits, "meets_deadline": self.meets_deadline,
               "peak_gib": None if self.step.peak_bytes is None else self.step.peak_bytes / GIB,
               "memory_budget_gib": self.memory_budget_bytes / GIB,
               "config": None if cfg is None else cfg.to_json(), "label": None if cfg is None else cfg.describe(),
               "achieved_mfu": self.achieved_mfu, "affordable": self.affordable()}
        out.update({k: v for k, v in self.extra.items() if k != "compute_s"})
        return out


def evaluate_scheme(task: TrainingTask, platform: AnyPlatform, devices: int, failures: Failures, *,
                    layout: Layout | None = None, mfu: float | None = None, input_wait_s: float | None = None,
                    pipeline: InputPipeline | None = None, kernels: str = "emulated", progress=None) -> SchemeResult:
    """Completion time, margin and feasibility of ``task`` on one scheme."""
    step = step_time(task, platform, devices, layout=layout, mfu=mfu, input_wait_s=input_wait_s, pipeline=pipeline,
                     kernels=kernels, progress=progress)
    ovh, info = failure_overhead(failures, devices, step.total_s, task.iterations)
    result = SchemeResult(platform.name, devices, task, step, ovh, info, platform.memory_budget_bytes,
                          device_peak_flops(platform))
    if pipeline is not None:
        result.extra["input_pipeline"] = pipeline.to_json(task.tokens_per_step, step.train_s)
    return result


def required_mfu(task: TrainingTask, peak_flops: float, devices: int, overhead_share: float) -> float:
    """The MFU ``devices`` devices need to finish by the deadline (above 1: no efficiency can)."""
    flops = task.flops_per_step * task.iterations * (1.0 + overhead_share)
    return flops / (_whole("devices", devices) * _positive("peak_flops", peak_flops) * task.available_s)


def deadline_devices(parameters: float, tokens: float, peak_flops: float, mfu: float, available_s: float) -> int:
    """p >= ceil(6 N D / (peak x MFU x T)): the devices that finish 6 N D FLOPs in T at that MFU."""
    need = FLOPS_PER_PARAM_TOKEN * _positive("parameters", parameters) * _positive("tokens", tokens)
    return max(1, math.ceil(need / (_positive("peak_flops", peak_flops) * _positive("mfu", mfu)
                                    * _positive("available_s", available_s))))


__all__ = ["DAY_S", "FLOPS_PER_PARAM_TOKEN", "Failures", "Layout", "SchemeResult", "StepTime", "TrainingTask",
           "deadline_devices", "default_activation", "device_peak_flops", "evaluate_scheme", "failure_overhead",
           "layout_config", "required_mfu", "smallest_need", "step_time"]

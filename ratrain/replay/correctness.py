"""Correctness run (paper Fig. 7) on the tiny model: Baseline-1F1B vs RATrain, both executed.

Both runs start from the same seed and read the same (step, replica,
micro-batch) batches. Baseline-1F1B replays the simulator's timeline with all
mechanisms off (bulk step-end GradSync/Update, backward-time recompute from
checkpoints); RATrain replays the timeline with layer-wise state pipeline,
update-prefetch scheduling and FSR on. A plain single-stage loop with gradient
accumulation (no timeline at all) is the third reference. The per-step relative
loss deviation |L_ratrain - L_base| / L_base is compared with the paper's
0.081% maximum.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib.util
import io
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ratrain.cost.tasks import PipelineCosts
from ratrain.errors import ConfigError, DivergedError, RatrainError
from ratrain.replay.executor import (
    ExecPlan,
    ModelState,
    StepStats,
    accumulate,
    dp_average,
    execute_steps,
    microbatch_dloss,
)
from ratrain.replay.textdata import VOCAB_SIZE, BatchProvider, corpus_batches
from ratrain.replay.tinymodel import (
    AdamConfig,
    TinyConfig,
    adam_update,
    make_view,
    microbatch_loss_and_grads,
)
from ratrain.sim.pipeline_order import PipelineSchedule
from ratrain.sim.simulator import Mechanisms, simulate
from ratrain.sim.timeline import Task
from rtcommon.fileio import atomic_write_bytes, atomic_write_json
from rtcommon.hostmem import check_host_memory

TARGET_MAX_REL_DEV = 0.00081   # paper Fig. 7: max per-step relative loss deviation 0.081%

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class CorrectnessConfig:
    steps: int = 40
    stages: int = 2
    dp: int = 2
    microbatches: int = 4
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    seq: int = 32
    micro_batch_size: int = 4
    lr: float = 3e-3
    seed: int = 0
    loss_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("steps", "stages", "dp", "microbatches", "layers", "hidden", "heads", "seq",
                     "micro_batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"correctness config: {name} must be a positive integer, got {v!r}")
        if self.layers % self.stages:
            raise ConfigError(f"correctness config: layers={self.layers} must be a multiple of "
                              f"stages={self.stages} (the simulator's uniform costs use whole "
                              f"layers per stage)")
        for name in ("lr", "loss_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"correctness config: {name} must be a positive finite number, got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"correctness config: seed must be a non-negative integer, got {self.seed!r}")

    def host_bytes(self) -> int:
        """Generous estimate of the host memory of one training run (FP32 arithmetic): weights,
        FP16 views, gradients and Adam moments per replica, and every micro-batch's activations
        (with the seq x seq attention probabilities) alive at once."""
        m = self.model()
        h, f = m.hidden, m.ffn_dim
        params = m.layers * (4 * h * h + 3 * h * f + 2 * h) + 2 * m.vocab * h
        tokens = self.micro_batch_size * self.seq
        per_layer = tokens * (16 * h + 4 * f) * 4 + self.micro_batch_size * self.heads * self.seq * self.seq * 8
        logits = tokens * m.vocab * 4 * 3
        return 18 * params * self.dp + self.dp * self.microbatches * (m.layers * per_layer + logits)

    def model(self) -> TinyConfig:
        return TinyConfig(vocab=VOCAB_SIZE, layers=self.layers, hidden=self.hidden, heads=self.heads,
                          seq=self.seq)

    def adam(self) -> AdamConfig:
        return AdamConfig(lr=self.lr, loss_scale=self.loss_scale)

    def batches(self) -> BatchProvider:
        return corpus_batches(self.seq, self.micro_batch_size, seed=self.seed)


@dataclass
class Schedule:
    """A timeline for one step plus the executor plan it needs."""
    name: str
    tasks: list[Task]
    plan: ExecPlan
    step_time_ms: float | None = None
    source: str = "ratrain.sim.simulator"


@contextlib.contextmanager
def single_thread_blas():
    """Run NumPy's bundled OpenBLAS on one thread inside the block (best effort).

    The tiny model's GEMMs are far too small to gain from threads; on a shared
    2-core machine OpenBLAS's thread pool made a 128x64x170 matmul ~40x slower
    than one thread. OpenBLAS splits GEMM work by output blocks, not along the
    reduction, so the thread count does not change results. If the library or
    its entry points are not found, nothing is changed.
    """
    setter = getter = None
    libdir = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libdir, "*openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)   # already loaded by NumPy: same instance
        except OSError:
            continue
        for suffix in ("64_", "_64_", ""):
            s = getattr(lib, f"scipy_openblas_set_num_threads{suffix}", None)
            g = getattr(lib, f"scipy_openblas_get_num_threads{suffix}", None)
            if s is not None and g is not None:
                setter, getter = s, g
                break
        if setter is not None:
            break
    if setter is None:
        yield
        return
    before = int(getter())
    setter(1)
    try:
        yield
    finally:
        setter(before)


def simulator_available() -> bool:
    return importlib.util.find_spec("ratrain.sim.simulator") is not None


def simulated_schedule(cfg: CorrectnessConfig, ratrain: bool,
                       pipeline: str | PipelineSchedule = "1f1b") -> Schedule:
    """One step's task list from the simulator: RATrain (all mechanisms on) or Baseline-1F1B (all off).

    Task costs are illustrative (only the order matters for correctness): per
    layer forward 1, backward 2, recompute 1 ms; per stage gradsync 0.5,
    update 0.5, prefetch 0.2 ms (split over its layers); transfer 0.1 ms.
    ``pipeline``: the pipeline schedule (default 1F1B; interleaved and zb-h1
    timelines replay on the same executor, the plan takes the interleaved placement).
    """
    if not simulator_available():
        raise RatrainError("ratrain.sim.simulator is not available: the correctness run replays its timelines")

    lps = cfg.layers // cfg.stages
    costs = PipelineCosts.uniform(cfg.stages, cfg.microbatches, t_forward=1.0 * lps,
                                  t_backward=2.0 * lps, t_transfer=0.1, t_update=0.5,
                                  layers_per_stage=lps, t_recompute=1.0 * lps, t_gradsync=0.5,
                                  t_prefetch=0.2)
    if ratrain:
        mech = Mechanisms(layerwise=True, update_prefetch=True, fsr=True, activation="fsr")
    else:
        mech = Mechanisms.all_off()
    pipeline = PipelineSchedule.of(pipeline)
    result = simulate(costs, schedule=pipeline, mechanisms=mech)
    activation = getattr(mech, "activation", "fsr" if ratrain else "ckpt")
    plan = ExecPlan(stages=cfg.stages, dp=cfg.dp, microbatches=cfg.microbatches, layers=cfg.layers,
                    activation=activation, virtual_stages=result.virtual_stages)
    name = "RATrain" if ratrain else "Baseline-1F1B"
    if pipeline.name != "1f1b":
        name = f"{name} ({pipeline.name})"
    return Schedule(name=name, tasks=list(result.tasks), plan=plan,
                    step_time_ms=getattr(result, "step_time_ms", None))


def train_schedule(cfg: CorrectnessConfig, schedule: Schedule, *, batches: BatchProvider | None = None,
                   fault_injection: bool = False, overlap: bool = True, progress: Progress | None = None
                   ) -> tuple[list[float], list[StepStats]]:
    """Train ``cfg.steps`` steps by replaying the same one-step timeline; return losses and stats.

    With ``overlap`` and a known step time, consecutive steps are replayed on one
    time axis at the simulated period (see ``executor.execute_steps``);
    otherwise back to back.
    """
    batches = batches or cfg.batches()
    state = ModelState.create(cfg.model(), cfg.adam(), cfg.seed, cfg.dp)
    period = schedule.step_time_ms if overlap else None
    on_step = (lambda done: progress(schedule.name, done, cfg.steps)) if progress else None
    losses, stats = execute_steps(state, schedule.tasks, schedule.plan, batches, cfg.steps, period_ms=period,
                                  fault_injection=fault_injection, on_step=on_step)
    return losses, stats


def train_single_stage(cfg: CorrectnessConfig, *, batches: BatchProvider | None = None,
                       reverse_accumulation: bool = False, progress: Progress | None = None) -> list[float]:
    """Plain loop: whole model per micro-batch, gradient accumulation, DP average, bulk Adam.

    ``reverse_accumulation`` sums the micro-batch gradients in the order A-1..0:
    the same mathematics with different FP32 rounding, the yardstick for how far
    a semantically equivalent but not bit-identical run drifts.
    """
    batches = batches or cfg.batches()
    mcfg, opt = cfg.model(), cfg.adam()
    state = ModelState.create(mcfg, opt, cfg.seed, cfg.dp)
    dloss = microbatch_dloss(opt, cfg.microbatches)
    order = list(range(cfg.microbatches))
    if reverse_accumulation:
        order.reverse()
    label = "reordered" if reverse_accumulation else "single-stage"
    losses = []
    for step in range(cfg.steps):
        per_replica, step_losses = [], {}
        for r in range(cfg.dp):
            acc: list = [None] * mcfg.layers
            for m in order:
                tokens, targets = batches(step, r, m)
                loss, grads = microbatch_loss_and_grads(state.view, mcfg, tokens, targets, dloss=dloss)
                step_losses[(r, m)] = loss
                for layer in range(mcfg.layers):
                    acc[layer] = accumulate(acc[layer], grads[layer])
            per_replica.append(acc)
        for layer in range(mcfg.layers):
            avg = dp_average([per_replica[r][layer] for r in range(cfg.dp)])
            adam_update(state.master[layer], avg, state.opt_state[layer], opt)
            state.view[layer] = make_view(state.master[layer], mcfg)
        ordered = [step_losses[k] for k in sorted(step_losses)]   # (replica, mb) order, as the executor
        losses.append(float(np.mean(np.asarray(ordered, dtype=np.float64))))
        if progress:
            progress(label, step + 1, cfg.steps)
    return losses


def relative_deviation(reference: list[float], other: list[float]) -> np.ndarray:
    ref = np.asarray(reference, dtype=np.float64)
    oth = np.asarray(other, dtype=np.float64)
    if ref.shape != oth.shape:
        raise ConfigError(f"loss curves differ in length: {ref.size} vs {oth.size}")
    return np.abs(oth - ref) / np.abs(ref)


@dataclass
class CorrectnessResult:
    config: CorrectnessConfig
    baseline_loss: list[float]
    ratrain_loss: list[float]
    single_stage_loss: list[float]
    rel_dev: list[float]
    single_stage_rel_dev: list[float]
    reordered_loss: list[float] | None = None
    baseline_stats: dict = field(default_factory=dict)
    ratrain_stats: dict = field(default_factory=dict)
    step_time_ms: dict = field(default_factory=dict)
    seconds: float = 0.0
    plot: str | None = None

    @property
    def max_rel_dev(self) -> float:
        return float(max(self.rel_dev))

    @property
    def mean_rel_dev(self) -> float:
        return float(np.mean(self.rel_dev))

    @property
    def final_rel_dev(self) -> float:
        return float(self.rel_dev[-1])

    def reordered_rel_dev(self) -> list[float] | None:
        if self.reordered_loss is None:
            return None
        return relative_deviation(self.baseline_loss, self.reordered_loss).tolist()

    def _reordered_json(self) -> dict:
        dev = self.reordered_rel_dev()
        if dev is None:
            return {}
        exceeds = [i for i, x in enumerate(dev) if x > TARGET_MAX_REL_DEV]
        return {"reordered_max_rel_dev": float(max(dev)), "reordered_mean_rel_dev": float(np.mean(dev)),
                "reordered_final_rel_dev": float(dev[-1]),
                "reordered_first_step_over_target": exceeds[0] + 1 if exceeds else None}   # 1-based

    @property
    def passed(self) -> bool:
        return self.max_rel_dev <= TARGET_MAX_REL_DEV

    def to_json(self) -> dict:
        return {
            "steps": self.config.steps,
            "baseline_loss": self.baseline_loss,
            "ratrain_loss": self.ratrain_loss,
            "single_stage_loss": self.single_stage_loss,
            "max_rel_dev": self.max_rel_dev,
            "mean_rel_dev": self.mean_rel_dev,
            "final_rel_dev": self.final_rel_dev,
            "target_max_rel_dev": TARGET_MAX_REL_DEV,
            "passed": self.passed,
            "bit_identical": self.baseline_loss == self.ratrain_loss,
            "single_stage_max_rel_dev": float(max(self.single_stage_rel_dev)),
            "single_stage_bit_identical": self.single_stage_loss == self.baseline_loss,
            "reordered_loss": self.reordered_loss,
            **self._reordered_json(),
            "config": asdict(self.config),
            "baseline_stats": self.baseline_stats,
            "ratrain_stats": self.ratrain_stats,
            "step_time_ms": self.step_time_ms,
            "seconds": self.seconds,
            "plot": self.plot,
        }


def _stats_summary(stats: list[StepStats]) -> dict:
    s = stats[0]
    return {"tasks_per_step": dict(sorted(s.tasks.items())),
            "recovered_by_r_per_step": s.recovered_by_r,
            "recomputed_at_backward_per_step": s.recomputed_at_backward,
            "peak_live_full_activation_sets_per_stage": s.peak_live_full}


def check_finite_losses(losses: list[float], run: str, cfg: CorrectnessConfig) -> None:
    """A diverged run has no deviation to compare: refuse it instead of reporting NaN as FAIL."""
    bad = [i for i, x in enumerate(losses) if not math.isfinite(x)]
    if bad:
        raise DivergedError(f"correctness run: the {run} loss is {losses[bad[0]]} from step {bad[0] + 1} of "
                            f"{len(losses)} (training diverged; lr={cfg.lr} may be too large)")


def run_correctness(cfg: CorrectnessConfig, *, progress: Progress | None = None,
                    schedules: tuple[Schedule, Schedule] | None = None,
                    reorder_reference: bool = True) -> CorrectnessResult:
    """Train Baseline-1F1B, RATrain and the single-stage loop; compare the loss curves.

    ``schedules`` = (baseline, ratrain) overrides the simulator (tests use it).
    ``reorder_reference`` adds the single-stage loop with micro-batch gradients
    summed in reverse order (rounding-only differences) as a yardstick.
    """
    t0 = time.perf_counter()
    check_host_memory(cfg.host_bytes(), f"the correctness run (L={cfg.layers} H={cfg.hidden} seq={cfg.seq} "
                      f"D={cfg.dp} A={cfg.microbatches} x {cfg.micro_batch_size})", ConfigError)
    if schedules is None:
        schedules = (simulated_schedule(cfg, ratrain=False), simulated_schedule(cfg, ratrain=True))
    base_sched, rat_sched = schedules
    batches = cfg.batches()
    # overflow shows as a non-finite loss, which check_finite_losses reports in one line
    with single_thread_blas(), np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        base, base_stats = train_schedule(cfg, base_sched, batches=batches, progress=progress)
        check_finite_losses(base, base_sched.name, cfg)
        rat, rat_stats = train_schedule(cfg, rat_sched, batches=batches, progress=progress)
        check_finite_losses(rat, rat_sched.name, cfg)
        single = train_single_stage(cfg, batches=batches, progress=progress)
        check_finite_losses(single, "single-stage", cfg)
        reordered = (train_single_stage(cfg, batches=batches, reverse_accumulation=True, progress=progress)
                     if reorder_reference else None)
        if reordered is not None:
            check_finite_losses(reordered, "reordered single-stage", cfg)
    return CorrectnessResult(
        config=cfg, baseline_loss=base, ratrain_loss=rat, single_stage_loss=single,
        rel_dev=relative_deviation(base, rat).tolist(),
        single_stage_rel_dev=relative_deviation(base, single).tolist(), reordered_loss=reordered,
        baseline_stats=_stats_summary(base_stats), ratrain_stats=_stats_summary(rat_stats),
        step_time_ms={base_sched.name: base_sched.step_time_ms, rat_sched.name: rat_sched.step_time_ms},
        seconds=time.perf_counter() - t0)


def render_plot(result: CorrectnessResult) -> bytes:
    """Fig.-7-like PNG: (a) both loss curves, (b) per-step relative deviation vs the 0.081% target."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.arange(1, len(result.baseline_loss) + 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(steps, result.baseline_loss, label="Baseline-1F1B", lw=2.2, color="tab:blue")
    ax1.plot(steps, result.ratrain_loss, label="RATrain", lw=1.2, ls="--", color="tab:orange")
    ax1.plot(steps, result.single_stage_loss, label="single-stage reference", lw=0.8, ls=":",
             color="black")
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss (nats/token)")
    ax1.set_title("(a) loss curves")
    ax1.legend()
    dev_pct = 100.0 * np.asarray(result.rel_dev)
    ax2.plot(steps, dev_pct, marker="o", ms=3, color="tab:orange", label="|RATrain - Baseline| / Baseline")
    rdev = result.reordered_rel_dev()
    if rdev is not None:
        ax2.plot(steps, 100.0 * np.asarray(rdev), lw=0.9, color="grey",
                 label="same maths, micro-batch grads summed in reverse")
    ax2.axhline(100 * TARGET_MAX_REL_DEV, color="tab:red", ls=":", label="paper max (0.081%)")
    top = max(0.1, 1.2 * float(dev_pct.max()))
    if rdev is not None:
        top = max(top, 1.1 * 100.0 * max(rdev))
    top = max(top, 1.6 * 100 * TARGET_MAX_REL_DEV)   # the legend's rows sit above the paper's line
    ax2.set_ylim(bottom=-0.03 * top, top=top)   # keeps an all-zero curve visible above the axis
    ax2.set_xlabel("step")
    ax2.set_ylabel("relative loss deviation (%)")
    for ax in (ax1, ax2):
        ax.xaxis.get_major_locator().set_params(integer=True)      # whole steps
    same = " (bit-identical)" if result.baseline_loss == result.ratrain_loss else ""
    ax2.set_title(f"(b) max {100 * result.max_rel_dev:.4g}%, mean {100 * result.mean_rel_dev:.4g}%{same}")
    ax2.legend(loc="upper left", fontsize=8)
    c = result.config
    fig.suptitle(f"Tiny LLaMA-style model, L={c.layers} H={c.hidden} seq={c.seq}, "
                 f"P={c.stages} D={c.dp} A={c.microbatches}, {c.steps} steps", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def save_outputs(result: CorrectnessResult, out_dir: str | Path) -> None:
    """Write correctness.png and correctness.json into ``out_dir`` (atomically)."""
    out = Path(out_dir)
    png = out / "correctness.png"
    atomic_write_bytes(png, render_plot(result))
    result.plot = str(png)
    atomic_write_json(out / "correctness.json", result.to_json())

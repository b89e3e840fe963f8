"""What an experiment of the reproduction returns, and the settings every experiment shares.

An :class:`Experiment` holds JSON-able rows (ours and the paper's value side by side), pass/miss
:class:`Check` s against the tolerances, figure paths and notes. Where the paper is silent the
choice is a field of :class:`Settings` (documented in docs/CHOICES.md, "reproduction"), never a
hidden constant; one Settings instance serves every experiment.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from ratrain.plan.planner import Planner, mechanisms_for
from ratrain.plan.space import PAPER_SPACE
from ratrain.sim.simulator import Mechanisms
from ratrain.spec.memory import FSR_BUFFER_LAYERS, MemoryConstants
from ratrain.spec.models import ModelSpec
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import TrainingPlatform


@dataclass
class Check:
    name: str
    ours: float | str | None
    paper: float | str | None
    tolerance: str
    ok: bool
    note: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "ours": self.ours, "paper": self.paper, "tolerance": self.tolerance,
                "ok": self.ok, "note": self.note}


@dataclass
class Experiment:
    key: str
    title: str
    rows: list[dict]
    checks: list[Check] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    text: str = ""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # what the run cost (wall_s, cpu_s); like ``seconds``, not a result: comparisons ignore it
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        return sum(c.ok for c in self.checks)

    def to_json(self) -> dict:
        return {"key": self.key, "title": self.title, "rows": self.rows, "checks": [c.to_json() for c in self.checks],
                "figures": self.figures, "notes": self.notes, "seconds": self.seconds,
                "timing": self.timing}


@dataclass(frozen=True)
class Settings:
    profile_source: str = "emulated"        # latencies from mtemu ("roofline" only for quick looks)
    recovery_resource: str = "compute"      # FSR recovery recomputes on the DSPs (honest default)
    seq: int = 2048
    micro_batch: int = 1
    # Table 4 does not give its global batch; Table 6 shows 7B at 256 clusters with 2048.
    table4_global_batch: int = 2048
    # Table 6: throughput-oriented scale-out, global batch = 8 sequences per cluster.
    table6_clusters: tuple[int, ...] = (256, 512, 768, 1024)
    table6_batch_per_cluster: int = 8
    # Table 3: cluster counts tried (the paper does not say): 2^k and 3 x 2^k.
    table3_grid: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    # RATrain's own search space (paper Fig. 2: PP + DP + lightweight ZeRO, no intra-layer
    # collectives; `ratrain plan --space paper`). TP and ZeRO-3 are the baselines of Table 2, not
    # RATrain plans.
    ratrain_zero_stages: tuple[int, ...] = PAPER_SPACE.zero_stages
    ratrain_tp_degrees: tuple[int, ...] = PAPER_SPACE.tp_degrees
    # Ablation configuration (paper: Qwen2.5-32B, 256 clusters, P=8, D=32, T=1, Z=2, b=1, A=128)
    ablation_model: str = "qwen2.5-32b"
    # Planner ranking: simulate every feasible configuration of a case, or a fixed-seed
    # sample of this many (the planner's pick always included) where there are more.
    ranking_max_configs: int = 200
    ranking_seed: int = 15
    ranking_workers: int = 2        # processes that simulate a case's configurations (1: in-process)
    # Fig. 9: "training time" is the time to train on this many tokens at every sequence length
    # (20 x 4096 x 12288: whole steps of 4096 sequences at 512, 1024, 2048, 3072 and 4096 tokens;
    # ~1 B tokens, the size of the paper's correctness run).
    fig9_token_budget: int = 1_006_632_960
    # Link, DDR and memory budget the simulator and planner see (the emulated kernel latencies come
    # from mtemu's own platform). `ratrain reproduce --platform FILE` replaces it.
    platform: TrainingPlatform = TrainingPlatform()
    # FSR's recovery buffer in layers (Eq. 6's single M_rec): the memory model counts it and the
    # simulator recovers ahead no further (docs/CHOICES.md, "FSR's recovery buffer").
    fsr_buffer_layers: int = FSR_BUFFER_LAYERS

    def __post_init__(self) -> None:
        self.memory_constants()        # a bad buffer size is refused before any experiment runs

    def to_json(self) -> dict:
        return asdict(self)

    def memory_constants(self) -> MemoryConstants:
        return MemoryConstants(fsr_buffer_layers=self.fsr_buffer_layers)

    def planner(self, model: ModelSpec, platform: TrainingPlatform | None = None, **kwargs) -> Planner:
        """The planner every experiment uses: these settings' kernels, recovery and memory constants."""
        return Planner(model, platform or self.platform, profile_source=self.profile_source,
                       recovery_resource=self.recovery_resource, constants=self.memory_constants(), **kwargs)

    def mechanisms(self, method: str, cfg: ParallelConfig, base: Mechanisms | None = None) -> Mechanisms:
        """``method``'s mechanisms for ``cfg`` (or ``base``) with these settings' recovery buffer."""
        mech = base if base is not None else mechanisms_for(method, cfg.activation, cfg.prefetch)
        return replace(mech, fsr_buffer_layers=self.fsr_buffer_layers)


DEFAULT_SETTINGS = Settings()


def format_check_value(v) -> str:
    """A check's ours or paper cell: "-" when there is no value (the paper gives none, or we found none)."""
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def settings_markdown(settings: Settings | None) -> list[str]:
    """The settings as a small table: lists joined, the platform by name (its every field is under
    ``settings`` in each experiment's JSON)."""
    lines = ["| setting | value |", "| --- | --- |"]
    for name, value in (settings.to_json() if settings else {}).items():
        if isinstance(value, dict):
            value = f"{value.get('name', '?')} (every field: `settings.{name}` in each experiment's JSON)"
        elif isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value))
        lines.append(f"| {name} | {value} |")
    return lines


def format_checks(exp: Experiment) -> str:
    lines = [f"{'check':52s} {'ours':>12s} {'paper':>12s}  tolerance        mark"]
    for c in exp.checks:
        ours, ref = format_check_value(c.ours), format_check_value(c.paper)
        lines.append(f"{c.name[:52]:52s} {ours:>12s} {ref:>12s}  {c.tolerance:15s}  {'pass' if c.ok else 'MISS'}"
                     + (f"  ({c.note})" if c.note else ""))
    return "\n".join(lines)


def format_value(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    return str(v)


def format_table(rows: list[dict], cols: list[str]) -> str:
    widths = [max(len(c), *(len(format_value(r.get(c))) for r in rows)) for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=False)),
             "  ".join("-" * w for w in widths)]
    for r in rows:
        lines.append("  ".join(format_value(r.get(c)).ljust(w) for c, w in zip(cols, widths, strict=False)))
    return "\n".join(lines)

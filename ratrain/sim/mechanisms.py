"""Which RATrain mechanisms a simulation runs (`Mechanisms`), the activation policies and the paper's
ablation variants. No NumPy: the ``ratrain simulate`` parser reads the names, and ``ratrain.sim.simulator``
re-exports them."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ratrain.errors import ConfigError
from ratrain.spec.memory import FSR_BUFFER_LAYERS

ACTIVATIONS = ("full", "ckpt", "fsr")
ABLATION_VARIANTS = ("full", "no-fsr", "no-update-prefetch", "no-layerwise")


@dataclass(frozen=True)
class Mechanisms:
    """Which RATrain mechanisms are on.

    layerwise: per-layer GradSync -> UpdateShard -> PrefetchW chains (off: bulk
    step-end processing after the stage's last backward: all GradSyncs, then all
    updates, then all prefetches; ``update_prefetch`` is then ignored).
    update_prefetch: UpdateShard/PrefetchW of a layer start right after its
    GradSync, earliest deadline first, and may overlap the next step's forward up
    to that layer (off: a bulk phase after all of the stage's GradSyncs, and the
    stage's next step waits for all of it).
    fsr / activation: see the module docstring; activation 'fsr' with fsr=False
    behaves as 'ckpt'.
    fsr_lookahead: how many micro-batches may hold recovery buffers at once.
    fsr_skip_adjacent: a micro-batch whose B directly follows its F on a stage
    keeps its activations instead of being recovered (off by default: the
    executor applies one activation policy per run).
    fsr_buffer_layers: the recovery buffer's capacity in layers (default Eq. 6's one,
    ``ratrain.spec.memory.FSR_BUFFER_LAYERS``, which the memory model counts): the k-th
    recovery of a stage (backward order) waits until the backward that consumed the
    (k - capacity)-th has ended; None lifts the cap (only the lookahead bounds it).
    """
    layerwise: bool = True
    update_prefetch: bool = True
    fsr: bool = True
    activation: str = "fsr"
    fsr_lookahead: int = 1
    fsr_skip_adjacent: bool = False
    fsr_buffer_layers: int | None = FSR_BUFFER_LAYERS

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"Mechanisms.activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if isinstance(self.fsr_lookahead, bool) or not isinstance(self.fsr_lookahead, int) \
                or self.fsr_lookahead < 1:
            raise ConfigError(f"Mechanisms.fsr_lookahead must be an integer >= 1, got {self.fsr_lookahead!r}")
        if self.fsr_buffer_layers is not None and (isinstance(self.fsr_buffer_layers, bool)
                                                   or not isinstance(self.fsr_buffer_layers, int)
                                                   or self.fsr_buffer_layers < 1):
            raise ConfigError("Mechanisms.fsr_buffer_layers must be None (no cap) or an integer >= 1, "
                              f"got {self.fsr_buffer_layers!r}")

    @property
    def policy(self) -> str:
        """Effective activation policy: 'full', 'ckpt' (backward-time) or 'fsr'."""
        if self.activation == "fsr" and not self.fsr:
            return "ckpt"
        return self.activation

    @property
    def deadline_aware(self) -> bool:
        return self.layerwise and self.update_prefetch

    @classmethod
    def all_off(cls, activation: str = "ckpt") -> "Mechanisms":
        """Baseline 1F1B: bulk step-end processing and backward-time recomputation."""
        return cls(layerwise=False, update_prefetch=False, fsr=False, activation=activation)

    @classmethod
    def variant(cls, name: str) -> "Mechanisms":
        """The paper's ablation variants: 'full', 'no-fsr', 'no-update-prefetch', 'no-layerwise'."""
        if name == "full":
            return cls()
        if name == "no-fsr":
            return cls(fsr=False, activation="ckpt")
        if name == "no-update-prefetch":
            return cls(update_prefetch=False)
        if name == "no-layerwise":
            return cls(layerwise=False, update_prefetch=False)
        if name == "all-off":
            return cls.all_off()
        raise ConfigError(f"ablation variant must be one of {ABLATION_VARIANTS + ('all-off',)}, got {name!r}")

    def to_json(self) -> dict:
        return {**asdict(self), "policy": self.policy}


__all__ = ["ABLATION_VARIANTS", "ACTIVATIONS", "Mechanisms"]

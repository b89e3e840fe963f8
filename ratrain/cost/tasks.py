"""Per-layer task costs of one pipeline-parallel training step: the simulator's input.

Times are milliseconds; bytes are bytes. Every cost is for one layer and (where
it says so) one micro-batch on one data-parallel replica: replicas run the same
schedule, so the simulator models one of them.

Which resource a task occupies is part of the cost description (a planner that
knows recovery is DDR-bound, or that the optimizer step runs on the DSPs, says
so here): ``recovery_resource`` is one of ``compute`` / ``ddr``;
``update_resource`` and ``prefetch_resource`` one of ``compute`` / ``ddr`` / ``link``
(a ZeRO-1/2 PrefetchW is the all-gather of the updated shards, i.e. link work).
GradSync always uses the stage's ``link``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ratrain.errors import ConfigError

LAYER_TIME_FIELDS = ("forward_ms", "backward_ms", "recompute_ms", "gradsync_ms", "update_ms", "prefetch_ms")
LAYER_BYTE_FIELDS = ("act_full_bytes", "act_ckpt_bytes", "recovery_bytes")
# Parts of forward_ms / backward_ms spent waiting on the link for the EP all-to-alls and the CP K/V
# ring (already inside the F and B times; the trace draws them on the link). Listed in the JSON
# only when non-zero.
LAYER_EXCHANGE_FIELDS = ("exchange_forward_ms", "exchange_backward_ms")
STATE_RESOURCES = ("compute", "ddr")                 # where recovery (R) may run
LIFECYCLE_RESOURCES = STATE_RESOURCES + ("link",)    # where UpdateShard / PrefetchW may run


def _check_time(where: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where} must be a finite number >= 0 ms, got {value!r}")
    return float(value)


def _check_count(where: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class LayerCosts:
    """Costs of one layer.

    forward_ms / backward_ms / recompute_ms: per micro-batch (recompute = the
    activation recovery of this layer from its checkpoint).
    gradsync_ms: per step, data-parallel sync of this layer's gradients over the link.
    update_ms: per step, UpdateShard (optimizer update of the local shard).
    prefetch_ms: per step, PrefetchW (materialise the next step's working weights; under
    ZeRO-1/2 with D > 1 the all-gather of the updated shards, on the link).
    act_full_bytes / act_ckpt_bytes: activations one micro-batch leaves resident
    under full-save / checkpointing; recovery_bytes: the recovery buffer R fills.
    grad_bytes: the layer's FP16 gradient on this rank (what GradSync reduces; gradient buckets
    group layers by it, offloading sizes the layer's state from it); 0 when unknown.
    exchange_forward_ms / exchange_backward_ms: the EP all-to-all and CP ring time inside
    forward_ms / backward_ms (``LAYER_EXCHANGE_FIELDS``).
    """
    forward_ms: float
    backward_ms: float
    recompute_ms: float = 0.0
    gradsync_ms: float = 0.0
    update_ms: float = 0.0
    prefetch_ms: float = 0.0
    act_full_bytes: int = 0
    act_ckpt_bytes: int = 0
    recovery_bytes: int = 0
    grad_bytes: int = 0
    exchange_forward_ms: float = 0.0
    exchange_backward_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in LAYER_TIME_FIELDS + LAYER_EXCHANGE_FIELDS:
            object.__setattr__(self, name, _check_time(f"LayerCosts.{name}", getattr(self, name)))
        for name in LAYER_BYTE_FIELDS + ("grad_bytes",):
            _check_count(f"LayerCosts.{name}", getattr(self, name), 0)


@dataclass
class PipelineCosts:
    """Everything the simulator needs for one step.

    ``stages[p]`` lists the layers of stage p in forward order; the global layer
    index is the position across stages. ``transfer_ms`` is one stage-boundary
    activation (or activation-gradient) transfer of one micro-batch.
    ``bulk_update_ms``: if set, bulk step-end processing uses one monolithic
    ``Update`` task of this length per stage instead of per-layer UpdateShards.
    ``dp`` is informational (the gradsync costs already include it).
    ``gradsync_launch_ms``: the fixed part of one GradSync collective (its cost at zero bytes: launch
    and per-step latencies), what merging layers into one gradient bucket saves per merge.
    ``microbatch_scales``: per micro-batch, a factor on its F, B, W and R times (a step whose
    micro-batches hold unequal sequences: ``ratrain.spec.lengths``); None: all equal.
    """
    stages: list[list[LayerCosts]]
    transfer_ms: float
    microbatches: int
    bulk_update_ms: float | None = None
    dp: int = 1
    recovery_resource: str = "compute"
    update_resource: str = "ddr"
    prefetch_resource: str = "ddr"
    gradsync_launch_ms: float = 0.0
    microbatch_scales: tuple[float, ...] | None = None
    _ranges: list[range] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.stages, (list, tuple)) or not self.stages:
            raise ConfigError("PipelineCosts.stages must be a non-empty list of stages")
        self.stages = [list(s) for s in self.stages]
        for p, layers in enumerate(self.stages):
            if not layers:
                raise ConfigError(f"PipelineCosts.stages[{p}] has no layers")
            for i, layer in enumerate(layers):
                if not isinstance(layer, LayerCosts):
                    raise ConfigError(f"PipelineCosts.stages[{p}][{i}] must be a LayerCosts, "
                                      f"got {type(layer).__name__}")
        self.transfer_ms = _check_time("PipelineCosts.transfer_ms", self.transfer_ms)
        _check_count("PipelineCosts.microbatches", self.microbatches, 1)
        _check_count("PipelineCosts.dp", self.dp, 1)
        self.gradsync_launch_ms = _check_time("PipelineCosts.gradsync_launch_ms", self.gradsync_launch_ms)
        if self.bulk_update_ms is not None:
            self.bulk_update_ms = _check_time("PipelineCosts.bulk_update_ms", self.bulk_update_ms)
        for name, allowed in (("recovery_resource", STATE_RESOURCES), ("update_resource", LIFECYCLE_RESOURCES),
                              ("prefetch_resource", LIFECYCLE_RESOURCES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"PipelineCosts.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.microbatch_scales is not None:
            scales = tuple(self.microbatch_scales)
            if len(scales) != self.microbatches:
                raise ConfigError(f"PipelineCosts.microbatch_scales has {len(scales)} entries for "
                                  f"{self.microbatches} micro-batches")
            for i, value in enumerate(scales):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                        or value <= 0:
                    raise ConfigError(f"PipelineCosts.microbatch_scales[{i}] must be a finite number > 0, "
                                      f"got {value!r}")
            self.microbatch_scales = tuple(float(v) for v in scales)
        ranges, start = [], 0
        for layers in self.stages:
            ranges.append(range(start, start + len(layers)))
            start += len(layers)
        self._ranges = ranges

    # ------------------------------------------------------------ shape helpers
    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def num_layers(self) -> int:
        return self._ranges[-1].stop

    def layer_range(self, stage: int) -> range:
        """Global layer indices of ``stage``."""
        return self._ranges[stage]

    def layer(self, index: int) -> LayerCosts:
        for p, r in enumerate(self._ranges):
            if index in r:
                return self.stages[p][index - r.start]
        raise ConfigError(f"layer {index} out of range 0..{self.num_layers - 1}")

    def stage_of(self, index: int) -> int:
        for p, r in enumerate(self._ranges):
            if index in r:
                return p
        raise ConfigError(f"layer {index} out of range 0..{self.num_layers - 1}")

    def stage_total(self, stage: int, name: str) -> float:
        """Sum of one LayerCosts field over the layers of ``stage``."""
        return sum(getattr(layer, name) for layer in self.stages[stage])

    # ------------------------------------------------------------ constructors
    @classmethod
    def uniform(cls, stages: int, microbatches: int, *, t_forward: float, t_backward: float,
                t_transfer: float = 0.0, t_update: float = 0.0, layers_per_stage: int = 1,
                t_recompute: float = 0.0, t_gradsync: float = 0.0, t_prefetch: float = 0.0,
                act_full_bytes: int = 0, act_ckpt_bytes: int = 0, recovery_bytes: int = 0,
                grad_bytes: int = 0, **options) -> "PipelineCosts":
        """Identical stages; every per-stage time (ms) is split evenly over ``layers_per_stage``.

        The activation byte arguments are per layer and micro-batch, ``grad_bytes`` per layer.
        ``options`` pass through to the constructor (``bulk_update_ms``, ``dp``, ``*_resource``,
        ``gradsync_launch_ms``).
        """
        _check_count("stages", stages, 1)
        _check_count("layers_per_stage", layers_per_stage, 1)
        per = {"forward_ms": t_forward, "backward_ms": t_backward, "recompute_ms": t_recompute,
               "gradsync_ms": t_gradsync, "update_ms": t_update, "prefetch_ms": t_prefetch}
        for name, value in per.items():
            _check_time(f"t_{name[:-3]}", value)
        n = layers_per_stage
        layer = LayerCosts(**{k: v / n for k, v in per.items()}, act_full_bytes=act_full_bytes,
                           act_ckpt_bytes=act_ckpt_bytes, recovery_bytes=recovery_bytes, grad_bytes=grad_bytes)
        return cls(stages=[[layer] * n for _ in range(stages)], transfer_ms=t_transfer,
                   microbatches=microbatches, **options)

    def microbatch_scale(self, microbatch: int) -> float:
        return 1.0 if self.microbatch_scales is None else self.microbatch_scales[microbatch]

    def to_json(self) -> dict:
        out = {
            "stages": [[_layer_json(layer) for layer in s] for s in self.stages],
            "transfer_ms": self.transfer_ms, "microbatches": self.microbatches,
            "bulk_update_ms": self.bulk_update_ms, "dp": self.dp,
            "recovery_resource": self.recovery_resource, "update_resource": self.update_resource,
            "prefetch_resource": self.prefetch_resource,
        }
        if self.microbatch_scales is not None:
            out["microbatch_scales"] = list(self.microbatch_scales)
        return out


def _layer_json(layer: LayerCosts) -> dict:
    out = {k: getattr(layer, k) for k in LAYER_TIME_FIELDS + LAYER_BYTE_FIELDS}
    out.update({k: getattr(layer, k) for k in LAYER_EXCHANGE_FIELDS if getattr(layer, k)})
    return out


__all__ = ["LayerCosts", "PipelineCosts", "LAYER_TIME_FIELDS", "LAYER_BYTE_FIELDS", "LAYER_EXCHANGE_FIELDS",
           "LIFECYCLE_RESOURCES",
           "STATE_RESOURCES"]

"""Gradient buckets: a stage's layer gradients reduced in groups of at least a given size.

A stage's gradients complete layer by layer, in the order of the layers' last backward (their last
W under a split backward). Walking that order, a bucket collects layers until its gradient bytes
(``LayerCosts.grad_bytes``) reach ``bucket_bytes``; then the next bucket starts; the last bucket
takes what is left. A bucket is one GradSync collective on the stage's link: it may start once
its last gradient exists and the link is free, and it costs the sum of its layers' GradSync times
less one launch (``PipelineCosts.gradsync_launch_ms``, the collective's cost at zero bytes) per
merged layer. A collective's time is launch plus bytes over bandwidth, so that is exactly one
collective of the bucket's bytes (with the link time a layer's GradSync also holds for its
backward's tensor-parallel collectives kept per layer). A one-layer bucket is the layer's GradSync
as it is: any ``bucket_bytes`` no larger than the smallest layer's gradient gives RATrain's
layer-wise GradSync, and one bucket of everything is the step-end all-reduce of the stage's whole
gradient after its last backward.

On GPU platforms with ``algorithm = "auto"`` a collective's time is the cheaper of ring and tree,
not one line; the launch subtracted is then the cheaper fixed cost (an approximation for mixed
choices).
"""
from __future__ import annotations

from dataclasses import dataclass

from ratrain.errors import ConfigError


@dataclass(frozen=True)
class GradBuckets:
    """Gradient bucketing of GradSync: ``bucket_bytes`` >= 1 (a bucket closes once it holds that many)."""
    bucket_bytes: int

    def __post_init__(self) -> None:
        b = self.bucket_bytes
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ConfigError(f"gradient bucket size must be an integer >= 1 byte, got {b!r}")

    def to_json(self) -> dict:
        return {"bucket_bytes": self.bucket_bytes}


@dataclass(frozen=True)
class BucketRecord:
    """One bucket of one stage in the simulated step (times in ms).

    first_gradient_ms: when the first of its gradients existed; ready_ms: when the last did (the
    bucket waited on data from first_gradient_ms to ready_ms); start_ms: when the link took it
    (it waited on the link from ready_ms to start_ms); end_ms: when the collective ended."""
    stage: int
    index: int
    layers: tuple[int, ...]
    nbytes: int
    first_gradient_ms: float
    ready_ms: float
    start_ms: float
    end_ms: float

    @property
    def wait_data_ms(self) -> float:
        return self.ready_ms - self.first_gradient_ms

    @property
    def wait_link_ms(self) -> float:
        return self.start_ms - self.ready_ms

    def to_json(self) -> dict:
        return {"stage": self.stage, "index": self.index, "layers": list(self.layers), "bytes": self.nbytes,
                "first_gradient_ms": self.first_gradient_ms, "ready_ms": self.ready_ms, "start_ms": self.start_ms,
                "end_ms": self.end_ms, "wait_data_ms": self.wait_data_ms, "wait_link_ms": self.wait_link_ms,
                "link_ms": self.end_ms - self.start_ms}


def group_layers(order: list[int], grad_bytes: dict[int, int], bucket_bytes: int) -> list[list[int]]:
    """The buckets of one stage: ``order`` is its layers in the order their gradients complete."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for layer in order:
        current.append(layer)
        filled += grad_bytes[layer]
        if filled >= bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


def bucket_ms(layers: list[int], gradsync_ms: dict[int, float], launch_ms: float) -> float:
    """One bucket's collective: its layers' GradSync times less a launch per merged layer."""
    if len(layers) == 1:
        return gradsync_ms[layers[0]]
    total = sum(gradsync_ms[layer] for layer in layers)
    if total == 0.0:
        return 0.0
    return total - (len(layers) - 1) * launch_ms


def check_bucketable(stage: int, layers: list[int], grad_bytes: dict[int, int], gradsync_ms: dict[int, float],
                     launch_ms: float) -> None:
    """Bucketing needs every layer's gradient size, and GradSync times that include the launch."""
    for layer in layers:
        if grad_bytes[layer] <= 0:
            raise ConfigError(f"gradient buckets: layer {layer} (stage {stage}) has no gradient size "
                              "(LayerCosts.grad_bytes; uniform mode: --layer-grad-bytes)")
        if 0.0 < gradsync_ms[layer] < launch_ms:
            raise ConfigError(f"gradient buckets: layer {layer}'s GradSync ({gradsync_ms[layer]:g} ms) is shorter "
                              f"than one collective's launch ({launch_ms:g} ms)")


def bucket_records(sim) -> list[BucketRecord]:
    """The buckets of a finished simulation (``ratrain.sim.simulator._Sim``): when each waited on what."""
    out = []
    for p, k, layers, g in sim.bucket_jobs:
        done = [sim.acc_done[p][layer].end for layer in layers] if sim.mech.layerwise else [sim.main_chain[p][-1].end]
        nbytes = sum(sim.flat[layer].grad_bytes for layer in layers)
        out.append(BucketRecord(p, k, tuple(layers), nbytes, min(done), max(done), g.start, g.end))
    return out


def bucket_summary(records: list[BucketRecord], last_backward_ms: list[float]) -> dict:
    """Per stage: buckets, link time of its collectives, and the communication left exposed after
    its last backward (end of its last bucket less the end of its last backward, >= 0)."""
    stages: dict[int, list[BucketRecord]] = {}
    for r in records:
        stages.setdefault(r.stage, []).append(r)
    out = []
    for p, rs in sorted(stages.items()):
        end = max(r.end_ms for r in rs)
        out.append({"stage": p, "buckets": len(rs), "link_ms": sum(r.end_ms - r.start_ms for r in rs),
                    "exposed_after_last_backward_ms": max(0.0, end - last_backward_ms[p]),
                    "wait_data_ms": sum(r.wait_data_ms for r in rs), "wait_link_ms": sum(r.wait_link_ms for r in rs)})
    return {"stages": out,
            "exposed_after_last_backward_ms": max((s["exposed_after_last_backward_ms"] for s in out), default=0.0),
            "link_ms": max((s["link_ms"] for s in out), default=0.0)}


__all__ = ["BucketRecord", "GradBuckets", "bucket_ms", "bucket_records", "bucket_summary", "check_bucketable",
           "group_layers"]

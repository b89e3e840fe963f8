"""The gradient bucket size that minimises the step: simulate the step at a ladder of sizes.

Sizes (unless given): the smallest layer gradient of any stage (every bucket one layer: RATrain's
layer-wise GradSync), doubling up to the largest stage's whole gradient (one bucket of everything:
the step-end all-reduce). Per size: the step time, the communication left exposed after each
stage's last backward (the worst stage), the link time of the stage's collectives (the busiest
stage) and the buckets per stage. The best size is the shortest step; ties go to the smaller
exposed communication, then to the larger bucket (fewer launches).
"""
from __future__ import annotations

from dataclasses import dataclass

from ratrain.cost.tasks import PipelineCosts
from ratrain.errors import ConfigError
from ratrain.sim.buckets import GradBuckets
from ratrain.sim.offload import OffloadPlan
from ratrain.sim.pipeline_order import PipelineSchedule
from ratrain.sim.simulator import Mechanisms, simulate

MAX_SWEEP_SIZES = 64


@dataclass(frozen=True)
class SweepPoint:
    bucket_bytes: int
    step_time_ms: float
    exposed_ms: float
    link_ms: float
    buckets_per_stage: list[int]

    def to_json(self) -> dict:
        return {"bucket_bytes": self.bucket_bytes, "step_time_ms": self.step_time_ms,
                "exposed_after_last_backward_ms": self.exposed_ms, "link_ms": self.link_ms,
                "buckets_per_stage": self.buckets_per_stage}


def default_sizes(costs: PipelineCosts) -> list[int]:
    """Powers of two from the smallest layer gradient to the largest stage gradient, both ends kept."""
    smallest = min(lc.grad_bytes for s in costs.stages for lc in s)
    largest = max(sum(lc.grad_bytes for lc in s) for s in costs.stages)
    if smallest <= 0:
        raise ConfigError("bucket sweep: every layer needs a gradient size (LayerCosts.grad_bytes; "
                          "uniform mode: --layer-grad-bytes)")
    sizes, b = [smallest], smallest
    while b * 2 < largest:
        b *= 2
        sizes.append(b)
    if largest > smallest:
        sizes.append(largest)
    return sizes


def bucket_sweep(costs: PipelineCosts, *, schedule: str | PipelineSchedule = "1f1b",
                 mechanisms: Mechanisms | None = None, sizes: list[int] | None = None,
                 offload: OffloadPlan | None = None) -> tuple[list[SweepPoint], SweepPoint]:
    """Every size's step; and the best (see the module docstring)."""
    mechanisms = mechanisms if mechanisms is not None else Mechanisms()
    sizes = default_sizes(costs) if sizes is None else sorted(set(sizes))
    if not sizes or len(sizes) > MAX_SWEEP_SIZES:
        raise ConfigError(f"bucket sweep: give 1 to {MAX_SWEEP_SIZES} sizes, got {len(sizes)}")
    points = []
    for size in sizes:
        r = simulate(costs, schedule=schedule, mechanisms=mechanisms, buckets=GradBuckets(size), offload=offload)
        summary = r.to_json(timeline=False)["gradient_buckets"]
        points.append(SweepPoint(size, r.step_time_ms, summary["exposed_after_last_backward_ms"], summary["link_ms"],
                                 [s["buckets"] for s in summary["stages"]]))
    best = min(points, key=lambda q: (q.step_time_ms, q.exposed_ms, -q.bucket_bytes))
    return points, best


__all__ = ["MAX_SWEEP_SIZES", "SweepPoint", "bucket_sweep", "default_sizes"]

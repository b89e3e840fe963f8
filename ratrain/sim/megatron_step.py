"""One Megatron iteration on the event simulator, and where its time goes.

The pipeline part (every F, B with its recomputation, and every stage-boundary transfer) is the
event simulator's (``ratrain.sim.simulator.simulate``) with every RATrain mechanism off: the
baseline 1F1B of the measured runs. The step end follows Megatron's order, which the simulator's
periodic step does not have: each stage's data-parallel gradient sync starts at its last backward;
the tied embedding's all-reduce joins the first and last stage after theirs; the gradient norm and
overflow check is an all-reduce over every model-parallel rank, so every stage waits for the
slowest; then each stage updates its own parameters (ZeRO-1: and all-gathers them), and the next
iteration starts on every rank together. So

    iteration = max_p(last backward_p + sync_p) [+ embedding sync] + barrier
                + max_p(optimizer_p + gather_p) + overhead.
"""
from __future__ import annotations

from dataclasses import dataclass

from ratrain.cost.megatron import MegatronStep
from ratrain.sim.simulator import Mechanisms, simulate


@dataclass(frozen=True)
class MegatronResult:
    iteration_ms: float
    pipeline_ms: float               # the last backward of the slowest stage (warm-up, steady, cool-down)
    breakdown_ms: dict               # the iteration split into what it is made of (sums to iteration_ms)

    def to_json(self) -> dict:
        return {"iteration_ms": self.iteration_ms, "pipeline_ms": self.pipeline_ms, "breakdown_ms": self.breakdown_ms}


def simulate_megatron(step: MegatronStep, schedule: str = "1f1b") -> MegatronResult:
    """Simulate one iteration of ``step`` (see the module docstring for how it is composed)."""
    result = simulate(step.costs, schedule=schedule, mechanisms=Mechanisms.all_off(activation="ckpt"))
    P = step.costs.num_stages
    last_b = [0.0] * P
    for t in result.tasks:
        if t.kind in ("B", "W"):
            last_b[t.stage] = max(last_b[t.stage], t.end_ms)
    synced = [last_b[p] + step.dp_sync_ms[p] for p in range(P)]
    sync_end = max(synced) + step.embedding_sync_ms
    tail = max(step.optimizer_ms[p] + step.weight_gather_ms[p] for p in range(P))
    iteration = sync_end + step.barrier_ms + tail + step.overhead_ms
    # where the time goes, read on the stage that ends the sync last
    crit = max(range(P), key=lambda p: synced[p])
    A = step.costs.microbatches
    layer = step.costs.stages[crit][0]
    tp_comm = A * step.parts["tp_comm_per_microbatch_ms"][crit]
    busy = A * (layer.forward_ms + layer.backward_ms + layer.recompute_ms)
    compute = busy - tp_comm
    pipeline = last_b[crit]
    breakdown = {"compute": compute, "tp_communication": tp_comm, "pipeline_bubble_and_transfers": pipeline - busy,
                 "dp_allreduce": sync_end - pipeline,
                 "optimizer": step.barrier_ms + tail, "overhead": step.overhead_ms}
    return MegatronResult(iteration, max(last_b), breakdown)


__all__ = ["MegatronResult", "simulate_megatron"]

"""The simulator's output format: one record per executed task.

This is the contract between the simulator (which produces timelines), the
executor (which replays them on a real small model), the plots and the
Chrome-trace export. Times are milliseconds from the start of the step.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

TASK_KINDS = ("F", "B", "W", "R", "GradSync", "UpdateShard", "PrefetchW", "Send", "Recv", "Update")
# offloading's tasks (ratrain.sim.offload): transfers to and from host memory, gradient conversion
HOST_TASK_KINDS = ("ToHost", "FromHost", "Convert")
# d2h / h2d: the two directions of the link to host memory; host: the host's cores (offloading only)
RESOURCES = ("compute", "ddr", "link", "d2h", "h2d", "host")


@dataclass(frozen=True)
class Task:
    stage: int                # pipeline stage p, 0 = input side
    kind: str                 # one of TASK_KINDS (W: weight gradient of a split backward, zb-h1)
    microbatch: int | None    # micro-batch index, None for per-step lifecycle tasks
    layer: int | None         # global layer index, None for stage-level tasks
    resource: str             # one of RESOURCES
    start_ms: float
    end_ms: float

    def to_json(self) -> dict:
        return asdict(self)

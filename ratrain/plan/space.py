"""Named planner search spaces: which tensor-parallel degrees, ZeRO stages and micro-batch sizes
``ratrain plan`` enumerates.

- ``wide`` (the default): the planner's own enumeration, T any divisor of N up to ``MAX_TP`` that
  divides the model, ZeRO 0-3, b any divisor of G/D up to ``MAX_MICRO_BATCH``. It answers "what is
  fastest on this machine" and may leave the paper's space (e.g. T=4, Z=3).
- ``paper``: the paper's Algorithm 2 space, RATrain's own (Fig. 2: pipeline + data parallelism +
  lightweight ZeRO, no intra-layer collectives): T=1, ZeRO <= 2, b=1. The reproduction's Tables 3,
  4 and 6 ask the planner for this space (``ratrain.repro.experiment.Settings``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ratrain.plan.choices import MAX_MICRO_BATCH, MAX_TP


@dataclass(frozen=True)
class SearchSpace:
    name: str
    description: str
    tp_degrees: tuple[int, ...] | None       # None: the planner's default enumeration
    zero_stages: tuple[int, ...] | None
    micro_batches: tuple[int, ...] | None

    def to_json(self) -> dict:
        return {"name": self.name, "description": self.description, "tp_degrees": self.tp_degrees,
                "zero_stages": self.zero_stages, "micro_batches": self.micro_batches}


WIDE_SPACE = SearchSpace("wide", f"T up to {MAX_TP} dividing N and the model, ZeRO 0-3, b dividing G/D up to "
                                 f"{MAX_MICRO_BATCH}",
                         None, None, None)
PAPER_SPACE = SearchSpace("paper", "the paper's Algorithm 2: T=1, ZeRO 0-2, b=1", (1,), (0, 1, 2), (1,))
SEARCH_SPACES = {s.name: s for s in (WIDE_SPACE, PAPER_SPACE)}
DEFAULT_SPACE = WIDE_SPACE.name

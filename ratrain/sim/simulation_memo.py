"""A memo of simulated steps, on only while a caller asks for it (the reproduction, across its
experiments): the same simulator inputs are simulated once.

Keyed on the full inputs of ``ratrain.sim.simulator.simulate``: every compared field of the
``PipelineCosts`` (each layer's costs), the schedule and the mechanisms, floats by their exact bits
(``float.hex``), so only bit-identical inputs share an entry and a hit returns what the simulation
returns. The one field left out is one the simulation does not read: where FSR recovery would run,
under mechanisms without FSR (no recovery task exists), e.g. Fig. 9's plans that save or checkpoint
activations, simulated with recovery on compute and again on DDR. Full results (task records
included) are kept for the ``FULL_RESULTS`` most recently used inputs, so the memo's memory stays
bounded; the step time and main-path end of every input are kept.

    with simulation_memo.enabled():
        ...   # simulate / simulate_step calls here share results
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

from ratrain.sim.pipeline_order import PipelineSchedule
from rtcommon.scoped import Scoped

# full SimResults kept (the largest steps of the reproduction hold ~10**5 task records)
FULL_RESULTS = 24


def _freeze(value: Any) -> Any:
    """A hashable, exact image of a simulator input: dataclasses by their compared fields, sequences
    as tuples, floats by their bits (so 0.0 and -0.0 differ, as the arithmetic on them may)."""
    if isinstance(value, float):
        return ("f", value.hex())
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__,
                tuple((f.name, _freeze(getattr(value, f.name))) for f in dataclasses.fields(value) if f.compare))
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _without_unused(costs: Any, mechanisms: Any) -> Any:
    """``costs`` less what the simulation cannot read: without FSR no recovery task exists, and
    ``recovery_resource`` (where one would run) is read only to build them, so such inputs share a key."""
    if getattr(mechanisms, "policy", "fsr") == "fsr" or getattr(costs, "recovery_resource", "compute") == "compute":
        return costs
    return dataclasses.replace(costs, recovery_resource="compute")


@dataclasses.dataclass
class SimulationMemo:
    """Results by input key: ``results`` (full, least recently used dropped), ``steps`` (step, main end)."""
    results: OrderedDict = dataclasses.field(default_factory=OrderedDict)
    steps: dict = dataclasses.field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def key(self, costs, schedule, mechanisms) -> tuple:
        return _freeze(_without_unused(costs, mechanisms)), _freeze(PipelineSchedule.of(schedule)), _freeze(mechanisms)

    def lookup_result(self, key: tuple):
        got = self.results.get(key)
        if got is not None:
            self.results.move_to_end(key)
            self.hits += 1
        return got

    def lookup_step(self, key: tuple) -> tuple[float, float] | None:
        got = self.steps.get(key)
        if got is not None:
            self.hits += 1
        return got

    def store(self, key: tuple, result, step: tuple[float, float]) -> None:
        self.misses += 1
        self.steps[key] = step
        if result is not None:
            self.results[key] = result
            while len(self.results) > FULL_RESULTS:
                self.results.popitem(last=False)


_MEMO: Scoped[SimulationMemo] = Scoped(SimulationMemo)
# ``with enabled(): ...``: the simulations inside share results (a nested block shares the outer memo)
enabled = _MEMO.enabled


def active() -> SimulationMemo | None:
    """The memo in force, or None (the default: every call simulates)."""
    return _MEMO.active


def find(costs, schedule, mechanisms, full: bool) -> tuple[tuple | None, Any]:
    """(key, what the memo holds for these inputs or None); key None when no memo is in force.
    ``full``: a whole SimResult, else (step time, main-path end)."""
    memo = _MEMO.active
    if memo is None:
        return None, None
    key = memo.key(costs, schedule, mechanisms)
    return key, memo.lookup_result(key) if full else memo.lookup_step(key)


def keep(key: tuple | None, result, step: tuple[float, float]) -> None:
    """Store a simulation under ``key`` from ``find`` (nothing when no memo was in force)."""
    if key is not None and _MEMO.active is not None:
        _MEMO.active.store(key, result, step)


__all__ = ["FULL_RESULTS", "SimulationMemo", "active", "enabled", "find", "keep"]

"""Per-stage operation orders of the non-interleaved pipeline schedules.

An order is a list of ``("F", m)`` / ``("B", m)`` per stage (stage 0 is the input
side). The simulator expands each op into per-layer tasks; the order itself
never changes (RATrain only schedules work around it).
"""
from __future__ import annotations

from ratrain.errors import ConfigError

Op = tuple[str, int]
SCHEDULES = ("1f1b", "gpipe")


def _check(stages: int, microbatches: int) -> None:
    for name, v in (("stages", stages), ("microbatches", microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"schedule: {name} must be an integer >= 1, got {v!r}")


def warmup_forwards(stages: int, microbatches: int, stage: int) -> int:
    """Forwards stage ``stage`` runs before its first backward beyond the first steady-state one."""
    return min(stages - stage - 1, microbatches)


def one_f_one_b(stages: int, microbatches: int) -> list[list[Op]]:
    """Standard non-interleaved 1F1B: warm-up min(P-p-1, A) forwards, then F/B pairs, then cool-down."""
    _check(stages, microbatches)
    orders = []
    for p in range(stages):
        warm = warmup_forwards(stages, microbatches, p)
        ops: list[Op] = [("F", m) for m in range(warm)]
        for i in range(microbatches - warm):      # steady state: one forward, one backward
            ops.append(("F", warm + i))
            ops.append(("B", i))
        ops.extend(("B", m) for m in range(microbatches - warm, microbatches))   # cool-down
        orders.append(ops)
    return orders


def gpipe(stages: int, microbatches: int) -> list[list[Op]]:
    """GPipe fill-drain: all forwards, then all backwards (micro-batch order 0..A-1)."""
    _check(stages, microbatches)
    return [[("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)]
            for _ in range(stages)]


def build(name: str, stages: int, microbatches: int) -> list[list[Op]]:
    if name == "1f1b":
        return one_f_one_b(stages, microbatches)
    if name == "gpipe":
        return gpipe(stages, microbatches)
    raise ConfigError(f"schedule must be one of {SCHEDULES}, got {name!r}")


__all__ = ["Op", "SCHEDULES", "build", "gpipe", "one_f_one_b", "warmup_forwards"]

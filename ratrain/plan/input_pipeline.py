"""The input pipeline on the critical path: read, tokenize/decode, pack and host-to-device stages and a queue.

Each stage moves tokens at a rate (tokens per second; a stage in bytes converts with its bytes per
token before it is given here). The stages run concurrently on different batches, so the pipeline
delivers min(rate) tokens per second and one step's batch of ``tokens_per_step`` takes
t_in = tokens_per_step / min(rate) once the pipeline is full.

The queue holds up to Q prepared batches between the pipeline and training. With Q >= 1 the next
batch is prepared while a step trains, so a step waits max(0, t_in - t_train) for its input
(steady state; the first Q batches are a one-off fill of Q x t_in, negligible over a run). With
Q = 0 nothing is prepared ahead and every step waits the whole t_in. The host-to-device stage is
the host link: when it is the slowest stage, the input wait is the host link's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ratrain.errors import ConfigError

STAGE_NAMES = ("read", "tokenize", "pack", "h2d")


@dataclass(frozen=True)
class InputPipeline:
    rates: dict[str, float]      # stage name -> tokens/s
    queue_batches: int = 2

    def __post_init__(self) -> None:
        if not self.rates:
            raise ConfigError("input pipeline: give at least one stage rate (read, tokenize, pack, h2d)")
        for name, rate in self.rates.items():
            if name not in STAGE_NAMES:
                raise ConfigError(f"input pipeline: unknown stage {name!r} (stages: {', '.join(STAGE_NAMES)})")
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
                raise ConfigError(f"input pipeline: stage {name} rate={rate!r}: must be a positive number of tokens/s")
        q = self.queue_batches
        if isinstance(q, bool) or not isinstance(q, int) or q < 0:
            raise ConfigError(f"input pipeline: queue_batches={q!r}: must be an integer >= 0")

    @property
    def slowest(self) -> str:
        return min(self.rates, key=lambda n: (self.rates[n], STAGE_NAMES.index(n)))

    @property
    def rate(self) -> float:
        return self.rates[self.slowest]

    def batch_s(self, tokens_per_step: float) -> float:
        """Time the pipeline needs for one step's batch."""
        return tokens_per_step / self.rate

    def wait_s(self, tokens_per_step: float, train_step_s: float) -> float:
        """The per-step input wait (module docstring)."""
        t_in = self.batch_s(tokens_per_step)
        return t_in if self.queue_batches == 0 else max(0.0, t_in - train_step_s)

    def scaled(self, factor: float) -> InputPipeline:
        """Every stage ``factor`` times faster."""
        return InputPipeline({n: r * factor for n, r in self.rates.items()}, self.queue_batches)

    def to_json(self, tokens_per_step: float, train_step_s: float) -> dict:
        return {"rates_tokens_per_s": dict(self.rates), "queue_batches": self.queue_batches,
                "slowest_stage": self.slowest, "rate_tokens_per_s": self.rate,
                "batch_s": self.batch_s(tokens_per_step), "fill_s": self.queue_batches * self.batch_s(tokens_per_step),
                "wait_s": self.wait_s(tokens_per_step, train_step_s)}


def parse_stage(text: str) -> tuple[str, float]:
    """'tokenize=2.5e6' -> ('tokenize', 2.5e6)."""
    name, sep, value = text.partition("=")
    if not sep:
        raise ConfigError(f"--input-stage {text!r}: write STAGE=TOKENS_PER_S (stages: {', '.join(STAGE_NAMES)})")
    try:
        rate = float(value)
    except ValueError:
        raise ConfigError(f"--input-stage {text!r}: {value!r} is not a number of tokens/s") from None
    return name.strip(), rate


__all__ = ["InputPipeline", "STAGE_NAMES", "parse_stage"]

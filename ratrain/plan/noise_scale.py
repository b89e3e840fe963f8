"""Batch size against the gradient noise scale: steps and samples to the same loss.

The empirical law of large-batch training: the optimizer steps S and the tokens processed E to reach
a given loss with a batch of B tokens trade off as

    (S / S_min - 1) (E / E_min - 1) = 1,    E = B S,    B_crit = E_min / S_min,

so S(B) = S_min (1 + B_crit / B) and E(B) = E_min (1 + B / B_crit). The critical batch B_crit is
taken equal to the gradient noise scale B_noise (a parameter, in tokens). The user's reference run
(batch B_ref tokens, D tokens) is taken to meet the target: E_ref = D and S_ref = D / B_ref give

    E_min = D / (1 + B_ref / B_noise),    S_min = (D / B_ref) / (1 + B_noise / B_ref).

Scaling the device count by k from the reference:

* weak scaling (global batch k B_ref, per-device work per step fixed, so the step time stays
  t_ref): S(k B_ref) steps of t_ref; speed-up S_ref / S(k B_ref), at most S_ref / S_min =
  1 + B_noise / B_ref however many devices (the ceiling), while the tokens processed grow to E(k B_ref);
* strong scaling (global batch fixed): S_ref steps of t_ref / k (per-device throughput held, the
  ideal), speed-up k, up to the device count where each device holds one sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ratrain.errors import ConfigError

# Device-count multiples of the reference in the scaling table: 1/4 .. 64
SCALE_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={value!r}: must be a positive finite number")
    return float(value)


@dataclass(frozen=True)
class NoiseScaleLaw:
    """S_min, E_min inferred from a reference run that meets the target loss."""
    noise_scale_tokens: float
    s_min: float
    e_min: float

    @property
    def critical_batch_tokens(self) -> float:
        return self.e_min / self.s_min

    def steps(self, batch_tokens: float) -> float:
        """S(B) = S_min (1 + B_crit / B)."""
        return self.s_min * (1.0 + self.critical_batch_tokens / _positive("batch_tokens", batch_tokens))

    def tokens(self, batch_tokens: float) -> float:
        """E(B) = E_min (1 + B / B_crit)."""
        return self.e_min * (1.0 + _positive("batch_tokens", batch_tokens) / self.critical_batch_tokens)

    def to_json(self) -> dict:
        return {"noise_scale_tokens": self.noise_scale_tokens, "critical_batch_tokens": self.critical_batch_tokens,
                "s_min": self.s_min, "e_min": self.e_min}


def fit_reference(noise_scale_tokens: float, reference_batch_tokens: float, reference_tokens: float) -> NoiseScaleLaw:
    """The law through the reference run (B_ref tokens per step, D tokens in all) with B_crit = B_noise."""
    bn = _positive("noise_scale_tokens", noise_scale_tokens)
    b = _positive("reference_batch_tokens", reference_batch_tokens)
    d = _positive("reference_tokens", reference_tokens)
    return NoiseScaleLaw(bn, s_min=(d / b) / (1.0 + bn / b), e_min=d / (1.0 + b / bn))


def weak_scaling_ceiling(noise_scale_tokens: float, reference_batch_tokens: float) -> float:
    """S_ref / S_min = 1 + B_noise / B_ref: the most weak scaling can ever speed the run up."""
    return 1.0 + _positive("noise_scale_tokens", noise_scale_tokens) / _positive("reference_batch_tokens",
                                                                                 reference_batch_tokens)


def scaling_table(law: NoiseScaleLaw, reference_devices: int, reference_batch_seqs: int, seq: int,
                  reference_step_s: float, reserve_s: float = 0.0, overhead_share: float = 0.0,
                  factors: tuple[float, ...] = SCALE_FACTORS) -> list[dict]:
    """Completion time against device count, weak and strong scaling (see the module docstring).

    Completion = reserve + steps x step x (1 + overhead_share); a device count that is not whole, or
    where the batch would hold less than one sequence per device, is left out."""
    _positive("reference_step_s", reference_step_s)
    ref_batch_tokens = float(reference_batch_seqs * seq)
    s_ref = law.steps(ref_batch_tokens)
    rows = []
    for k in factors:
        devices = reference_devices * k
        if devices < 1 or not float(devices).is_integer():
            continue
        weak_batch = ref_batch_tokens * k
        weak_steps = law.steps(weak_batch)
        strong_step = reference_step_s / k
        weak_s = reserve_s + weak_steps * reference_step_s * (1.0 + overhead_share)
        strong_ok = reference_batch_seqs >= devices       # at least one sequence per device
        strong_s = reserve_s + s_ref * strong_step * (1.0 + overhead_share) if strong_ok else None
        rows.append({"devices": int(devices), "factor": k,
                     "weak": {"batch_tokens": weak_batch, "steps": weak_steps, "tokens": law.tokens(weak_batch),
                              "step_s": reference_step_s, "completion_days": weak_s / 86400.0,
                              "speedup": s_ref / weak_steps},
                     "strong": {"batch_tokens": ref_batch_tokens, "steps": s_ref,
                                "tokens": law.tokens(ref_batch_tokens),
                                "step_s": strong_step,
                                "completion_days": None if strong_s is None else strong_s / 86400.0,
                                "speedup": k if strong_ok else None}})
    return rows


__all__ = ["NoiseScaleLaw", "SCALE_FACTORS", "fit_reference", "scaling_table", "weak_scaling_ceiling"]

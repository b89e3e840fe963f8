"""What lives in host memory instead of on the device, and what that leaves on the device.

Targets (``--offload``, comma separated):

- ``optimizer``: Adam's moments m and v (8 B per parameter of the local shard);
- ``master``: the FP32 master weights (4 B per parameter of the local shard);
- ``grads``: the gradients the update reads; they live in host memory only with a host-side
  optimizer (``host_adam``), which reads them there, so ``grads`` needs ``host_adam``, and
  ``host_adam`` implies ``optimizer``, ``master`` and ``grads``. The device keeps its FP16
  accumulation buffer (the backward adds into it); a 32-bit main gradient (Megatron's) lives on the
  host instead;
- ``activations``: each micro-batch's saved layer activations (checkpoints under ckpt/fsr, the
  full set under full) go to the host after the layer's forward and come back before the layer's
  backward (its recovery under fsr) needs them.

The memory model (``ratrain.spec.memory.stage_memory(..., offload=...)``) frees those terms on the
device and adds the device buffers the transfers need (each buffer lives at both ends for a
transfer's duration): the layer states in flight for a device-side update (two layers': one
arriving, one being updated and written back), the reloaded activations (``2 + reload_lookahead``
layer sets: one leaving, the ones arriving ahead of their backward and the one in use), and, for
a host-side update whose gradients are converted to 32-bit on the device, the converted gradient of
one layer. No buffer exceeds the term it replaces, so offloading never raises the device peak.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ratrain.errors import ConfigError

OFFLOAD_TARGETS = ("optimizer", "master", "grads", "activations")
CONVERT_CHOICES = ("auto", "device", "host")
MASTER_BYTES = 4          # FP32 master weight per parameter
MOMENT_BYTES = 8          # Adam m and v, FP32 each
GRAD16, GRAD32 = 2, 4


@dataclass(frozen=True)
class Offload:
    """Offload targets and the host-side update.

    convert: where gradients become 32-bit for a host-side update: ``device`` (the device converts
    and sends 32-bit), ``host`` (the device sends 16-bit, the host converts) or ``auto`` (the faster
    on the platform, ``ratrain.sim.offload.conversion_choice``).
    reload_lookahead: how many compute tasks ahead of its consumer an activation reload may start.
    """
    targets: tuple[str, ...] = ()
    host_adam: bool = False
    convert: str = "auto"
    reload_lookahead: int = 1

    def __post_init__(self) -> None:
        targets = tuple(self.targets)
        for t in targets:
            if t not in OFFLOAD_TARGETS:
                raise ConfigError(f"offload target {t!r} is not one of {', '.join(OFFLOAD_TARGETS)}")
        if "grads" in targets and not self.host_adam:
            raise ConfigError("offload target 'grads' needs the host-side optimizer (--host-adam): gradients in "
                              "host memory are read there")
        if self.host_adam:
            targets += ("optimizer", "master", "grads")
        object.__setattr__(self, "targets", tuple(t for t in OFFLOAD_TARGETS if t in targets))
        if self.convert not in CONVERT_CHOICES:
            raise ConfigError(f"gradient conversion must be one of {', '.join(CONVERT_CHOICES)}, got {self.convert!r}")
        k = self.reload_lookahead
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ConfigError(f"reload lookahead must be an integer >= 0 compute tasks, got {k!r}")

    @classmethod
    def parse(cls, text: str | None, **options) -> "Offload":
        """``optimizer,master,...`` (empty or None: nothing offloaded unless ``host_adam``)."""
        names = tuple(x.strip() for x in (text or "").split(",") if x.strip())
        return cls(targets=names, **options)

    def has(self, target: str) -> bool:
        return target in self.targets

    @property
    def state_bytes_per_param(self) -> int:
        """Bytes of the local shard's optimizer state held on the host per parameter."""
        return (MOMENT_BYTES if self.has("optimizer") else 0) + (MASTER_BYTES if self.has("master") else 0)

    def to_json(self) -> dict:
        return {"targets": list(self.targets), "host_adam": self.host_adam, "convert": self.convert,
                "reload_lookahead": self.reload_lookahead}


def _shard(count: int, d: int) -> int:
    return math.ceil(count / d)


def offload_stage_terms(bd: dict[str, int], off: Offload, *, params: int, biggest: int, dp: int, zero: int,
                        n_act: int, n_layers: int, per_layer_act: int, tokens: int, grad_bytes: int,
                        host_path_convert: bool) -> tuple[dict[str, int], dict[str, int]]:
    """Eq. 9's terms of one stage with ``off`` applied: (device terms, host-memory terms).

    ``bd``: the resident terms; ``per_layer_act``: one layer's saved set of one micro-batch;
    ``tokens``: the resident token ids and masks (never offloaded); ``host_path_convert``: a host-side
    update's gradients cross as 16-bit (the host converts)."""
    dev, host = dict(bd), {}
    shard = _shard(params, dp) if zero >= 1 else params
    big_shard = _shard(biggest, dp) if zero >= 1 else biggest
    state = off.state_bytes_per_param
    if state:
        freed = min(shard * state, bd["optimizer"])
        dev["optimizer"] = bd["optimizer"] - freed
        host["optimizer_state"] = freed
        # a device-side update streams the offloaded state in and out: two layers' worth at once
        dev["host_state_buffer"] = 0 if off.host_adam else min(freed, 2 * big_shard * state)
    if off.host_adam:
        if grad_bytes > GRAD16:      # the 32-bit main gradient lives on the host
            grad_shard = _shard(params, dp) if zero >= 2 else params
            dev["gradients"] = grad_shard * GRAD16
        host["gradients"] = shard * GRAD32
        dev["grad_convert_buffer"] = 0 if host_path_convert else big_shard * GRAD32
        host["grad_convert_buffer"] = big_shard * GRAD16 if host_path_convert else 0
    if off.has("activations"):
        key = "saved_activations" if bd.get("saved_activations", 0) else "checkpoints"
        resident = bd[key] - tokens
        buffer = min(resident, (2 + off.reload_lookahead) * per_layer_act)
        dev[key] = tokens + buffer
        host["activations"] = n_act * n_layers * per_layer_act
    return dev, host


__all__ = ["CONVERT_CHOICES", "MASTER_BYTES", "MOMENT_BYTES", "OFFLOAD_TARGETS", "Offload", "offload_stage_terms"]

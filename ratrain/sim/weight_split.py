"""How much of each layer's backward is the weight gradient W (what zb-h1 defers).

A projection's backward is two GEMMs: the input gradient dX = dY W^T (which the
stage below waits for) and the weight gradient dW = X^T dY (which it does not).
The latency profile keeps every GEMM it timed (``OpProfile.gemms``: forward,
dX, dW in that order), so W of a layer is the sum of its projections' dW GEMMs;
the embedding's backward (a scatter-add into its weight gradient) is W too.
Everything else in the backward (attention, norms, element-wise ops, the TP
all-reduces and ZeRO-3 gathers the cost model adds) is B. The share is taken
against the layer's ``backward_ms`` in the costs (recompute excluded).

Without a profile (uniform costs) the share is a parameter: the CLI's
``--t-backward-weight`` (default half of ``--t-backward``).

Memory: between B and W a layer keeps only what W reads, the input and the
output gradient of each projection GEMM (``weight_gradient_bytes``); the
simulator's ``activation_residency`` takes it per layer.
"""
from __future__ import annotations

from ratrain.cost.tasks import PipelineCosts
from ratrain.errors import ConfigError
from ratrain.spec.models import FP16, ModelSpec, check_tp

DEFAULT_WEIGHT_FRACTION = 0.5    # dX and dW GEMMs of a projection have equal MACs


def _ops_weight_ms(ops) -> float:
    total = 0.0
    for op in ops:
        if op.kind == "gemm":
            if len(op.gemms) != 3:
                raise ConfigError(f"layer profile: GEMM op {op.name!r} has {len(op.gemms)} timed GEMMs, "
                                  "expected forward, dX and dW")
            total += float(op.gemms[2][3])
        elif op.kind == "embedding":
            total += float(op.backward_s)
    return 1e3 * total


def weight_gradient_ms(profile) -> dict[str, float]:
    """The weight-gradient milliseconds of a ``LayerProfile``: a transformer layer ('layer'), and
    what the embedding ('first') and the final norm + LM head ('last') add."""
    return {"layer": _ops_weight_ms(profile.ops), "first": _ops_weight_ms(profile.first_ops),
            "last": _ops_weight_ms(profile.last_ops)}


def weight_fractions(costs: PipelineCosts, profile) -> tuple[float, ...]:
    """Per global layer (model order), W's share of its ``backward_ms`` in ``costs``, from the
    profile's dW GEMMs; layer 0 adds the embedding, the last layer the LM head. Capped at 1."""
    w = weight_gradient_ms(profile)
    flat = [lc for layers in costs.stages for lc in layers]
    out = []
    for i, lc in enumerate(flat):
        ms = w["layer"] + (w["first"] if i == 0 else 0.0) + (w["last"] if i == len(flat) - 1 else 0.0)
        out.append(min(1.0, ms / lc.backward_ms) if lc.backward_ms > 0 else 0.0)
    return tuple(out)


def weight_gradient_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, *, first: bool = False,
                          last: bool = False) -> int:
    """Bytes one layer and micro-batch keeps from the end of B to the end of W (FP16, one TP rank):
    the inputs of its projection GEMMs (q/k/v: the normed input; o: the attention context; gate/up:
    the normed residual; down: the SwiGLU output) and their output gradients (dq, dk, dv, d(o out),
    d gate, d up, d(down out)). Layer 0 adds the embedding's output gradient, the last layer the LM
    head's input and output gradient (the logits' gradient)."""
    check_tp(spec, tp)
    m = micro_batch * seq
    h, d, f = spec.hidden, spec.head_dim, spec.ffn // tp
    q, kv = spec.heads // tp * d, spec.kv_heads // tp * d
    inputs = h + q + h + f
    grads = (q + 2 * kv) + h + 2 * f + h
    extra = (h if first else 0) + ((h + spec.vocab // tp) if last else 0)
    return m * (inputs + grads + extra) * FP16


def layer_weight_gradient_bytes(spec: ModelSpec, num_layers: int, micro_batch: int, seq: int,
                                tp: int = 1) -> list[int]:
    """``weight_gradient_bytes`` for every global layer of a ``num_layers``-layer pipeline."""
    return [weight_gradient_bytes(spec, micro_batch, seq, tp, first=i == 0, last=i == num_layers - 1)
            for i in range(num_layers)]


__all__ = ["DEFAULT_WEIGHT_FRACTION", "layer_weight_gradient_bytes", "weight_fractions", "weight_gradient_bytes",
           "weight_gradient_ms"]

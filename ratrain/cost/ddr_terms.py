"""Which emulated DDR access pattern models each bandwidth-bound training term.

The emulator measures access patterns by their own names (``mtemu.ddr_probe.PATTERNS``, measured
by ``mtemu.ddr_probe.pattern_bandwidth``); the training terms are ratrain's vocabulary, so the map
from one to the other lives here. A term's time is its bytes over the rate of its pattern
(``ratrain.cost.profile.ddr_rates`` stores the rates of ``profile.DDR_TERMS`` in each profile).
"""
from __future__ import annotations

from ratrain.errors import ConfigError

# training term -> probe pattern (mtemu.ddr_probe.PATTERNS_BY_NAME)
TERM_PATTERNS: dict[str, str] = {
    "optimizer_update": "adam",              # UpdateShard: 28 B per parameter of the local shard
    "parameter_copy": "param_copy",          # a working-weight copy DDR -> DDR
    "prefetch_write": "bulk_write",          # PrefetchW: gathered FP16 weights streamed into DDR
    "elementwise": "read_write",             # norms, residuals, SwiGLU, rotary: stream in, stream out
    "embedding": "read_write",               # gathered 8 KiB+ rows in, activations out
    "loss": "read_write",                    # logits in, gradient out
    "gradient_accumulate": "grad_accumulate",
    "activation_store": "bulk_write",        # checkpoint / offload of activations
    "activation_load": "bulk_read",          # recovery reload of saved activations
}


def term_pattern(term: str) -> str:
    """The probe pattern of a training term (an error lists the known terms)."""
    pattern = TERM_PATTERNS.get(term) if isinstance(term, str) else None
    if pattern is None:
        raise ConfigError(f"unknown training term {term!r} (known: {', '.join(sorted(TERM_PATTERNS))})")
    return pattern


__all__ = ["TERM_PATTERNS", "term_pattern"]

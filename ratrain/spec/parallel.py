"""Parallel training configuration c = (P, D, T, Z, b, A, pi_act, pi_pref) and layer partitioning.

Beyond the paper's dimensions: expert parallelism EP (the experts of a MoE layer spread over EP
devices, carved out of the D x CP data-parallel ranks as Megatron-Core and DeepSpeed-MoE do: it
adds no devices) with its routing choices (capacity factor, hot experts; ``ratrain.spec.moe``),
and context parallelism CP (each sequence split over CP devices, a dimension of its own:
P x D x T x CP devices; the CP ranks hold the same weights, so gradients are reduced and ZeRO
shards over D x CP).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from ratrain.errors import ConfigError
from ratrain.spec.models import layer_parameter_count, stage_edge_parameters
from ratrain.spec.moe import Routing

# The paper's activation policies: what the planner searches and the simulator runs.
ACTIVATION_POLICIES = ("full", "ckpt", "fsr")
# Every mode a configuration may name: the policies plus Megatron's selective recomputation
# (the attention core recomputed in backward, so its seq x seq tensors are not stored), which
# the memory model counts (ratrain.spec.memory).
ACTIVATION_MODES = ACTIVATION_POLICIES + ("selective",)
PREFETCH_POLICIES = ("layerwise", "bulk")
PARTITIONS = ("balanced", "uniform")
ZERO_STAGES = (0, 1, 2, 3)
_ACT_LABEL = {"full": "Full", "ckpt": "Ckpt", "fsr": "FSR", "selective": "Selective"}


@dataclass(frozen=True)
class ParallelConfig:
    pp: int = 1                   # P, pipeline stages
    dp: int = 1                   # D, data-parallel replicas
    tp: int = 1                   # T, tensor-parallel ranks per stage
    zero: int = 2                 # Z, ZeRO stage over the D replicas (0..3)
    micro_batch: int = 1          # b, sequences per micro-batch
    accum: int = 1                # A, micro-batches per step per replica
    seq: int = 2048               # tokens per sequence
    activation: str = "fsr"       # 'full' | 'ckpt' | 'fsr' | 'selective'
    prefetch: str = "layerwise"   # 'layerwise' | 'bulk'
    partition: str = "balanced"   # 'balanced' (parameter-balanced) | 'uniform' (equal layer counts)
    ep: int = 1                   # expert parallelism (MoE models), out of the D x CP data ranks
    cp: int = 1                   # context parallelism: devices one sequence is split over
    capacity_factor: float | None = None     # MoE capacity factor c (None: dropless)
    hot_share: float = 0.0        # MoE routing imbalance: share of hot experts
    hot_load: float = 1.0         # ... and their load over the mean

    def __post_init__(self) -> None:
        for name in ("pp", "dp", "tp", "micro_batch", "accum", "seq"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"parallel config: {name} must be a positive integer, got {value!r}")
        if isinstance(self.zero, bool) or not isinstance(self.zero, int) or self.zero not in ZERO_STAGES:
            raise ConfigError(f"parallel config: zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.activation not in ACTIVATION_MODES:
            raise ConfigError(f"parallel config: activation must be one of {', '.join(ACTIVATION_MODES)}, "
                              f"got {self.activation!r}")
        if self.prefetch not in PREFETCH_POLICIES:
            raise ConfigError(f"parallel config: prefetch must be one of {', '.join(PREFETCH_POLICIES)}, "
                              f"got {self.prefetch!r}")
        if self.partition not in PARTITIONS:
            raise ConfigError(f"parallel config: partition must be one of {', '.join(PARTITIONS)}, "
                              f"got {self.partition!r}")
        for name in ("ep", "cp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"parallel config: {name} must be a positive integer, got {value!r}")
        if (self.dp * self.cp) % self.ep:
            raise ConfigError(f"parallel config: expert parallelism EP={self.ep} must divide the data-parallel "
                              f"ranks D x CP = {self.dp * self.cp}")
        if self.seq % self.cp:
            raise ConfigError(f"parallel config: context parallelism CP={self.cp} must divide the sequence "
                              f"length {self.seq}")
        Routing(self.capacity_factor, self.hot_share, self.hot_load)      # checks c and the imbalance

    @property
    def routing(self) -> Routing:
        return Routing(self.capacity_factor, self.hot_share, self.hot_load)

    @property
    def data_ranks(self) -> int:
        """Ranks holding the same weights: D x CP (gradient reduction, ZeRO sharding)."""
        return self.dp * self.cp

    @property
    def clusters(self) -> int:
        return self.pp * self.dp * self.tp * self.cp

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step over all replicas."""
        return self.dp * self.micro_batch * self.accum

    def describe(self, verbose: bool = False) -> str:
        """Paper-style label, e.g. 'P=8,D=32,Z=2,FSR' (T shown only when > 1)."""
        parts = [f"P={self.pp}", f"D={self.dp}"]
        if self.tp > 1:
            parts.append(f"T={self.tp}")
        parts += [f"{label}={value}" for label, value in (("EP", self.ep), ("CP", self.cp)) if value > 1]
        parts.append(f"Z={self.zero}")
        if verbose:
            parts += [f"b={self.micro_batch}", f"A={self.accum}", f"seq={self.seq}"]
        parts.append(_ACT_LABEL[self.activation])
        if verbose:
            parts += [self.prefetch, self.partition]
        return ",".join(parts)

    def to_json(self) -> dict:
        out = asdict(self)
        for key, default in _MOE_CP_DEFAULTS.items():
            if out[key] == default:
                del out[key]        # a dense, CP=1 configuration's JSON as before
        return out


_MOE_CP_DEFAULTS = {"ep": 1, "cp": 1, "capacity_factor": None, "hot_share": 0.0, "hot_load": 1.0}


def in_flight_microbatches(stage: int, pp: int, accum: int) -> int:
    """N_act(p) = min(P - p, A): micro-batches whose activations stage p holds under 1F1B.

    Stage p runs P - p warm-up forwards before its first backward, and never more than the
    A micro-batches that exist in one step.
    """
    if not 0 <= stage < pp:
        raise ConfigError(f"stage {stage} out of range for P={pp}")
    return min(pp - stage, accum)


def in_flight_activation_sets(schedule: str, stage: int, pp: int, accum: int, virtual_stages: int = 1) -> float:
    """Peak micro-batches' worth of activations stage p keeps under a pipeline schedule's order
    (``ratrain.sim.pipeline_order``), chunks of an interleaved stage counted as 1/v each:

    * 1f1b: min(P - p, A) (Eq. 5's N_act);
    * gpipe: A;
    * zb-h1: min(P, A) on every stage: activations live until the deferred weight gradient W;
    * interleaved (v > 1): (w_p + 1) / v chunks with Megatron's w_p = 2(P - p - 1) + (v - 1)P
      warm-up forwards, at most A (all forwards first when A <= P); v = 1 is 1f1b.

    The simulator measures the same from its timeline (``SimResult.peak_activation_sets``).
    """
    if not 0 <= stage < pp:
        raise ConfigError(f"stage {stage} out of range for P={pp}")
    if accum < 1 or virtual_stages < 1:
        raise ConfigError(f"accum and virtual_stages must be >= 1, got {accum}, {virtual_stages}")
    if schedule == "1f1b" or (schedule == "interleaved" and virtual_stages == 1):
        return float(in_flight_microbatches(stage, pp, accum))
    if schedule == "gpipe":
        return float(accum)
    if schedule == "zb-h1":
        return float(min(pp, accum))
    if schedule == "interleaved":
        total = accum * virtual_stages
        warm = total if accum <= pp else min(total, 2 * (pp - stage - 1) + (virtual_stages - 1) * pp)
        return min(total, warm + 1) / virtual_stages
    raise ConfigError(f"schedule must be one of 1f1b, gpipe, interleaved, zb-h1, got {schedule!r}")


def partition_layers(num_layers: int, pp: int, first_extra: float = 0.0,
                     last_extra: float = 0.0) -> list[range]:
    """Split layers 0..num_layers-1 into `pp` contiguous, non-empty stages.

    Rule: stage p carries a load of (its layer count) + extra_p, where extra_0 = first_extra
    and extra_{P-1} = last_extra are the embedding / LM-head weights in units of one layer
    (0 for a pure layer-count split). We pick the smallest capacity C such that stages
    filled with floor(C - extra_p) layers (at least one each) hold all layers, then take
    surplus layers away one at a time from the most loaded stage, ties going to the lower
    stage index: input-side stages hold more in-flight micro-batches (N_act = P - p), so
    leftover layers end up on the output side.  With no extras this is the usual
    balanced split with the remainder on the last stages.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ConfigError(f"num_layers must be a positive integer, got {num_layers!r}")
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
        raise ConfigError(f"pp must be a positive integer, got {pp!r}")
    if pp > num_layers:
        raise ConfigError(f"pp={pp} exceeds the number of layers ({num_layers}); every stage needs a layer")
    for label, value in (("first_extra", first_extra), ("last_extra", last_extra)):
        if value < 0 or not math.isfinite(value):
            raise ConfigError(f"{label} must be a finite non-negative number, got {value!r}")
    stages, start = [], 0
    for count in _stage_counts(num_layers, pp, first_extra, last_extra):
        stages.append(range(start, start + count))
        start += count
    return stages


@lru_cache(maxsize=4096)
def _stage_counts(num_layers: int, pp: int, first_extra: float, last_extra: float) -> tuple[int, ...]:
    """``partition_layers``' layer counts (valid arguments), memoised: the planner asks for the same
    split of a model once per configuration it reports and per plan."""
    # only the edge stages carry extras (one stage: both), so every middle stage has the same cap and
    # takes layers alike: the split is three counts and the scans over every stage are closed forms
    first = 0.0 + first_extra
    last = first + last_extra if pp == 1 else 0.0 + last_extra
    middle = max(0, pp - 2)
    eps = 1e-9

    def caps(capacity: float) -> tuple[int, int, int]:
        """(stage 0's, each middle stage's, the last stage's) floor(C - extra_p) layers, at least one."""
        return (max(1, math.floor(capacity - first + eps)), max(1, math.floor(capacity - 0.0 + eps)),
                max(1, math.floor(capacity - last + eps)))

    def total(capacity: float) -> int:
        c_first, c_mid, c_last = caps(capacity)
        return c_first if pp == 1 else c_first + middle * c_mid + c_last

    # Candidate capacities are integers plus one of the extras; scan them in increasing order.
    offsets = sorted({e - math.floor(e) for e in (first, last)} | {0.0})
    base = math.floor(num_layers / pp)
    # total() grows with c, so the first integer part k at which any offset fits is found by
    # bisection (a linear scan took ~max(extras) steps: hours for a vocabulary of 10**15); at
    # k = max(extras) + num_layers + 1 every stage alone holds every layer
    k_lo = max(0, base - math.ceil(max(first, last)) - 1)
    k_hi = k_lo + math.ceil(max(first, last)) + num_layers + 2
    # the bisection starts from the average load's capacity and its neighbours, which hold the answer
    # unless a stage is at its one-layer minimum: any bracket of the first k that fits gives that k
    guess = min(max(k_lo, math.floor((num_layers + first + last) / pp - offsets[-1])), k_hi)
    if total(guess + offsets[-1]) >= num_layers:
        if guess - 1 < k_lo or total(guess - 1 + offsets[-1]) < num_layers:
            k_lo = k_hi = guess
        else:
            k_hi = guess - 1
    elif guess + 1 <= k_hi and total(guess + 1 + offsets[-1]) >= num_layers:
        k_lo = k_hi = guess + 1
    else:
        k_lo = min(guess + 2, k_hi)
    while k_lo < k_hi:
        mid = (k_lo + k_hi) // 2
        if total(mid + offsets[-1]) >= num_layers:
            k_hi = mid
        else:
            k_lo = mid + 1
    capacity = next(k_lo + off for off in offsets if total(k_lo + off) >= num_layers)
    c_first, level, c_last = caps(capacity)
    surplus = (c_first if pp == 1 else c_first + middle * level + c_last) - num_layers
    # Take the surplus away one layer at a time from the most loaded stage that has more than one, ties to
    # the lower index (the load key (count + extra, -p)). The middle stages give theirs in index order: the
    # first ``taken`` of them hold level - 1 layers, the others level, so the one to compare is stage taken + 1;
    # while it is the most loaded, so is each middle stage after it at that level: those go at once.
    taken = 0
    while surplus > 0:
        offers = []
        if c_first > 1:
            offers.append((c_first + first, 0))
        if middle and level > 1:
            offers.append((level + 0.0, -(taken + 1)))
        if pp > 1 and c_last > 1:
            offers.append((c_last + last, -(pp - 1)))
        _, best = max(offers)
        if best == 0:
            c_first -= 1
            surplus -= 1
        elif best == -(pp - 1):
            c_last -= 1
            surplus -= 1
        else:
            step = min(surplus, middle - taken)
            taken += step
            surplus -= step
            if taken == middle:
                level, taken = level - 1, 0
    counts = [c_first] if pp == 1 else [c_first] + [level - 1] * taken + [level] * (middle - taken) + [c_last]
    return tuple(counts)


def partition_model(spec, pp: int, rule: str = "balanced") -> list[range]:
    """Partition a model's layers over `pp` stages.

    'balanced': parameter-balanced; the embedding counts on stage 0 and the final norm +
    LM head on stage P-1, both measured in layers' worth of parameters.
    'uniform': equal layer counts (remainder on the last stages); the embedding and LM head
    simply sit on top of stage 0 and stage P-1.
    """
    if rule == "uniform":
        return partition_layers(spec.layers, pp)
    if rule != "balanced":
        raise ConfigError(f"partition must be one of {', '.join(PARTITIONS)}, got {rule!r}")
    # TP (vocab-parallel embedding, split projections) shrinks both sides alike, so the
    # ratio uses whole-model counts.
    per_layer = layer_parameter_count(spec)
    first, last = stage_edge_parameters(spec, pp)
    first, last = first / per_layer, last / per_layer
    return partition_layers(spec.layers, pp, first_extra=first, last_extra=last)

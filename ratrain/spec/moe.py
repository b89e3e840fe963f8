"""Mixture-of-experts layers: the layer's shape, token routing with a capacity factor, and where
the routed tokens land under expert parallelism.

A MoE layer replaces the dense MLP by a router (a hidden x E GEMM and a softmax over E) and E
experts, each a SwiGLU MLP of ``expert_ffn``; every token is dispatched to its top ``k`` experts,
and ``shared_experts`` always-on experts (together ``shared_ffn`` wide, as one SwiGLU MLP) see
every token. Expert parallelism EP spreads the E experts over EP devices (E/EP each, experts
0..E/EP-1 on the first device, and so on); the routed tokens travel there and back by
all-to-all.

Routing of one all-to-all group (``tokens`` tokens, ``tokens x k`` dispatches):

* imbalance: ``hot_share`` of the experts (rounded to whole experts) are hot, each receiving
  ``hot_load`` times the mean load ``tokens x k / E``; the cold experts share the rest evenly.
  Loads are whole dispatches: a hot expert gets round(hot_load x mean), the cold ones the rest,
  the remainder one each to the lowest-numbered cold experts. The hot experts are the lowest
  numbered, so they sit together on the first devices (the worst placement).
* capacity factor c: each expert takes at most C = floor(c x tokens x k / E) dispatches; the
  rest are dropped (their tokens skip the expert, as GShard and Switch do), and every expert runs
  exactly C rows, the missing ones zero padding. Without a capacity factor routing is dropless:
  each expert runs its load, no padding.
* the step waits for the busiest device: its rows (the sum over its experts) set the expert
  GEMMs' time and the volume of its all-to-all.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction

from ratrain.errors import ConfigError
from rtcommon.checks import is_finite_number, is_integer, show_value

# Largest accepted expert count (public MoE models use up to a few hundred)
MAX_EXPERTS = 2 ** 16


@dataclass(frozen=True)
class MoeSpec:
    """The MoE part of a model: experts E, experts per token k, expert FFN width, shared experts."""
    experts: int
    experts_per_token: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int = 0           # total intermediate width of the shared experts (0: none)

    def __post_init__(self) -> None:
        for name in ("experts", "experts_per_token", "expert_ffn"):
            value = getattr(self, name)
            if not is_integer(value) or value <= 0:
                raise ConfigError(f"MoE field {name} must be a positive integer, got {show_value(value)}")
        if self.experts > MAX_EXPERTS:
            raise ConfigError(f"MoE field experts = {self.experts} is above {MAX_EXPERTS}")
        if self.experts_per_token > self.experts:
            raise ConfigError(f"MoE experts_per_token k = {self.experts_per_token} exceeds the experts "
                              f"E = {self.experts} (a token picks k of E experts)")
        for name in ("shared_experts", "shared_ffn"):
            value = getattr(self, name)
            if not is_integer(value) or value < 0:
                raise ConfigError(f"MoE field {name} must be an integer >= 0, got {show_value(value)}")
        if (self.shared_experts > 0) != (self.shared_ffn > 0):
            raise ConfigError(f"MoE shared_experts = {self.shared_experts} and shared_ffn = {self.shared_ffn} "
                              f"must be both zero or both positive")

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Routing:
    """Routing choices of a run: the capacity factor (None: dropless) and the imbalance."""
    capacity_factor: float | None = None
    hot_share: float = 0.0        # share of the experts that are hot, in [0, 1]
    hot_load: float = 1.0         # a hot expert's load over the mean load, >= 1

    def __post_init__(self) -> None:
        c = self.capacity_factor
        if c is not None and (not is_finite_number(c) or c <= 0):
            raise ConfigError(f"capacity factor must be a finite number > 0, got {show_value(c)}")
        if not is_finite_number(self.hot_share) or not 0 <= self.hot_share <= 1:
            raise ConfigError(f"hot-experts share must be in [0, 1], got {show_value(self.hot_share)}")
        if not is_finite_number(self.hot_load) or self.hot_load < 1:
            raise ConfigError(f"hot-experts load must be a finite number >= 1 (times the mean), "
                              f"got {show_value(self.hot_load)}")

    @property
    def balanced(self) -> bool:
        return self.hot_share == 0 or self.hot_load == 1

    def to_json(self) -> dict:
        return asdict(self)


def hot_expert_count(experts: int, routing: Routing) -> int:
    """Whole hot experts: round(hot_share x E), at least one when the share is positive."""
    if routing.balanced:
        return 0
    return max(1, round(routing.hot_share * experts))


def expert_loads(experts: int, k: int, tokens: int, routing: Routing) -> list[int]:
    """Dispatches per expert for ``tokens`` tokens routed to ``k`` experts each (module docstring)."""
    total = tokens * k
    hot = hot_expert_count(experts, routing)
    if hot == 0:
        base, extra = divmod(total, experts)
        return [base + (1 if e < extra else 0) for e in range(experts)]
    if hot * routing.hot_load > experts + 1e-12:
        raise ConfigError(f"hot experts: {hot} of {experts} experts at {routing.hot_load:g} x the mean load "
                          f"would take more than every dispatch (need hot experts x load <= E)")
    hot_each = min(round(routing.hot_load * total / experts), total // hot)
    rest = total - hot * hot_each
    cold = experts - hot
    if cold == 0:
        base, extra = divmod(total, experts)
        return [base + (1 if e < extra else 0) for e in range(experts)]
    base, extra = divmod(rest, cold)
    return [hot_each] * hot + [base + (1 if e < extra else 0) for e in range(cold)]


def expert_capacity(capacity_factor: float, tokens: int, k: int, experts: int) -> int:
    """C = floor(c x tokens x k / E), in exact arithmetic (c is the float as given)."""
    return math.floor(Fraction(capacity_factor) * tokens * k / experts)


@dataclass(frozen=True)
class RoutingReport:
    """One micro-batch's routing in one all-to-all group of ``ep`` devices."""
    capacity_factor: float | None
    capacity: int | None          # rows per expert (None: dropless)
    dispatches: int               # tokens x k
    dropped: int
    dropped_fraction: float
    executed_rows: int            # over all experts, padding included
    padding_fraction: float       # executed rows that are zero padding
    busiest_device_rows: int
    mean_device_rows: float       # dispatches / ep: the balanced, dropless rows per device
    load_factor: float            # busiest device rows / mean device rows
    max_expert_load: int
    dropless_capacity_factor: float   # the smallest c that drops nothing

    def to_json(self) -> dict:
        return asdict(self)


def dropless_capacity_factor(loads: list[int], tokens: int, k: int) -> float:
    """The smallest float c with floor(c x tokens x k / E) >= the largest load: max load x E / (tokens x k),
    rounded up to the next float where the division rounded it down."""
    exact = Fraction(max(loads) * len(loads), tokens * k)
    c = float(exact)
    return c if Fraction(c) >= exact else math.nextafter(c, math.inf)


def route(moe: MoeSpec, tokens: int, ep: int, routing: Routing) -> RoutingReport:
    """Routing of ``tokens`` tokens (one micro-batch on each of the ``ep`` devices of the group:
    ``tokens`` counts the group's) over ``moe.experts`` experts spread over ``ep`` devices."""
    E, k = moe.experts, moe.experts_per_token
    if not is_integer(ep) or ep < 1 or E % ep:
        raise ConfigError(f"expert parallelism EP = {show_value(ep)} must divide the experts E = {E}")
    loads = expert_loads(E, k, tokens, routing)
    dispatches = tokens * k
    c = routing.capacity_factor
    if c is None:
        capacity, rows, dropped = None, loads, 0
    else:
        capacity = expert_capacity(c, tokens, k, E)
        rows = [capacity] * E
        dropped = sum(max(0, load - capacity) for load in loads)
    executed = sum(rows)
    useful = dispatches - dropped
    per = E // ep
    busiest = max(sum(rows[d * per:(d + 1) * per]) for d in range(ep))
    mean = dispatches / ep
    return RoutingReport(capacity_factor=c, capacity=capacity, dispatches=dispatches, dropped=dropped,
                         dropped_fraction=dropped / dispatches, executed_rows=executed,
                         padding_fraction=(executed - useful) / executed if executed else 0.0,
                         busiest_device_rows=busiest, mean_device_rows=mean, load_factor=busiest / mean,
                         max_expert_load=max(loads),
                         dropless_capacity_factor=dropless_capacity_factor(loads, tokens, k))


# Capacity factors every routing report lists (Switch and GShard used 1 to 2)
REPORT_CAPACITY_FACTORS = (1.0, 1.25, 1.5, 2.0)


def capacity_factors(extra: tuple[float, ...] = (), chosen: float | None = None) -> tuple[float, ...]:
    """The report's capacity factors: REPORT_CAPACITY_FACTORS, ``extra`` and the chosen one, sorted."""
    return tuple(sorted(set(REPORT_CAPACITY_FACTORS) | set(extra) | ({chosen} if chosen is not None else set())))


def capacity_sweep(moe: MoeSpec, tokens: int, ep: int, routing: Routing,
                   factors: tuple[float, ...] = REPORT_CAPACITY_FACTORS) -> dict:
    """The routing report at each capacity factor, dropless, and the c at which nothing drops."""
    rows = [route(moe, tokens, ep, Routing(c, routing.hot_share, routing.hot_load)).to_json() for c in factors]
    dropless = route(moe, tokens, ep, Routing(None, routing.hot_share, routing.hot_load))
    return {"per_capacity_factor": rows, "dropless": dropless.to_json(),
            "no_drop_capacity_factor": dropless.dropless_capacity_factor}


__all__ = ["MAX_EXPERTS", "REPORT_CAPACITY_FACTORS", "MoeSpec", "Routing", "RoutingReport", "capacity_factors",
           "capacity_sweep", "dropless_capacity_factor",
           "expert_capacity", "expert_loads", "hot_expert_count", "route"]

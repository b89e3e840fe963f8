"""Per-stage operation orders of the pipeline schedules, and where each layer lives.

An order is a list of ops ``(kind, microbatch, chunk)`` per stage (stage 0 is
the input side). ``kind`` is ``F`` (forward), ``B`` (backward; the whole
backward except under ``zb-h1``, where it is only the input gradient) or ``W``
(``zb-h1`` only: the weight gradient). ``chunk`` is the stage-local model chunk
(always 0 except under ``interleaved``); the global chunk is
``chunk * stages + stage``. The simulator expands each op into per-layer
tasks; the order itself never changes (RATrain only schedules work around it).

Schedules:

* ``1f1b``: warm-up min(P-p-1, A) forwards, then F/B pairs, then the cool-down backwards.
* ``gpipe``: all forwards, then all backwards.
* ``interleaved`` (Megatron's interleaved 1F1B): the layers are cut into P*v
  chunks, chunk c on stage c mod P. Virtual micro-batches run in groups of P
  micro-batches (the last group may be smaller), each group chunk by chunk
  (forwards: chunks 0..v-1; backwards: chunks v-1..0). Stage p runs
  2(P-p-1) + (v-1)P warm-up forwards (all forwards first when A <= P), then
  alternates F and B, then the cool-down backwards. A must be a multiple of P
  when A > P (Megatron's rule, ``interleaved_microbatches_ok``: with a smaller
  last group this warm-up can deadlock, e.g. P=4, A=5, v=3). With v = 1 it is
  ``1f1b`` (Megatron runs its non-interleaved schedule then).
* ``zb-h1`` (the zero-bubble paper's H1): the 1F1B order of F and B, where B is
  only the input gradient; stage p holds back its first p weight gradients W,
  then runs W of the oldest pending micro-batch after each B (1F-1B-1W) and the
  held-back ones at the end, filling the tail bubbles. Every stage then keeps at
  most min(P, A) micro-batches' activations (they live until W), as much as
  1F1B's first stage.

A schedule is one value, :class:`PipelineSchedule` (name, v, W's share, chunk
sizes), validated once when it is made; the planner, the simulator, the CLIs
and the reproduction all pass it, and names are parsed into it at the edges
(``PipelineSchedule.of``).

Text form (debugging): ``format_order`` writes one line per stage,
``S0: F0 F1 B0 F2 B1 W0 ...``, an op as kind + micro-batch, with ``.chunk``
appended when some op of the order has a chunk above 0 (interleaved:
``F0.1``); ``parse_order`` reads it back (round-trip).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ratrain.errors import ConfigError
from ratrain.spec.models import ModelSpec
from ratrain.spec.parallel import ParallelConfig, partition_model

Op = tuple[str, int, int]          # (kind, microbatch, stage-local chunk)
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")
OP_KINDS = ("F", "B", "W")


def _check_count(name: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"schedule: {name} must be an integer >= {minimum}, got {v!r}")
    return v


def _check(stages: int, microbatches: int) -> None:
    _check_count("stages", stages)
    _check_count("microbatches", microbatches)


def interleaved_microbatches_ok(stages: int, microbatches: int) -> bool:
    """Megatron's rule for interleaved 1F1B (v > 1): the micro-batches per step A are at most the
    stages P (every forward runs first) or a multiple of P (full groups of P micro-batches). The one
    place this rule is written; the order, the simulator's flags and the planner ask it."""
    return microbatches <= stages or microbatches % stages == 0


@dataclass(frozen=True)
class PipelineSchedule:
    """A schedule by name plus what it needs beyond P and A.

    virtual_stages: model chunks per stage (``interleaved`` only; 1 otherwise).
    weight_fraction: the share of each layer's backward (recompute excluded) that
    is the weight gradient W (``zb-h1`` only): one number for every layer, or one
    per global layer in model order. The input gradient B is the rest.
    chunk_sizes: ``interleaved`` only: layers per chunk in model order (P*v
    entries); None cuts the layers as evenly as possible (``interleaved_chunks``).
    Model-driven runs pass their partition rule applied to P*v parts.

    Validation, here only: ``name`` in ``SCHEDULES``; ``virtual_stages`` an integer >= 1, above 1
    only for ``interleaved`` (v = 1 orders as 1f1b); ``weight_fraction`` in [0, 1]; what depends on
    P and A (Megatron's micro-batch rule) is ``check_layout``. Two schedules are equal when all four
    fields are (the planner's choices carry the defaults: name and v say it all).
    """
    name: str = "1f1b"
    virtual_stages: int = 1
    weight_fraction: float | tuple[float, ...] = 0.5
    chunk_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.name!r}")
        _check_count("virtual_stages", self.virtual_stages)
        if self.virtual_stages > 1 and self.name != "interleaved":
            raise ConfigError(f"schedule {self.name!r} has one chunk per stage; virtual_stages="
                              f"{self.virtual_stages} needs schedule 'interleaved'")
        wf = self.weight_fraction
        values = wf if isinstance(wf, (tuple, list)) else (wf,)
        if isinstance(wf, list):
            object.__setattr__(self, "weight_fraction", tuple(wf))
        if self.chunk_sizes is not None:
            if self.name != "interleaved":
                raise ConfigError(f"schedule {self.name!r}: chunk_sizes is for schedule 'interleaved'")
            object.__setattr__(self, "chunk_sizes", tuple(self.chunk_sizes))
            for n in self.chunk_sizes:
                _check_count("chunk_sizes entries", n)
        for x in values:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or not 0 <= x <= 1:
                raise ConfigError(f"schedule: weight_fraction must be in [0, 1] (the weight gradient's share of "
                                  f"the backward), got {x!r}")

    @classmethod
    def of(cls, schedule: "str | PipelineSchedule") -> "PipelineSchedule":
        """A PipelineSchedule from a name (defaults for the rest) or itself."""
        if isinstance(schedule, PipelineSchedule):
            return schedule
        if not isinstance(schedule, str):
            raise ConfigError(f"schedule must be a name {SCHEDULES} or a PipelineSchedule, got {schedule!r}")
        return cls(name=schedule)

    @property
    def splits_backward(self) -> bool:
        return self.name == "zb-h1"

    @property
    def chunks_per_stage(self) -> int:
        """Model chunks per stage: v under ``interleaved``, 1 otherwise."""
        return self.virtual_stages if self.name == "interleaved" else 1

    def label(self) -> str:
        """``1f1b``, ``gpipe``, ``zb-h1`` or ``interleaved v=2`` (the planner's tables)."""
        return f"{self.name} v={self.virtual_stages}" if self.name == "interleaved" else self.name

    def runs(self, stages: int, microbatches: int) -> bool:
        """Whether P stages and A micro-batches can run this order (interleaved with v > 1:
        ``interleaved_microbatches_ok``; every other order runs any P, A)."""
        return self.chunks_per_stage == 1 or interleaved_microbatches_ok(stages, microbatches)

    def check_layout(self, stages: int, microbatches: int) -> None:
        """Raise ConfigError when ``runs`` says no, naming P and A."""
        if not self.runs(stages, microbatches):
            raise ConfigError(f"interleaved schedule: the micro-batches per step (A={microbatches}) must be a "
                              f"multiple of the stages (P={stages}) when A > P (Megatron's rule; A <= P runs every "
                              "forward first)")

    def layer_weight_fraction(self, layer: int) -> float:
        """W's share of ``layer``'s backward (0 when the schedule does not split the backward)."""
        if not self.splits_backward:
            return 0.0
        wf = self.weight_fraction
        if isinstance(wf, tuple):
            if not 0 <= layer < len(wf):
                raise ConfigError(f"schedule: weight_fraction has {len(wf)} entries, no entry for layer {layer}")
            return float(wf[layer])
        return float(wf)

    def chunks(self, num_layers: int, stages: int) -> list[range]:
        """The global chunks (chunk g on stage g mod P) of a ``num_layers``-layer model: P chunks for the
        one-chunk schedules, P*v under interleaved (``chunk_sizes`` or the even cut)."""
        if self.name != "interleaved" or self.virtual_stages == 1 and self.chunk_sizes is None:
            return chunk_layers(num_layers, stages)
        if self.chunk_sizes is None:
            return interleaved_chunks(num_layers, stages, self.virtual_stages)
        sizes = self.chunk_sizes
        if len(sizes) != stages * self.virtual_stages or sum(sizes) != num_layers:
            raise ConfigError(f"schedule: chunk_sizes {list(sizes)} must be P x v = {stages * self.virtual_stages} "
                              f"chunks summing to the {num_layers} layers")
        out, start = [], 0
        for n in sizes:
            out.append(range(start, start + n))
            start += n
        return out

    def to_json(self) -> dict:
        wf = self.weight_fraction
        return {"name": self.name, "virtual_stages": self.virtual_stages,
                "weight_fraction": (list(wf) if isinstance(wf, tuple) else wf) if self.splits_backward else None,
                "chunk_sizes": None if self.chunk_sizes is None else list(self.chunk_sizes)}


# ------------------------------------------------------------------ layer placement

def chunk_layers(num_layers: int, chunks: int) -> list[range]:
    """Cut layers 0..num_layers-1 into ``chunks`` contiguous chunks as evenly as possible,
    earlier chunks taking the extra layers; every chunk needs a layer."""
    _check_count("layers", num_layers)
    _check_count("chunks", chunks)
    if chunks > num_layers:
        raise ConfigError(f"cannot cut {num_layers} layers into {chunks} non-empty chunks")
    base, extra = divmod(num_layers, chunks)
    out, start = [], 0
    for c in range(chunks):
        n = base + (1 if c < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def interleaved_chunks(num_layers: int, stages: int, virtual_stages: int) -> list[range]:
    """The P*v chunks of the interleaved schedule (chunk c runs on stage c mod P), with a clear
    error when the virtual-stage count cannot cut the layers."""
    _check_count("stages", stages)
    _check_count("virtual_stages", virtual_stages)
    n = stages * virtual_stages
    if n > num_layers:
        raise ConfigError(f"--virtual-stages {virtual_stages} does not divide the layers: {num_layers} layers "
                          f"cannot be cut into P x v = {stages} x {virtual_stages} = {n} non-empty chunks")
    return chunk_layers(num_layers, n)


def interleaved_chunk_sizes(model: ModelSpec, cfg: ParallelConfig, virtual_stages: int) -> tuple[int, ...]:
    """Layers per chunk of an interleaved layout: the layout's partition rule (``cfg.partition``,
    e.g. parameter-balanced with the embedding on the first and the LM head on the last chunk)
    applied to P x v parts, so each stage carries what the rule gives it under 1F1B."""
    n = cfg.pp * virtual_stages
    if n > model.layers:
        raise ConfigError(f"--virtual-stages {virtual_stages} does not divide the layers: {model.layers} layers "
                          f"cannot be cut into P x v = {cfg.pp} x {virtual_stages} = {n} non-empty chunks")
    return tuple(len(r) for r in partition_model(model, n, cfg.partition))


# ------------------------------------------------------------------ orders

def warmup_forwards(stages: int, microbatches: int, stage: int) -> int:
    """Forwards stage ``stage`` runs before its first backward beyond the first steady-state one (1F1B)."""
    return min(stages - stage - 1, microbatches)


def one_f_one_b(stages: int, microbatches: int) -> list[list[Op]]:
    """Standard non-interleaved 1F1B: warm-up min(P-p-1, A) forwards, then F/B pairs, then cool-down."""
    _check(stages, microbatches)
    orders = []
    for p in range(stages):
        warm = warmup_forwards(stages, microbatches, p)
        ops: list[Op] = [("F", m, 0) for m in range(warm)]
        for i in range(microbatches - warm):      # steady state: one forward, one backward
            ops.append(("F", warm + i, 0))
            ops.append(("B", i, 0))
        ops.extend(("B", m, 0) for m in range(microbatches - warm, microbatches))   # cool-down
        orders.append(ops)
    return orders


def gpipe(stages: int, microbatches: int) -> list[list[Op]]:
    """GPipe fill-drain: all forwards, then all backwards (micro-batch order 0..A-1)."""
    _check(stages, microbatches)
    return [[("F", m, 0) for m in range(microbatches)] + [("B", m, 0) for m in range(microbatches)]
            for _ in range(stages)]


def interleaved_sequence(stages: int, microbatches: int, virtual_stages: int, backward: bool) -> list[tuple[int, int]]:
    """Megatron's virtual micro-batch table: (microbatch, local chunk) in the order every stage
    runs its forwards (``backward=False``) or backwards (chunks reversed)."""
    out = []
    for g0 in range(0, microbatches, stages):
        group = range(g0, min(g0 + stages, microbatches))
        for c in range(virtual_stages):
            chunk = virtual_stages - 1 - c if backward else c
            out.extend((m, chunk) for m in group)
    return out


def interleaved_warmup(stages: int, microbatches: int, virtual_stages: int, stage: int) -> int:
    """Warm-up forwards (virtual micro-batches) of stage ``stage`` in Megatron's interleaved order."""
    total = microbatches * virtual_stages
    if microbatches <= stages:
        return total                       # every forward first (Megatron: A == P)
    return min(total, 2 * (stages - stage - 1) + (virtual_stages - 1) * stages)


def interleaved(stages: int, microbatches: int, virtual_stages: int) -> list[list[Op]]:
    """Megatron's interleaved 1F1B (see the module docstring); v = 1 is 1F1B."""
    _check(stages, microbatches)
    PipelineSchedule("interleaved", virtual_stages).check_layout(stages, microbatches)
    if virtual_stages == 1:
        return one_f_one_b(stages, microbatches)
    fwd = interleaved_sequence(stages, microbatches, virtual_stages, backward=False)
    bwd = interleaved_sequence(stages, microbatches, virtual_stages, backward=True)
    total = len(fwd)
    orders = []
    for p in range(stages):
        warm = interleaved_warmup(stages, microbatches, virtual_stages, p)
        ops: list[Op] = [("F", m, c) for m, c in fwd[:warm]]
        for i in range(total - warm):
            ops.append(("F", *fwd[warm + i]))
            ops.append(("B", *bwd[i]))
        ops.extend(("B", m, c) for m, c in bwd[total - warm:])
        orders.append(ops)
    return orders


def zb_h1(stages: int, microbatches: int) -> list[list[Op]]:
    """The zero-bubble paper's H1 order (see the module docstring)."""
    orders = []
    for p, ops in enumerate(one_f_one_b(stages, microbatches)):
        out: list[Op] = []
        held = 0                    # W's not yet placed, oldest first
        next_w = 0
        for op in ops:
            out.append(op)
            if op[0] == "B":
                held += 1
                if held > p:        # stage p holds back p weight gradients
                    out.append(("W", next_w, 0))
                    next_w += 1
                    held -= 1
        out.extend(("W", m, 0) for m in range(next_w, microbatches))
        orders.append(out)
    return orders


def build(schedule: "str | PipelineSchedule", stages: int, microbatches: int) -> list[list[Op]]:
    """Per-stage orders of ``schedule`` (a name or a PipelineSchedule)."""
    s = PipelineSchedule.of(schedule)
    if s.name == "1f1b":
        return one_f_one_b(stages, microbatches)
    if s.name == "gpipe":
        return gpipe(stages, microbatches)
    if s.name == "interleaved":
        return interleaved(stages, microbatches, s.virtual_stages)
    return zb_h1(stages, microbatches)


def held_activation_sets(ops: list[Op], virtual_stages: int = 1) -> float:
    """Peak activation sets an order keeps alive on its stage, in whole-stage micro-batches
    (a chunk counts 1/v): a set lives from its F to its B (to its W when the order has W's)."""
    release = "W" if any(k == "W" for k, _, _ in ops) else "B"
    cur = peak = 0
    for kind, _, _ in ops:
        if kind == "F":
            cur += 1
            peak = max(peak, cur)
        elif kind == release:
            cur -= 1
    return peak / virtual_stages


# ------------------------------------------------------------------ text form

def op_token(op: Op, chunked: bool) -> str:
    """``F3`` (micro-batch 3), or with ``chunked`` ``F3.1`` (local chunk 1)."""
    kind, m, c = op
    return f"{kind}{m}.{c}" if chunked else f"{kind}{m}"


def format_order(orders: list[list[Op]]) -> str:
    """Per stage one line ``S<p>: <op> <op> ...`` (see the module docstring); chunk indices appear on
    every op when any op has a chunk above 0."""
    chunked = any(c for ops in orders for _, _, c in ops)
    return "\n".join(f"S{p}: " + " ".join(op_token(op, chunked) for op in ops) if ops else f"S{p}:"
                      for p, ops in enumerate(orders))


def parse_order(text: str) -> list[list[Op]]:
    """The orders ``format_order`` wrote: lines ``S<p>: ...`` for p = 0, 1, ... in order (blank lines
    skipped); a token is a kind of ``OP_KINDS``, a micro-batch and optionally ``.chunk``."""
    orders: list[list[Op]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        head, sep, body = line.partition(":")
        if not sep or head.strip() != f"S{len(orders)}":
            raise ConfigError(f"order line {n}: expected 'S{len(orders)}: ...', got {line.strip()!r}")
        ops: list[Op] = []
        for tok in body.split():
            m, dot, c = tok[1:].partition(".")
            if tok[:1] not in OP_KINDS or not m.isdigit() or (dot and not c.isdigit()):
                raise ConfigError(f"order line {n}: bad op {tok!r} (expected e.g. F0, B3, W2 or F0.1)")
            ops.append((tok[0], int(m), int(c) if dot else 0))
        orders.append(ops)
    return orders


__all__ = ["OP_KINDS", "Op", "PipelineSchedule", "SCHEDULES", "build", "chunk_layers", "format_order", "gpipe",
           "held_activation_sets", "interleaved", "interleaved_chunk_sizes", "interleaved_chunks",
           "interleaved_microbatches_ok", "interleaved_sequence", "interleaved_warmup", "one_f_one_b", "op_token",
           "parse_order", "warmup_forwards", "zb_h1"]

"""Sequence-length distributions: how documents of unequal lengths become a step's micro-batches,
and the work each micro-batch's attention and GEMMs do.

A distribution is a list of document lengths in tokens (a file: one length per line, or
``LENGTH COUNT`` per line for a histogram; ``#`` starts a comment). A step needs A micro-batches
of b sequences of the target length S (``ParallelConfig.seq``, the length the latency profile was
taken at) per replica; documents are taken in the file's order (from the start again when they run
out) until those sequences are full. Modes (``PACKINGS``):

* ``pad``: one document per sequence, padded to S (a document longer than S is cut into S-token
  pieces, each its own sequence);
* ``pack``: documents laid end to end and cut at every S tokens, causal over the whole sequence (a
  token attends across document boundaries);
* ``pack-masked``: packed the same way with a document mask: a token attends only within its piece
  of its document;
* ``group``: as ``pad``, then the step's sequences sorted by length and cut into micro-batches in
  that order, each padded only to its own longest sequence.

Work per micro-batch: GEMM and elementwise work follows the executed tokens (padding included);
attention follows causal (query, key) pairs: s(s+1)/2 per causal sequence of s tokens. Two
attention costs (``ATTENTION_COSTS``):

* ``kernel`` (the default): what the emulated kernel computes. The kernel skips the key tiles above
  the diagonal of one causal sequence and knows no padding or document mask, so every executed
  sequence of length s costs s(s+1)/2 pairs: padding and packing at S cost exactly the uniform
  step, a document mask saves nothing;
* ``mask``: the real mask: padding rows attend to nothing and a document mask keeps only the pairs
  inside each document (a variable-length kernel's work), so a micro-batch's attention costs the
  sum of d(d+1)/2 over its documents' pieces d.

A micro-batch's time is the uniform micro-batch's, its GEMM-like part scaled by executed tokens
over b x S and its attention part by pairs over b x S(S+1)/2 (``microbatch_scale``). Equal lengths
of S give scale 1 in every mode: the uniform step exactly.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction

from ratrain.errors import ConfigError
from rtcommon.checks import is_integer, show_value

PACKINGS = ("pad", "pack", "pack-masked", "group")
ATTENTION_COSTS = ("kernel", "mask")
# Largest length distribution read (documents after expanding a histogram) and largest length
MAX_DOCUMENTS = 10 ** 7
MAX_LENGTH = 2 ** 31


def read_lengths(path: str | os.PathLike) -> list[int]:
    """Document lengths from a file: ``LENGTH`` or ``LENGTH COUNT`` per line; ConfigError naming the
    file and line of anything else (a non-positive length or count, a non-integer, an empty file)."""
    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read the length file ({e.__class__.__name__}: {e})") from None
    lengths: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].replace(",", " ").split()
        if not fields:
            continue
        if len(fields) > 2:
            raise ConfigError(f"{where}:{number}: expected LENGTH or LENGTH COUNT, got {line.strip()!r}")
        values = []
        for label, text_value in zip(("length", "count"), fields, strict=False):
            try:
                value = int(text_value)
            except ValueError:
                raise ConfigError(f"{where}:{number}: {label} {text_value!r} is not an integer") from None
            if value <= 0:
                raise ConfigError(f"{where}:{number}: {label} must be a positive integer, got {value}")
            values.append(value)
        length, count = values[0], values[1] if len(values) == 2 else 1
        if length > MAX_LENGTH:
            raise ConfigError(f"{where}:{number}: length {length} is above {MAX_LENGTH}")
        if len(lengths) + count > MAX_DOCUMENTS:
            raise ConfigError(f"{where}:{number}: more than {MAX_DOCUMENTS:,} documents")
        lengths += [length] * count
    if not lengths:
        raise ConfigError(f"{where}: no lengths (one LENGTH or LENGTH COUNT per line)")
    return lengths


def parse_lengths(text: str) -> list[int]:
    """Lengths from the command line: a file name, or a comma-separated list such as 512,2048,4096."""
    items = [x.strip() for x in text.split(",")]
    if os.path.exists(text) or not all(x.lstrip("+-").isdigit() for x in items):
        return read_lengths(text)
    return check_lengths([int(x) for x in items], "--seq-lengths")


def check_lengths(lengths: list[int], where: str = "lengths") -> list[int]:
    if not lengths:
        raise ConfigError(f"{where}: no lengths given")
    for i, value in enumerate(lengths):
        if not is_integer(value) or not 0 < value <= MAX_LENGTH:
            raise ConfigError(f"{where}: entry {i} must be a positive integer up to {MAX_LENGTH}, "
                              f"got {show_value(value)}")
    return list(lengths)


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a step: its sequences' executed length, and the documents' pieces in each."""
    seq: int                                 # executed length of each of its sequences (padded)
    pieces: tuple[tuple[int, ...], ...]      # per sequence, the lengths of its documents' pieces
    tokens_real: int
    tokens_executed: int
    pairs_real: int                          # causal pairs inside each document piece
    pairs_executed: int                      # pairs the attention computes under the chosen cost

    def to_json(self) -> dict:
        return {"seq": self.seq, "sequences": [list(p) for p in self.pieces], "tokens_real": self.tokens_real,
                "tokens_executed": self.tokens_executed, "pairs_real": self.pairs_real,
                "pairs_executed": self.pairs_executed}


def causal_pairs(s: int) -> int:
    """(query, key) pairs of one causal sequence of s tokens: s(s+1)/2."""
    return s * (s + 1) // 2


@dataclass(frozen=True)
class LengthPlan:
    """A step's micro-batches built from a length distribution (module docstring)."""
    packing: str
    attention_cost: str
    seq: int
    micro_batch: int
    microbatches: tuple[MicroBatch, ...]

    @property
    def tokens_reference(self) -> int:
        return self.micro_batch * self.seq

    @property
    def pairs_reference(self) -> int:
        return self.micro_batch * causal_pairs(self.seq)

    def scales(self, linear_ms: float, attention_ms: float) -> tuple[float, ...]:
        """Per micro-batch, its time over the uniform micro-batch's, from the uniform micro-batch's
        GEMM-like and attention times (any unit)."""
        return tuple(microbatch_scale(mb, self.tokens_reference, self.pairs_reference, linear_ms, attention_ms)
                     for mb in self.microbatches)

    def summary(self) -> dict:
        real = sum(mb.tokens_real for mb in self.microbatches)
        executed = sum(mb.tokens_executed for mb in self.microbatches)
        pairs_real = sum(mb.pairs_real for mb in self.microbatches)
        pairs_exec = sum(mb.pairs_executed for mb in self.microbatches)
        n = len(self.microbatches)
        return {"packing": self.packing, "attention_cost": self.attention_cost, "seq": self.seq,
                "micro_batch": self.micro_batch, "microbatches": n, "tokens_real": real,
                "tokens_executed": executed, "padding_fraction": 1 - real / executed,
                "pairs_real": pairs_real, "pairs_executed": pairs_exec,
                "pairs_uniform": n * self.pairs_reference, "tokens_uniform": n * self.tokens_reference}

    def to_json(self, linear_ms: float | None = None, attention_ms: float | None = None) -> dict:
        out = self.summary()
        out["per_microbatch"] = [mb.to_json() for mb in self.microbatches]
        if linear_ms is not None and attention_ms is not None:
            out["scales"] = list(self.scales(linear_ms, attention_ms))
        return out


def microbatch_scale(mb: MicroBatch, tokens_ref: int, pairs_ref: int, linear_ms: float, attention_ms: float) -> float:
    """(linear x tokens / tokens_ref + attention x pairs / pairs_ref) / (linear + attention), exactly 1.0
    when the micro-batch is the uniform one."""
    total = Fraction(linear_ms) + Fraction(attention_ms)
    if total == 0:
        return 1.0
    work = (Fraction(linear_ms) * Fraction(mb.tokens_executed, tokens_ref)
            + Fraction(attention_ms) * Fraction(mb.pairs_executed, pairs_ref))
    return float(work / total)


def _pieces(lengths: list[int], seq: int, needed: int):
    """Document pieces of at most ``seq`` tokens, in order, from the start again when the list ends."""
    produced, i = 0, 0
    while produced < needed:
        rest = lengths[i % len(lengths)]
        i += 1
        while rest > 0 and produced < needed:
            piece = min(rest, seq)
            yield piece
            rest -= piece
            produced += 1


def _packed(lengths: list[int], seq: int, needed: int) -> list[tuple[int, ...]]:
    """``needed`` sequences of exactly ``seq`` tokens, documents laid end to end and cut at the boundaries."""
    out: list[tuple[int, ...]] = []
    current: list[int] = []
    room, i = seq, 0
    while len(out) < needed:
        rest = lengths[i % len(lengths)]
        i += 1
        while rest > 0 and len(out) < needed:
            take = min(rest, room)
            current.append(take)
            rest -= take
            room -= take
            if room == 0:
                out.append(tuple(current))
                current, room = [], seq
    return out


def _microbatch(seqs: list[tuple[int, ...]], executed: int, packing: str, attention_cost: str) -> MicroBatch:
    real = sum(sum(s) for s in seqs)
    pairs_real = sum(causal_pairs(d) for s in seqs for d in s)
    if attention_cost == "kernel" or packing == "pack":
        pairs = len(seqs) * causal_pairs(executed)      # the kernel's work, or no document mask
    else:
        pairs = pairs_real
    return MicroBatch(executed, tuple(seqs), real, len(seqs) * executed, pairs_real, pairs)


def plan_lengths(lengths: list[int], seq: int, micro_batch: int, accum: int, packing: str = "pad",
                 attention_cost: str = "kernel") -> LengthPlan:
    """The step's ``accum`` micro-batches of ``micro_batch`` sequences (module docstring)."""
    check_lengths(lengths)
    if packing not in PACKINGS:
        raise ConfigError(f"packing must be one of {', '.join(PACKINGS)}, got {packing!r}")
    if attention_cost not in ATTENTION_COSTS:
        raise ConfigError(f"attention cost must be one of {', '.join(ATTENTION_COSTS)}, got {attention_cost!r}")
    for label, value in (("seq", seq), ("micro_batch", micro_batch), ("accum", accum)):
        if not is_integer(value) or value < 1:
            raise ConfigError(f"{label} must be a positive integer, got {show_value(value)}")
    needed = micro_batch * accum
    pieces = needed * -(-seq // min(lengths)) if packing in ("pack", "pack-masked") else needed
    if pieces > MAX_DOCUMENTS:
        raise ConfigError(f"length plan: {needed:,} sequences of {seq} tokens could take {pieces:,} document pieces "
                          f"(shortest document {min(lengths)}); at most {MAX_DOCUMENTS:,} are batched")
    if packing in ("pack", "pack-masked"):
        seqs = _packed(lengths, seq, needed)
    else:
        seqs = [(p,) for p in _pieces(lengths, seq, needed)]
        if packing == "group":
            seqs.sort(key=lambda s: s[0])
    mbs = []
    for a in range(accum):
        group = seqs[a * micro_batch:(a + 1) * micro_batch]
        executed = max(s[0] for s in group) if packing == "group" else seq
        mbs.append(_microbatch(group, executed, packing, attention_cost))
    return LengthPlan(packing, attention_cost, seq, micro_batch, tuple(mbs))


@dataclass(frozen=True)
class LengthDistribution:
    """A length distribution and how to batch it: what ``--seq-lengths``, ``--packing`` and
    ``--attention-cost`` give; ``plan`` builds a configuration's step from it."""
    lengths: tuple[int, ...]
    packing: str = "pad"
    attention_cost: str = "kernel"

    def __post_init__(self) -> None:
        check_lengths(list(self.lengths))
        if self.packing not in PACKINGS:
            raise ConfigError(f"packing must be one of {', '.join(PACKINGS)}, got {self.packing!r}")
        if self.attention_cost not in ATTENTION_COSTS:
            raise ConfigError(f"attention cost must be one of {', '.join(ATTENTION_COSTS)}, "
                              f"got {self.attention_cost!r}")

    def plan(self, seq: int, micro_batch: int, accum: int) -> LengthPlan:
        return plan_lengths(list(self.lengths), seq, micro_batch, accum, self.packing, self.attention_cost)


__all__ = ["ATTENTION_COSTS", "LengthDistribution", "LengthPlan", "MicroBatch", "PACKINGS", "causal_pairs",
           "check_lengths", "microbatch_scale", "parse_lengths", "plan_lengths", "read_lengths"]

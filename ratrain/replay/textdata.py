"""Real text for the tiny-model correctness run, shipped with the project.

Source of ``ratrain/data/corpus.txt`` (342,784 bytes, sha256 dd2ce270...b47f0):
the documentation strings of 68 Python 3.11 standard-library modules
(``abc`` .. ``zlib`` in a fixed list), each module docstring followed by the
docstrings (``inspect.getdoc``) of its public classes and functions in
alphabetical order, those under 40 characters dropped, Unicode folded to
ASCII (NFKD, non-ASCII removed), capped at 400 KB. It was generated once,
offline, with a throw-away script on the development machine and is now a
plain data file: this module only reads it (no generation or download at run
time). The docstrings are part of CPython, distributed under the PSF License.

Tokenizer: characters, with a fixed 96-symbol alphabet (newline + printable
ASCII 32..126), so token ids do not depend on the corpus contents.

Batches are addressed by (step, replica, microbatch): each address seeds its
own generator from (seed, step, replica, microbatch), so a batch is the same
whichever order, schedule or process asks for it. That is what makes the
Baseline-1F1B, RATrain and single-stage runs see the same data order.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ratrain.errors import ConfigError, RatrainError

CORPUS_PATH = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(ALPHABET)   # 96

_LOOKUP = np.full(256, -1, dtype=np.int16)
for _i, _ch in enumerate(ALPHABET):
    _LOOKUP[ord(_ch)] = _i


def encode(text: str | bytes, *, source: str = "<text>") -> np.ndarray:
    """Token ids (int32) of ``text``; a byte outside the alphabet is an error naming its offset."""
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    ids = _LOOKUP[np.frombuffer(raw, dtype=np.uint8)]
    bad = np.flatnonzero(ids < 0)
    if bad.size:
        off = int(bad[0])
        raise RatrainError(f"{source}: byte {raw[off]!r} at offset {off} is outside the "
                           f"{VOCAB_SIZE}-symbol alphabet (newline + printable ASCII)")
    return ids.astype(np.int32)


def decode(ids: np.ndarray) -> str:
    return "".join(ALPHABET[int(i)] for i in np.asarray(ids).reshape(-1))


def load_corpus(path: str | Path = CORPUS_PATH) -> np.ndarray:
    """Read and tokenize the shipped corpus (or another ASCII file)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RatrainError(f"{path}: corpus file not found") from None
    return encode(raw, source=str(path))


def corpus_sha256(path: str | Path = CORPUS_PATH) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass
class BatchProvider:
    """Deterministic micro-batches of (tokens, next-token targets), each (micro_batch_size, seq)."""
    tokens: np.ndarray
    seq: int
    micro_batch_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.seq < 1 or self.micro_batch_size < 1:
            raise ConfigError(f"BatchProvider: seq={self.seq} and micro_batch_size="
                              f"{self.micro_batch_size} must be >= 1")
        if len(self.tokens) < self.seq + 2:
            raise ConfigError(f"BatchProvider: corpus has {len(self.tokens)} tokens, "
                              f"too few for seq={self.seq}")

    def batch(self, step: int, replica: int, microbatch: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, step, replica, microbatch])
        starts = rng.integers(0, len(self.tokens) - self.seq - 1, size=self.micro_batch_size)
        idx = starts[:, None] + np.arange(self.seq + 1)[None, :]
        window = self.tokens[idx]
        return window[:, :-1], window[:, 1:]

    __call__ = batch


def corpus_batches(seq: int, micro_batch_size: int, seed: int = 0,
                   path: str | Path = CORPUS_PATH) -> BatchProvider:
    """Batch provider over the shipped corpus."""
    return BatchProvider(load_corpus(path), seq=seq, micro_batch_size=micro_batch_size, seed=seed)

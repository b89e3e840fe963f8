"""Prepared programs on disk: the tables the machine derives from a program, kept between processes.

Before it runs a program the machine derives tables from it (:func:`mtemu.machine._prepare`): the
straight-line runs and their counters (:func:`mtemu.fast.runs.build_blocks`), and in functional mode
the decoded instructions, fused stretches and each run's last scalar loads
(:func:`mtemu.fast.queues.defer_tables`). For a 1024^3 GEMM that takes some 25 ms, plus loading the
jitted builders in a new process: more than a tenth of the functional run itself. In functional mode,
programs whose content has a name (``Program.origin``, set by the kernels' program cache from its
key) get those tables written once to ``<cache>/prepared/<hash>.bin`` and mapped back after
(copy-on-write, :func:`rtcommon.arrayfile.read_arrays`: no fresh memory to fault in, no copy).
Timing mode does not use this: its runs are long next to deriving the tables, and the tuner emulates
hundreds of candidate programs whose tables (some 10 MB each, uncompressed so that they map
fast) would fill the disk. The folder is kept under ``MTEMU_PREPARED_CACHE_MB`` (default
1024) by dropping the least recently used files.

With the tables, a functional run announces each named program it kept them for (:func:`kept`): the
kernels' program cache then keeps that program's code in its own folder (``program-code``), to map it
in a new process instead of inflating its ``.npz``. Each cache has one writer.

The key names the programs' origins, which program each DSP runs, the platform, the mode, and the
state of the machine's jitted sources (``mtemu.jit.JIT_STATE``, which also names Numba's cache folder), so
an edit to the machine never reads tables an older machine wrote. The file is an array file
(:mod:`rtcommon.arrayfile`: a JSON header with the key and a checksum, then the arrays' bytes); one
that cannot be read, holds another key or fails its checksum is ignored with a
:class:`PreparedCacheWarning` (a :class:`rtcommon.caches.CacheWarning`), and the tables are derived and
written again (atomically). The folder is the ``prepared`` cache of :mod:`rtcommon.caches` (which
names its format version); ``MTEMU_PROGRAM_CACHE=0`` turns this cache off with the program cache.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rtcommon import caches
from rtcommon.arrayfile import ArrayFileError, read_arrays, write_arrays

from ..jit import JIT_STATE
from ..platform import Platform

FORMAT = caches.cache("prepared").version       # bumped there when what is stored changes
DEFAULT_LIMIT_MB = 1024         # least recently used files beyond this are dropped (~11 MB per 1024^3 GEMM)

Groups = list[tuple[np.ndarray, ...] | None]


# In memory, a process keeps its built and prepared programs up to this many bytes of arrays: enough for
# the hundreds of small ones the tuner and the tests run again. A larger one (Table 5's naive tiles:
# 510 000 bundles, 218 MB of code, as much again prepared) is not kept at all: each is run once, and
# keeping it beside the next one's build set the emulator process's peak.
KEPT_BYTES = 64 << 20


def nbytes(obj, depth: int = 4) -> int:
    """The bytes of the arrays ``obj`` holds (in tuples, lists, dicts and objects' attributes, ``depth``
    levels down: a program's arrays are one or two levels down, a platform's none)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if depth <= 0:
        return 0
    if isinstance(obj, (tuple, list)):
        return sum(nbytes(x, depth - 1) for x in obj)
    if isinstance(obj, dict):
        return sum(nbytes(x, depth - 1) for x in obj.values())
    if hasattr(obj, "__dict__"):
        return sum(nbytes(x, depth - 1) for x in vars(obj).values())
    return 0


class SizedMemo:
    """A least-recently-used memo bounded by entries and by the bytes of arrays its values hold; a value
    larger than the byte bound is not kept."""

    def __init__(self, entries: int, max_bytes: int = KEPT_BYTES):
        self.entries, self.max_bytes = entries, max_bytes
        self._items: OrderedDict = OrderedDict()       # key -> (value, bytes)

    def get(self, key, default=None):
        hit = self._items.get(key)
        if hit is None:
            return default
        self._items.move_to_end(key)
        return hit[0]

    def put(self, key, value, size: int | None = None) -> None:
        size = nbytes(value) if size is None else size
        self._items.pop(key, None)
        if size > self.max_bytes:
            return                                  # larger than the bound: not kept (the rest stays)
        self._items[key] = (value, size)
        total = sum(b for _v, b in self._items.values())
        while len(self._items) > self.entries or total > self.max_bytes:
            total -= self._items.popitem(last=False)[1][1]

    def __contains__(self, key) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def values(self) -> list:
        return [v for v, _b in self._items.values()]

    def clear(self) -> None:
        self._items.clear()


def sized_memo(entries: int, max_bytes: int = KEPT_BYTES) -> Callable[[Callable], Callable]:
    """``functools.lru_cache`` for builders of large values: a :class:`SizedMemo` keyed by the arguments
    (positional, hashable); the wrapper has ``cache_clear()`` as lru_cache's."""
    def wrap(fn: Callable) -> Callable:
        memo = SizedMemo(entries, max_bytes)

        @functools.wraps(fn)
        def call(*args):
            value = memo.get(args)
            if value is None:
                value = fn(*args)
                memo.put(args, value)
            return value
        call.cache_clear = memo.clear
        call.memo = memo
        return call
    return wrap


class PreparedCacheWarning(caches.CacheWarning):
    """A prepared program on disk could not be used (unreadable, another key, damaged)."""


def enabled() -> bool:
    """Whether built and prepared programs are kept on disk (``MTEMU_PROGRAM_CACHE``, default on)."""
    return os.environ.get("MTEMU_PROGRAM_CACHE", "1").strip().lower() not in ("0", "off", "false", "no")


def cache_key(origins: list[str], dsp_program: list[int], platform: Platform, functional: bool,
              skip: bool) -> str:
    """The identity of one prepared set of programs (a JSON string; its hash names the file)."""
    return json.dumps([FORMAT, JIT_STATE, list(origins), [int(k) for k in dsp_program], platform.digest(),
                       bool(functional), bool(skip)])


def cache_path(key: str) -> Path:
    return caches.path("prepared") / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.bin"


def limit_bytes() -> int:
    """The most the prepared cache may hold (``MTEMU_PREPARED_CACHE_MB``, default 1024 MB)."""
    raw = os.environ.get("MTEMU_PREPARED_CACHE_MB", "").strip()
    if not raw:
        return DEFAULT_LIMIT_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        mb = math.nan
    if not math.isfinite(mb) or mb < 0:
        caches.warn(f"MTEMU_PREPARED_CACHE_MB={raw!r} is not a size in MB (a number >= 0); using the default "
                    f"{DEFAULT_LIMIT_MB}", PreparedCacheWarning, stacklevel=3)
        mb = DEFAULT_LIMIT_MB
    return int(mb * (1 << 20))


def store(key: str, groups: Groups) -> None:
    """Write ``groups`` (tuples of arrays, or None) under ``key``, then drop the least recently used
    files beyond :func:`limit_bytes`; a set larger than an eighth of it is not kept, and a folder that
    cannot be written only costs deriving the tables again next time."""
    size = sum(a.nbytes for g in groups if g is not None for a in g)
    limit = limit_bytes()
    if size > limit // 8:
        return
    path = cache_path(key)
    try:
        write_arrays(path, key, groups)
        caches.evict_lru(path.parent, "*.bin", limit)
    except OSError as exc:
        caches.warn(f"cannot write the prepared programs in {path.parent} ({exc.strerror or exc}); running "
                    "without them", PreparedCacheWarning)


# Called with each named program whose prepared tables a functional run keeps on disk (the kernels'
# program cache registers one: it keeps the program's code then, mtemu.kernels.program_cache).
_on_kept: list[Callable[[Any], None]] = []


def on_kept(hook: Callable[[Any], None]) -> None:
    """Have ``hook(program)`` called for each program whose tables a functional run keeps (once per hook)."""
    if hook not in _on_kept:
        _on_kept.append(hook)


def kept(programs: list) -> None:
    """The machine kept (or read) prepared tables of ``programs`` on disk: tell whoever asked."""
    for hook in _on_kept:
        for program in programs:
            hook(program)


def load(key: str) -> Groups | None:
    """The groups stored under ``key`` (writable arrays), or None if there are none or the file is
    unusable (then with a :class:`PreparedCacheWarning`). A file read is marked as recently used."""
    path = cache_path(key)
    try:
        groups = read_arrays(path, key, mapped=True)[0]
    except FileNotFoundError:
        return None
    except ArrayFileError as exc:
        caches.warn(f"prepared program {exc}; deriving it again", PreparedCacheWarning, stacklevel=3)
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    return groups

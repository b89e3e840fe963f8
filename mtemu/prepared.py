"""Prepared programs on disk: the tables the machine derives from a program, kept between processes.

Before it runs a program the machine derives tables from it (:func:`mtemu.machine._prepare`): the
straight-line runs and their counters (:func:`mtemu.blocks.build_blocks`), and in functional mode
the decoded instructions, fused stretches and each run's last scalar loads
(:func:`mtemu.blocks.defer_tables`). For a 1024^3 GEMM that takes some 25 ms, plus loading the
jitted builders in a new process: more than a tenth of the functional run itself. In functional mode,
programs whose content has a name (``Program.origin``, set by the kernels' program cache from its
key) get those tables written once to ``<cache>/prepared/<hash>.bin`` and mapped back after
(copy-on-write, :func:`rtcommon.arrayfile.read_arrays`: no fresh memory to fault in, no copy).
Timing mode does not use this: its runs are long next to deriving the tables, and the tuner emulates
hundreds of candidate programs whose tables (some 10 MB each, uncompressed so that they map
fast) would fill the disk. The folder is kept under ``MTEMU_PREPARED_CACHE_MB`` (default
1024) by dropping the least recently used files.

With the tables the machine also keeps each such program's code there (:func:`store_code`: int64, as
it runs), and the kernels' program cache maps it (:func:`load_code`) instead of inflating and
widening the compressed copy in its ``.npz``: a first call's 7 MB of code for a 1024^3 GEMM without
fresh memory to fault in. Only functional runs write it, like the tables, and it is dropped with
them (least recently used first).

The key names the programs' origins, which program each DSP runs, the platform, the mode, and the
state of the machine's jitted sources (``mtemu.JIT_STATE``, which also names Numba's cache folder), so
an edit to the machine never reads tables an older machine wrote. The file is an array file
(:mod:`rtcommon.arrayfile`: a JSON header with the key and a checksum, then the arrays' bytes); one
that cannot be read, holds another key or fails its checksum is ignored with a
:class:`PreparedCacheWarning`, and the tables are derived and written again (atomically).
``MTEMU_CACHE_DIR`` moves the cache (default ``~/.cache/mtemu``); ``MTEMU_PROGRAM_CACHE=0`` turns this
cache off with the program cache.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from pathlib import Path

import numpy as np

from rtcommon.arrayfile import ArrayFileError, read_arrays, write_arrays

from . import JIT_STATE
from .platform import Platform

FORMAT = 1                      # bump when what is stored changes
DEFAULT_LIMIT_MB = 1024         # least recently used files beyond this are dropped (~11 MB per 1024^3 GEMM)

Groups = list[tuple[np.ndarray, ...] | None]


class PreparedCacheWarning(UserWarning):
    """A prepared program on disk could not be used (unreadable, another key, damaged)."""


def cache_root() -> Path:
    """The folder of mtemu's caches (``MTEMU_CACHE_DIR``, default ``~/.cache/mtemu``)."""
    return Path(os.environ.get("MTEMU_CACHE_DIR", Path.home() / ".cache" / "mtemu"))


def enabled() -> bool:
    """Whether built and prepared programs are kept on disk (``MTEMU_PROGRAM_CACHE``, default on)."""
    return os.environ.get("MTEMU_PROGRAM_CACHE", "1").strip().lower() not in ("0", "off", "false", "no")


def cache_key(origins: list[str], dsp_program: list[int], platform: Platform, functional: bool,
              skip: bool) -> str:
    """The identity of one prepared set of programs (a JSON string; its hash names the file)."""
    return json.dumps([FORMAT, JIT_STATE, list(origins), [int(k) for k in dsp_program], platform.digest(),
                       bool(functional), bool(skip)])


def cache_path(key: str) -> Path:
    return cache_root() / "prepared" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.bin"


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
        warnings.warn(f"MTEMU_PREPARED_CACHE_MB={raw!r} is not a size in MB (a number >= 0); using the default "
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
    try:
        write_arrays(cache_path(key), key, groups)
        _evict(cache_path(key).parent, limit)
    except OSError:
        pass


def code_key(origin: str) -> str:
    """The identity of the code kept for the program named ``origin``."""
    return json.dumps(["code", FORMAT, origin])


def store_code(origin: str, code: np.ndarray) -> None:
    """Keep the code of the program named ``origin`` (unless it is there already; see :func:`store`)."""
    key = code_key(origin)
    if not cache_path(key).exists():
        store(key, [(np.ascontiguousarray(code, dtype=np.int64),)])


def load_code(origin: str) -> np.ndarray | None:
    """The code kept for the program named ``origin`` (int64, bundles x units x fields, mapped
    copy-on-write), or None if there is none or it is unusable (then with a
    :class:`PreparedCacheWarning`, and dropped, so that the next functional run keeps it again)."""
    key = code_key(origin)
    groups = load(key)
    if groups is None:
        if cache_path(key).exists():        # there but unusable (load warned)
            drop_code(origin)
        return None
    if len(groups) == 1 and groups[0] is not None and len(groups[0]) == 1 and groups[0][0].dtype == np.int64 \
            and groups[0][0].ndim == 3:
        return groups[0][0]
    warnings.warn(f"prepared program {cache_path(key)}: not a program's code; ignoring it", PreparedCacheWarning,
                  stacklevel=2)
    drop_code(origin)
    return None


def drop_code(origin: str) -> None:
    """Forget the code kept for the program named ``origin`` (it did not match the program)."""
    try:
        cache_path(code_key(origin)).unlink()
    except OSError:
        pass


def _evict(folder: Path, limit: int) -> None:
    files = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".bin"):
            st = entry.stat()
            files.append((st.st_mtime, st.st_size, entry.path))
    total = sum(f[1] for f in files)
    for _mtime, nbytes, path in sorted(files):
        if total <= limit:
            break
        try:
            os.unlink(path)
            total -= nbytes
        except OSError:
            pass


def load(key: str) -> Groups | None:
    """The groups stored under ``key`` (writable arrays), or None if there are none or the file is
    unusable (then with a :class:`PreparedCacheWarning`). A file read is marked as recently used."""
    path = cache_path(key)
    try:
        groups = read_arrays(path, key, mapped=True)[0]
    except FileNotFoundError:
        return None
    except ArrayFileError as exc:
        warnings.warn(f"prepared program {exc}; deriving it again", PreparedCacheWarning, stacklevel=3)
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    return groups

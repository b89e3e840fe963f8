"""Every cache the project keeps on disk: where it lives, what keys it, who writes it.

All caches live under one root, ``RTCACHE_DIR`` (default ``~/.cache``), in two parts: ``mtemu/``
(the emulator's) and ``ratrain/`` (training's). ``MTEMU_CACHE_DIR`` and ``RATRAIN_CACHE_DIR`` move
one part each (they win over the root). Numba's compiled code is a cache of the mtemu part
(``numba/``) unless ``NUMBA_CACHE_DIR`` is set, which wins: mtemu then keeps its folders under it.

Each cache is registered here once (:data:`CACHES`): its folder, the glob of its entries, what keys
an entry, the version of its format (the owning module reads it from here), the one module that
writes it, and whether deleting it only costs a rebuild. Nothing else computes a cache's folder.
Shipped data (``ratrain/data/profiles``, ``mtemu/data/versions.json``) is not a cache.

Every cache problem (a damaged entry discarded, a folder that cannot be written, an entry of another
version or key) is reported the same way: a :class:`CacheWarning` naming the file and what was done,
once per message per process. A cache never stops a run: the entry is rebuilt, or the run goes on
without the cache.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT_VARIABLE = "RTCACHE_DIR"
PART_VARIABLES = {"mtemu": "MTEMU_CACHE_DIR", "ratrain": "RATRAIN_CACHE_DIR"}
NUMBA_VARIABLE = "NUMBA_CACHE_DIR"


class CacheWarning(UserWarning):
    """A cache entry or folder could not be used; the message names the file and what was done."""


_warned: set[str] = set()


def warn(message: str, category: type[CacheWarning] = CacheWarning, stacklevel: int = 2) -> None:
    """Report one cache problem (once per message per process)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, category, stacklevel=stacklevel + 1)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def root() -> Path:
    """The folder that holds every cache (``RTCACHE_DIR``, default ``~/.cache``)."""
    return _env_path(ROOT_VARIABLE) or Path.home() / ".cache"


def part_dir(part: str) -> Path:
    """The folder of one package's caches: its variable (``MTEMU_CACHE_DIR``...), else under the root."""
    return _env_path(PART_VARIABLES[part]) or root() / part


@dataclass(frozen=True)
class Cache:
    """One cache on disk (a row of the table in docs/ARCHITECTURE.md)."""

    name: str
    part: str               # "mtemu" or "ratrain": the folder under the root it lives in
    folder: str             # under the part's folder ("" for files at its top)
    entries: str            # glob of its entries in ``folder``
    key: str                # what keys an entry
    version: int | None     # format version of an entry, in its key (None: not versioned, the key decides)
    writer: str             # the one module that writes it
    deletable: bool = True  # deleting it costs only a rebuild (all of them, today)

    def path(self) -> Path:
        """The cache's folder now (the variables are read on each call: tests move them). Numba's folder,
        and what lies in it, follow ``numba_base`` (``NUMBA_CACHE_DIR``, set, wins over the part)."""
        head, _, rest = self.folder.partition("/")
        if head == "numba":
            return numba_base() / rest
        return part_dir(self.part) / self.folder


def numba_base() -> Path:
    """Where Numba's compiled code goes: ``NUMBA_CACHE_DIR`` if the user set it, else the mtemu
    part's ``numba/``. mtemu keeps one folder per state of its jitted sources under it."""
    user = _env_path(NUMBA_VARIABLE)
    if user is None:
        return part_dir("mtemu") / "numba"
    # mtemu sets the variable to its own subfolder at first use (for worker processes): not a choice
    return user.parent if user.name.startswith(JIT_FOLDER_PREFIX) else user


JIT_FOLDER_PREFIX = "mtemu-jit-"

CACHES: tuple[Cache, ...] = (
    Cache("numba", "mtemu", "numba", f"{JIT_FOLDER_PREFIX}*",
          "Numba's own (function, signature, CPU), in a folder per state of mtemu's jitted sources",
          None, "numba (for mtemu.machine and the modules it compiles)"),
    Cache("simulator-jit", "mtemu", "numba/ratrain-sim", "sim_*",
          "Numba's own (function, signature, CPU), in a folder per copy of the simulator's jitted source",
          None, "numba (for ratrain.sim.event_kernel, the compiled event loop)"),
    Cache("programs", "mtemu", "programs", "*.npz",
          "kernel, hash of its generator's sources, shape, tiles, platform digest",
          3, "mtemu.kernels.program_cache"),
    Cache("program-code", "mtemu", "program-code", "*.bin",
          "the program's name (its programs entry's key hash); kept when a functional run prepares it",
          2, "mtemu.kernels.program_cache"),
    Cache("prepared", "mtemu", "prepared", "*.bin",
          "program names, DSP-to-program map, platform digest, mode, state of the jitted sources",
          2, "mtemu.fast.prepared (for mtemu.machine)"),
    Cache("tune", "mtemu", "tune", "*.json",
          "kernel, loop order, shape, tiles, platform digest, emulator version",
          None, "mtemu.tune"),
    Cache("fig10", "mtemu", "fig10", "*.json",
          "attention backward variant, shape, causal, platform digest, emulator version",
          None, "mtemu.validate.attention"),
    Cache("versions", "mtemu", "", "versions.json",
          "hash of the sources of the reference programs, kernel family",
          None, "mtemu.version"),
    Cache("gemm-latencies", "ratrain", "", "gemm_cache.json",
          "emulator version, platform timing digest, GEMM variant, tiles, shape (in each entry's key)",
          2, "ratrain.cost.profile"),
    Cache("profiles", "ratrain", "profiles", "*.json",
          "model, micro-batch, sequence, TP, platform key (name); emulator version (inside)",
          2, "ratrain.cost.profile"),
    Cache("npm", "ratrain", "npm", "*.tgz", "npm package and version (the dashboard's JavaScript libraries)",
          None, "scripts/localize_dashboard.py"),
)
BY_NAME = {c.name: c for c in CACHES}


def cache(name: str) -> Cache:
    """The registered cache ``name``."""
    return BY_NAME[name]


def path(name: str) -> Path:
    """The folder of the registered cache ``name``."""
    return BY_NAME[name].path()


def _entries(c: Cache) -> list[Path]:
    folder = c.path()
    try:
        return sorted(p for p in folder.glob(c.entries) if p.name != ".")
    except OSError:
        return []


def _size(p: Path) -> int:
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return p.stat().st_size
    except OSError:
        return 0


def describe() -> list[dict]:
    """Every registered cache as it is on disk now: folder, entries, bytes, version, writer."""
    out = []
    for c in CACHES:
        entries = _entries(c)
        out.append({"name": c.name, "folder": str(c.path()), "entries": len(entries),
                    "bytes": sum(_size(p) for p in entries), "version": c.version, "key": c.key,
                    "writer": c.writer, "deletable": c.deletable})
    return out


def evict_lru(folder: Path, pattern: str, limit: int) -> None:
    """Delete the least recently used entries matching ``pattern`` in ``folder`` beyond ``limit``
    bytes (a read marks an entry used by touching it)."""
    files = []
    for entry in os.scandir(folder):
        if Path(entry.name).match(pattern):
            st = entry.stat()
            files.append((st.st_mtime, st.st_size, entry.path))
    total = sum(f[1] for f in files)
    for _mtime, nbytes, where in sorted(files):
        if total <= limit:
            break
        try:
            os.unlink(where)
            total -= nbytes
        except OSError:
            pass

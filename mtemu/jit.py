"""Numba's setting for the jitted machine, made on its first use (never by ``import mtemu``).

Numba keys a function's on-disk cache on its own file's timestamp only, so a compiled machine that
inlines code from another file (fast/, isa, fp16) can go stale and crash. Every state of the
jitted sources therefore gets its own cache folder, ``<numba>/mtemu-jit-<hash>``, where ``<numba>`` is
``NUMBA_CACHE_DIR`` if the user set it, else the mtemu cache's ``numba/`` (:mod:`rtcommon.caches`).

Numba picks a function's cache folder when the function is defined, from ``numba.config.CACHE_DIR``
(read from the environment when numba is imported). :func:`configure` sets both, so it must run
before the first ``@njit(cache=True)``: the jitted modules that every other one imports first
(:mod:`mtemu.fp16`, :mod:`mtemu.dma`) call it after their imports. It also sets the variable in
``os.environ``, so that worker processes compile into (and read) the same folder.

Numba's on-disk cache takes one writer at a time, and a reader beside a writer can load a half-written
entry. A process that shares the cache with another one compiling (the main job's parent beside its
emulator worker) calls :func:`hold_jit`: its next load or compile of any cached jitted function first
waits for the other process, so the two never touch the cache at once, whatever code path asks.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import sys
from pathlib import Path
from typing import Callable

from rtcommon import caches

from ._version import __version__

# the files whose code the compiled machine holds
JIT_SOURCES = ("machine.py", "fast/runs.py", "fast/queues.py", "fast/fused.py", "fast/simd.py", "dma.py", "fp16.py",
               "isa.py", "trace.py", "accuracy.py")


def _jit_state() -> str:
    h = hashlib.sha256(__version__.encode())
    for name in JIT_SOURCES:
        path = Path(__file__).parent / name
        if path.exists():
            h.update(name.encode() + path.read_bytes())
    return f"{caches.JIT_FOLDER_PREFIX}{h.hexdigest()[:12]}"


# the state of the jitted sources, computed once: names Numba's cache folder and keys the machine's
# prepared tables on disk (mtemu.fast.prepared)
JIT_STATE = _jit_state()


def jit_cache_dir() -> str:
    """The folder Numba caches the machine's compiled code in."""
    return str(caches.numba_base() / JIT_STATE)


def configure() -> None:
    """Point Numba's cache at :func:`jit_cache_dir` (idempotent: the jitted modules each call it)."""
    folder = jit_cache_dir()
    os.environ[caches.NUMBA_VARIABLE] = folder
    numba = sys.modules.get("numba")
    if numba is not None:
        # numba was imported first (it always is by the caller; or by a test, a user's script): its
        # config read the variable then, but it picks the folder when each jitted function is defined
        numba.config.CACHE_DIR = folder
    _guard_cache_loads(numba)


# what this process runs before its next load or compile of jitted code (hold_jit), and how often a
# hold was waited on (the main job's test asserts its parent never needed one)
_HOLDS: list[Callable[[], None]] = []
HOLDS_WAITED = [0]


def hold_jit(wait: Callable[[], None]) -> None:
    """Run ``wait`` (once) before this process next reads or writes Numba's on-disk cache: before the
    first load or compile of any cached jitted function's new signature. Code already loaded runs
    as before. Numba is imported if it is not yet (it would be by the first jitted module)."""
    _HOLDS.append(wait)
    _guard_cache_loads(importlib.import_module("numba"))


def release_jit() -> None:
    """Drop the waits :func:`hold_jit` left (the process they waited for is gone)."""
    _HOLDS.clear()


def _run_holds() -> None:
    while _HOLDS:
        HOLDS_WAITED[0] += 1
        _HOLDS.pop(0)()


def _guard_cache_loads(numba) -> None:
    """Make a damaged entry of the machine's Numba cache (a truncated, bit-flipped or replaced
    ``.nbi``/``.nbc`` file) a cache miss: warn once, delete that function's entry, compile again.
    Numba itself lets the unpickling error escape from the first call, on every later run too.
    Both the load and the save first run the waits of :func:`hold_jit`: a compile begins with a load."""
    if numba is None:
        return
    caching = importlib.import_module("numba.core.caching")    # numba is imported by now: cheap

    original = caching.Cache.load_overload
    if getattr(original, "_mtemu_guard", False):
        return
    original_save = caching.Cache.save_overload

    def save_overload(self, sig, data):
        _run_holds()
        return original_save(self, sig, data)

    def load_overload(self, sig, target_context):
        _run_holds()
        try:
            return original(self, sig, target_context)
        except Exception as exc:   # any failure to read our own cache: rebuild, never stop the run
            folder = str(getattr(self, "_cache_path", ""))
            if not folder.startswith(str(caches.numba_base())):
                raise                              # not the machine's cache: Numba's own behaviour
            index = Path(self._cache_file._index_path)
            caches.warn(f"{index}: damaged Numba cache entry ({type(exc).__name__}): removed; "
                        f"compiling it again", stacklevel=2)
            for stale in index.parent.glob(index.name[:-len(".nbi")] + ".*"):
                try:
                    stale.unlink()
                except OSError:
                    pass
            return None

    load_overload._mtemu_guard = True
    caching.Cache.load_overload = load_overload
    caching.Cache.save_overload = save_overload

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
emulator worker) calls :func:`hold_jit_for`: its next load or compile of any cached jitted function first
waits for the other process, so the two never touch the cache at once, whatever code path asks.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import sys
import time
from pathlib import Path

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


# the process (its id) that every load or compile of jitted code here, and in the processes started
# from here (forked or spawned: they inherit the variable), waits for first (hold_jit_for)
WAIT_VARIABLE = "MTEMU_JIT_WAIT_FOR"
# how often a load waited (the main job's test asserts its parent never had to)
HOLDS_WAITED = [0]


def hold_jit_for(pid: int) -> None:
    """Before this process, or one it starts, next reads or writes Numba's on-disk cache (the first load
    or compile of a cached jitted function's new signature), wait until process ``pid`` has exited.
    Code already loaded runs as before. Numba is imported if it is not yet (the first jitted module
    would import it)."""
    os.environ[WAIT_VARIABLE] = str(pid)
    _guard_cache_loads(importlib.import_module("numba"))


def release_jit() -> None:
    """Drop the wait of :func:`hold_jit_for` (the process it waited for is gone)."""
    os.environ.pop(WAIT_VARIABLE, None)


def _run_holds() -> None:
    value = os.environ.get(WAIT_VARIABLE, "")
    if not value.isdigit() or not _running(int(value)):
        return
    pid = int(value)
    HOLDS_WAITED[0] += 1
    print(f"mtemu: jitted code needed while process {pid} compiles into Numba's cache; waiting for it to finish",
          file=sys.stderr, flush=True)
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)      # our child: left for its parent to reap
    except ChildProcessError:           # another's child (we were started by its parent): poll
        while _running(pid):
            time.sleep(0.2)
    release_jit()


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has: it waits only to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:                     # no /proc: whether it exists at all
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _guard_cache_loads(numba) -> None:
    """Make a damaged entry of the machine's Numba cache (a truncated, bit-flipped or replaced
    ``.nbi``/``.nbc`` file) a cache miss: warn once, delete that function's entry, compile again.
    Numba itself lets the unpickling error escape from the first call, on every later run too.
    Both the load and the save first wait as :func:`hold_jit_for` asks: a compile begins with a load."""
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

"""Every test run gets its own cache root: no test reads or writes the user's caches.

The root (``RTCACHE_DIR``) points at a fresh temporary folder, and the per-package variables
(``MTEMU_CACHE_DIR``, ``RATRAIN_CACHE_DIR``) are cleared so that it holds every cache. Tests of a cache
move it again (monkeypatch) into their own ``tmp_path``. The exception is Numba's compiled code: it
stays where it was before the test run (``NUMBA_CACHE_DIR`` if set, as ``.ci/run`` does; else the
user's own mtemu cache), so the suite does not recompile the machine (minutes) on every run. It is
keyed by the state of the jitted sources (mtemu.jit), so it cannot hand a test stale code. Built kernel
programs are kept the same way, in ``<numba>/tests-programs`` (the root's ``mtemu/programs`` links to it):
an entry is keyed by the hash of its generator's sources, the shape, the tiles and the platform digest,
so it too cannot be stale, and the suite does not assemble the same few hundred programs again on every
run. Tests of those caches move them into their own ``tmp_path`` as before. Shipped data
(``ratrain/data/profiles``, ``mtemu/data/versions.json``) is read as always: it is not a cache.

Compiled bytecode is kept too where the user turned it off (``PYTHONDONTWRITEBYTECODE``, as many container
images do): without it every run, and every interpreter a test starts, compiles and assertion-rewrites
the same sources again (about a third of collecting the suite, and most of a short subprocess's time).
It goes to ``<numba>/tests-bytecode`` (``sys.pycache_prefix``, and ``PYTHONPYCACHEPREFIX`` for the
interpreters tests start), never beside the sources, and is keyed by each source's own timestamp and
size as Python's always is. A user's own ``PYTHONPYCACHEPREFIX`` is left as it is.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rtcommon import caches

BYTECODE_VARIABLES = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")


def _keep_bytecode(numba: Path) -> None:
    """Where writing bytecode is off, write it under ``numba`` instead of nowhere (module docstring).
    Runs when this file is imported: before the test modules are, so they are cached too."""
    if not sys.dont_write_bytecode:
        return
    if not sys.pycache_prefix:
        sys.pycache_prefix = str(numba / "tests-bytecode")
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)      # the interpreters tests start
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix


def _one_numba_cache_user_at_a_time(numba: Path) -> None:
    """Under pytest-xdist (``-n 2``) the workers share Numba's on-disk cache, which takes one writer at a
    time and must not be read while written (:mod:`mtemu.jit`): each worker loads and saves compiled code
    holding one lock file (compiling itself stays parallel). Numba is imported only in such a worker."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    import fcntl

    from numba.core import caching

    numba.mkdir(parents=True, exist_ok=True)
    lock_path = numba / "tests-workers.lock"

    def locked(method):
        def run(self, *args, **kwargs):
            with open(lock_path, "a+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                return method(self, *args, **kwargs)
        return run

    caching.Cache.load_overload = locked(caching.Cache.load_overload)
    caching.Cache.save_overload = locked(caching.Cache.save_overload)


_BYTECODE_SETTING = (sys.dont_write_bytecode, sys.pycache_prefix, {n: os.environ.get(n) for n in BYTECODE_VARIABLES})
_keep_bytecode(caches.numba_base())
_one_numba_cache_user_at_a_time(caches.numba_base())


def pytest_unconfigure(config):
    """The setting as the user had it (an in-process caller of pytest.main goes on after the run)."""
    sys.dont_write_bytecode, sys.pycache_prefix, environment = _BYTECODE_SETTING
    for name, value in environment.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True, scope="session")
def own_cache_root(tmp_path_factory):
    numba = caches.numba_base()                  # before the root moves
    patch = pytest.MonkeyPatch()
    patch.setenv(caches.ROOT_VARIABLE, str(tmp_path_factory.mktemp("caches")))
    for variable in caches.PART_VARIABLES.values():
        patch.delenv(variable, raising=False)
    patch.setenv(caches.NUMBA_VARIABLE, str(numba))
    _keep_built_programs(numba)
    yield caches.root()
    patch.undo()


def _keep_built_programs(numba) -> None:
    """Point this run's program cache at the one kept between runs beside Numba's (made on first use)."""
    _link(caches.path("programs"), numba / "tests-programs")


@pytest.fixture
def mtemu_cache_in(monkeypatch):
    """``move(folder)``: the mtemu caches move to ``folder`` (for a test of the tuner's, the latencies' or
    another cache's own behaviour) except the built programs, still the kept ones, so that the test
    starts from empty caches without assembling every program again."""
    def move(folder: Path) -> Path:
        kept = caches.path("programs").resolve()
        monkeypatch.setenv(caches.PART_VARIABLES["mtemu"], str(folder))
        _link(caches.path("programs"), kept)
        return folder
    return move


def _link(here: Path, kept: Path) -> None:
    try:
        kept.mkdir(parents=True, exist_ok=True)
        here.parent.mkdir(parents=True, exist_ok=True)
        here.symlink_to(kept, target_is_directory=True)
    except OSError:
        pass                        # a fresh folder then: every program is built, as on a first run


@pytest.fixture
def run_cli(capsys):
    """Run a command's ``main(argv)`` in this process: (exit status, stdout, stderr) as ``python -m`` would
    give them, without a new interpreter loading the machine again (seconds per call). Tests of the process
    itself (start-up, imports, signals) still start one."""
    def run(main, argv: list[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as exc:           # argparse's errors
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code or 0, out, err
    return run

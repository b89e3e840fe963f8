"""Every test run gets its own cache root: no test reads or writes the user's caches.

The root (``RTCACHE_DIR``) points at a fresh temporary folder, and the per-package variables
(``MTEMU_CACHE_DIR``, ``RATRAIN_CACHE_DIR``) are cleared so that it holds every cache. Tests of a cache
move it again (monkeypatch) into their own ``tmp_path``. The exception is Numba's compiled code: it
stays where it was before the test run (``NUMBA_CACHE_DIR`` if set, as ``.ci/run`` does; else the
user's own mtemu cache), so the suite does not recompile the machine (minutes) on every run. It is
keyed by the state of the jitted sources (mtemu.jit), so it cannot hand a test stale code. Shipped
data (``ratrain/data/profiles``, ``mtemu/data/versions.json``) is read as always: it is not a cache.
"""
from __future__ import annotations

import pytest

from rtcommon import caches


@pytest.fixture(autouse=True, scope="session")
def own_cache_root(tmp_path_factory):
    numba = caches.numba_base()                  # before the root moves
    patch = pytest.MonkeyPatch()
    patch.setenv(caches.ROOT_VARIABLE, str(tmp_path_factory.mktemp("caches")))
    for variable in caches.PART_VARIABLES.values():
        patch.delenv(variable, raising=False)
    patch.setenv(caches.NUMBA_VARIABLE, str(numba))
    yield caches.root()
    patch.undo()


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

"""A damaged entry of the machine's Numba cache is a cache miss: one CacheWarning, then it is
compiled again and the next run is clean (Numba alone fails on every later run)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = """import numba  # as the jitted modules do: numba first, then configure
from mtemu import jit
jit.configure()
from numba import njit

@njit(cache=True)
def plus_one(x):
    return x + 1

print(plus_one(41))
"""


def _run(script, cache):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The tiny script and a cache it compiled into: each damage case starts from a copy of it."""
    folder = tmp_path_factory.mktemp("tinyjit")
    script = folder / "tinyjit.py"
    script.write_text(TINY)
    cache = folder / "numba"
    first = _run(script, cache)
    assert first.returncode == 0 and first.stdout.strip() == "42", first.stderr
    return script, cache


# one damage in the quick layer; the other two read the same repair path
@pytest.mark.slow  # the quick layer's costliest (a compile and two interpreters): the full suite (CI) runs it
@pytest.mark.parametrize("damage", ["truncate-nbc", "flip-nbc",
                                    "truncate-nbi"])
def test_a_damaged_numba_cache_entry_is_rebuilt(tmp_path, compiled, damage):
    script, template = compiled
    cache = tmp_path / "numba"
    shutil.copytree(template, cache)
    suffix = ".nbi" if damage.endswith("nbi") else ".nbc"
    (entry,) = cache.rglob(f"*{suffix}")
    raw = entry.read_bytes()
    if damage.startswith("truncate"):
        entry.write_bytes(raw[: len(raw) // 3])
    else:
        entry.write_bytes(raw[:20] + bytes(b ^ 0xFF for b in raw[20:60]) + raw[60:])
    damaged = _run(script, cache)
    assert damaged.returncode == 0 and damaged.stdout.strip() == "42", damaged.stderr
    assert "Traceback" not in damaged.stderr
    healed = _run(script, cache)
    assert healed.returncode == 0 and healed.stdout.strip() == "42" and "CacheWarning" not in healed.stderr

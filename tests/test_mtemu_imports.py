"""`import mtemu` stays light: the kernels (and numba) load on first use of a kernel name."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mtemu

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)


def test_light_imports_do_not_load_numba():
    # (mtemu.version builds reference programs, so it loads the kernels: not in this list)
    out = _python("import mtemu, mtemu.platform, mtemu.errors, sys; "
                  "assert 'numba' not in sys.modules, 'numba'; assert 'mtemu.kernels' not in sys.modules; "
                  "import mtemu.kernels.names; assert 'numba' not in sys.modules, 'names'; "
                  "print(mtemu.__version__, mtemu.DEFAULT_PLATFORM.dsps)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [mtemu.__version__, str(mtemu.DEFAULT_PLATFORM.dsps)]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_kernel_names_load_on_first_use():
    out = _python("import mtemu, sys; f = mtemu.run_gemm; assert 'numba' in sys.modules; "
                  "from mtemu import attention_backward_timing, DEFAULT_TILES; "
                  "import mtemu.kernels.gemm as g; assert f is g.run_gemm and DEFAULT_TILES is g.DEFAULT_TILES")
    assert out.returncode == 0, out.stderr


def test_public_names_listed_and_resolvable():
    for name in mtemu.__all__:
        assert name in dir(mtemu)
        assert getattr(mtemu, name) is not None
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = mtemu.no_such_name


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("numba_first", [False, True])
def test_jitted_code_caches_in_the_folder_of_its_sources(numba_first, tmp_path):
    """The compiled machine inlines code from several files, and numba keys a function's cache on its
    own file only; so mtemu caches in a folder named by the state of all of them, even when numba was
    imported (and read NUMBA_CACHE_DIR) before mtemu was."""
    first = "import numba; " if numba_first else ""
    out = _python(f"import os; os.environ['NUMBA_CACHE_DIR'] = {str(tmp_path)!r}; {first}"
                  "import mtemu, mtemu.jit, numba, os; leaf = os.path.basename(mtemu.jit.jit_cache_dir()); "
                  "assert leaf.startswith('mtemu-jit-'), leaf; from mtemu import machine; "
                  f"assert numba.config.CACHE_DIR == os.path.join({str(tmp_path)!r}, leaf), numba.config.CACHE_DIR; "
                  "path = machine._run_timing._cache._cache_path; "
                  "assert path.startswith(numba.config.CACHE_DIR), path")
    assert out.returncode == 0, out.stderr


@pytest.mark.slow  # compiles the timing machine in a new process
def test_a_timing_run_compiles_no_functional_code(tmp_path):
    """The machine's loop is compiled per mode: a timing run, on an empty Numba cache, types neither the
    functional loop nor the deferred-work queues only functional runs use (the one loop for both modes
    compiled them all)."""
    out = _python(f"import os; os.environ['NUMBA_CACHE_DIR'] = {str(tmp_path)!r}; "
                  "from mtemu import machine; from mtemu.fast import queues; "
                  "from mtemu.kernels.gemm import gemm_timing; assert gemm_timing(64, 64, 192).cycles > 0; "
                  "assert machine._run_timing.signatures, 'timing loop'; "
                  "assert not machine._run_functional.signatures, 'functional loop'; "
                  "assert not (queues.flush.signatures or queues.settle.signatures), 'queues'")
    assert out.returncode == 0, out.stderr


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_importing_mtemu_and_the_planner_changes_no_process_wide_setting():
    """No environment variable, no numba import (so no Numba setting or threading layer) until the
    jitted machine is first used; then Numba's cache folder is set, before any function is compiled."""
    out = _python("import os, sys; before = dict(os.environ); import mtemu, ratrain.plan.planner; "
                  "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items()); "
                  "assert 'numba' not in sys.modules; "
                  "from mtemu import machine; import numba; "
                  "assert os.environ['NUMBA_CACHE_DIR'] == numba.config.CACHE_DIR == mtemu.jit.jit_cache_dir()")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("numba_set", [False, True])
def test_the_cache_root_moves_numbas_cache_unless_the_user_set_its_own(numba_set, tmp_path):
    want = tmp_path / ("mine" if numba_set else "root/mtemu/numba")
    user = f"os.environ['NUMBA_CACHE_DIR'] = {str(want)!r}; " if numba_set else ""
    out = _python("import os; os.environ.pop('NUMBA_CACHE_DIR', None); os.environ.pop('MTEMU_CACHE_DIR', None); "
                  f"os.environ['RTCACHE_DIR'] = {str(tmp_path / 'root')!r}; {user}"
                  "import mtemu.jit, rtcommon.caches as c; "
                  f"assert mtemu.jit.jit_cache_dir() == os.path.join({str(want)!r}, mtemu.jit.JIT_STATE); "
                  f"assert c.path('numba') == c.Path({str(want)!r}), c.path('numba')")
    assert out.returncode == 0, out.stderr


def test_jit_state_hashes_every_jitted_source():
    """JIT_STATE keys Numba's cache folder on the jitted sources: every file it names exists (a moved
    file would otherwise drop out of the hash silently), and every mtemu file with jitted code is named."""
    import mtemu.jit

    package = ROOT / "mtemu"
    named = set(mtemu.jit.JIT_SOURCES)
    assert all((package / name).is_file() for name in named), sorted(n for n in named if not (package / n).is_file())
    jitted = {p.relative_to(package).as_posix() for p in package.rglob("*.py")
              if re.search(r"^@(njit|intrinsic)\b", p.read_text(), re.M)}
    assert jitted <= named, sorted(jitted - named)

"""Caches that heal: corrupted, impossible or unreadable entries are discarded with one warning and
rebuilt; an unwritable cache folder only costs the cache; a killed tuner sweep resumes; cache
file names never come from text inside an input file."""
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rtcommon.cache as cache
from mtemu.errors import MtemuError
from mtemu.tune import _read, _valid_entry, check_grid, tune_cache_dir, tune_gemm
from ratrain.errors import ConfigError
from ratrain.spec.models import ModelSpec, from_hf_config, safe_model_name
from rtcommon import caches
from rtcommon.cache import check_fields, read_json_cache, write_json_cache
from rtcommon.caches import CacheWarning

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (256, 512, 768)
GRID = {"mg": (128, 256), "k2": (64,), "n2": (384, 768), "mr_nv": ((6, 4),)}
GOOD = {"utilization": 0.5, "cycles": 1000, "latency_ms": 0.01, "stalls": {"latency": 3, "dma_wait": 0}}


@pytest.fixture
def cachedir(tmp_path, mtemu_cache_in):
    mtemu_cache_in(tmp_path / "cache")
    caches._warned.clear()
    return tmp_path


# --- the reader ----------------------------------------------------------------------------
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300),
                 st.recursive(st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=5)),
                              lambda c: st.one_of(st.lists(c, max_size=4),
                                                  st.dictionaries(st.text(max_size=8), c, max_size=4)),
                              max_leaves=12).map(lambda v: json.dumps(v).encode())))
def test_any_bytes_give_a_valid_entry_or_none(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("c") / "entry.json"
    path.write_bytes(data)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = read_json_cache(path, _valid_entry)
    if got is not None:
        assert _valid_entry(got) is None
    assert len(seen) <= 1 and all(issubclass(w.category, CacheWarning) for w in seen)
    assert got is not None or (seen and str(path) in str(seen[0].message))


@pytest.mark.parametrize("entry, reason", [
    ({**GOOD, "utilization": 5.0}, "above 1.0"),
    ({**GOOD, "utilization": -0.1}, "below"),
    ({**GOOD, "cycles": 12.5}, "not an integer"),
    ({**GOOD, "cycles": 0}, "below 1"),
    ({**GOOD, "latency_ms": "fast"}, "not a number"),
    ({**GOOD, "stalls": {"latency": -3}}, "below 0"),
    ({**GOOD, "stalls": []}, "not a table"),
    ({k: v for k, v in GOOD.items() if k != "cycles"}, "'cycles' is missing"),
])
def test_impossible_tuner_entries_are_refused(tmp_path, entry, reason):
    path = tmp_path / "e.json"
    write_json_cache(path, entry)           # as a faulty version would write it: the checksum holds
    with pytest.warns(CacheWarning) as seen:
        assert _read(path) is None
    (message,) = [str(w.message) for w in seen]
    assert reason in message and str(path) in message and "ignored (it will be rebuilt)" in message


def test_nan_and_huge_files_are_refused(tmp_path, monkeypatch):
    path = tmp_path / "e.json"
    path.write_text('{"utilization": NaN, "cycles": 1, "latency_ms": 1, "stalls": {"a": 0}}')
    with pytest.warns(CacheWarning, match="NaN"):
        assert read_json_cache(path) is None
    monkeypatch.setattr(cache, "MAX_CACHE_BYTES", 10)
    path.write_text(json.dumps(GOOD))
    with pytest.warns(CacheWarning, match="too large"):
        assert read_json_cache(path) is None
    monkeypatch.setattr(cache, "MAX_CACHE_BYTES", 1 << 20)
    write_json_cache(path, GOOD)
    assert read_json_cache(path, _valid_entry) == GOOD


def test_an_entry_edited_renamed_or_unsigned_is_never_used(tmp_path):
    caches._warned.clear()
    path = tmp_path / "e.json"
    assert write_json_cache(path, GOOD)
    assert read_json_cache(path, _valid_entry) == GOOD          # the checksum is not part of the entry
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({**stored, "cycles": 999}))       # a plausible value, typed by hand
    with pytest.warns(CacheWarning, match=r"e.json: checksum mismatch .*ignored \(it will be rebuilt\)"):
        assert read_json_cache(path, _valid_entry) is None
    write_json_cache(path, GOOD)
    path.rename(tmp_path / "other-key.json")                      # another key's name: the same bytes
    with pytest.warns(CacheWarning, match="other-key.json: checksum mismatch"):
        assert read_json_cache(tmp_path / "other-key.json") is None
    path.write_text(json.dumps(GOOD))                             # written by hand, no checksum at all
    with pytest.warns(CacheWarning, match="e.json: has no checksum"):
        assert read_json_cache(path) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_json_cache(path, checksum=False) == GOOD    # shipped data: checked only if signed


def test_check_fields():
    assert check_fields({"a": 1, "b": 0.5}, {"a": (1, None, True), "b": (0.0, 1.0)}) is None
    assert "missing" in check_fields({}, {"a": (0, 1)})
    assert check_fields({}, {"a": (0, 1)}, optional=("a",)) is None
    assert "True" in check_fields({"a": True}, {"a": (0, 1)})
    assert "inf" in check_fields({"a": float("inf")}, {"a": (0, None)})


def test_an_unwritable_cache_degrades_with_one_warning(tmp_path):
    caches._warned.clear()
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    with pytest.warns(CacheWarning) as seen:
        assert write_json_cache(blocker / "sub" / "e.json", GOOD) is False
        assert write_json_cache(blocker / "sub" / "f.json", GOOD) is False
        assert read_json_cache(blocker / "sub" / "e.json") is None
    messages = [str(w.message) for w in seen]
    assert len(messages) == 2 and "running without it" in messages[0] and str(blocker / "sub") in messages[0]


# --- the tuner's cache ---------------------------------------------------------------------
def test_tuner_re_emulates_an_impossible_entry_and_runs_without_a_writable_cache(cachedir, monkeypatch):
    first = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False)
    files = sorted(tune_cache_dir().glob("*.json"))
    assert len(files) == len(first.candidates)
    write_json_cache(files[0], {**GOOD, "utilization": 5.0})     # a utilization of 500%, checksum intact
    files[1].write_bytes(b"\x00\xff binary junk")
    edited = json.loads(files[2].read_text())
    files[2].write_text(json.dumps({**edited, "utilization": edited["utilization"] * 1.1}))   # plausible, by hand
    with pytest.warns(CacheWarning) as seen:
        again = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False)
    messages = " ".join(str(w.message) for w in seen)
    assert "above 1.0" in messages and f"{files[2]}: checksum mismatch" in messages
    assert sum(not c.cached for c in again.candidates) == 3
    assert [c.utilization for c in again.candidates] == [c.utilization for c in first.candidates]
    assert all(c.utilization <= 1 for c in again.candidates)
    blocked = cachedir / "blocked"
    blocked.write_text("not a folder")
    monkeypatch.setenv("MTEMU_CACHE_DIR", str(blocked))
    with pytest.warns(CacheWarning, match="running without it"):
        third = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False)
    assert [c.utilization for c in third.candidates] == [c.utilization for c in first.candidates]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_a_killed_sweep_resumes_where_it_stopped(cachedir):
    code = ("from mtemu.tune import tune_gemm\n"
            f"tune_gemm(*{SHAPE!r}, grid={GRID!r}, workers=1, out_dir=None, progress=False)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MTEMU_CACHE_DIR": str(cachedir / "cache")}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)
    folder = cachedir / "cache" / "tune"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list(folder.glob("*.json")) and p.poll() is None:
            time.sleep(0.05)
        running = p.poll() is None
        p.send_signal(signal.SIGKILL)      # no chance to clean up or write anything more
        p.wait(timeout=30)
    finally:
        p.kill()
    written = list(folder.glob("*.json"))
    assert running and written, "the first finished candidate was not written while the sweep ran"
    resumed = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False)
    assert sum(c.cached for c in resumed.candidates) >= len(written)
    fresh = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False, cache=False)
    assert [c.utilization for c in resumed.candidates] == [c.utilization for c in fresh.candidates]


def test_an_interrupted_sweep_keeps_every_finished_candidate(cachedir):
    from mtemu.kernels.registry import DEFAULT_GEMM, gemm_variant
    from mtemu.platform import DEFAULT
    from mtemu.tune import _emulate, _sweep, gemm_candidates
    feasible, pruned = gemm_candidates(*SHAPE, GRID)
    variant = gemm_variant(DEFAULT_GEMM)
    default = variant.plan(*SHAPE, variant.default_tiles, DEFAULT).tiles
    calls = []

    def emulate(args):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt           # Ctrl-C during the third candidate
        return _emulate(args)

    with pytest.raises(KeyboardInterrupt):
        _sweep("gemm", SHAPE, list(feasible), default, pruned, DEFAULT, emulate, 1, None, False, True,
               job=(DEFAULT_GEMM,))
    assert len(list(tune_cache_dir().glob("*.json"))) == 2
    resumed = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False)
    assert sum(c.cached for c in resumed.candidates) == 2


@pytest.mark.parametrize("grid, match", [
    ({"mg": "big"}, "expected a list"),
    ({"mg": (0, 128)}, "positive integers"),
    ({"mg": ()}, "non-empty"),
    ({"kg": (1,)}, "unknown tile 'kg'"),
    ({"mr_nv": ((6,),)}, "pairs"),
    ({"mg": (1.5,)}, "positive integers"),
])
def test_tile_lists_the_tuner_cannot_use_are_refused(grid, match):
    with pytest.raises(MtemuError, match=match):
        check_grid(grid, {"mg": (), "k2": (), "n2": (), "mr_nv": ()})


def test_a_grid_with_no_usable_tile_is_refused_not_replaced_by_the_defaults(cachedir):
    with pytest.raises(MtemuError, match="no tile set from the given lists .* is usable"):
        tune_gemm(*SHAPE, grid={"k2": (10 ** 6,), "n2": (10 ** 6,)}, workers=1, out_dir=None, progress=False)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_an_unreachable_scheduler_fails_fast(cachedir):
    pytest.importorskip("dask.distributed")
    t0 = time.perf_counter()
    with pytest.raises(MtemuError, match="cannot reach the Dask scheduler"):
        tune_gemm(*SHAPE, grid=GRID, scheduler="tcp://127.0.0.1:9", out_dir=None, progress=False, cache=False)
    assert time.perf_counter() - t0 < 30


# --- names from input files never choose where a file goes ----------------------------------
@pytest.mark.parametrize("raw, expected", [
    ("../../etc/evil", "evil"), ("/abs/models/llama", "llama"), ("meta-llama/Llama-2-7b-hf", "Llama-2-7b-hf"),
    ("..", "llama"), ("", "llama"), ("a b/c d", "c-d"), ("C:\\models\\q", "q"), ("x" * 300, "x" * 80),
])
def test_hf_names_are_one_safe_component(tmp_path, raw, expected):
    cfg = json.loads((ROOT / "tests/fixtures/hf/llama2-7b.json").read_text())
    cfg["_name_or_path"] = raw
    (tmp_path / "my.json").write_text(json.dumps(cfg))
    spec = from_hf_config(tmp_path / "my.json")
    assert spec.name == (expected if raw else "my")
    assert "/" not in spec.name and "\\" not in spec.name and not spec.name.startswith(".")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=120))
def test_safe_model_name_is_always_a_plain_component(text):
    name = safe_model_name(text, "fallback")
    assert name == "fallback" or (0 < len(name) <= 80 and os.path.basename(name) == name
                                  and name not in (".", "..") and not name.startswith("."))
    ModelSpec(name, 8, 8, 1, 1, 1, 8, 8)        # accepted as a model name


def test_unsafe_model_names_are_refused():
    with pytest.raises(ConfigError, match="cache files"):
        ModelSpec("../x", 8, 8, 1, 1, 1, 8, 8)


@pytest.mark.parametrize("data, match", [
    (b"\xff\xfe{}", "not UTF-8"), (b"[" * 1000 + b"]" * 1000, "nested deeper"),
    (b'{"hidden_size": ' + b"9" * 5000 + b"}", "unreadable JSON value"),
])
def test_bad_hf_files_are_named_errors(tmp_path, data, match):
    (tmp_path / "c.json").write_bytes(data)
    with pytest.raises(ConfigError, match=match):
        from_hf_config(tmp_path / "c.json")

"""Prepared programs on disk (mtemu.fast.prepared over rtcommon.arrayfile): the tables the machine derives
from a kernel's program are written once and read back identical; a damaged file is derived again
with a warning; programs nobody named, or a cache turned off, write nothing."""
import os
import warnings

import numpy as np
import pytest

from mtemu import machine
from mtemu.assembler import parse
from mtemu.fast import prepared as prepared_store
from mtemu.kernels import gemm_a_resident, program_cache
from mtemu.kernels.gemm_a_resident import AResidentGemmTiles, run_a_resident
from mtemu.machine import Cluster
from mtemu.platform import DEFAULT
from rtcommon.arrayfile import ArrayFileError, read_arrays, write_arrays

SMALL = DEFAULT.with_overrides(dsps=4, vector_lanes=32)
TILES = AResidentGemmTiles(mg=48, kg=128, k2=64, n2=64)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MTEMU_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MTEMU_PROGRAM_CACHE", raising=False)
    _forget()
    yield tmp_path
    _forget()


def _forget():
    """A new process, as far as the caches go: programs and prepared tables only on disk."""
    gemm_a_resident._build_cached.cache_clear()
    machine._PREPARED.clear()


def _operands(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((96, 256)).astype(np.float16), rng.standard_normal((256, 96)).astype(np.float16))


def _prepared_files(root):
    return sorted((root / "prepared").glob("*.bin")) if (root / "prepared").exists() else []


def _code_files(root):
    return sorted((root / "program-code").glob("*.bin")) if (root / "program-code").exists() else []


def _code_file(root):
    """The program's code that the program cache kept when the functional run kept its tables (one
    program here)."""
    (program,) = next(iter(machine._PREPARED.values()))[0]
    return program_cache.code_path(program.origin)


def _table_file(root):
    (path,) = _prepared_files(root)
    return path


def _tables():
    (entry,) = machine._PREPARED.values()
    code, descs, lo, hi, desc_off, blocks, tables = entry[1]
    return [code, descs, lo, hi, desc_off, *blocks, *tables]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_tables_read_back_are_the_derived_ones_and_give_the_same_product(cache_dir, monkeypatch):
    a, b = _operands()
    first = run_a_resident(a, b, platform=SMALL, tiles=TILES)
    derived = [x.copy() for x in _tables()]
    files = _prepared_files(cache_dir)
    assert len(files) == 1 and _code_files(cache_dir) == [_code_file(cache_dir)]   # the tables; the code
    _forget()
    calls = []
    monkeypatch.setattr(machine, "build_blocks", lambda *a, **k: calls.append(1))     # must not be needed
    again = run_a_resident(a, b, platform=SMALL, tiles=TILES)
    assert not calls
    read = _tables()
    assert len(read) == len(derived)
    for x, y in zip(read, derived, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
        assert x.flags.c_contiguous
    # the machine runs the program's own (frozen) code, not a copy; the tables are writable arrays
    (program,) = next(iter(machine._PREPARED.values()))[0]
    assert read[0] is program.code and all(x.flags.writeable for x in read[1:])
    assert np.array_equal(first.c.view(np.uint16), again.c.view(np.uint16))
    assert first.stats.cycles == again.stats.cycles and _prepared_files(cache_dir) == files


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("damage", ["flip", "truncate", "other_key"])
def test_a_damaged_file_is_derived_again_with_a_warning(cache_dir, damage):
    a, b = _operands()
    want = run_a_resident(a, b, platform=SMALL, tiles=TILES).c
    path = _table_file(cache_dir)
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-100] ^= 0x10
    elif damage == "truncate":
        raw = raw[:len(raw) // 2]
    else:
        write_arrays(path, "another key", [(np.zeros(3, np.int64),)])
        raw = bytearray(path.read_bytes())
    path.write_bytes(bytes(raw))
    _forget()
    with pytest.warns(prepared_store.PreparedCacheWarning, match="deriving it again"):
        got = run_a_resident(a, b, platform=SMALL, tiles=TILES).c
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    _forget()
    run_a_resident(a, b, platform=SMALL, tiles=TILES)         # rewritten: read without a warning


def test_a_new_process_maps_the_code_a_functional_run_kept(cache_dir, monkeypatch):
    """The program cache takes a program's code from the copy kept with the prepared tables (mapped,
    not inflated from its .npz), the same code; without that copy it inflates the .npz again."""
    a, b = _operands()
    want = run_a_resident(a, b, platform=SMALL, tiles=TILES)
    (built,) = next(iter(machine._PREPARED.values()))[0]
    built_code = built.code.copy()
    _forget()

    inflate = program_cache._read_widened

    def no_inflate(*args):
        raise AssertionError("inflated the .npz's code")
    monkeypatch.setattr(program_cache, "_read_widened", no_inflate)
    got = run_a_resident(a, b, platform=SMALL, tiles=TILES)
    (loaded,) = next(iter(machine._PREPARED.values()))[0]
    assert loaded is not built and np.array_equal(loaded.code, built_code) and loaded.code.dtype == np.int64
    assert not loaded.code.flags.writeable and not loaded.code.flags.owndata
    assert np.array_equal(got.c.view(np.uint16), want.c.view(np.uint16)) and got.stats.cycles == want.stats.cycles
    monkeypatch.setattr(program_cache, "_read_widened", inflate)
    _code_file(cache_dir).unlink()
    _forget()
    assert np.array_equal(run_a_resident(a, b, platform=SMALL, tiles=TILES).c.view(np.uint16),
                          want.c.view(np.uint16))
    assert _code_file(cache_dir).exists()                      # kept again by the run


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("damage", ["flip", "other_content", "other_shape"])
def test_a_damaged_code_copy_is_ignored_with_a_warning(cache_dir, damage):
    a, b = _operands()
    want = run_a_resident(a, b, platform=SMALL, tiles=TILES).c
    (program,) = next(iter(machine._PREPARED.values()))[0]
    path = _code_file(cache_dir)
    if damage == "flip":
        raw = bytearray(path.read_bytes())
        raw[-100] ^= 0x10
        path.write_bytes(bytes(raw))
    elif damage == "other_content":   # a well-formed file under the code's key that holds something else
        write_arrays(path, program_cache.code_key(program.origin), [(np.zeros((2, 3), np.int64),)])
    else:                             # code of another length under the same name
        write_arrays(path, program_cache.code_key(program.origin), [(program.code[:-1].copy(),)])
    _forget()
    with pytest.warns((prepared_store.PreparedCacheWarning, program_cache.ProgramCacheWarning)):
        got = run_a_resident(a, b, platform=SMALL, tiles=TILES).c
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    assert np.array_equal(program_cache.load_code(program.origin), program.code)     # kept again, whole
    _forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error")                         # and mapped without a warning from now on
        again = run_a_resident(a, b, platform=SMALL, tiles=TILES).c
    assert np.array_equal(again.view(np.uint16), want.view(np.uint16))


def test_unnamed_programs_timing_runs_and_a_cache_turned_off_write_nothing(cache_dir, monkeypatch):
    prog = parse("{ smovi s1, 4 }\n{ nop }\n{ halt }", SMALL).freeze()
    Cluster(SMALL, ddr_bytes=4096).run([prog])
    assert _prepared_files(cache_dir) == _code_files(cache_dir) == []     # frozen, but nobody named its content
    gemm_a_resident.a_resident_timing(96, 256, 96, tiles=TILES, platform=SMALL)
    assert _prepared_files(cache_dir) == _code_files(cache_dir) == []     # timing mode: derived in memory only
    monkeypatch.setenv("MTEMU_PROGRAM_CACHE", "0")
    a, b = _operands()
    run_a_resident(a, b, platform=SMALL, tiles=TILES)
    assert _prepared_files(cache_dir) == _code_files(cache_dir) == []


def test_the_key_separates_mode_dsp_programs_and_platform():
    keys = {prepared_store.cache_key(["x"], [0, 0], SMALL, True, True),
            prepared_store.cache_key(["x"], [0, 0], SMALL, False, True),
            prepared_store.cache_key(["x"], [0, 0], SMALL, True, False),
            prepared_store.cache_key(["x", "y"], [0, 1], SMALL, True, True),
            prepared_store.cache_key(["y"], [0, 0], SMALL, True, True),
            prepared_store.cache_key(["x"], [0, 0], SMALL.with_overrides(vector_lanes=64), True, True)}
    assert len({prepared_store.cache_path(k) for k in keys}) == 6


def test_a_mapped_array_file_is_copy_on_write(tmp_path):
    """Writing to arrays of a mapped file changes them for this reader only: neither the file nor a
    second mapping of it sees the write."""
    path = tmp_path / "a.bin"
    write_arrays(path, "k", [(np.arange(4096, dtype=np.int64),)])
    before = path.read_bytes()
    first = read_arrays(path, "k", mapped=True)[0][0][0]
    first[:] = -1
    second = read_arrays(path, "k", mapped=True)[0][0][0]
    assert (first == -1).all() and np.array_equal(second, np.arange(4096))
    assert path.read_bytes() == before


@pytest.mark.parametrize("mapped", [False, True])
def test_array_files_round_trip_and_refuse_damage(tmp_path, mapped):
    path = tmp_path / "sub" / "a.bin"
    groups = [(np.arange(7, dtype=np.int64).reshape(7, 1), np.zeros((0, 3), np.int64), np.array([True, False])),
              None, (np.arange(5, dtype=np.uint16), np.float32([1.5, -0.0]))]
    write_arrays(path, "k", groups, {"labels": {"x": 1}})
    got, meta = read_arrays(path, "k", mapped=mapped)
    assert meta == {"labels": {"x": 1}} and got[1] is None
    for g, w in ((got[0], groups[0]), (got[2], groups[2])):
        for x, y in zip(g, w, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y) and x.flags.writeable
    with pytest.raises(ArrayFileError, match="key mismatch"):
        read_arrays(path, "other", mapped=mapped)
    raw = path.read_bytes()
    for bad, why in ((raw[:-64], "checksum|shorter"), (raw[:-1], "checksum"), (b"junk" + raw, "not an array file"),
                     (raw[:-8] + bytes([raw[-8] ^ 1]) + raw[-7:], "checksum"), (b"", "too short"),
                     (raw[:12], "too short"),
                     (raw.replace(b"[7, 1]", b"[1, 7]", 1), "header was edited"),      # same bytes, another shape
                     (raw.replace(b'{"x": 1}', b'{"x": 2}', 1), "header was edited")):
        path.write_bytes(bad)
        with pytest.raises(ArrayFileError, match=why):
            read_arrays(path, "k", mapped=mapped)
    with pytest.raises(FileNotFoundError):
        read_arrays(tmp_path / "none.bin", "k", mapped=mapped)
    with pytest.raises(ArrayFileError, match="must be of"):
        write_arrays(path, "k", [(np.zeros(2, np.complex64),)])


@pytest.mark.parametrize("raw", ["lots", "-5", "nan", "inf"])
def test_a_malformed_limit_warns_naming_the_variable_and_keeps_the_default(raw, monkeypatch):
    monkeypatch.setenv("MTEMU_PREPARED_CACHE_MB", raw)
    with pytest.warns(prepared_store.PreparedCacheWarning, match="MTEMU_PREPARED_CACHE_MB"):
        assert prepared_store.limit_bytes() == prepared_store.DEFAULT_LIMIT_MB << 20
    monkeypatch.setenv("MTEMU_PREPARED_CACHE_MB", "0.5")
    assert prepared_store.limit_bytes() == 1 << 19


def test_the_cache_keeps_to_its_limit_dropping_the_least_recently_used(cache_dir, monkeypatch):
    monkeypatch.setenv("MTEMU_PREPARED_CACHE_MB", str(24 / 1024))            # 24 KB
    table = (np.arange(256, dtype=np.int64),)                                # 2 KB a file
    for i in range(6):
        prepared_store.store(f"k{i}", [table])
        os.utime(prepared_store.cache_path(f"k{i}"), (1000 + i, 1000 + i))  # k0 oldest
    assert prepared_store.load("k0") is not None                            # ... now the newest
    for i in range(6, 16):
        prepared_store.store(f"k{i}", [table])
    kept = {p.name for p in _prepared_files(cache_dir)}
    assert sum(p.stat().st_size for p in _prepared_files(cache_dir)) <= 24 * 1024
    assert prepared_store.cache_path("k0").name in kept and prepared_store.cache_path("k15").name in kept
    assert prepared_store.cache_path("k1").name not in kept
    prepared_store.store("big", [(np.zeros(1024, np.int64),)])              # 8 KB > a eighth of 24 KB
    assert not prepared_store.cache_path("big").exists()


def test_an_origin_that_named_two_programs_is_caught_by_the_tables_sizes(cache_dir):
    """Tables read for a program of another length are refused (with a warning) before the machine
    indexes them, and derived from the program at hand."""
    short = parse("{ smovi s1, 4 }\n{ halt }", SMALL)
    long = parse("{ smovi s1, 4 }\n{ nop }\n{ smovi s2, 5 }\n{ halt }", SMALL)
    for prog in (short, long):
        prog.origin = "the same name for two programs"
        prog.freeze()
    Cluster(SMALL, ddr_bytes=4096, functional=True).run([short])
    assert len(_prepared_files(cache_dir)) == len(_code_files(cache_dir)) == 1     # its tables, its code
    cluster = Cluster(SMALL, ddr_bytes=4096, functional=True)
    with pytest.warns(prepared_store.PreparedCacheWarning, match="another program"):
        cluster.run([long])
    assert cluster.sregs[0, 2] == 5


def test_the_memo_keeps_the_newest_within_its_bytes():
    memo = prepared_store.SizedMemo(entries=3, max_bytes=1000)
    memo.put("a", np.zeros(400, np.uint8))
    memo.put("b", (np.zeros(400, np.uint8), [np.zeros(100, np.uint8)]))
    assert "a" in memo and "b" in memo and memo.get("a") is not None      # "a" now the most recent
    memo.put("c", np.zeros(300, np.uint8))        # 1300 bytes: the least recent ("b") goes
    assert "b" not in memo and "a" in memo and "c" in memo
    memo.put("huge", np.zeros(5000, np.uint8))    # larger than the bound: not kept, the rest stays
    assert "huge" not in memo and "a" in memo and "c" in memo
    memo.put("a", np.zeros(2000, np.uint8))       # a key's new value too large: its old one goes too
    assert "a" not in memo and "c" in memo
    for key in "wxyz":
        memo.put(key, np.zeros(1, np.uint8))      # entries bound too
    assert [len(v) for v in memo.values()] == [1, 1, 1]


def test_sized_memo_builds_once_and_clears():
    calls = []

    @prepared_store.sized_memo(entries=2)
    def build(n):
        calls.append(n)
        return np.zeros(n, np.uint8)
    assert build(3) is build(3) and calls == [3]
    build.cache_clear()
    build(3)
    assert calls == [3, 3]

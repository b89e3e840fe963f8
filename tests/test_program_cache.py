"""Built GEMM programs on disk: identical to a fresh build, keyed by kernel, shape, tiles and platform,
rebuilt with a warning when a file is unreadable or holds another program."""
import json

import numpy as np
import pytest

from mtemu.kernels import gemm, gemm_a_resident
from mtemu.kernels.gemm import GemmTiles
from mtemu.kernels.gemm_a_resident import AResidentGemmTiles
from mtemu.kernels.program_cache import _NPZ_LEVEL, ProgramCacheWarning, _narrow, _npz_bytes, cache_key, cache_path
from mtemu.platform import DEFAULT

SMALL = DEFAULT.with_overrides(dsps=4, vector_lanes=32)
CASES = [(gemm, "gemm", GemmTiles(mg=48, k2=64, n2=64)),
         (gemm_a_resident, "gemm_a_resident", AResidentGemmTiles(mg=48, kg=128, k2=64, n2=64))]
SHAPE = (96, 256, 96)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MTEMU_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MTEMU_PROGRAM_CACHE", raising=False)
    for mod, _, _ in CASES:
        mod._build_cached.cache_clear()
    yield tmp_path
    for mod, _, _ in CASES:
        mod._build_cached.cache_clear()


def build(mod, tiles, shape=SHAPE, platform=SMALL):
    mod._build_cached.cache_clear()      # past the in-process cache, to the disk
    return mod._build_cached(*shape, tiles, platform)


def same(a, b) -> bool:
    pa, pb = a.program, b.program
    return (np.array_equal(pa.code, pb.code) and np.array_equal(pa.descriptors, pb.descriptors)
            and pa.labels == pb.labels and pa.descriptor_names == pb.descriptor_names
            and a.init_sregs == b.init_sregs and a.dsp_descriptors.keys() == b.dsp_descriptors.keys()
            and all(np.array_equal(a.dsp_descriptors[d], b.dsp_descriptors[d]) for d in a.dsp_descriptors)
            and a.plan == b.plan and a.useful_macs == b.useful_macs)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("mod, kernel, tiles", CASES)
def test_a_loaded_program_is_the_built_one(mod, kernel, tiles, monkeypatch):
    monkeypatch.setenv("MTEMU_PROGRAM_CACHE", "0")
    fresh = build(mod, tiles)
    path = cache_path(cache_key(kernel, SHAPE, tiles, SMALL))
    assert not path.exists()                              # off: nothing written
    monkeypatch.setenv("MTEMU_PROGRAM_CACHE", "1")
    written = build(mod, tiles)
    assert path.exists() and same(fresh, written)
    loaded = build(mod, tiles)
    assert same(fresh, loaded)
    assert loaded.program.code.flags.c_contiguous and loaded.program.code.dtype == np.int64
    with np.load(path) as z:
        assert z["code"].dtype == np.int32                  # stored narrow, widened on load


def test_code_is_stored_as_int32_only_when_every_field_fits():
    code = np.zeros((3, 8, 7), np.int64)
    code[1, 2, 5], code[2, 7, 6] = (1 << 31) - 1, -(1 << 31)
    assert _narrow(code).dtype == np.int32 and np.array_equal(_narrow(code), code)
    for bad in (1 << 31, -(1 << 31) - 1):
        wide = code.copy()
        wide[0, 0, 6] = bad
        assert _narrow(wide) is wide


def test_a_program_file_is_an_npz_deflated_at_the_stated_level():
    """np.load reads what the writer deflates, every array as it was (dtype, shape, values)."""
    import io
    import zipfile

    arrays = {"header": np.array(json.dumps({"key": "k"})), "code": np.arange(-50, 70, dtype=np.int32).reshape(4, 5, 6),
              "descriptors": np.ones((3, 7), np.int64), "tables": np.zeros((0, 3, 7), np.int64)}
    data = _npz_bytes(arrays)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert {i.filename: i.compress_type for i in archive.infolist()} == \
            {f"{k}.npy": zipfile.ZIP_DEFLATED for k in arrays}
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        assert sorted(z.files) == sorted(arrays)
        for k, a in arrays.items():
            assert z[k].dtype == a.dtype and np.array_equal(z[k], a)
    assert _NPZ_LEVEL == 1


def test_the_key_separates_kernels_shapes_tiles_and_platforms():
    t = GemmTiles(mg=48, k2=64, n2=64)
    keys = {cache_key("gemm", SHAPE, t, SMALL), cache_key("gemm_a_resident", SHAPE, t, SMALL),
            cache_key("gemm", (96, 256, 97), t, SMALL), cache_key("gemm", SHAPE, GemmTiles(mg=96), SMALL),
            cache_key("gemm", SHAPE, t, SMALL.with_overrides(dma_latency_cycles=601))}
    assert len({cache_path(k) for k in keys}) == 5


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("damage", ["truncate", "garbage", "other_key", "flip", "float_code", "short_code",
                                    "edited_descriptor", "edited_register"])
def test_a_damaged_file_is_rebuilt_with_a_warning(damage):
    mod, kernel, tiles = CASES[0]
    fresh = build(mod, tiles)
    path = cache_path(cache_key(kernel, SHAPE, tiles, SMALL))
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "garbage":
        path.write_bytes(b"not a zip file at all")
    elif damage == "flip":                                # inside the compressed code
        raw = bytearray(path.read_bytes())
        at = raw.index(b"code.npy") + 200
        raw[at] ^= 0x5A
        path.write_bytes(bytes(raw))
    elif damage in ("float_code", "short_code", "edited_descriptor", "edited_register"):
        with np.load(path) as z:                          # a well-formed file, one thing changed in it
            arrays = {k: z[k] for k in z.files}
        if damage == "edited_descriptor":                 # a plausible value, by hand
            arrays["tables"] = arrays["tables"].copy()
            arrays["tables"].flat[0] += 64
        elif damage == "edited_register":
            header = json.loads(str(arrays["header"]))
            header["init_sregs"][0][1][0][1] += 1
            arrays["header"] = np.array(json.dumps(header, sort_keys=True))
        else:
            arrays["code"] = (arrays["code"].astype(np.float32) if damage == "float_code"
                              else arrays["code"].reshape(-1)[:-1])
        with open(path, "wb") as fh:
            np.savez_compressed(fh, **arrays)
    else:   # a valid file of another program under this name
        build(mod, tiles, shape=(96, 256, 192))
        path.write_bytes(cache_path(cache_key(kernel, (96, 256, 192), tiles, SMALL)).read_bytes())
    with pytest.warns(ProgramCacheWarning, match="rebuilding"):
        again = build(mod, tiles)
    assert same(fresh, again)
    assert same(fresh, build(mod, tiles))                 # rewritten: loads without a warning


def test_an_unwritable_cache_only_costs_the_build(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("MTEMU_CACHE_DIR", str(blocker))
    mod, _, tiles = CASES[0]
    with pytest.warns(ProgramCacheWarning, match=f"cannot write the program cache in {blocker}.*running without it"):
        assert build(mod, tiles).program.bundles > 0

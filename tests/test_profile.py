import dataclasses
import json
import warnings

import pytest

import ratrain.cost.profile as profile
from mtemu.kernels import registry
from mtemu.kernels.registry import DEFAULT_GEMM, emulation_set, gemm_variant, tile_candidates
from mtemu.platform import DEFAULT as DEFAULT_CLUSTER
from ratrain.errors import ConfigError
from ratrain.spec.models import ModelSpec, get_model, layer_operators
from rtcommon.cache import write_json_cache
from rtcommon.caches import CacheWarning

DEFAULT_VARIANT = gemm_variant(DEFAULT_GEMM)
gemm_timing = DEFAULT_VARIANT.timing          # the training platform's default GEMM
TINY = ModelSpec(name="tiny-test", hidden=192, ffn=384, layers=2, heads=3, kv_heads=3, head_dim=64, vocab=384)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(profile, "SHIPPED_DIR", tmp_path / "shipped")
    profile._MEMO.clear()
    yield tmp_path
    profile._MEMO.clear()


def test_roofline_profile_adds_up_its_operators():
    prof = profile.layer_profile(get_model("llama2-7b"), 1, 2048, source="roofline")
    assert prof.forward_s == pytest.approx(sum(o.forward_s for o in prof.ops))
    ops = {o.name: o for o in prof.ops}
    # a GEMM's backward is two GEMMs of the same MAC count
    assert ops["q_proj"].backward_s == pytest.approx(2 * ops["q_proj"].forward_s)
    assert [o.name for o in prof.ops] == [o.name for o in layer_operators(get_model("llama2-7b"), 1, 2048)]
    assert prof.last_forward_s > prof.first_forward_s > 0


def test_emulated_profile_uses_emulated_gemms_and_is_cached(cache):
    prof = profile.layer_profile(TINY, 1, 64, progress=False)
    q = {o.name: o for o in prof.ops}["q_proj"]
    m, k, n, seconds, method = q.gemms[0]
    assert (m, k, n, method) == (64, 192, 192, "emulated")
    assert seconds == pytest.approx(gemm_timing(64, 192, 192).cycles / 1.7578125e9)
    files = list((cache / "profiles").glob("hf-config-*.json"))
    assert len(files) == 1
    # a second lookup loads the file instead of emulating
    profile._MEMO.clear()
    calls = []
    monkey = profile.build_profile
    profile.build_profile = lambda *a, **k: calls.append(1) or monkey(*a, **k)
    try:
        again = profile.layer_profile(TINY, 1, 64)
    finally:
        profile.build_profile = monkey
    assert calls == [] and again.forward_s == pytest.approx(prof.forward_s)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("damage", ["corrupt", "stale", "malformed", "edited"])
def test_damaged_or_stale_profiles_are_rebuilt(cache, damage):
    prof = profile.layer_profile(TINY, 1, 64)
    path = next((cache / "profiles").glob("hf-config-*.json"))
    data = json.loads(path.read_text())
    if damage == "corrupt":
        path.write_text(path.read_text()[:100])
    elif damage == "stale":
        data["emulator_version"] = "0" * 16
        data["forward_s"] = 123.0
        for o in data["ops"]:
            o["forward_s"] = 1.0
        write_json_cache(path, data)            # an older version's entry, its checksum intact
    elif damage == "malformed":
        del data["ops"]
        path.write_text(json.dumps(data))
    else:                                       # by hand, to plausible values: every operator 10x faster
        for o in data["ops"] + data["first_ops"] + data["last_ops"]:
            o["forward_s"], o["backward_s"] = o["forward_s"] / 10, o["backward_s"] / 10
        path.write_text(json.dumps(data))
    profile._MEMO.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        again = profile.layer_profile(TINY, 1, 64)
    assert again.forward_s == pytest.approx(prof.forward_s)
    assert json.loads(path.read_text())["emulator_version"] == profile.emulator_version()
    # a damaged file is named in one CacheWarning; a stale one is expected (a new emulator), silent
    assert [(w.category, str(path) in str(w.message)) for w in seen] == ([] if damage == "stale" else
                                                                         [(CacheWarning, True)])


def test_gemm_cache_ignores_entries_of_another_emulator_version(cache):
    c = profile.GemmCache()
    entry = c.lookup(48, 64, 192)
    c.save()
    raw = json.loads((cache / "gemm_cache.json").read_text())
    assert list(raw["entries"]) == [c.key(48, 64, 192)]
    # the same shape under another version is not found
    raw["entries"] = {k.replace(c.version, "f" * 16): {**v, "seconds": 99.0} for k, v in raw["entries"].items()}
    write_json_cache(cache / "gemm_cache.json", raw)
    fresh = profile.GemmCache()
    assert fresh.lookup(48, 64, 192)["seconds"] == entry["seconds"]


def test_a_hand_edited_gemm_latency_is_never_used(cache):
    c = profile.GemmCache()
    entry = c.lookup(48, 64, 192)
    c.save()
    raw = json.loads((cache / "gemm_cache.json").read_text())
    raw["entries"][c.key(48, 64, 192)]["seconds"] = entry["seconds"] / 10      # plausible, 10x faster
    (cache / "gemm_cache.json").write_text(json.dumps(raw))
    with pytest.warns(CacheWarning, match="gemm_cache.json: checksum mismatch"):
        fresh = profile.GemmCache()
    assert fresh.lookup(48, 64, 192)["seconds"] == entry["seconds"]


def test_tuned_gemm_entry_reuses_the_choosers_run(monkeypatch):
    # tuned tiles: the chooser emulates its candidates once each and the entry is the winner's run,
    # not a second emulation of it
    m, k, n = 96, 128, 192
    runs = []

    def counted(*args, **kwargs):
        runs.append(kwargs["tiles"])
        return gemm_timing(*args, **kwargs)

    timed = dataclasses.replace(DEFAULT_VARIANT, timing=counted)
    monkeypatch.setitem(registry.GEMM_VARIANTS, DEFAULT_GEMM, timed)
    registry.choose_tiles_measured.cache_clear()
    entry = profile.emulate_kernel(("gemm", DEFAULT_GEMM, m, k, n, True, DEFAULT_CLUSTER))
    registry.choose_tiles_measured.cache_clear()
    ranked = [t for _, t in tile_candidates(DEFAULT_GEMM, m, k, n, DEFAULT_CLUSTER)]
    default = DEFAULT_VARIANT.plan(m, k, n, DEFAULT_VARIANT.default_tiles, DEFAULT_CLUSTER).tiles
    assert len(runs) == len(emulation_set(ranked, default, registry.CHOOSE_EMULATE_TOP))
    best = DEFAULT_VARIANT.tiles(entry["tiles"])
    assert entry["cycles"] == gemm_timing(m, k, n, tiles=best).cycles == min(gemm_timing(m, k, n, tiles=t).cycles
                                                                                 for t in runs)


def test_extrapolated_gemm_matches_full_emulation(cache, monkeypatch):
    # N = 9 panels of n2 + 128: emulate 3+r and 5+r panels, extrapolate to 9+r
    n2 = DEFAULT_VARIANT.default_tiles.n2
    m, k, n = 512, 256, 9 * n2 + 128
    full = gemm_timing(m, k, n).cycles
    monkeypatch.setattr(profile, "EXTRAPOLATE_ABOVE_MACS", 1e6)
    c = profile.GemmCache()
    e = c.lookup(m, k, n)
    assert e["method"] == "extrapolated"
    assert abs(e["cycles"] - full) / full < 0.005


def test_bad_source_is_refused():
    with pytest.raises(ConfigError, match="profile source"):
        profile.build_profile(TINY, 1, 64, source="guess")


def test_shipped_latencies_match_the_current_emulator():
    """Shipped GEMM latencies are keyed by mtemu.version; re-emulating some must give the same
    cycles, or the timing changed without bumping TIMING_VERSION (then regenerate with
    scripts/ship_profiles.py)."""
    path = profile.SHIPPED_DIR / "gemm_cache.json"
    if not path.exists():
        pytest.skip("no shipped latency cache")
    entries = json.loads(path.read_text())["entries"]
    version = profile.emulator_version("gemm")
    current = {k: v for k, v in entries.items() if k.startswith(version) and v["method"] == "emulated"
               and f"|{DEFAULT_GEMM}|" in k and "|tuned|" not in k}
    assert current, (f"shipped latencies are stale: none carries emulator version {version}; "
                     "run scripts/ship_profiles.py")
    shapes = sorted(current, key=lambda k: current[k]["cycles"])
    picks = [shapes[0], shapes[len(shapes) // 2]]
    for key in picks:
        m, k, n = (int(x) for x in key.rsplit("|", 1)[1].split("x"))
        assert gemm_timing(m, k, n).cycles == current[key]["cycles"], key


def test_every_shipped_profile_is_current():
    shipped = sorted(profile.SHIPPED_DIR.glob("*-tp*.json"))
    if not shipped:
        pytest.skip("no shipped profiles")
    version = profile.emulator_version()
    stale = [p.name for p in shipped if json.loads(p.read_text())["emulator_version"] != version]
    assert not stale, f"stale shipped profiles {stale}: run scripts/ship_profiles.py"

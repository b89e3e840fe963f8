"""One platform from kernel to training step: every training number follows the platform's fields."""
from __future__ import annotations

import json

import pytest

import ratrain.cost.profile as profile
from mtemu.kernels.registry import DEFAULT_GEMM, gemm_variant
from mtemu.platform import Platform
from ratrain.errors import ConfigError
from ratrain.plan.planner import Planner, simulate_config
from ratrain.spec.models import ModelSpec, get_model
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import GIB, TrainingPlatform
from rtcommon.cache import write_json_cache
from rtcommon.caches import CacheWarning

TINY = ModelSpec(name="tiny-platform", hidden=192, ffn=384, layers=4, heads=3, kv_heads=3, head_dim=64, vocab=384)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(profile, "SHIPPED_DIR", tmp_path / "shipped")
    profile._MEMO.clear()
    yield
    profile._MEMO.clear()


def _profile(platform: TrainingPlatform, seq: int = 128):
    return profile.layer_profile(TINY, 1, seq, platform=platform, progress=False)


def test_default_is_fig4_loop_order_on_the_raw_ddr_rate():
    p = TrainingPlatform()
    assert p.gemm_loop_order == DEFAULT_GEMM == "a-resident"
    assert p.cluster.ddr_bandwidth == 51e9 and p.cluster.dma_row_overhead_cycles == 0.0
    assert p.memory_budget_bytes == p.cluster.ddr_bytes == 20 * GIB


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_ddr_bandwidth_moves_kernel_latencies_and_the_step():
    fast = TrainingPlatform()
    slow = fast.with_overrides(ddr_bandwidth=8e9)
    pf, ps = _profile(fast), _profile(slow)
    gemm = {o.name: o for o in pf.ops}["up_proj"].gemms[0]
    gemm_slow = {o.name: o for o in ps.ops}["up_proj"].gemms[0]
    assert gemm_slow[3] > gemm[3]                              # the emulated GEMM itself
    assert ps.ddr_rate("optimizer_update") < 0.2 * pf.ddr_rate("optimizer_update")
    assert ps.forward_s > pf.forward_s and ps.backward_s > pf.backward_s
    cfg = ParallelConfig(pp=2, dp=2, accum=4, seq=128)
    step_fast = simulate_config(TINY, cfg, platform=fast).simulated_ms
    step_slow = simulate_config(TINY, cfg, platform=slow).simulated_ms
    assert step_slow > step_fast


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_clock_moves_latencies_both_ways():
    base = TrainingPlatform()
    quick = base.with_overrides(clock_hz=2 * base.cluster.clock_hz)
    assert _profile(quick).forward_s < _profile(base).forward_s


def test_small_am_is_an_error_naming_the_memory_and_the_bytes():
    tiny_am = TrainingPlatform().with_overrides(am_bytes=64 * 1024)
    with pytest.raises(Exception, match=r"AM: .* \d+ more than the 65536-byte AM"):
        _profile(tiny_am, seq=2048)


@pytest.mark.slow     # > 5 s: the full suite runs it, the quick layer does not
def test_tuned_tiles_are_no_slower_and_keyed_apart():
    default = TrainingPlatform()
    tuned = default.with_overrides(tiles="tuned")
    assert profile.platform_key(default) != profile.platform_key(tuned)
    pd, pt = _profile(default, 256), _profile(tuned, 256)
    gemm_d = sum(g[3] for o in pd.ops if o.kind == "gemm" for g in o.gemms)
    gemm_t = sum(g[3] for o in pt.ops if o.kind == "gemm" for g in o.gemms)
    assert gemm_t <= gemm_d


def test_budget_change_reuses_profiles_and_moves_the_plan():
    model = get_model("llama2-7b")
    big = TrainingPlatform()
    small = big.with_overrides(memory_budget_bytes=12 * GIB)
    assert profile.platform_key(big) == profile.platform_key(small)          # no re-emulation for a budget
    best_big = Planner(model, big, profile_source="roofline").plan(16, 512).best
    best_small = Planner(model, small, profile_source="roofline").plan(16, 512).best
    assert best_small.peak_bytes <= 12 * GIB < best_big.peak_bytes or best_small.config != best_big.config
    assert best_small.step_ms >= best_big.step_ms


def test_link_bandwidth_moves_the_planners_choice_toward_data_parallel_traffic():
    model = get_model("llama2-13b")
    slow = Planner(model, TrainingPlatform(), profile_source="roofline").plan(64, 256).best
    fast = Planner(model, TrainingPlatform(link_bandwidth=400e9), profile_source="roofline").plan(64, 256).best
    assert fast.step_ms < slow.step_ms


def test_description_round_trips_through_both_clis(tmp_path, run_cli):
    from mtemu.cli import main as mtemu_main
    from ratrain.cli import main as ratrain_main
    code, out, err = run_cli(ratrain_main, ["platform", "--json"])
    assert code == 0, err
    data = json.loads(out)
    data["cluster"]["ddr_bandwidth"] = 40e9
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    again = TrainingPlatform.from_file(path)
    assert again.cluster.ddr_bandwidth == 40e9 and again.link_bandwidth == 3.7e9
    assert Platform.from_file(path).ddr_bandwidth == 40e9                     # mtemu reads the [cluster] part
    code, out, err = run_cli(mtemu_main, ["platform", "--platform", str(path), "--json"])
    assert code == 0 and json.loads(out)["ddr_bandwidth"] == 40e9, err


@pytest.mark.parametrize("data, pattern", [
    ({"training": {"ddr_bandwidth": 1}}, r"unknown field 'ddr_bandwidth' in \[training\]"),
    ({"hbm": 1}, r"unknown field 'hbm'"),
    ({"cluster": {"clock_hz": -1.0}}, r"clock_hz"),
    ({"link_bandwidth": 3.7}, r"in bytes/s"),
    ({"gemm_loop_order": "z-order"}, r"gemm_loop_order must be one of a-resident, c-stationary"),
    ({"tiles": "best"}, r"tiles must be one of default, tuned"),
])
def test_bad_platform_descriptions_name_the_field(data, pattern):
    with pytest.raises(ConfigError, match=pattern):
        TrainingPlatform.from_dict(data)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_profile_of_the_c_stationary_variant_uses_it():
    p = TrainingPlatform(gemm_loop_order="c-stationary")
    prof = _profile(p)
    m, k, n, seconds, _ = {o.name: o for o in prof.ops}["q_proj"].gemms[0]
    want = gemm_variant("c-stationary").timing(m, k, n, platform=p.cluster).cycles / p.cluster.clock_hz
    assert seconds == pytest.approx(want)


def test_corrupt_gemm_cache_entries_are_dropped_with_a_warning(tmp_path):
    cache = profile.GemmCache()
    key = cache.key(48, 64, 192)
    write_json_cache(tmp_path / "gemm_cache.json",
                     {"format": profile.GEMM_FORMAT, "entries": {key: {"seconds": 1.0, "utilization": 5.0}}})
    with pytest.warns(CacheWarning, match="impossible cache entr"):
        fresh = profile.GemmCache()
    assert key not in fresh.entries


def test_attention_of_larger_micro_batches_and_tp_scales_the_reference_kernels():
    p = TrainingPlatform()
    one = profile.layer_profile(TINY, 1, 128, platform=p, progress=False)
    two = profile.layer_profile(TINY, 2, 128, platform=p, progress=False)
    a1 = {o.name: o for o in one.ops}["attention"]
    a2 = {o.name: o for o in two.ops}["attention"]
    assert a2.forward_s == pytest.approx(2 * a1.forward_s) and a2.backward_s == pytest.approx(2 * a1.backward_s)
    # GEMMs are still emulated at the larger shape
    assert {o.name: o for o in two.ops}["q_proj"].gemms[0][4] == "emulated"


def test_bound_model_is_the_reference_at_b1_and_scaled_bounds_above():
    p = TrainingPlatform()
    ref = profile.layer_profile(TINY, 1, 128, platform=p, progress=False)
    assert profile.layer_profile(TINY, 1, 128, source="bound", platform=p) is ref
    fast = profile.layer_profile(TINY, 2, 128, source="bound", platform=p)
    cache = profile.GemmCache(p)
    shapes = [g for o in ref.ops + ref.first_ops + ref.last_ops if o.kind == "gemm" for g in o.gemms]
    scale = sum(g[3] for g in shapes) / sum(cache.bound_seconds(*g[:3]) for g in shapes)
    m, k, n, seconds, method = {o.name: o for o in fast.ops}["up_proj"].gemms[0]
    assert method == "bound" and seconds == pytest.approx(cache.bound_seconds(m, k, n) * scale)
    # the fast model is within 10 % of the emulated profile at b = 2 on this model
    emulated = profile.layer_profile(TINY, 2, 128, platform=p, progress=False)
    assert fast.forward_s == pytest.approx(emulated.forward_s, rel=0.10)


def test_planner_confirms_finalists_on_emulated_kernels():
    planner = Planner(TINY, TrainingPlatform(), progress=False)
    r = planner.plan(4, 16, seq=128, top=6, confirm=2)
    assert r.kernel_model == "bound" and r.confirmed == 2 and r.fast_error is not None
    head = r.ranked[:2]
    assert all(c.kernels == "emulated" and c.fast_step_ms is not None for c in head)
    assert head[0].step_ms <= head[1].step_ms
    assert all(c.kernels == "bound" for c in r.ranked[2:])
    for c in head:        # the confirmed estimate is the emulated-profile estimate
        assert c.step_ms == pytest.approx(planner.estimate(c.config).step_ms)

"""`mtemu tune gemm` and training's `--tiles tuned` choose from the same candidates the same way."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

import ratrain.cost.profile as profile
from mtemu.kernels.registry import CHOOSE_EMULATE_TOP, DEFAULT_GEMM, choose_tiles, gemm_variant, tile_candidates
from mtemu.platform import DEFAULT
from mtemu.tune import tune_gemm
from ratrain.plan.planner import simulate_config
from ratrain.spec.models import ModelSpec
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import TrainingPlatform

# a shape where the choice beats the defaults (a-resident: 18835 vs 20453 cycles, n2 = one vector)
SHAPE = (256, 384, 192)
TINY = ModelSpec(name="tiny-tuned", hidden=192, ffn=384, layers=4, heads=3, kv_heads=3, head_dim=64, vocab=384)


@pytest.fixture
def private(tmp_path, monkeypatch, mtemu_cache_in):
    mtemu_cache_in(tmp_path / "mtemu")
    monkeypatch.setenv("RATRAIN_CACHE_DIR", str(tmp_path / "ratrain"))
    monkeypatch.setattr(profile, "SHIPPED_DIR", tmp_path / "shipped")
    profile._MEMO.clear()
    yield tmp_path
    profile._MEMO.clear()


@pytest.mark.parametrize("loop_order", [None, "c-stationary"])
def test_the_tuners_best_is_the_tuned_tiles_pick(private, loop_order):
    name = loop_order or DEFAULT_GEMM
    kw = {"loop_order": loop_order} if loop_order else {}     # the tuner's default is the training default
    r = tune_gemm(*SHAPE, emulate_top=CHOOSE_EMULATE_TOP, workers=1, out_dir=None, progress=False, **kw)
    assert r.loop_order == name
    variant = gemm_variant(name)
    ranked = [t for _, t in tile_candidates(name, *SHAPE, DEFAULT)]
    default = variant.plan(*SHAPE, variant.default_tiles, DEFAULT).tiles
    # the same candidates: the registry's grid, its two best by the bound emulated with the defaults
    emulated = {json.dumps(c.tiles, sort_keys=True) for c in r.candidates}
    assert emulated == {json.dumps(asdict(t), sort_keys=True) for t in [*ranked[:CHOOSE_EMULATE_TOP], default]}
    assert len(r.candidates) + len(r.screened) == len(ranked) + (default not in ranked)
    # the same choice
    assert r.best.tiles == asdict(choose_tiles(name, *SHAPE, DEFAULT))
    assert r.best.cycles == variant.timing(*SHAPE, tiles=variant.tiles_type(**r.best.tiles), platform=DEFAULT).cycles
    if name == DEFAULT_GEMM:
        assert r.best.cycles < r.default.cycles                  # hand-checked: 18835 < 20453


@pytest.mark.slow            # two emulated profiles, the tuned one emulating three tile sets per GEMM shape
def test_better_tiles_shorten_the_simulated_step(private):
    default = TrainingPlatform()
    tuned = default.with_overrides(tiles="tuned")
    prof_d = profile.layer_profile(TINY, 1, 128, platform=default, progress=False)
    prof_t = profile.layer_profile(TINY, 1, 128, platform=tuned, progress=False)
    gemms_d = [g for o in prof_d.ops if o.kind == "gemm" for g in o.gemms]
    gemms_t = [g for o in prof_t.ops if o.kind == "gemm" for g in o.gemms]
    # per GEMM never slower (the defaults compete), and faster somewhere
    assert all(t[3] <= d[3] for d, t in zip(gemms_d, gemms_t, strict=True))
    assert sum(t[3] for t in gemms_t) < sum(d[3] for d in gemms_d)
    # each tuned latency is the tile set the tuner finds for that shape
    m, k, n = gemms_t[0][:3]
    pick = choose_tiles(DEFAULT_GEMM, m, k, n, tuned.cluster)
    assert gemms_t[0][3] == pytest.approx(
        gemm_variant(DEFAULT_GEMM).timing(m, k, n, tiles=pick, platform=tuned.cluster).cycles / tuned.cluster.clock_hz)
    cfg = ParallelConfig(pp=2, dp=2, accum=4, seq=128)
    assert simulate_config(TINY, cfg, platform=tuned).simulated_ms < simulate_config(TINY, cfg, platform=default
                                                                                     ).simulated_ms


def test_cli_tunes_the_named_loop_order_and_refuses_a_foreign_tile(private, tmp_path, mtemu_cache_in, run_cli):
    from mtemu.cli import main
    mtemu_cache_in(tmp_path / "cli")
    run = ["tune", "gemm", "--m", "64", "--k", "64", "--n", "192", "--emulate-top", "1", "--out", str(tmp_path / "out"),
           "--json"]
    code, out, err = run_cli(main, run + ["--kg", "64"])
    assert code == 0, err
    assert json.loads(out)["loop_order"] == DEFAULT_GEMM
    code, _, err = run_cli(main, run + ["--loop-order", "c-stationary", "--kg", "64"])
    assert code == 2 and "unknown tile 'kg'" in err and len(err.strip().splitlines()) == 1

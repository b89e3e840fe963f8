import json
import os

import pytest

from mtemu.errors import CapacityError, MtemuError
from mtemu.kernels.gemm import GemmTiles, gemm_timing
from mtemu.kernels.gemm_bound import gemm_bound
from mtemu.platform import DEFAULT
from mtemu.tune import gemm_candidates, tune_gemm

SHAPE = (256, 512, 768)
GRID = {"mg": (128, 256), "k2": (64, 128), "n2": (384, 768), "mr_nv": ((6, 4),)}
CS = "c-stationary"           # the tests that check against the C-stationary kernel's own functions


@pytest.fixture
def cachedir(tmp_path, mtemu_cache_in):
    mtemu_cache_in(tmp_path / "cache")
    return tmp_path


def test_infeasible_tiles_are_pruned_before_emulation():
    small_am = DEFAULT.with_overrides(am_bytes=448 * 1024)
    feasible, pruned = gemm_candidates(2048, 4096, 4096, {"mg": (2048,), "k2": (128,), "n2": (384, 1152),
                                                          "mr_nv": ((6, 4),)}, small_am, loop_order=CS)
    assert [t.n2 for t in feasible] == [384]
    assert len(pruned) == 1 and "AM:" in pruned[0].reason


def test_sweep_ranks_by_emulated_utilization_and_resumes_from_cache(cachedir):
    r = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=cachedir / "out", progress=False, loop_order=CS)
    utils = [c.utilization for c in r.candidates]
    assert utils == sorted(utils, reverse=True)
    best = GemmTiles(**r.best.tiles)
    assert r.best.utilization == gemm_timing(*SHAPE, tiles=best).utilization
    assert r.best.utilization >= r.default.utilization
    assert (cachedir / "out" / "gemm_c-stationary_256x512x768_heatmap.png").stat().st_size > 1000
    table = json.loads((cachedir / "out" / "gemm_c-stationary_256x512x768.json").read_text())
    assert set(table) >= {"default", "best", "candidates", "pruned"}
    # each candidate names its closed-form bound and its top stall
    for c in table["candidates"]:
        b = gemm_bound(*SHAPE, GemmTiles(**c["tiles"]))
        assert (c["bound"], c["bound_utilization"]) == (b.bound, b.utilization)
        assert c["top_stall"] == max(c["stalls"], key=c["stalls"].get)
    again = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False, loop_order=CS)
    assert all(c.cached for c in again.candidates)
    assert [c.to_json() | {"cached": False} for c in again.candidates] == [c.to_json() for c in r.candidates]


def test_a_corrupt_cache_entry_is_re_emulated(cachedir):
    r = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False)
    files = sorted((cachedir / "cache" / "tune").glob("*.json"))
    files[0].write_text('{"utilization": 0.9')           # a crash mid-write
    again = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False)
    assert sum(not c.cached for c in again.candidates) == 1
    assert [c.utilization for c in again.candidates] == [c.utilization for c in r.candidates]


@pytest.fixture(scope="module")
def one_process_table():
    """The sweep on this process alone (uncached): what every parallel run must give."""
    table = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False, cache=False)
    return [c.to_json() for c in table.candidates]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_local_processes_give_the_same_table(one_process_table):
    two = tune_gemm(*SHAPE, grid=GRID, workers=2, out_dir=None, progress=False, cache=False)
    assert [c.to_json() for c in two.candidates] == one_process_table


def _dask_table(workers: int, processes: bool) -> list[dict]:
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] not installed")
    with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            remote = tune_gemm(*SHAPE, grid=GRID, scheduler=client, out_dir=None, progress=False, cache=False)
    return [c.to_json() for c in remote.candidates]


def test_dask_cluster_in_this_process_gives_the_same_table(one_process_table):
    # the scheduler path (map, as completed, back in order) on one worker thread: no process to start
    assert _dask_table(1, processes=False) == one_process_table


@pytest.mark.slow
def test_dask_local_cluster_gives_the_same_table(one_process_table):
    # worker processes, each loading the machine: the same path as above, across processes
    assert _dask_table(2, processes=True) == one_process_table


def test_defaults_that_do_not_fit_are_reported():
    tiny = DEFAULT.with_overrides(sm_bytes=4096)
    with pytest.raises(CapacityError, match="SM"):
        tune_gemm(2048, 4096, 4096, platform=tiny, out_dir=None, progress=False)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_attention_sweep_prunes_ranks_and_caches(cachedir):
    from mtemu.tune import tune_attention
    grid = {"br": (64, 192, 256), "bc": (64, 128), "br_prime": (32,), "bc_prime": (32,)}
    r = tune_attention(256, 2, 1, 64, grid=grid, workers=1, out_dir=cachedir / "out", progress=False)
    assert any("exceeds one vector" in c.reason for c in r.pruned)        # br=256 > 192 lanes
    utils = [c.utilization for c in r.candidates]
    assert utils == sorted(utils, reverse=True) and r.best.utilization >= r.default.utilization
    assert (cachedir / "out" / "attention_h2_kv1_s256_d64_heatmap.png").stat().st_size > 1000
    again = tune_attention(256, 2, 1, 64, grid=grid, workers=1, out_dir=None, progress=False)
    assert all(c.cached for c in again.candidates)
    assert all(c.top_stall in c.stalls and c.bound is None for c in again.candidates)


def test_screening_by_the_bound_emulates_only_the_top_and_keeps_the_best(cachedir):
    full = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=None, progress=False, loop_order=CS)
    top = tune_gemm(*SHAPE, grid=GRID, workers=1, out_dir=cachedir / "screen", progress=False, emulate_top=2,
                    loop_order=CS)
    emulated = {json.dumps(c.tiles, sort_keys=True) for c in top.candidates}
    assert len(emulated) <= 3                                   # the top 2 and the defaults
    assert len(top.candidates) + len(top.screened) == len(full.candidates)
    assert top.best.tiles == full.best.tiles
    # every screened candidate's bound is at most the cut's, and every bound is above the emulation
    cut = min(gemm_bound(*SHAPE, GemmTiles(**c.tiles)).utilization for c in top.candidates
              if c.tiles != top.default.tiles)
    assert all(c.bound_utilization <= cut + 1e-12 and c.utilization is None and c.bound in ("ddr", "compute")
               and c.top_stall is None for c in top.screened)
    by_tiles = {json.dumps(c.tiles, sort_keys=True): c.utilization for c in full.candidates}
    assert all(c.bound_utilization >= by_tiles[json.dumps(c.tiles, sort_keys=True)] for c in top.screened)
    assert "screened" in top.to_json() and os.path.getsize(top.heatmap) > 5000


def test_screening_rejects_a_bad_count():
    with pytest.raises(MtemuError, match="emulate_top"):
        tune_gemm(*SHAPE, grid=GRID, out_dir=None, progress=False, emulate_top=0)

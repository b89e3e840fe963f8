"""The planner's analytic pass over arrays (ratrain.plan.vectorised) gives the scalar path's numbers bit
for bit: the memory check, every layer kind's cost terms, the main path, and so the planner's picks.

The scalar side (each point's cost terms, the roofline profiles, the partitions) is computed once per
case and shared by the tests that compare against it (``functools.cache``): the same pure functions of
the same inputs, so each test still compares every point."""
from __future__ import annotations

import functools

import pytest

from ratrain.cost.profile import layer_profile
from ratrain.cost.terms import cost_terms, stage_kinds
from ratrain.plan.estimator import main_path
from ratrain.plan.planner import Planner, search_grid, search_space
from ratrain.plan.vectorised import COLUMNS, FIELDS, KINDS, Grid, kind_arrays, main_path_ms, peak_bytes
from ratrain.spec.memory import DEFAULT_CONSTANTS, MemoryConstants, PeakMemory
from ratrain.spec.models import get_model
from ratrain.spec.parallel import ParallelConfig, partition_model
from ratrain.spec.platform import TrainingPlatform
from ratrain.spec.platforms import load_platform

CASES = [("llama2-7b", 64, 256, 2048), ("llama2-70b", 96, 32, 2048), ("qwen2.5-32b", 64, 512, 4096),
         ("baichuan2-13b", 32, 128, 1024), ("llama2-7b", 8, 512, 2048)]
PLATFORMS = ["default", "platforms/bandwidth-rich.toml", "platforms/mt3000-30gbps.toml"]


def _platform(name: str) -> TrainingPlatform:
    return TrainingPlatform() if name == "default" else load_platform(name)


def _cfg(point, seq, partition="balanced") -> ParallelConfig:
    p, d, t, z, b, a, act, pref = point
    return ParallelConfig(pp=p, dp=d, tp=t, zero=z, micro_batch=b, accum=a, seq=seq, activation=act, prefetch=pref,
                          partition=partition)


@functools.cache
def _profile(name: str, b: int, seq: int, t: int):
    return layer_profile(get_model(name), b, seq, t, source="roofline")


def _profiles(model, seq):
    return lambda b, t: _profile(model.name, b, seq, t)


@functools.cache
def _points(name: str, clusters: int, global_batch: int) -> tuple:
    return tuple(search_space(get_model(name), clusters, global_batch))


@functools.cache
def _scalar_terms(name: str, clusters: int, global_batch: int, seq: int, platform: str) -> tuple:
    """(config, cost_terms) of every point of the case on ``platform``: the scalar path's numbers."""
    model, plat, of = get_model(name), _platform(platform), _profiles(get_model(name), seq)
    return tuple((cfg, cost_terms(model, cfg, of(cfg.micro_batch, cfg.tp), plat))
                 for cfg in (_cfg(point, seq) for point in _points(name, clusters, global_batch)))


@functools.cache
def _partition(name: str, pp: int):
    return partition_model(get_model(name), pp, "balanced")


@pytest.mark.parametrize("name, clusters, global_batch, seq", CASES)
@pytest.mark.parametrize("method", ["ratrain", "tp-heavy", "zero3-heavy", "tuned", "full-save"])
@pytest.mark.parametrize("restrict", [{}, {"micro_batches": (1, 4), "tp_degrees": (1, 2), "zero_stages": (0, 3)}])
def test_the_grid_of_columns_is_the_search_space(name, clusters, global_batch, seq, method, restrict):
    model = get_model(name)
    points = list(search_space(model, clusters, global_batch, method, **restrict))
    grid = search_grid(model, clusters, global_batch, seq, method, **restrict)
    want = Grid.of(points, seq)
    assert all(getattr(grid, n).tolist() == getattr(want, n).tolist() for n in COLUMNS) and grid.seq == seq
    assert [grid.point(i) for i in range(len(grid))] == points


@pytest.mark.parametrize("name, clusters, global_batch, seq", CASES)
@pytest.mark.parametrize("partition", ["balanced", "uniform"])
# the quick layer checks the default constants; the full suite (CI) the other two as well
@pytest.mark.parametrize("constants", [DEFAULT_CONSTANTS,
                                       pytest.param(MemoryConstants.megatron(), marks=pytest.mark.slow),
                                       pytest.param(MemoryConstants(fsr_buffer_layers=3), marks=pytest.mark.slow)])
def test_the_memory_check_over_arrays_is_peak_memory(name, clusters, global_batch, seq, partition, constants):
    model = get_model(name)
    points = _points(name, clusters, global_batch)
    memory = PeakMemory(model, partition, constants)
    got = peak_bytes(PeakMemory(model, partition, constants), Grid.of(points, seq))
    assert got.tolist() == [memory.peak(p, d, t, z, b, a, seq, act, pref) for p, d, t, z, b, a, act, pref in points]


@pytest.mark.parametrize("name, clusters, global_batch, seq", CASES)
# the quick layer checks the default platform; the full suite (CI) the other two as well
@pytest.mark.parametrize("platform", [p if p == "default" else pytest.param(p, marks=pytest.mark.slow)
                                      for p in PLATFORMS])
def test_the_cost_terms_over_arrays_are_cost_terms(name, clusters, global_batch, seq, platform):
    model, plat = get_model(name), _platform(platform)
    points = list(_points(name, clusters, global_batch))
    ka = kind_arrays(model, plat, Grid.of(points, seq), _profiles(model, seq))
    for i, (cfg, want) in enumerate(_scalar_terms(name, clusters, global_batch, seq, platform)):
        got = ka.terms(i)
        assert got.transfer == want.transfer
        for kind in KINDS:
            w = getattr(want, kind)
            assert [getattr(getattr(got, kind), f) for f in FIELDS] == [getattr(w, f) for f in FIELDS], (cfg, kind)


@pytest.mark.parametrize("name, clusters, global_batch, seq", CASES)
# the quick layer checks one buffered layer with and without FSR; the full suite (CI) more buffered layers too
@pytest.mark.parametrize("fsr, buffer_layers", [(True, 1), (False, 1), pytest.param(True, 2, marks=pytest.mark.slow),
                                                pytest.param(True, 5, marks=pytest.mark.slow)])
def test_the_main_path_over_arrays_is_main_path(name, clusters, global_batch, seq, fsr, buffer_layers):
    model, plat = get_model(name), TrainingPlatform()
    points = list(_points(name, clusters, global_batch))
    grid = Grid.of(points, seq)
    ka = kind_arrays(model, plat, grid, _profiles(model, seq))
    got = main_path_ms(ka, grid, lambda pp: [len(r) for r in partition_model(model, pp, "balanced")], fsr=fsr,
                       fsr_buffer_layers=buffer_layers)
    for i, (cfg, terms) in enumerate(_scalar_terms(name, clusters, global_batch, seq, "default")):
        want = main_path(stage_kinds(terms, _partition(name, cfg.pp)), terms.transfer, cfg.accum,
                         activation=cfg.activation, fsr=fsr, recovery_resource="compute",
                         fsr_buffer_layers=buffer_layers)
        assert got[i] == want.t_main_ms, cfg


def _roofline(model, b, seq, tp, *, source):
    return layer_profile(model, b, seq, tp, source="roofline")


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("name, clusters, global_batch, method, top, platform", [
    ("llama2-7b", 8, 512, "ratrain", 10, "default"), ("baichuan2-13b", 16, 256, "ratrain", 10, "default"),
    ("llama2-70b", 96, 32, "ratrain", 10, "platforms/bandwidth-rich.toml"),
    ("llama2-7b", 64, 256, "tuned", 5, "default"), ("qwen2.5-32b", 64, 512, "ratrain", 3, "default"),
    ("llama2-13b", 32, 128, "zero3-heavy", 25, "default"), ("llama2-7b", 16, 256, "full-save", 10, "default"),
    ("llama2-7b", 32, 256, "ratrain", 10, "platforms/dgx-a100.toml")])
def test_the_planner_over_arrays_picks_as_the_scalar_loop(name, clusters, global_batch, method, top, platform,
                                                          monkeypatch):
    plat = TrainingPlatform() if platform == "default" else load_platform(platform)

    def run():
        return Planner(get_model(name), plat, profile_source="roofline", profile_fn=_roofline).plan(
            clusters, global_batch, method=method, top=top)

    got = run()
    monkeypatch.setattr(Planner, "_vectorisable", lambda self, choices: False)
    want = run()
    assert (got.enumerated, got.pruned_by_memory, got.timed) == (want.enumerated, want.pruned_by_memory, want.timed)
    assert [(c.config, c.step_ms, c.peak_bytes, c.breakdown) for c in got.ranked] == \
        [(c.config, c.step_ms, c.peak_bytes, c.breakdown) for c in want.ranked]

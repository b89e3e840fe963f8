"""The planner's faster paths give the plain ones' numbers exactly: the layer partition against the
stage-by-stage scan it replaced, the memory model's layer sizes against the public per-tensor functions,
the memory check over a grid of layouts against the row-by-row one and ``PeakMemory.peak``, the row
deduplication of the main path against ``np.unique``, and the stage chains without PrefetchW against the
event loop."""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import numpy as np
import pytest

from ratrain.cost.terms import LayerKind
from ratrain.errors import ConfigError
from ratrain.plan import estimator, vectorised
from ratrain.plan.planner import search_grid, search_space
from ratrain.plan.vectorised import Grid, peak_bytes
from ratrain.spec.memory import (
    DEFAULT_CONSTANTS,
    MemoryConstants,
    PeakMemory,
    _layer_bytes,
    head_workspace_bytes,
    layer_checkpoint_bytes,
    layer_full_bytes,
    layer_selective_bytes,
    layer_workspace_bytes,
)
from ratrain.spec.models import get_model, layer_tp_parameter_count, list_models, stage_edge_parameters
from ratrain.spec.parallel import partition_layers


def _plain_partition(num_layers: int, pp: int, first_extra: float = 0.0, last_extra: float = 0.0) -> list[range]:
    """``partition_layers`` as it was written first (valid arguments): every stage's cap summed per probe,
    and the surplus taken from the most loaded stage found by scanning them all."""
    extras = [0.0] * pp
    extras[0] += first_extra
    extras[-1] += last_extra
    eps = 1e-9

    def caps(capacity: float) -> list[int]:
        return [max(1, math.floor(capacity - e + eps)) for e in extras]

    offsets = sorted({e - math.floor(e) for e in extras} | {0.0})
    k_lo = max(0, math.floor(num_layers / pp) - math.ceil(max(extras)) - 1)
    k_hi = k_lo + math.ceil(max(extras)) + num_layers + 2
    while k_lo < k_hi:
        mid = (k_lo + k_hi) // 2
        if sum(caps(mid + offsets[-1])) >= num_layers:
            k_hi = mid
        else:
            k_lo = mid + 1
    capacity = next(k_lo + off for off in offsets if sum(caps(k_lo + off)) >= num_layers)
    counts = caps(capacity)
    surplus = sum(counts) - num_layers
    while surplus > 0:
        best = max((p for p in range(pp) if counts[p] > 1), key=lambda p: (counts[p] + extras[p], -p))
        counts[best] -= 1
        surplus -= 1
    stages, start = [], 0
    for count in counts:
        stages.append(range(start, start + count))
        start += count
    return stages


def _extra(rng: random.Random) -> float:
    return rng.choice([0.0, rng.random() * 5, float(rng.randint(0, 6)), rng.random() * 40, 1.0 / rng.randint(1, 9),
                       rng.randint(0, 3) + 0.5, 1e-10, 1 - 1e-10, 2.0 - 1e-9, rng.randint(0, 4)])


def test_the_partition_is_the_plain_scan_on_random_splits():
    rng = random.Random(7)
    for _ in range(2000):      # the plain scan is quadratic in P: a few thousand splits take seconds
        layers = rng.randint(1, 130)
        pp = rng.randint(1, layers)
        first = _extra(rng)
        last = first if rng.random() < 0.2 else _extra(rng)
        assert partition_layers(layers, pp, first, last) == _plain_partition(layers, pp, first, last), \
            (layers, pp, first, last)


@pytest.mark.parametrize("first, last", [(0.0, 0.0), (0.5, 0.5), (1.3, 0.2), (0.0, 3.7), (12.0, 0.0), (2.5, 2.5)])
def test_the_partition_is_the_plain_scan_on_every_depth(first, last):
    for layers in range(1, 41):
        for pp in range(1, layers + 1):
            assert partition_layers(layers, pp, first, last) == _plain_partition(layers, pp, first, last)


@pytest.mark.parametrize("args", [(1, 1), (2, 2), (5, 2, 1e15, 1e15), (80, 48, 0.31, 0.31), (7, 1, 3.5, 0.25),
                                  (9, 3, 0.0, 1e-10)])
def test_the_partition_edges_are_the_plain_scans(args):
    assert partition_layers(*args) == _plain_partition(*args)


@pytest.mark.parametrize("args", [(0, 1), (3, 0), (3, 4), (3, 2, -1.0, 0.0), (3, 2, float("inf")), (True, 1), (3, 1.0)])
def test_the_partition_refuses_what_it_refused(args):
    with pytest.raises(ConfigError):
        partition_layers(*args)


def _models():
    base = [get_model(name) for name in list_models()] + [get_model("gpt-h1024-l24-a16")]
    return base + [replace(get_model("llama2-7b"), name="llama2-7b-qk", qk_norm=True),
                   replace(get_model("llama2-7b"), name="llama2-7b-tied", tied_embeddings=True)]


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.name)
def test_the_layer_sizes_are_the_per_tensor_functions(model):
    tps = [t for t in (1, 2, 4, 8) if not (model.heads % t or model.kv_heads % t or model.ffn % t or model.vocab % t)]
    for b, seq, t, sp, pp in itertools.product((1, 2, 8), (1024, 2048), tps, (False, True), (1, 2, 5)):
        got = _layer_bytes(model, b, seq, t, pp, sp)
        tokens = b * seq // (t if sp else 1)
        assert (got.ckpt, got.full, got.selective) == (
            layer_checkpoint_bytes(model, b, seq, t, sequence_parallel=sp),
            layer_full_bytes(model, b, seq, t, sequence_parallel=sp),
            layer_selective_bytes(model, b, seq, t, sequence_parallel=sp))
        assert (got.workspace_fsr, got.workspace_full, got.head_workspace) == (
            layer_workspace_bytes(model, b, seq, t, True), layer_workspace_bytes(model, b, seq, t, False),
            head_workspace_bytes(model, b, seq, t))
        assert (got.layer_params, (got.embedding_params, got.head_params)) == (
            layer_tp_parameter_count(model, t), stage_edge_parameters(model, pp, t))
        assert got.replicated_tokens == tokens
        assert got.embedding_mask == (tokens * model.hidden if model.dropout > 0 else 0)


GRID_CASES = [("llama2-7b", 8, 512, 2048), ("llama2-70b", 96, 32, 2048), ("qwen2.5-32b", 64, 512, 4096),
              ("baichuan2-13b", 16, 256, 2048), ("llama2-13b", 256, 1024, 1024), ("gpt-h1024-l24-a16", 32, 256, 1024)]


@pytest.mark.parametrize("name, clusters, global_batch, seq", GRID_CASES)
@pytest.mark.parametrize("partition", ["balanced", "uniform"])
def test_the_memory_check_per_layout_is_the_check_per_row(name, clusters, global_batch, seq, partition):
    model = get_model(name)
    for method in ("ratrain", "tuned", "zero3-heavy", "full-save", "backward-ckpt"):
        for restrict in ({}, {"micro_batches": (1, 4), "tp_degrees": (1, 2), "zero_stages": (0, 3)}):
            grid = search_grid(model, clusters, global_batch, seq, method, **restrict)
            assert grid.product is not None
            points = list(search_space(model, clusters, global_batch, method, **restrict))
            for constants in (DEFAULT_CONSTANTS, MemoryConstants.megatron(), MemoryConstants(fsr_buffer_layers=3)):
                memory = PeakMemory(model, partition, constants)
                got = peak_bytes(memory, grid)
                assert got.tolist() == peak_bytes(memory, Grid.of(points, seq)).tolist()
                if constants is DEFAULT_CONSTANTS and method == "ratrain":
                    assert got.tolist() == [memory.peak(p, d, t, z, b, a, seq, act, pref)
                                            for p, d, t, z, b, a, act, pref in points]


def test_a_taken_grid_is_checked_row_by_row():
    model = get_model("llama2-70b")
    grid = search_grid(model, 96, 32, 2048)
    rows = np.random.default_rng(3).permutation(len(grid))[:300]
    memory = PeakMemory(model, "balanced")
    sub = grid.take(rows)
    assert sub.product is None
    assert peak_bytes(memory, sub).tolist() == peak_bytes(memory, grid)[rows].tolist()


def _unique_rows(bits: np.ndarray) -> tuple[list, list]:
    """The groups of equal rows, each as its sorted row indices, and each row's representative's value."""
    first, inverse = vectorised._distinct_rows(bits)
    assert (bits[first][inverse] == bits).all()
    groups = sorted(sorted(np.flatnonzero(inverse == k).tolist()) for k in range(len(first)))
    return groups, len(first)


@pytest.mark.parametrize("collide", [False, True])
def test_distinct_rows_are_the_unique_rows(monkeypatch, collide):
    if collide:     # every row gets the same mixed key: the exact way must take over
        monkeypatch.setattr(vectorised, "_MIX", np.zeros(64, dtype=np.int64))
    rng = np.random.default_rng(11)
    values = rng.standard_normal((40, 16))
    values[5] = -0.0                    # -0.0 and 0.0 are different bits: kept apart, as np.unique keeps them
    values[6] = 0.0
    table = np.ascontiguousarray(values[rng.integers(0, 40, 500)]).view(np.int64)
    _, first, inverse = np.unique(table, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    want = sorted(sorted(np.flatnonzero(inverse == k).tolist()) for k in range(len(first)))
    assert _unique_rows(table) == (want, len(first))


def _stage_chain_inputs(rng: random.Random) -> tuple:
    """A stage's GradSync/UpdateShard chains as ``_stage_life`` hands them over: a first layer and identical
    middle ones (as the planner's stages) or every layer its own, zero-length tasks, ties and GradSyncs
    longer or shorter than the backward that releases them."""
    def value(scale: float) -> float:
        c = rng.random()
        return 0.0 if c < 0.15 else rng.choice([1.0, 2.0, 0.5, 3.0]) * scale if c < 0.3 else rng.random() * scale

    n = rng.randint(1, 30)
    if rng.random() < 0.5:
        first, mid = (LayerKind(value(5), 0.0, 0.0, value(5), value(5), 0.0) for _ in range(2))
        kinds = [first] + [mid] * (n - 1)
        bprime = [rng.choice([mid.forward * 2, 1.0, 3.0, mid.gradsync, mid.gradsync / 2])] * n
    else:
        kinds = [LayerKind(value(5), 0.0, 0.0, value(5), value(5), 0.0) for _ in range(n)]
        bprime = [value(5) for _ in range(n)]
    ready, acc = [0.0] * n, 0.0
    if rng.random() < 0.8:
        for j in range(n):
            ready[j], acc = -acc, acc + bprime[j]
    else:
        ready = [rng.choice([-2.0, -1.0, 0.0, rng.random() - 1]) for _ in range(n)]
    ff, acc = [0.0] * n, 0.0
    for j in range(n):
        ff[j], acc = acc, acc + kinds[j].forward
    return kinds, ready, ff, rng.choice([0.0, rng.random(), 1.0, rng.random() * 10, 1e-10, 5.0]), rng.random() < 0.6


def test_the_chains_without_prefetch_are_the_event_loops():
    rng = random.Random(5)
    walked = 0
    for _ in range(6000):
        kinds, ready, ff, X, has_send = _stage_chain_inputs(rng)
        want = estimator._deadline_chains_events(kinds, ready, ff, X, has_send, False)
        got = estimator._chains_without_prefetch(kinds, ready, ff, X, has_send)
        walked += got is not None
        assert got is None or got == want, (kinds, ready, X, has_send)
        assert estimator._deadline_chains(kinds, ready, ff, X, has_send, False) == want
    assert walked > 5000         # most take the walk; the rest (instants too close) the events


def test_instants_too_close_take_the_event_loop():
    # the second GradSync is ready a hair after the first ends: the event loop's tolerance merges the two
    kinds = [LayerKind(1.0, 0.0, 0.0, 1.0, 0.5, 0.0)] * 2
    ready = [-1.0 - 5e-13, -2.0]
    assert estimator._chains_without_prefetch(kinds, ready, [0.0, 1.0], 0.0, False) is None
    assert estimator._deadline_chains(kinds, ready, [0.0, 1.0], 0.0, False, False) == \
        estimator._deadline_chains_events(kinds, ready, [0.0, 1.0], 0.0, False, False)


def test_a_plan_is_the_same_with_and_without_the_memos():
    from ratrain.cost.profile import layer_profile
    from ratrain.plan.planner import Planner, clear_memos
    from ratrain.spec.memory import _layer_bytes
    from ratrain.spec.parallel import _stage_counts

    def run():
        return Planner(get_model("llama2-70b"), profile_source="roofline",
                       profile_fn=lambda m, b, s, t, source: layer_profile(m, b, s, t, source="roofline")).plan(96, 32)

    clear_memos()
    assert _stage_counts.cache_info().currsize == 0 and _layer_bytes.cache_info().currsize == 0
    cold = run()
    assert _stage_counts.cache_info().currsize > 0 and _layer_bytes.cache_info().currsize > 0
    warm = run()
    assert [c.to_json() for c in cold.ranked] == [c.to_json() for c in warm.ranked]

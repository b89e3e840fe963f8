"""pytest-benchmark micro-benchmarks of the hot loops.

Skipped in the normal test run (pyproject ``addopts`` has ``--benchmark-skip`` and testpaths is
``tests``); run them by naming this file (see README "## Benchmarks"):

    python -m pytest bench/test_micro.py --benchmark-only --benchmark-enable

Derived rates (bundles/s, conversions/s, evaluations/s, MAC/s) go to ``extra_info`` so they are
saved with the timings. This module imports no pytest and defines no ``time_``/``track_`` names:
asv imports every module under bench/ (also in virtualenvs without pytest).
"""
from __future__ import annotations

import functools

import numpy as np

import mtemu
from mtemu.assembler import Program, parse
from mtemu.fp16 import f16_to_f32_array, f32_to_f16_array
from mtemu.kernels.gemm import build_gemm
from mtemu.machine import Cluster
from mtemu.platform import DEFAULT
from ratrain.plan.time_to_train import expected_max_normal
from ratrain.spec.memory import stage_memory
from ratrain.spec.models import get_model
from ratrain.spec.parallel import ParallelConfig

from .speed import LOOP_ORDERS, TABLE5_SHAPES, functional_gemm, numpy_matmul_seconds, table5_timing

STRAIGHT_BUNDLES = 4000          # scalar bundles before the halt
LOOP_TRIPS = 20000
LOOP_VFMAS = 16                  # independent accumulators per trip
LOOP_BODY = LOOP_VFMAS + 5 + 1   # + nops until the last VFMA retires (latency 6) + the branch
CONVERT_N = 1 << 20
SMALL_GEMM = (128, 256, 192)


@functools.lru_cache(maxsize=None)
def straight_program() -> Program:
    return parse("{ smovi s1, 1 }\n" * STRAIGHT_BUNDLES + "{ halt }")


@functools.lru_cache(maxsize=None)
def loop_program() -> Program:
    body = "".join(f"{{ vfma v{i}, v20, v21 }}\n" for i in range(1, LOOP_VFMAS + 1)) + "{ nop }\n" * 5
    return parse(f"{{ smovi s1, {LOOP_TRIPS} }}\ntop:\n{body}{{ bdec s1, top }}\n{{ halt }}")


def _run_machine(benchmark, prog: Program, functional: bool, bundles_per_dsp: int) -> None:
    cluster = Cluster(DEFAULT, ddr_bytes=4096, functional=functional)
    cluster.run([prog])                                   # compile / warm outside the timing
    stats = benchmark(cluster.run, [prog])
    assert stats.cycles >= bundles_per_dsp                # every bundle issued at least once
    bundles = bundles_per_dsp * DEFAULT.dsps
    benchmark.extra_info["bundles"] = bundles
    if benchmark.stats is not None:                       # None under --benchmark-disable
        benchmark.extra_info["bundles_per_s"] = bundles / benchmark.stats.stats.mean


def test_machine_straight_line_bundles(benchmark):
    _run_machine(benchmark, straight_program(), True, STRAIGHT_BUNDLES + 1)


def test_machine_vfma_loop_bundles_functional(benchmark):
    _run_machine(benchmark, loop_program(), True, 1 + LOOP_TRIPS * LOOP_BODY + 1)


def test_machine_vfma_loop_bundles_timing(benchmark):
    _run_machine(benchmark, loop_program(), False, 1 + LOOP_TRIPS * LOOP_BODY + 1)


def _rate(benchmark, key: str, count: int) -> None:
    if benchmark.stats is not None:
        benchmark.extra_info[key] = count / benchmark.stats.stats.mean


def test_fp32_to_fp16_array(benchmark):
    x = np.random.default_rng(0).standard_normal(CONVERT_N).astype(np.float32)
    f32_to_f16_array(x[:16])
    out = benchmark(f32_to_f16_array, x)
    assert np.array_equal(out, x.astype(np.float16).view(np.uint16))   # RNE, same as NumPy
    _rate(benchmark, "conversions_per_s", CONVERT_N)


def test_fp16_to_fp32_array(benchmark):
    bits = np.random.default_rng(1).integers(0, 1 << 16, CONVERT_N, dtype=np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00]                # drop Inf/NaN: NaN payloads differ in ==
    f16_to_f32_array(bits[:16])
    out = benchmark(f16_to_f32_array, bits)
    assert np.array_equal(out, bits.view(np.float16).astype(np.float32))
    _rate(benchmark, "conversions_per_s", bits.size)


MEMORY_CONFIGS = [ParallelConfig(pp=pp, dp=dp, zero=zero, micro_batch=1, accum=128, seq=2048, activation=act)
                  for pp in (4, 8) for dp in (16, 32) for zero in (1, 2) for act in ("fsr", "ckpt")]


def test_memory_model_evaluations(benchmark):
    model = get_model("llama2-7b")

    def sweep():
        return [stage_memory(model, cfg) for cfg in MEMORY_CONFIGS]

    out = benchmark(sweep)
    assert len(out) == len(MEMORY_CONFIGS)
    _rate(benchmark, "evaluations_per_s", len(MEMORY_CONFIGS))


def test_small_gemm_functional(benchmark):
    m, k, n = SMALL_GEMM
    rng = np.random.default_rng(2)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    build_gemm(m, k, n)
    mtemu.run_gemm(a, b)                                  # compile + build outside the timing
    r = benchmark(mtemu.run_gemm, a, b)
    assert np.array_equal(r.c, mtemu.reference_gemm(a, b))
    _rate(benchmark, "macs_per_s", m * k * n)


def test_tuner_sweep_100_candidates(benchmark, tmp_path, monkeypatch):
    """Speed target: a 100-candidate timing-mode sweep on 2048x4096x4096 in under 5 minutes."""
    from mtemu.tune import tune_gemm
    monkeypatch.setenv("MTEMU_CACHE_DIR", str(tmp_path))
    grid = {"mg": (512, 768, 1024, 2048), "k2": (64, 96, 128, 192), "n2": (384, 576, 768, 960, 1152),
            "mr_nv": ((6, 4), (8, 3))}          # 160 candidates, 40 pruned by capacity, 120 emulated
    result = benchmark.pedantic(lambda: tune_gemm(2048, 4096, 4096, grid=grid, out_dir=None, progress=False,
                                                  cache=False, loop_order="c-stationary"), rounds=1, iterations=1)
    benchmark.extra_info["candidates"] = len(result.candidates)
    benchmark.extra_info["pruned"] = len(result.pruned)
    assert len(result.candidates) >= 100


def _speed_info(benchmark, figures: dict) -> None:
    for key, value in figures.items():
        if isinstance(value, (int, float, str)):
            benchmark.extra_info[key] = value


def test_table5_timing_set_against_numpy(benchmark):
    """Speed target: each Table 5 set in timing mode in 5 s or less; ratio to NumPy and bundles/s in
    extra_info (bench/speed.py), for the A-resident (default) and the C-stationary loop order."""
    mtemu.gemm_timing(64, 64, 64)                          # Numba loaded outside the timing
    numpy_s = numpy_matmul_seconds(TABLE5_SHAPES)
    out = {}

    def both():
        out.update({order: table5_timing(order, numpy_s) for order in LOOP_ORDERS})

    benchmark.pedantic(both, rounds=1, iterations=1)
    for order, figures in out.items():
        _speed_info(benchmark, {f"{order}_{k}": v for k, v in figures.items()})
        assert figures["bundles"] > 10**9


def test_functional_gemm_1024_against_numpy(benchmark):
    """Speed target: functional 1024^3 within 10x of NumPy's float32 matmul, first call included; ratios
    and bundles/s per loop order (the default, A-resident, and C-stationary) in extra_info."""
    a = np.ones((64, 64), np.float16)
    mtemu.run_gemm(a, a)                                   # Numba loaded outside the timing
    out = {}
    benchmark.pedantic(lambda: out.update({order: functional_gemm(1024, order) for order in LOOP_ORDERS}),
                       rounds=1, iterations=1)
    for order, figures in out.items():
        _speed_info(benchmark, {f"{order}_{k}": v for k, v in figures.items()})
        assert figures["bundles"] > 10**6


def test_expected_max_normal_100k(benchmark):
    """Expected slowest of 100,000 clusters (the straggler factor); target well under 0.5 s."""
    expected_max_normal(7)               # build the integration grid once
    value = benchmark(expected_max_normal, 100_000)
    assert 4.0 < value < 5.0

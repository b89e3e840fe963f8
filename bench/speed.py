"""Emulator speed against NumPy, both measured in the same process: what both suites report.

- :func:`table5_timing`: the Table 5 set (M = 2048, (K, N) from ``mtemu.paper_targets.TABLE5``) in
  timing mode on ``platforms/mt3000-raw-ddr.toml``, with the A-resident loop order (the default)
  or the C-stationary one: wall seconds, emulated bundles per second, and the ratio to NumPy's
  float32 matmul of the same five shapes.
- :func:`functional_gemm`: an n^3 functional GEMM of either loop order (default: the project's,
  A-resident), its first call in the process (programs come from the disk cache, as in a new
  process; the cache is filled first if needed) and the best of a few warm calls, against NumPy's
  float32 matmul of the same shape, and emulated bundles per second.

Every call starts with the in-process program caches cleared, so it measures what a new process
with warm disk caches (Numba, built programs) would see. The functional figures also give the CPU
seconds of all the process's threads (on a shared machine wall time moves with the neighbours; the
CPU time is the work done, and CPU / wall how well the two cores were used). Ratios are emulator / NumPy: lower is
better; the targets are 5 s for each Table 5 set and 10x for the functional 1024^3 first call.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from mtemu.kernels import gemm, gemm_a_resident
from mtemu.kernels.gemm import GemmTiles, build_gemm, gemm_timing
from mtemu.kernels.gemm_a_resident import AResidentGemmTiles, a_resident_timing
from mtemu.kernels.names import DEFAULT_GEMM, GEMM_LOOP_ORDERS
from mtemu.kernels.registry import gemm_variant
from mtemu.paper_targets import TABLE5, TABLE5_M
from mtemu.platform import DEFAULT, load_platform

RAW_DDR = Path(__file__).resolve().parent.parent / "platforms" / "mt3000-raw-ddr.toml"
TABLE5_SHAPES = [(TABLE5_M, k, n) for k, n, *_ in TABLE5]
LOOP_ORDERS = GEMM_LOOP_ORDERS


def _clear_program_caches() -> None:
    gemm._build_cached.cache_clear()
    gemm_a_resident._build_cached.cache_clear()


def numpy_matmul_seconds(shapes: list[tuple[int, int, int]], repeat: int = 3, seed: int = 0) -> float:
    """Best of ``repeat`` of the summed float32 matmul time over ``shapes`` (operands made outside the timing)."""
    rng = np.random.default_rng(seed)
    total = 0.0
    for m, k, n in shapes:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        a @ b
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        total += best
    return total


def table5_timing(loop_order: str = "a-resident", numpy_s: float | None = None) -> dict:
    """The Table 5 set in timing mode: seconds, bundles per second, ratio to NumPy, cycles per shape."""
    plat = load_platform(str(RAW_DDR))
    run = (lambda s: a_resident_timing(*s, tiles=AResidentGemmTiles(), platform=plat)) if loop_order == "a-resident" \
        else (lambda s: gemm_timing(*s, tiles=GemmTiles(), platform=plat))
    for s in TABLE5_SHAPES:          # fill the disk cache of built programs (not timed)
        (gemm_a_resident.build_a_resident(*s, AResidentGemmTiles(), plat) if loop_order == "a-resident"
         else build_gemm(*s, GemmTiles(), plat))
    _clear_program_caches()
    t0 = time.perf_counter()
    results = [run(s) for s in TABLE5_SHAPES]
    seconds = time.perf_counter() - t0
    bundles = sum(r.stats.bundles for r in results)
    numpy_s = numpy_matmul_seconds(TABLE5_SHAPES) if numpy_s is None else numpy_s
    return {"loop_order": loop_order, "seconds": seconds, "bundles": bundles, "bundles_per_s": bundles / seconds,
            "numpy_seconds": numpy_s, "ratio_to_numpy": seconds / numpy_s,
            "cycles": {f"{r.m}x{r.k}x{r.n}": r.cycles for r in results}}


def functional_gemm(n: int = 1024, loop_order: str = DEFAULT_GEMM, seed: int = 0, warm_calls: int = 3) -> dict:
    """n^3 functional GEMM: first call (program from the disk cache) and best warm call, against NumPy."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)).astype(np.float16)
    b = rng.standard_normal((n, n)).astype(np.float16)
    variant = gemm_variant(loop_order)
    tiles = variant.default_tiles
    (gemm_a_resident.build_a_resident if loop_order == "a-resident" else build_gemm)(n, n, n, tiles, DEFAULT)
    _clear_program_caches()             # the program is on disk (built once above if it was not)
    t0, c0 = time.perf_counter(), time.process_time()
    first = variant.run(a, b, platform=DEFAULT, tiles=tiles)
    first_s, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    warm_s = warm_cpu = float("inf")
    for _ in range(warm_calls):
        t0, c0 = time.perf_counter(), time.process_time()
        variant.run(a, b, platform=DEFAULT, tiles=tiles)
        warm_s = min(warm_s, time.perf_counter() - t0)
        warm_cpu = min(warm_cpu, time.process_time() - c0)
    numpy_s = numpy_matmul_seconds([(n, n, n)], repeat=5, seed=seed)
    bundles = first.stats.bundles
    return {"n": n, "loop_order": loop_order, "first_call_seconds": first_s, "warm_seconds": warm_s,
            "first_call_cpu_seconds": first_cpu, "warm_cpu_seconds": warm_cpu,
            "numpy_seconds": numpy_s, "first_call_ratio_to_numpy": first_s / numpy_s,
            "warm_ratio_to_numpy": warm_s / numpy_s, "bundles": bundles, "bundles_per_s": bundles / warm_s}

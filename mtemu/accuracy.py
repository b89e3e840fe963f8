"""Numerical effect of the A-resident GEMM's FP16 partial sums (Fig. 4's loop order).

:mod:`mtemu.kernels.gemm_a_resident` accumulates in FP32 within a k-block of ``kg`` columns and
stores C as FP16 between k-blocks, so a result with ``B = ceil(K / kg)`` k-blocks is rounded to
FP16 B times instead of once. This module measures what that costs on the Table 5 shapes
against (a) the FP32-accumulating single-pass order (:func:`mtemu.kernels.gemm.reference_gemm`)
and (b) the float64 product, on fixed-seed FP16 inputs from two distributions:

- ``normal``: standard normal entries; sums cancel, partials stay ~sqrt(k) in size;
- ``uniform``: uniform [0, 1) entries; no cancellation, partials grow linearly with k, so each
  FP16 rounding of a partial is as large as the final one's would be at that size.

Definitions (per element C_ij of the float64 product C):

- ``max_rel``: max_ij |C^_ij - C_ij| / max_ij |C_ij| (normwise, safe where C_ij is near zero);
- ``mean_rel``: mean of |C^_ij - C_ij| / |C_ij| over the elements with |C_ij| >= max|C| / 16
  (elementwise; the floor excludes elements near zero, where relative error is meaningless);
- ULPs: the distance between the blocked and the single-pass FP16 results in units in the last
  place of FP16 (adjacent FP16 values are 1 apart; +0 and -0 are 0 apart). The 0 / 1 / 2+ ULP
  shares count every element; the max and mean ULP count the elements above the same floor,
  since near zero an FP16 ULP is tiny and a partial's rounding error is thousands of them.

Rigorous bound (:func:`error_bound`): products of FP16 values are exact in FP32; each of the K
FP32 additions errs by at most u32 = 2^-24 of a value bounded by S + E, and each of the B FP16
roundings by u16 = 2^-11 of such a value plus 2^-25 (subnormal range), where
S_ij = sum_k |a_ik b_kj| and E is the total error. Summing,
E <= ((K u32 + B u16) S + B 2^-25) / (1 - K u32 - B u16), valid while no value overflows FP16.

The computation runs in a jitted loop (three accumulators in one pass: the blocked FP32/FP16
order, the single-pass FP32 order, float64); it is bit-exact with
:func:`~mtemu.kernels.gemm_a_resident.reference_gemm_a_resident` and
:func:`~mtemu.kernels.gemm.reference_gemm` (tests) but ~100x faster, which the full Table 5
shapes need. Elements are independent across rows of A, so ``rows`` may sample fewer rows than
M = 2048: each measured element is then exactly what the full product would hold.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from numba import njit

from .errors import MtemuError
from .fp16 import f16_bits_to_f32, f32_to_f16_bits
from .kernels.gemm_a_resident import AResidentGemmTiles, plan_a_resident
from .platform import DEFAULT, Platform
from .validate import TABLE5, TABLE5_M

TABLE5_SHAPES: tuple[tuple[int, int, int], ...] = tuple((TABLE5_M, k, n) for k, n, *_ in TABLE5)
DISTRIBUTIONS = ("normal", "uniform")
U16 = 2.0 ** -11          # unit roundoff of FP16
U32 = 2.0 ** -24          # unit roundoff of FP32
ETA16 = 2.0 ** -25        # largest absolute error of rounding into FP16's subnormal range
REL_FLOOR = 1 / 16        # elementwise relative error counts elements with |C| >= REL_FLOOR * max|C|
KERNEL_TILES = AResidentGemmTiles()      # the kernel's defaults: kg = 768 on every Table 5 shape
SWEEP_KGS = (8192, 4096, 2048, 1024, 768, 512, 256, 128, 64, 16, 1)

_TILE_I = 8               # rows x columns of C kept in cache while k streams through
_TILE_J = 256


@njit(cache=True)
def _round16(x):
    return f16_bits_to_f32(f32_to_f16_bits(x))


@njit(cache=True, inline="always")
def _accumulate_row(x, row, acc_b, acc_s, acc_e):
    # 1-D contiguous arrays: LLVM vectorizes this loop (the sums stay sequential in k per element)
    for j in range(row.shape[0]):
        p = x * row[j]                # exact: a product of two FP16 values fits FP32
        acc_b[j] += p
        acc_s[j] += p
        acc_e[j] += np.float64(p)


@njit(cache=True)
def _accumulate(at, b, kg, blocked, single, exact):
    """C = A B three ways; ``at`` is A transposed (K, M) float32, ``b`` (K, N) float32.

    blocked: FP32 sequential-k within k-blocks of kg, FP16 rounding at each block's end;
    single: FP32 sequential-k, one FP16 rounding at the end; exact: float64 (products are exact)."""
    k_total, m = at.shape
    n = b.shape[1]
    for j0 in range(0, n, _TILE_J):
        tj = min(_TILE_J, n - j0)
        b_tile = np.ascontiguousarray(b[:, j0:j0 + tj])
        for i0 in range(0, m, _TILE_I):
            ti = min(_TILE_I, m - i0)
            acc_b = np.zeros((ti, tj), np.float32)
            acc_s = np.zeros((ti, tj), np.float32)
            acc_e = np.zeros((ti, tj), np.float64)
            for k in range(k_total):
                row = b_tile[k]
                for ii in range(ti):
                    _accumulate_row(at[k, i0 + ii], row, acc_b[ii], acc_s[ii], acc_e[ii])
                if (k + 1) % kg == 0 or k + 1 == k_total:
                    for ii in range(ti):
                        for jj in range(tj):
                            acc_b[ii, jj] = _round16(acc_b[ii, jj])
            for ii in range(ti):
                for jj in range(tj):
                    blocked[i0 + ii, j0 + jj] = acc_b[ii, jj]
                    single[i0 + ii, j0 + jj] = _round16(acc_s[ii, jj])
                    exact[i0 + ii, j0 + jj] = acc_e[ii, jj]


def _check_operands(a: np.ndarray, b: np.ndarray, kg: int) -> None:
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, np.ndarray) or x.ndim != 2 or x.dtype != np.float16:
            raise MtemuError(f"{name} must be a 2-D float16 NumPy array")
    if a.shape[1] != b.shape[0]:
        raise MtemuError(f"inner dimensions differ: a is {a.shape}, b is {b.shape}")
    if isinstance(kg, bool) or not isinstance(kg, (int, np.integer)) or kg <= 0:
        raise MtemuError(f"kg must be a positive integer, got {kg!r}")


def products(a: np.ndarray, b: np.ndarray, kg: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blocked FP16, single-pass FP16, float64) products of FP16 ``a`` and ``b``; FP16 results as float16."""
    _check_operands(a, b, kg)
    m, n = a.shape[0], b.shape[1]
    blocked = np.empty((m, n), np.float32)
    single = np.empty((m, n), np.float32)
    exact = np.empty((m, n), np.float64)
    _accumulate(np.ascontiguousarray(a.T.astype(np.float32)), np.ascontiguousarray(b.astype(np.float32)), int(kg),
                blocked, single, exact)
    return blocked.astype(np.float16), single.astype(np.float16), exact


def error_bound(a: np.ndarray, b: np.ndarray, kg: int) -> np.ndarray:
    """Per-element bound on |blocked - exact| (module docstring); FP16 roundings B = ceil(K / kg)."""
    _check_operands(a, b, kg)
    k = a.shape[1]
    rounds = math.ceil(k / kg)
    rate = k * U32 + rounds * U16
    if rate >= 1:
        raise MtemuError(f"no bound: K u32 + B u16 = {rate} >= 1 (K={k}, kg={kg})")
    s = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return (rate * s + rounds * ETA16) / (1 - rate)


def _ordered(x16: np.ndarray) -> np.ndarray:
    """FP16 values as integers in value order: adjacent FP16 numbers differ by 1, +0 == -0."""
    bits = x16.view(np.uint16).astype(np.int32)
    mag = bits & 0x7FFF
    return np.where(bits & 0x8000, -mag, mag)


def ulp_distance(x16: np.ndarray, y16: np.ndarray) -> np.ndarray:
    """Elementwise distance in FP16 ULPs between two float16 arrays of equal shape."""
    return np.abs(_ordered(x16) - _ordered(y16))


@dataclass(frozen=True)
class ErrorStats:
    max_rel: float
    mean_rel: float


def error_stats(approx: np.ndarray, exact: np.ndarray) -> ErrorStats:
    err = np.abs(approx.astype(np.float64) - exact)
    mag = np.abs(exact)
    top = float(mag.max())
    if top == 0:
        return ErrorStats(float(err.max()), float(err.mean()))
    keep = mag >= REL_FLOOR * top
    return ErrorStats(float(err.max() / top), float((err[keep] / mag[keep]).mean()))


@dataclass(frozen=True)
class AccuracyRow:
    m: int                  # rows of the shape
    k: int
    n: int
    rows: int               # rows of A measured (elements are independent across rows)
    kg: int
    k_blocks: int           # ceil(k / kg): FP16 roundings per element
    distribution: str
    max_abs_c: float
    blocked_max_rel: float  # vs float64
    blocked_mean_rel: float
    fp32_max_rel: float     # single-pass FP32 accumulation vs float64
    fp32_mean_rel: float
    ulp_equal: float        # share of all elements where blocked == single-pass
    ulp_one: float          # ... 1 ULP apart
    ulp_two_plus: float     # ... 2 or more ULPs apart
    max_ulp: int            # over elements with |C| >= REL_FLOOR * max|C|
    mean_ulp: float         # over the same elements

    def to_json(self) -> dict:
        return asdict(self)


def _operands(rows: int, k: int, n: int, distribution: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if distribution not in DISTRIBUTIONS:
        raise MtemuError(f"unknown distribution {distribution!r} (known: {', '.join(DISTRIBUTIONS)})")
    rng = np.random.default_rng([seed, k, n, DISTRIBUTIONS.index(distribution)])
    draw = rng.standard_normal if distribution == "normal" else rng.random
    # A's rows are drawn for the full shape's first `rows` rows only: B is drawn first so that it
    # does not depend on how many rows are sampled.
    b = draw((k, n)).astype(np.float16)
    a = draw((rows, k)).astype(np.float16)
    return a, b


def measure(m: int, k: int, n: int, kg: int, distribution: str = "normal", seed: int = 0,
            rows: int | None = None) -> AccuracyRow:
    """One shape, one k-block width, one input distribution."""
    for name, v in (("m", m), ("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise MtemuError(f"GEMM dimension {name} must be a positive integer, got {v!r}")
    rows = m if rows is None else rows
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or not 1 <= rows <= m:
        raise MtemuError(f"rows must be an integer in 1..{m}, got {rows!r}")
    a, b = _operands(int(rows), k, n, distribution, seed)
    blocked, single, exact = products(a, b, kg)
    if not (np.isfinite(blocked).all() and np.isfinite(single).all()):
        raise MtemuError(f"{m}x{k}x{n} ({distribution}): the FP16 result overflows")
    eb, es = error_stats(blocked, exact), error_stats(single, exact)
    ulps = ulp_distance(blocked, single)
    total = ulps.size
    top = float(np.abs(exact).max())
    big = ulps[np.abs(exact) >= REL_FLOOR * top] if top > 0 else ulps.ravel()
    return AccuracyRow(m, k, n, int(rows), int(kg), math.ceil(k / kg), distribution, top,
                       eb.max_rel, eb.mean_rel, es.max_rel, es.mean_rel, float((ulps == 0).sum() / total),
                       float((ulps == 1).sum() / total), float((ulps >= 2).sum() / total), int(big.max()),
                       float(big.mean()))


def kernel_kg(m: int, k: int, n: int, tiles: AResidentGemmTiles = KERNEL_TILES,
              platform: Platform = DEFAULT) -> int:
    """The k-block width the A-resident kernel uses for this shape (its plan: min(tiles.kg, k))."""
    return plan_a_resident(m, k, n, tiles, platform).tiles.kg


def accuracy_study(shapes: tuple[tuple[int, int, int], ...] = TABLE5_SHAPES, seed: int = 0,
                   distributions: tuple[str, ...] = DISTRIBUTIONS, rows: int | None = None,
                   tiles: AResidentGemmTiles = KERNEL_TILES, platform: Platform = DEFAULT,
                   progress=None) -> list[AccuracyRow]:
    """Every shape x distribution with the kernel's own kg (``rows``: measure only that many rows of M)."""
    out = []
    for m, k, n in shapes:
        kg = kernel_kg(m, k, n, tiles, platform)
        for dist in distributions:
            if progress:
                progress(f"accuracy {m}x{k}x{n} kg={kg} {dist}")
            out.append(measure(m, k, n, kg, dist, seed, rows))
    return out


def kblock_sweep(m: int = 128, k: int = 8192, n: int = 512, kgs: tuple[int, ...] = SWEEP_KGS,
                 distribution: str = "uniform", seed: int = 0) -> list[AccuracyRow]:
    """One shape at several k-block widths: how the error grows with the number of FP16 roundings.

    kg = 1 rounds after every product, close to accumulating in FP16 registers (VFMULAH16; it
    differs from a fused FP16 accumulate only where the FP32 sum double-rounds)."""
    return [measure(m, k, n, kg, distribution, seed) for kg in kgs]


def format_accuracy(rows: list[AccuracyRow]) -> str:
    """Table: errors vs float64 (blocked and single-pass) and the ULP split blocked vs single-pass."""
    lines = ["FP16 partial sums (A-resident order) vs FP32 single-pass accumulation and float64",
             f"max rel = max|err| / max|C|; mean rel over |C| >= max|C|/{int(1 / REL_FLOOR)}; ULPs: blocked vs "
             "single-pass FP16 results (shares: all elements; max, mean: the |C| floor above)",
             f"{'M x K x N':>18s} {'rows':>5s} {'kg':>5s} {'blocks':>6s} {'dist':>7s} | {'blocked vs f64':>19s} | "
             f"{'fp32 vs f64':>19s} | {'0 ULP':>6s} {'1 ULP':>6s} {'2+ ULP':>6s} {'max':>4s} {'mean':>5s}",
             f"{'':>18s} {'':>5s} {'':>5s} {'':>6s} {'':>7s} | {'max rel':>9s} {'mean rel':>9s} | "
             f"{'max rel':>9s} {'mean rel':>9s} |", "-" * 122]
    for r in rows:
        lines.append(f"{f'{r.m}x{r.k}x{r.n}':>18s} {r.rows:5d} {r.kg:5d} {r.k_blocks:6d} {r.distribution:>7s} | "
                     f"{r.blocked_max_rel:9.2e} {r.blocked_mean_rel:9.2e} | {r.fp32_max_rel:9.2e} "
                     f"{r.fp32_mean_rel:9.2e} | {100 * r.ulp_equal:5.1f}% {100 * r.ulp_one:5.1f}% "
                     f"{100 * r.ulp_two_plus:5.1f}% {r.max_ulp:4d} {r.mean_ulp:5.2f}")
    return "\n".join(lines)


__all__ = ["DISTRIBUTIONS", "KERNEL_TILES", "REL_FLOOR", "SWEEP_KGS", "TABLE5_SHAPES", "AccuracyRow", "ErrorStats",
           "accuracy_study", "error_bound", "error_stats", "format_accuracy", "kblock_sweep", "kernel_kg", "measure",
           "products", "ulp_distance"]

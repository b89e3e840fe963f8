"""FP16 partial sums of the A-resident GEMM: bit-exactness, a rigorous bound, determinism."""
import json

import numpy as np
import pytest

from mtemu.accuracy import (
    TABLE5_SHAPES,
    accuracy_study,
    error_bound,
    format_accuracy,
    kblock_sweep,
    kernel_kg,
    measure,
    products,
    ulp_distance,
)
from mtemu.errors import MtemuError
from mtemu.kernels.gemm import reference_gemm
from mtemu.kernels.gemm_a_resident import reference_gemm_a_resident


def _normal(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)


def _bits(x):
    return x.view(np.uint16)


@pytest.mark.parametrize("kg", [1, 7, 64, 100, 257, 300])
def test_fast_products_are_the_numpy_references_bit_for_bit(kg):
    a, b = _normal(20, 300, 270, seed=kg)
    blocked, single, exact = products(a, b, kg)
    assert np.array_equal(_bits(blocked), _bits(reference_gemm_a_resident(a, b, kg)))
    assert np.array_equal(_bits(single), _bits(reference_gemm(a, b)))
    assert np.allclose(exact, a.astype(np.float64) @ b.astype(np.float64), rtol=0, atol=1e-9)


def test_one_k_block_is_the_fp32_accumulating_reference():
    a, b = _normal(48, 200, 96, seed=5)
    ref = reference_gemm(a, b)
    assert np.array_equal(_bits(reference_gemm_a_resident(a, b, 200)), _bits(ref))
    assert np.array_equal(_bits(reference_gemm_a_resident(a, b, 4096)), _bits(ref))
    assert np.array_equal(_bits(products(a, b, 200)[0]), _bits(ref))
    r = measure(48, 200, 96, kg=200)
    assert r.k_blocks == 1 and r.ulp_equal == 1.0 and r.max_ulp == 0
    assert r.blocked_max_rel == r.fp32_max_rel


def test_a_case_built_to_need_the_partial_rounding():
    # block 1 sums to 1 + 2^-11, a tie that rounds to 1 in FP16; the FP32 single pass keeps it,
    # ends at 1 + 3 * 2^-11 and rounds (tie, to even) to 1 + 2^-9; the blocked order gives 1 + 2^-10
    a = np.ones((1, 4), np.float16)
    b = np.array([[1], [2 ** -11], [2 ** -11], [2 ** -11]], np.float16)
    blocked, single, exact = products(a, b, 2)
    assert float(blocked[0, 0]) == 1 + 2 ** -10
    assert float(single[0, 0]) == 1 + 2 ** -9
    assert exact[0, 0] == 1 + 3 * 2 ** -11
    assert ulp_distance(blocked, single)[0, 0] == 1
    assert np.abs(blocked.astype(np.float64) - exact) <= error_bound(a, b, 2)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("dist", ["normal", "uniform"])
def test_error_is_within_the_rigorous_bound_and_nonzero_with_several_blocks(dist):
    rng = np.random.default_rng(11)
    draw = rng.standard_normal if dist == "normal" else rng.random
    a, b = draw((32, 2048)).astype(np.float16), draw((2048, 64)).astype(np.float16)
    for kg in (2048, 512, 64, 8):
        blocked, single, exact = products(a, b, kg)
        assert (np.abs(blocked.astype(np.float64) - exact) <= error_bound(a, b, kg)).all()
    # with 32 k-blocks of positive data the partial roundings change results
    assert (ulp_distance(products(a, b, 64)[0], single) > 0).any()


def test_uniform_error_grows_with_the_number_of_k_blocks():
    rows = kblock_sweep(m=16, k=4096, n=128, kgs=(4096, 1024, 256, 64, 16), distribution="uniform")
    errs = [r.blocked_mean_rel for r in rows]
    assert errs == sorted(errs) and errs[-1] > 2 * errs[0]
    assert rows[0].ulp_equal == 1.0 and rows[-1].ulp_two_plus > 0


def test_deterministic_and_json():
    a = [r.to_json() for r in accuracy_study(shapes=((64, 1536, 96),), seed=3)]
    b = [r.to_json() for r in accuracy_study(shapes=((64, 1536, 96),), seed=3)]
    assert json.dumps(a, allow_nan=False) == json.dumps(b, allow_nan=False)
    assert [r["distribution"] for r in a] == ["normal", "uniform"] and a[0]["kg"] == 768 and a[0]["k_blocks"] == 2
    text = format_accuracy(accuracy_study(shapes=((64, 1536, 96),), seed=3))
    assert "64x1536x96" in text and "ULP" in text


def test_row_sample_is_the_full_product_rows():
    full = measure(32, 1000, 64, kg=128, distribution="normal", seed=2)
    part = measure(32, 1000, 64, kg=128, distribution="normal", seed=2, rows=8)
    assert part.rows == 8 and full.rows == 32
    # B does not depend on the row count; the sampled rows are a subset, so their worst is no worse
    assert part.max_ulp <= full.max_ulp


def test_kernel_kg_follows_the_kernel_plan():
    assert [kernel_kg(*s) for s in TABLE5_SHAPES] == [768] * 5
    assert kernel_kg(2048, 512, 512) == 512


def test_bad_input():
    a, b = _normal(4, 8, 4)
    with pytest.raises(MtemuError, match="kg must be a positive integer"):
        products(a, b, 0)
    with pytest.raises(MtemuError, match="inner dimensions differ"):
        products(a, a, 2)
    with pytest.raises(MtemuError, match="unknown distribution 'laplace'"):
        measure(4, 8, 4, 2, distribution="laplace")
    with pytest.raises(MtemuError, match="rows must be an integer in 1..4"):
        measure(4, 8, 4, 2, rows=5)


@pytest.mark.slow
def test_table5_shapes_sampled_rows():
    rows = accuracy_study(rows=16)
    assert len(rows) == 10
    for r in rows:
        assert r.k_blocks == -(-r.k // 768)
        # blocked error stays within a few FP16 unit roundoffs of the single-pass order's on these shapes
        assert r.blocked_max_rel < 4 * r.k_blocks * 2 ** -11

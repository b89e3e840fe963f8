"""Exactness of mtemu.fp16 against numpy's float16 (an independent IEEE implementation).

numpy copies signalling-NaN payloads without quieting while mtemu.fp16 quiets them (IEEE
conversion semantics), so NaNs are compared as "both NaN, same sign"; their exact patterns are
checked separately against closed-form values.
"""
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from mtemu.errors import MtemuError
from mtemu.fp16 import (
    f16_bits_to_f32,
    f16_to_f32_array,
    f16_to_f32_into,
    f16_to_f32_into_reference,
    f32_to_f16_array,
    f32_to_f16_bits,
    from_bits,
    to_bits,
)

ALL_H = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def ref_f32_to_f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).view(np.uint16)


def f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def assert_f16_match(x: np.ndarray, got: np.ndarray) -> None:
    """got (uint16 patterns) equals numpy's rounding of float32 x, bit for bit (NaN: NaN+sign)."""
    want = ref_f32_to_f16(x)
    nan = np.isnan(x)
    bad = np.flatnonzero((got != want) & ~nan)
    assert bad.size == 0, [(hex(int(x.view(np.uint32)[i])), hex(int(got[i])), hex(int(want[i])))
                           for i in bad[:5]]
    gn = got[nan]
    assert np.all((gn & 0x7C00) == 0x7C00) and np.all((gn & 0x3FF) != 0)  # still NaN
    assert np.array_equal(gn >> 15, x[nan].view(np.uint32) >> 31)        # sign kept


def test_f16_to_f32_all_patterns():
    got = f16_to_f32_array(ALL_H).view(np.uint32)
    want = ALL_H.view(np.float16).astype(np.float32).view(np.uint32)
    nan = np.isnan(ALL_H.view(np.float16))
    assert nan.sum() == 2 * 1023
    assert np.array_equal(got[~nan], want[~nan])
    g = got[nan]
    assert np.all((g & 0x7F800000) == 0x7F800000) and np.all((g & 0x7FFFFF) != 0)
    assert np.array_equal(g >> 31, want[nan] >> 31)


def test_fast_widening_equals_the_integer_path_on_every_pattern():
    """widen_f16 (the CPU's conversion where there is one) gives the integer path's bits, NaNs included."""
    fast, ref = np.empty(ALL_H.size, np.float32), np.empty(ALL_H.size, np.float32)
    f16_to_f32_into(ALL_H, fast)
    f16_to_f32_into_reference(ALL_H, ref)
    assert np.array_equal(fast.view(np.uint32), ref.view(np.uint32))


@njit
def _f16_scalar_bits(h):
    return np.float32(f16_bits_to_f32(h)).view(np.uint32)


@njit
def _f32_scalar_from_bits(u):
    # the float32 is made inside jitted code so signalling NaNs reach the function intact
    return f32_to_f16_bits(np.uint32(u).view(np.float32))


def test_f16_to_f32_closed_form():
    cases = {
        0x0000: 0x00000000, 0x8000: 0x80000000,          # +-0
        0x0001: 0x33800000, 0x03FF: 0x387FC000,          # min / max subnormal
        0x8001: 0xB3800000,
        0x0400: 0x38800000, 0x3C00: 0x3F800000,          # min normal, 1.0
        0x7BFF: 0x477FE000, 0x7C00: 0x7F800000, 0xFC00: 0xFF800000,
        0x7E00: 0x7FC00000, 0xFE00: 0xFFC00000,          # quiet NaN
        0x7C01: 0x7FC02000, 0xFD55: 0xFFEAA000,          # signalling NaN: payload kept, quieted
    }
    h = np.array(list(cases), dtype=np.uint16)
    want = np.array(list(cases.values()), dtype=np.uint32)
    # Jitted paths only: boxing a float32 NaN to a Python float would quiet it on the way out.
    assert f16_to_f32_array(h).view(np.uint32).tolist() == want.tolist()
    assert [int(_f16_scalar_bits(v)) for v in h] == want.tolist()


def test_f32_to_f16_exact_values_and_round_trip():
    x = f16_to_f32_array(ALL_H)
    got = f32_to_f16_array(x)
    assert_f16_match(x, got)
    nan = (ALL_H & 0x7C00 == 0x7C00) & (ALL_H & 0x3FF != 0)
    assert np.array_equal(got[~nan], ALL_H[~nan])                # identity except NaNs
    assert np.array_equal(got[nan], ALL_H[nan] | 0x0200)         # NaNs come back quiet


def _finite_nonneg_f16_as_f64() -> np.ndarray:
    return np.arange(0, 0x7C01, dtype=np.uint16).view(np.float16).astype(np.float64)  # ..inf


def test_f32_to_f16_halfway_points_and_neighbours():
    v = _finite_nonneg_f16_as_f64()
    v[-1] = 65536.0                               # treat inf as the next "value" after 65504
    mid = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    assert np.array_equal(mid.astype(np.float64), (v[:-1] + v[1:]) / 2)   # exact in float32
    up = np.nextafter(mid, np.float32(np.inf))
    dn = np.nextafter(mid, np.float32(0))
    x = np.concatenate([mid, up, dn])
    x = np.concatenate([x, -x])
    assert_f16_match(x, f32_to_f16_array(x))
    # ties go to the even pattern, neighbours go to the nearer value
    got = f32_to_f16_array(mid).astype(np.int64)
    k = np.arange(mid.size)
    assert np.array_equal(got, np.where(k % 2 == 0, k, k + 1))
    assert np.array_equal(f32_to_f16_array(up).astype(np.int64), k + 1)
    assert np.array_equal(f32_to_f16_array(dn).astype(np.int64), k)


def test_f32_to_f16_random_bit_patterns():
    rng = np.random.default_rng(20240611)
    x = f32(rng.integers(0, 1 << 32, 1_000_000, dtype=np.uint64).astype(np.uint32))
    assert_f16_match(x, f32_to_f16_array(x))


def test_f32_to_f16_subnormal_range():
    rng = np.random.default_rng(7)
    lo, hi = 0x32FFF000, 0x38801000               # just below 2**-25 .. just above 2**-14
    dense = np.arange(0x33000000 - 4096, 0x33000000 + 4096, dtype=np.uint32)   # around 2**-25
    edge = np.arange(0x38800000 - 4096, 0x38800000 + 4096, dtype=np.uint32)    # around 2**-14
    rand = rng.integers(lo, hi, 300_000, dtype=np.uint64).astype(np.uint32)
    tiny = rng.integers(0, 0x00800000, 20_000, dtype=np.uint64).astype(np.uint32)  # f32 subnormals
    b = np.concatenate([dense, edge, rand, tiny])
    x = f32(np.concatenate([b, b | 0x80000000]))
    assert_f16_match(x, f32_to_f16_array(x))


def test_f32_to_f16_overflow_boundary_and_specials():
    below_65520 = np.nextafter(np.float32(65520), np.float32(0))
    vals = [65504, 65505, 65519, below_65520, 65520, np.nextafter(np.float32(65520), np.float32(1e9)),
            65535, 65536, 1e5, 3.4028235e38, np.inf, 0.0]
    x = np.array(vals, dtype=np.float32)
    x = np.concatenate([x, -x])
    got = f32_to_f16_array(x)
    assert_f16_match(x, got)
    want = [0x7BFF, 0x7BFF, 0x7BFF, 0x7BFF] + [0x7C00] * 7 + [0x0000]
    assert got.tolist() == want + [w | 0x8000 for w in want]


@pytest.mark.parametrize("bits,want", [
    (0x33000000, 0x0000),   # 2**-25: tie between 0 and min subnormal -> 0 (even)
    (0x33000001, 0x0001),   # just above -> min subnormal
    (0x33C00000, 0x0002),   # 1.5 * 2**-24: tie -> 2 (even)
    (0x34200000, 0x0002),   # 2.5 * 2**-24: tie -> 2 (even)
    (0x387FE000, 0x0400),   # 2**-14 - 2**-25: tie between 0x3FF and 0x400 -> 0x400 (even)
    (0x3F801000, 0x3C00),   # 1 + 2**-11: tie -> 1.0
    (0x3F803000, 0x3C02),   # 1 + 3 * 2**-11: tie -> even 0x3C02
    (0x80000000, 0x8000),   # -0
    (0x7F800001, 0x7E00),   # sNaN with low payload: stays NaN, quiet
    (0xFFA00000, 0xFF00),   # -sNaN: sign and top payload bits kept, quiet
    (0x7FFFFFFF, 0x7FFF),
])
def test_f32_to_f16_closed_form(bits, want):
    assert int(_f32_scalar_from_bits(np.uint32(bits))) == want
    assert int(f32_to_f16_array(f32([bits]))[0]) == want


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=True, allow_infinity=True),
       st.integers(min_value=0, max_value=(1 << 32) - 1))
def test_f32_to_f16_hypothesis(value, bits):
    x = np.array([value, f32(bits)[()]], dtype=np.float32)
    assert_f16_match(x, f32_to_f16_array(x))
    # the jitted scalar function agrees with the array path
    for xi, gi in zip(x, f32_to_f16_array(x), strict=False):
        assert int(f32_to_f16_bits(xi)) == int(gi)


@njit
def _jitted_caller(h, x):
    # proves the scalar functions are nopython-callable from other jitted code
    return f16_bits_to_f32(h) * np.float32(2), f32_to_f16_bits(x)


def test_scalars_callable_from_njit():
    y, b = _jitted_caller(np.uint16(0x3C00), np.float32(0.5))
    assert y == np.float32(2.0) and int(b) == 0x3800


def test_any_shape_and_noncontiguous():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    xt = x.transpose(2, 0, 1)                     # non-contiguous view
    b = f32_to_f16_array(xt)
    assert b.shape == xt.shape and b.dtype == np.uint16
    assert np.array_equal(b, ref_f32_to_f16(xt))
    y = f16_to_f32_array(b)
    assert y.shape == xt.shape and y.dtype == np.float32
    assert np.array_equal(y, b.view(np.float16).astype(np.float32))
    assert f16_to_f32_array(np.zeros((0, 3), np.uint16)).shape == (0, 3)


def test_to_bits_from_bits():
    h = np.array([[1.0, -2.5], [65504, np.inf]], dtype=np.float16)
    b = to_bits(h)
    assert b.dtype == np.uint16 and b.tolist() == [[0x3C00, 0xC100], [0x7BFF, 0x7C00]]
    assert np.array_equal(from_bits(b), h) and from_bits(b).dtype == np.float16
    assert to_bits(b) is b
    # pure-Python reference for one value via struct's IEEE half format
    assert struct.unpack("<H", struct.pack("<e", -2.5))[0] == int(b[0, 1])


@pytest.mark.parametrize("func,arg,needle", [
    (to_bits, np.zeros(3, np.float32), "float32"),
    (to_bits, [1.0], "list"),
    (from_bits, np.zeros(3, np.int16), "int16"),
    (f16_to_f32_array, np.zeros(3, np.float16), "float16"),
    (f32_to_f16_array, np.zeros(3, np.float64), "float64"),
])
def test_bad_dtype_raises(func, arg, needle):
    with pytest.raises(MtemuError, match=needle):
        func(arg)

"""IEEE 754 binary16 <-> binary32 conversion on uint16 bit patterns.

Numba has no float16 on the CPU, so the emulator stores FP16 data as uint16 bit patterns and
widens to float32 for arithmetic. All conversions here are pure integer bit manipulation, so
they are exact and independent of the host's FTZ/DAZ flags:

* f16 -> f32 is exact for every pattern (subnormals become normal float32 values).
* f32 -> f16 rounds to nearest, ties to even; magnitudes >= 65520 become inf; results below
  2**-14 become correctly rounded subnormals; the sign of zero is kept.
* NaN in either direction keeps its sign and the high payload bits (shifted by 13) and comes
  out quiet (quiet bit set), as IEEE 754 conversions do. numpy copies signalling NaNs unquieted,
  so NaNs are the only inputs on which this module may differ from numpy's bit patterns.

The scalar functions and the ``*_into`` kernels are jitted and meant to be called from other
jitted code; the ``*_array`` functions and ``to_bits``/``from_bits`` are the checked Python API.

:func:`widen_f16` is the hot-loop form of :func:`f16_bits_to_f32` (vector loads, the array API):
where the JIT target has a half -> single conversion instruction (x86 F16C, :data:`HARDWARE_F16`)
it is that instruction, which LLVM vectorises (some 10x faster than a table lookup per lane); the
conversion is exact by IEEE 754 and quiets NaNs as above (being the CPU's, it does not carry the
integer path's independence from FTZ/DAZ flags, which nothing here sets). Elsewhere it is the
integer :func:`f16_bits_to_f32`. tests/test_fp16.py checks it against the integer path on all 65536
patterns.
"""
from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.codegen import get_host_cpu_features
from numba.extending import intrinsic

from mtemu import jit
from mtemu.errors import MtemuError

jit.configure()             # Numba's cache folder, before the first jitted function (mtemu.jit)

__all__ = [
    "f16_bits_to_f32_bits",
    "f32_bits_to_f16_bits",
    "f16_bits_to_f32",
    "f32_to_f16_bits",
    "widen_f16",
    "HARDWARE_F16",
    "add_fp16_product",
    "HARDWARE_FMA",
    "f16_to_f32_into",
    "f32_to_f16_into",
    "f16_to_f32_array",
    "f32_to_f16_array",
    "to_bits",
    "from_bits",
]

# Everything is computed in int64: numba promotes uint64 (+) int64 to float64, which would
# silently lose bits, so no unsigned 64-bit value ever enters the arithmetic.


@njit(cache=True)
def f16_bits_to_f32_bits(h) -> np.uint32:
    """binary16 pattern -> binary32 pattern (exact)."""
    h = np.int64(h) & 0xFFFF
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        # inf (m == 0) or NaN: payload shifted up, quiet bit forced for NaN
        quiet = 0x400000 if m != 0 else 0
        body = 0x7F800000 | (m << 13) | quiet
    elif e == 0:
        # zero/subnormal: value m * 2**-24. int->float32 of m < 2**10 is exact; lowering the
        # exponent field by 24 divides by 2**24 exactly (result stays normal in float32).
        # For m == 0 the difference is negative and max() yields +0.
        body = max(np.int64(np.float32(m).view(np.uint32)) - (24 << 23), 0)
    else:
        # normal: rebias exponent 15 -> 127
        body = ((h & 0x7FFF) << 13) + (112 << 23)
    return np.uint32(sign | body)


@njit(cache=True)
def f32_bits_to_f16_bits(u) -> np.uint16:
    """binary32 pattern -> binary16 pattern, round to nearest even."""
    u = np.int64(u) & 0xFFFFFFFF
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        # NaN: quiet, keep the top 9 payload bits
        body = 0x7E00 | ((a >> 13) & 0x3FF)
    elif a >= 0x477FF000:
        # >= 65520 (halfway between 65504 and 2**16) rounds to inf; includes inf itself
        body = 0x7C00
    elif a >= 0x38800000:
        # normal result: drop 13 bits with RNE (bias 0xFFF plus the kept LSB); a carry out of
        # the mantissa correctly bumps the exponent. Then rebias 127 -> 15.
        body = ((a + 0xFFF + ((a >> 13) & 1)) >> 13) - (112 << 10)
    elif a >= 0x33000000:
        # |x| in [2**-25, 2**-14): subnormal result = round(|x| * 2**24) with RNE.
        # |x| * 2**24 = m * 2**(e - 126) where m has the implicit bit; shift s in [13, 24].
        e = a >> 23
        m = (a & 0x7FFFFF) | 0x800000
        s = 126 - e
        half = np.int64(1) << (s - 1)
        body = (m + half - 1 + ((m >> s) & 1)) >> s  # may round up to 0x400 = min normal
    else:
        # |x| < 2**-25 rounds to zero (exactly 2**-25 is a tie and went to even 0 above)
        body = 0
    return np.uint16(sign | body)


@njit(cache=True)
def f16_bits_to_f32(h) -> np.float32:
    """binary16 pattern (uint16) -> float32 value, exact."""
    return np.uint32(f16_bits_to_f32_bits(h)).view(np.float32)


@njit(cache=True)
def f32_to_f16_bits(x) -> np.uint16:
    """float32 value -> binary16 pattern (uint16), round to nearest even."""
    return f32_bits_to_f16_bits(np.float32(x).view(np.uint32))


def _target_has(feature: str) -> bool:
    """Whether Numba's JIT target (x86-64) has a CPU feature, e.g. "f16c" or "fma"."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    features = numba.config.CPU_FEATURES if numba.config.CPU_FEATURES is not None else get_host_cpu_features()
    return "+" + feature in str(features).split(",")


# with F16C, LLVM lowers half -> float to vcvtph2ps
HARDWARE_F16 = _target_has("f16c")


@intrinsic
def _widen_f16_hw(typingctx, h):
    """uint16 pattern -> float32 by LLVM's ``fpext half to float`` (one instruction with F16C)."""
    if not isinstance(h, types.Integer) or h.bitwidth != 16:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(h), codegen


# Chosen once per process; Numba's cache is keyed on the CPU's features, so a cache moved to a
# machine without F16C is recompiled there with the integer path.
widen_f16 = _widen_f16_hw if HARDWARE_F16 else f16_bits_to_f32


HARDWARE_FMA = _target_has("fma")


@intrinsic
def _fma_f32(typingctx, acc, x, y):
    """acc + x * y rounded once (LLVM's ``llvm.fma.f32``)."""
    if not all(isinstance(t, types.Float) and t.bitwidth == 32 for t in (acc, x, y)):
        return None

    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, [args[1], args[2], args[0]])
    return types.float32(acc, x, y), codegen


@njit(cache=True, inline="always")
def _add_product_rounded(acc, x, y):
    return acc + x * y


# acc + x * y for FP32 values x, y that are FP16 values (widened): their product has at most 22
# significant bits and an exponent inside FP32's normal range, so it is exact in FP32 and rounding
# the sum once (a fused multiply-add) gives the bits of rounding product then sum. One instruction
# where the JIT target has FMA (tests/test_fp16.py compares both forms).
add_fp16_product = _fma_f32 if HARDWARE_FMA else _add_product_rounded


@njit(cache=True)
def f16_to_f32_into(src, dst) -> None:
    """Jitted kernel: 1-D uint16 patterns -> 1-D float32 (same length, preallocated)."""
    for i in range(src.size):
        dst[i] = widen_f16(src[i])


@njit(cache=True)
def f16_to_f32_into_reference(src, dst) -> None:
    """:func:`f16_to_f32_into` by the integer path alone (tests compare the two)."""
    for i in range(src.size):
        dst[i] = f16_bits_to_f32(src[i])


@njit(cache=True)
def f32_to_f16_into(src, dst) -> None:
    """Jitted kernel: 1-D float32 -> 1-D uint16 patterns (same length, preallocated)."""
    for i in range(src.size):
        dst[i] = f32_to_f16_bits(src[i])


def _require_dtype(a: np.ndarray, dtype: type, what: str, hint: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise MtemuError(f"{what}: expected a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise MtemuError(f"{what}: expected dtype {np.dtype(dtype).name}, got {a.dtype.name}; {hint}")
    return a


def f16_to_f32_array(bits: np.ndarray) -> np.ndarray:
    """uint16 FP16 patterns of any shape -> float32 array of the same shape (exact)."""
    _require_dtype(bits, np.uint16, "f16_to_f32_array",
                   "pass FP16 bit patterns (use to_bits() on a float16 array)")
    flat = np.ascontiguousarray(bits).reshape(-1)
    out = np.empty(flat.size, dtype=np.float32)
    f16_to_f32_into(flat, out)
    return out.reshape(bits.shape)


def f32_to_f16_array(x: np.ndarray) -> np.ndarray:
    """float32 array of any shape -> uint16 FP16 patterns of the same shape (RNE)."""
    # float64 is refused rather than cast: float64 -> float32 -> float16 can double-round.
    _require_dtype(x, np.float32, "f32_to_f16_array",
                   "convert explicitly with .astype(np.float32) if double rounding is acceptable")
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.size, dtype=np.uint16)
    f32_to_f16_into(flat, out)
    return out.reshape(x.shape)


def to_bits(a: np.ndarray) -> np.ndarray:
    """float16 array -> uint16 bit-pattern view (uint16 input is returned unchanged)."""
    if isinstance(a, np.ndarray) and a.dtype == np.uint16:
        return a
    _require_dtype(a, np.float16, "to_bits",
                   "only float16 (or uint16 patterns) can be viewed as FP16 bits; "
                   "use f32_to_f16_array() for float32 data")
    return a.view(np.uint16)


def from_bits(b: np.ndarray) -> np.ndarray:
    """uint16 FP16 bit patterns -> float16 array view."""
    _require_dtype(b, np.uint16, "from_bits", "expected FP16 bit patterns")
    return b.view(np.float16)

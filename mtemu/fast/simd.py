"""Sixteen FP32 lanes as one value in jitted code: the host's vector registers, for the fused stretches.

LLVM vectorises only innermost loops, and a loop over a row's lanes must then load and store its
accumulators every few terms: they live in memory, which Numba's arrays may alias. A group of
accumulators that stays in registers over all its terms (a register-blocked GEMM micro-kernel, as
BLAS libraries write them in assembly) needs vector values that Numba code can name. This module
gives it one type, :data:`f32x16` (LLVM's ``<16 x float>``, one AVX-512 register or two AVX ones),
and four intrinsics over it:

- :func:`load_f16x16` ``(mem16, i)``: the 16 FP16 patterns at ``mem16[i:i + 16]``, widened (``fpext
  half`` lane by lane: exact, one ``vcvtph2ps`` with F16C);
- :func:`load_f32x16` / :func:`store_f32x16` ``(a, r, k[, x])``: ``a[r, k:k + 16]`` of a 2-D float32 array;
- :func:`fma_x16` ``(x, b, acc)``: ``acc + x * b`` per lane, rounded once (``llvm.fma``), with ``x`` a
  float32 scalar broadcast to every lane.

Each lane computes what :func:`mtemu.fp16.widen_f16` and :func:`mtemu.fp16.add_fp16_product` compute on
one value (the same LLVM operations), so results are bit-identical to the scalar forms.
:data:`VECTOR_FP16` says whether the JIT target has both F16C and FMA; without them LLVM would call
library routines per lane (or find none to link), so callers use their scalar loops instead.

The intrinsics do no bounds checks: callers pass indices whose 16 lanes lie inside the array (the
fused stretches read rows that the emulated ``vldh`` already checked).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from ..fp16 import HARDWARE_F16, HARDWARE_FMA

__all__ = ["LANES_X16", "VECTOR_FP16", "f32x16", "fma_x16", "load_f16x16", "load_f32x16", "store_f32x16"]

LANES_X16 = 16
# both conversions and multiply-adds are single instructions on the JIT target
VECTOR_FP16 = HARDWARE_F16 and HARDWARE_FMA

_F32 = ir.FloatType()
_VEC = ir.VectorType(_F32, LANES_X16)
_I32 = ir.IntType(32)


class F32x16(types.Type):
    """Numba type of 16 float32 lanes held as one LLVM vector value."""

    def __init__(self) -> None:
        super().__init__(name="f32x16")


f32x16 = F32x16()


@register_model(F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC)


def _is_array(t, dtype, ndim: int) -> bool:
    return isinstance(t, types.Array) and t.dtype == dtype and t.ndim == ndim


def _lanes_pointer(context, builder, arrty, arr, indices):
    """Pointer to 16 lanes of ``arr`` starting at ``indices`` (no bounds check)."""
    ary = context.make_array(arrty)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, arrty, ary, indices, wraparound=False)


@intrinsic
def load_f16x16(typingctx, mem16, i):
    """The FP16 patterns mem16[i:i + 16] (1-D uint16), widened to float32."""
    if not (_is_array(mem16, types.uint16, 1) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _lanes_pointer(context, builder, sig.args[0], args[0], [args[1]])
        bits = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(16), LANES_X16).as_pointer()), align=2)
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), LANES_X16)), _VEC)
    return f32x16(mem16, i), codegen


@intrinsic
def load_f32x16(typingctx, a, r, k):
    """a[r, k:k + 16] of a 2-D float32 array."""
    if not (_is_array(a, types.float32, 2) and isinstance(r, types.Integer) and isinstance(k, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _lanes_pointer(context, builder, sig.args[0], args[0], [args[1], args[2]])
        return builder.load(builder.bitcast(ptr, _VEC.as_pointer()), align=4)
    return f32x16(a, r, k), codegen


@intrinsic
def store_f32x16(typingctx, a, r, k, x):
    """a[r, k:k + 16] = x."""
    if not (_is_array(a, types.float32, 2) and isinstance(x, F32x16)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _lanes_pointer(context, builder, sig.args[0], args[0], [args[1], args[2]])
        builder.store(args[3], builder.bitcast(ptr, _VEC.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.none(a, r, k, x), codegen


@intrinsic
def fma_x16(typingctx, x, b, acc):
    """acc + x * b per lane, rounded once; x is a float32 scalar."""
    if not (x == types.float32 and isinstance(b, F32x16) and isinstance(acc, F32x16)):
        return None

    def codegen(context, builder, sig, args):
        one = builder.insert_element(ir.Constant(_VEC, ir.Undefined), args[0], ir.Constant(_I32, 0))
        splat = builder.shuffle_vector(one, ir.Constant(_VEC, ir.Undefined),
                                       ir.Constant(ir.VectorType(_I32, LANES_X16), [0] * LANES_X16))
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC, _VEC, _VEC]),
                                            "llvm.fma.v16f32")
        return builder.call(fn, [splat, args[1], args[2]])
    return f32x16(x, b, acc), codegen


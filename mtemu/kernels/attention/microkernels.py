"""Micro-kernels shared by the attention kernels: straight-line code, list-scheduled, ending in
``ret``, called by the per-DSP drivers with their operand addresses in the scalar registers below
(set with ``smovi`` before each call). Each is cached per argument tuple and platform."""
from __future__ import annotations

import functools
import math
import struct

import numpy as np

from ...assembler import ProgramBuilder, ins
from ...platform import Platform
from ..schedule import Op, check_registers, schedule

# scalar registers used by the micro-kernels (set by the driver with smovi before each call)
R_A, R_B, R_C, R_W, R_D, R_P = 1, 2, 3, 4, 5, 6
R_T0 = 16
FP16_MINUS_ONE = 0xBC00


def fp32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def vload(op: str, v: int, reg: int, off: int, fence: bool = False) -> Op:
    return Op(op, (v, (reg, off)), (("s", reg),), (("v", v),), fence)


def vstore(op: str, reg: int, off: int, v: int) -> Op:
    return Op(op, ((reg, off), v), (("s", reg), ("v", v)))


def fma(acc: int, a: int, b: int) -> Op:
    return Op("vfma", (acc, a, b), (("v", a), ("v", b), ("v", acc)), (("v", acc),))


def zero(v: int) -> Op:
    return Op("svbcast", (v, 0), (("s", 0),), (("v", v),))


def assemble(ops: list[Op], platform: Platform) -> np.ndarray:
    b = ProgramBuilder(platform)
    for bundle in schedule(ops, platform):
        b.bundle(*bundle)
    b.bundle(ins("ret"))
    return b.assemble().code


@functools.lru_cache(maxsize=512)
def mk_gemm(rows: int, nv: int, ks: int, first: bool, astride: int, akstride: int, bstride: int,
            cstride: int, platform: Platform, rotation: int = 2, b_fp32: bool = False) -> np.ndarray:
    """C[rows, nv vectors] (+)= A[rows, ks] B[ks, nv vectors]; A in SM at R_A + r*astride + k*akstride
    (FP16 scalars), B rows in AM at R_B + k*bstride, C in FP32 at R_C + r*cstride (loaded unless
    ``first``, always stored). Accumulation is sequential in k, as in the references."""
    lanes = platform.vector_lanes
    acc = [[r * nv + c for c in range(nv)] for r in range(rows)]
    va0 = rows * nv
    vb0 = va0 + rotation * rows
    check_registers(R_T0 + rotation * rows, vb0 + rotation * nv, platform, f"attention GEMM kernel {rows}x{nv}")
    ops: list[Op] = []
    for r in range(rows):
        for c in range(nv):
            ops.append(zero(acc[r][c]) if first else vload("vldw", acc[r][c], R_C, r * cstride + c * lanes * 4))
    for kk in range(ks):
        rs = kk % rotation
        for r in range(rows):
            s = R_T0 + rs * rows + r
            ops.append(Op("sldh", (s, (R_A, r * astride + kk * akstride)), (("s", R_A),), (("s", s),)))
        for r in range(rows):
            s, v = R_T0 + rs * rows + r, va0 + rs * rows + r
            ops.append(Op("svbcast", (v, s), (("s", s),), (("v", v),)))
        for c in range(nv):
            if b_fp32:
                ops.append(vload("vldw", vb0 + rs * nv + c, R_B, kk * bstride + c * lanes * 4))
            else:
                ops.append(vload("vldh", vb0 + rs * nv + c, R_B, kk * bstride + c * lanes * 2))
        for r in range(rows):
            for c in range(nv):
                ops.append(fma(acc[r][c], va0 + rs * rows + r, vb0 + rs * nv + c))
    for r in range(rows):
        for c in range(nv):
            ops.append(vstore("vstw", R_C, r * cstride + c * lanes * 4, acc[r][c]))
    return assemble(ops, platform)


def bcast_dot(ops: list[Op], acc: list[int], va0: int, vb: int, d: int, rotation: int, lanes: int) -> None:
    """Append acc[r] += A[r, e] * B[e] for e < d (the shared inner loop of the score kernels).

    A: len(acc) rows of d FP16 in SM at R_A, read one scalar at a time and broadcast; B: d FP16
    vector rows in AM at R_B. Scalar/vector registers rotate over ``rotation`` sets so a step's
    loads do not wait on the previous step's FMAs."""
    rows = len(acc)
    for e in range(d):
        rs = e % rotation
        for r in range(rows):
            s = R_T0 + rs * rows + r
            ops.append(Op("sldh", (s, (R_A, r * d * 2 + e * 2)), (("s", R_A),), (("s", s),)))
        for r in range(rows):
            s, v = R_T0 + rs * rows + r, va0 + rs * rows + r
            ops.append(Op("svbcast", (v, s), (("s", s),), (("v", v),)))
        ops.append(vload("vldh", vb + rs, R_B, e * lanes * 2))
        for r in range(rows):
            ops.append(fma(acc[r], va0 + rs * rows + r, vb + rs))


@functools.lru_cache(maxsize=256)
def mk_round(rows: int, nv: int, scale_bits: int, cstride: int, wstride: int, platform: Platform) -> np.ndarray:
    """FP16 write-back: W[r] = fp16(C[r] * scale) (or fp16(C[r]) when scale_bits == 0)."""
    lanes = platform.vector_lanes
    n = rows * nv
    check_registers(R_T0 + 1, 2 * n + 1, platform, f"attention write-back kernel {rows}x{nv}")
    ops: list[Op] = []
    vs = 2 * n
    if scale_bits:
        ops.append(Op("smovi", (R_T0, scale_bits), (), (("s", R_T0),)))
        ops.append(Op("svbcastw", (vs, R_T0), (("s", R_T0),), (("v", vs),)))
    for r in range(rows):
        for c in range(nv):
            x, y = 2 * (r * nv + c), 2 * (r * nv + c) + 1
            ops.append(vload("vldw", x, R_C, r * cstride + c * lanes * 4))
            if scale_bits:
                ops.append(zero(y))
                ops.append(fma(y, x, vs))
                ops.append(vstore("vsth", R_W, r * wstride + c * lanes * 2, y))
            else:
                ops.append(vstore("vsth", R_W, r * wstride + c * lanes * 2, x))
    return assemble(ops, platform)


def inv_sqrt_bits(d: int) -> int:
    """FP32 bits of 1/sqrt(d) (rounded to FP32 first): the score and dK scale."""
    return fp32_bits(float(np.float32(1.0 / math.sqrt(d))))

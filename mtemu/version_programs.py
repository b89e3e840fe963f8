"""The reference programs :mod:`mtemu.version` hashes into ``emulator_version``: what each kernel family's
generators build for a few reference shapes on the default platform (code, DMA descriptors, per-DSP
tables). Kept apart from the version lookup because building them loads the generators (and so the
machine and Numba), while looking up a recorded version loads neither.
"""
from __future__ import annotations

import numpy as np

from .assembler import Program
from .kernels.attention import build_attention_backward, build_attention_forward, plan_attention
from .kernels.attention.forward import plan_attention_forward
from .kernels.gemm import build_gemm
from .kernels.gemm_a_resident import build_a_resident
from .kernels.gemm_tiles import AResidentGemmTiles, GemmTiles
from .platform import DEFAULT

# Reference shapes: remainders in every loop (none of them a multiple of the tiles).
_GEMM_SHAPES = ((600, 1000, 700),)
_ATTENTION_SHAPES = ((4, 2, 320, 64),)


def update_hash(h, obj) -> None:
    """Feed a program's encoded form (arrays, tables, labels) into the hash, recursively."""
    if isinstance(obj, Program):
        h.update(obj.code.tobytes())
        h.update(obj.descriptors.tobytes())
        h.update(repr(sorted(obj.labels.items())).encode())
    elif isinstance(obj, np.ndarray):
        h.update(str(obj.dtype).encode() + repr(obj.shape).encode() + obj.tobytes())
    elif isinstance(obj, dict):
        for key in sorted(obj, key=repr):
            h.update(repr(key).encode())
            update_hash(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            update_hash(h, item)
    else:
        h.update(repr(obj).encode())


def gemm_programs() -> list:
    out = []
    for m, k, n in _GEMM_SHAPES:
        for tiles in (GemmTiles(), GemmTiles(pipelined=False)):
            gp = build_gemm(m, k, n, tiles, DEFAULT)
            out.append((gp.program, gp.dsp_descriptors, gp.init_sregs, gp.useful_macs))
        gp = build_a_resident(m, k, n, AResidentGemmTiles(), DEFAULT)
        out.append((gp.program, gp.dsp_descriptors, gp.init_sregs, gp.useful_macs))
    return out


def attention_programs() -> list:
    out = []
    for heads, kv_heads, seq, d in _ATTENTION_SHAPES:
        for variant in ("resident", "ddr-staged"):
            ap = build_attention_backward(plan_attention(heads, kv_heads, seq, d, variant=variant), DEFAULT)
            out.append((ap.programs, ap.useful_macs, ap.tile_pairs, ap.schedule))
        ap = build_attention_forward(plan_attention_forward(heads, kv_heads, seq, d), DEFAULT)
        out.append((ap.programs, ap.useful_macs, ap.tile_pairs, ap.schedule))
    return out


PROGRAMS = {"gemm": gemm_programs, "attention": attention_programs}

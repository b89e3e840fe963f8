"""The data a DMA transfer moves (functional mode): rows of bytes from one place of the flat memory to another.

The machine (:mod:`mtemu.machine`) checks a transfer's addresses and times it; this module only moves
its data, either when the transfer issues or later, in order with the DSP's other waiting work
(:mod:`mtemu.fast.queues`). Addresses are absolute byte offsets into the cluster's flat memory (the
space's base, plus the DSP's slice for SM and AM, plus the address). Row loops run over 1-D slices,
which LLVM vectorises; element order is kept where source and destination overlap.
"""
from __future__ import annotations

from numba import njit

from . import isa, jit

jit.configure()             # Numba's cache folder, before the first jitted function (mtemu.jit)


@njit(cache=True)
def move(mem16, mem32, mode, src, dst, rows, row_bytes, src_stride, dst_stride):
    """Copy (``DMA_COPY``, ``DMA_BROADCAST`` per target) or add (``DMA_REDUCE_ADD``: FP32 dst += src)
    ``rows`` rows of ``row_bytes`` from byte offset ``src`` to ``dst``, rows ``*_stride`` bytes apart."""
    if mode == isa.DMA_REDUCE_ADD:
        nw = row_bytes >> 2
        for r in range(rows):
            s0 = (src + r * src_stride) >> 2
            d0 = (dst + r * dst_stride) >> 2
            src32 = mem32[s0:s0 + nw]
            dst32 = mem32[d0:d0 + nw]
            for k in range(nw):
                dst32[k] += src32[k]
    else:
        nh = row_bytes >> 1
        for r in range(rows):
            s0 = (src + r * src_stride) >> 1
            d0 = (dst + r * dst_stride) >> 1
            src16 = mem16[s0:s0 + nh]
            dst16 = mem16[d0:d0 + nh]
            for k in range(nh):
                dst16[k] = src16[k]

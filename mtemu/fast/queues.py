"""Functional mode: the data of an accepted straight-line run, now or deferred in a queue per DSP.

A run's data effects touch only its DSP's registers, SM and AM, so they may wait in a queue per
DSP until something else looks at that state; a DMA whose data move writes only the DSP's AM waits
in the same queue. The scalar side runs at once: the registers the run's ``sldh`` load get their
values when the run is accepted (so branches, addresses and later runs see them), and a copy of the
span of SM they read (one block copy, not a value per load) is kept with the queued run, whose
vector side reads its scalars from it (on a copy of the registers taken at acceptance) instead of
from SM, which a DMA may meanwhile rewrite. So queued work reads and writes only its DSP's vector
registers and AM, plus, for a queued DMA, its source. What must wait for it (:func:`must_flush`):
a bundle of the DSP that is not plain and touches vector registers or AM (or stores to SM, which
a queued DMA may read), and a DMA that does not wait whose source or destination overlaps a range
queued work touches (a broadcast into every DSP's AM or SM, a transfer out of the DSP's AM, one into
GSM or DDR where a queued DMA reads). Then that DSP's queue, or every DSP's, executes in order
(:func:`settle`; every DSP's over threads); so does the end of the run. The order of each DSP's
effects is the bundle-by-bundle order, and the data are identical.

A run's multiply-accumulate core executes fused (:mod:`mtemu.fast.fused`), and a DMA's data move is
:func:`mtemu.dma.move`. ``tests/test_plain_runs.py`` and ``tests/test_fused.py`` check
:func:`run_plain` against :func:`run_plain_reference`.
"""
from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange

from .. import isa, semantics
from ..dma import move
from ..fp16 import f32_to_f16_bits, widen_f16
from .fused import (
    MIN_FUSED_TERMS,
    N_OPCOLS,
    O_FUSE_AT,
    O_FUSE_END,
    O_IMM,
    O_OP,
    O_R0,
    O_R1,
    O_R2,
    mark_stretches,
    run_fused,
)
from .runs import B_SSTH, CLASS_AM, CLASS_SM, FAR, MAX_CLASSES

QUEUE = 64                  # runs and DMAs a DSP may have waiting
# columns of a queue entry (qitem): its run's first and end PC (-1 for a DMA), where its SM copy sits
QI_START, QI_END, QI_SM = range(3)
# columns of a range waiting work touches (qrange, MAX_CLASSES per entry): space (-1: none), start, end
QR_SPACE, QR_START, QR_END = range(3)
# a waiting DMA's row of the queue's register copies: what it moves
Q_MODE, Q_SRC, Q_DST, Q_ROWS, Q_ROW_BYTES, Q_SRC_STRIDE, Q_DST_STRIDE = range(7)
# columns of decode_ops' sldh list (sld), of exit_loads' rows (exits: each run's last load of each
# register) and of its per-PC offsets (exit_off: sldh before the PC, then the rows of the run ending there)
SL_DST, SL_BASE, SL_IMM = range(3)
X_SLDH, X_DST, X_BASE, X_IMM = range(4)
XO_SLDH, XO_FIRST, XO_END = range(3)
SM_COPY_BYTES = 4 << 20     # copies of SM all DSPs' queued runs may hold (more costs the host's
                            # kernel zeroing untouched huge pages on every run)
PARALLEL_OPS = 20000        # waiting instructions worth a parallel launch (a GEMM run holds ~6600)
# Threading layer: OpenMP where the host has it, else Numba's own work queue (launches come from one
# thread). Between two flushes the machine's loop runs alone, and on a virtual machine an idle core
# sleeps: the work queue's threads then start a flush milliseconds late (measured: a third of the
# cores' time lost), where OpenMP's threads spin briefly before they sleep (a 1024^3 functional GEMM
# about 25 % faster on 2 cores). GNU OpenMP is not fork-safe: a process that has launched it must
# start workers by spawning (mtemu.tune does). A user's choice (NUMBA_THREADING_LAYER) is kept.
if numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER_PRIORITY = ["omp", "workqueue", "tbb"]



class Queues(NamedTuple):
    """What the machine's loop defers with (:func:`defer_buffers`; zero-length: nothing waits): the static
    tables of :func:`defer_tables` and, per DSP, its queue and broadcast scratch."""

    touches: np.ndarray     # per PC: the bundle touches what waiting work holds
    n: np.ndarray           # per DSP: entries waiting
    item: np.ndarray        # (dsps, QUEUE, QI_*) per entry: its run's PCs, or a DMA, and its SM copy
    regs: np.ndarray        # (dsps, QUEUE, registers): the scalar registers at acceptance, or a DMA's Q_* row
    ranges: np.ndarray      # (dsps, QUEUE, MAX_CLASSES, QR_*) what each entry touches
    sm: np.ndarray          # (dsps, words): the SM copies of the queued runs
    sm_used: np.ndarray     # per DSP: words of ``sm`` in use
    ops: np.ndarray         # decode_ops' instruction list (columns O_*), bundle q's at off[q]:off[q + 1]
    off: np.ndarray
    fused: np.ndarray       # the fused stretches' records (mtemu.fast.fused)
    exits: np.ndarray       # exit_loads' rows and per-PC offsets
    exit_off: np.ndarray
    bc_on: np.ndarray       # (dsps, vector registers): run_plain's deferred broadcasts
    bc_val: np.ndarray


@njit(cache=True)
def _fill(dst, x):
    for k in range(dst.size):
        dst[k] = x


@njit(cache=True)
def run_plain(d, p, e, ops, off, fused, sr, vregs, mem16, mem32, f16tab, bases, caps, lanes, bc_on, bc_val, smem,
              sbase):
    """The data effects of bundles [p, e) of a run DSP d may skip, in order, on scalar registers
    ``sr`` (DSP d's, or a copy): the values the bundle-by-bundle path computes, faster.

    ``ops``/``off`` are :func:`decode_ops`'s table. A broadcast only records its value (``bc_on``,
    ``bc_val``: DSP d's row all False on entry and exit): a ``vfma`` reading it multiplies by the
    scalar (the same FP32 product per lane), anything else that reads it, and the run's end, first
    writes the lanes. Vector loads widen FP16 with :func:`~mtemu.fp16.widen_f16`. Lane loops work on
    1-D slices so LLVM vectorises them. Fused stretches (:mod:`mtemu.fast.fused`) run blocked. ``sldh`` of SM
    address a read ``smem[(sbase + a) >> 1]``: DSP d's SM in ``mem16`` (``sbase`` its first byte), or the
    copy of the SM it reads that was taken when the run was queued. :func:`run_plain_reference` is the
    plain statement of it."""
    sm0 = bases[0] + d * caps[0]
    am0 = bases[1] + d * caps[1]
    v = vregs[d]
    on = bc_on[d]
    val = bc_val[d]
    i = off[p]
    last = off[e]
    while i < last:
        fe = ops[i, O_FUSE_END]
        if fe > i and fe <= last:
            run_fused(fused, ops[i, O_FUSE_AT], sr, v, on, val, mem16, am0, lanes, smem, sbase)
            i = fe
            continue
        op = ops[i, O_OP]
        r0 = ops[i, O_R0]
        r1 = ops[i, O_R1]
        r2 = ops[i, O_R2]
        if op == isa.OP_VFMA:
            if on[r0]:
                _fill(v[r0], val[r0])
                on[r0] = False
            acc = v[r0]
            if on[r1]:
                x = val[r1]
                if on[r2]:
                    xy = x * val[r2]
                    for k in range(lanes):
                        acc[k] += xy
                else:
                    vb = v[r2]
                    for k in range(lanes):
                        acc[k] += x * vb[k]
            elif on[r2]:
                y = val[r2]
                va = v[r1]
                for k in range(lanes):
                    acc[k] += va[k] * y
            else:
                va = v[r1]
                vb = v[r2]
                for k in range(lanes):
                    acc[k] += va[k] * vb[k]
        elif op == isa.OP_SVBCAST:
            val[r0] = f16tab[sr[r1] & 0xFFFF]
            on[r0] = True
        elif op == isa.OP_SVBCASTW:
            val[r0] = np.uint32(sr[r1] & 0xFFFFFFFF).view(np.float32)
            on[r0] = True
        elif op == isa.OP_VLDH:
            i0 = (am0 + sr[r1] + ops[i, O_IMM]) >> 1
            src = mem16[i0:i0 + lanes]
            dst = v[r0]
            for k in range(lanes):
                dst[k] = widen_f16(src[k])
            on[r0] = False
        elif op == isa.OP_SLDH:
            sr[r0] = smem[(sbase + sr[r1] + ops[i, O_IMM]) >> 1]
        elif op == isa.OP_VLDW:
            i0 = (am0 + sr[r1] + ops[i, O_IMM]) >> 2
            src32 = mem32[i0:i0 + lanes]
            dst = v[r0]
            for k in range(lanes):
                dst[k] = src32[k]
            on[r0] = False
        elif op == isa.OP_SSTH:
            mem16[(sm0 + sr[r1] + ops[i, O_IMM]) >> 1] = np.uint16(sr[r2] & 0xFFFF)
        elif op == isa.OP_VSTW or op == isa.OP_VSTH:
            if on[r2]:                   # stores read whole registers: write the lanes first
                _fill(v[r2], val[r2])
                on[r2] = False
            vs = v[r2]
            if op == isa.OP_VSTW:
                i0 = (am0 + sr[r1] + ops[i, O_IMM]) >> 2
                out32 = mem32[i0:i0 + lanes]
                for k in range(lanes):
                    out32[k] = vs[k]
            else:
                i0 = (am0 + sr[r1] + ops[i, O_IMM]) >> 1
                out16 = mem16[i0:i0 + lanes]
                for k in range(lanes):
                    out16[k] = f32_to_f16_bits(vs[k])
        elif op == isa.OP_VMAX:
            if on[r1]:
                _fill(v[r1], val[r1])
                on[r1] = False
            if on[r2]:
                _fill(v[r2], val[r2])
                on[r2] = False
            va = v[r1]
            vb = v[r2]
            dst = v[r0]
            for k in range(lanes):
                xa = va[k]
                xb = vb[k]
                dst[k] = xa if (xa > xb or xa != xa) else xb
            on[r0] = False
        i += 1
    for r in range(on.size):
        if on[r]:
            _fill(v[r], val[r])
            on[r] = False


@njit(cache=True)
def _scalar_exit(d, p, e, exits, exit_off, sr, mem16, bases, caps):
    """The scalar registers the run [p, e) leaves: each register its ``sldh`` load holds what the last of
    them read. ``exits`` lists, per run end e, the last load of each register in the whole run, latest
    first (:func:`exit_loads`); those at or after p's first load are the ones of [p, e). A run's addresses
    are never based on a register it loads (:func:`build_blocks`), so every load is read before any is
    written."""
    sm0 = bases[0] + d * caps[0]
    j0 = exit_off[p, XO_SLDH]
    a = exit_off[e, XO_FIRST]
    b = exit_off[e, XO_END]
    m = a
    while m < b and exits[m, X_SLDH] >= j0:
        m += 1
    if m == a:
        return
    vals = np.empty(m - a, np.int64)
    for i in range(a, m):
        vals[i - a] = mem16[(sm0 + sr[exits[i, X_BASE]] + exits[i, X_IMM]) >> 1]
    for i in range(a, m):
        sr[exits[i, X_DST]] = vals[i - a]


@njit(cache=True)
def _exit_loads(end, sld, sld_off, nregs, exits, exit_off):
    """Fill (or, with zero-length ``exits``, count) :func:`exit_loads`' rows; returns their number."""
    seen = np.full(nregs, -1, np.int64)
    m = 0
    for p in range(end.shape[0]):
        e = end[p]
        if e <= p or exit_off[e, XO_FIRST] >= 0:
            continue
        exit_off[e, XO_FIRST] = m       # p is the first PC of the run ending at e
        for j in range(sld_off[e] - 1, sld_off[p] - 1, -1):
            r = sld[j, SL_DST]
            if seen[r] != e:
                seen[r] = e
                if exits.shape[0] > 0:
                    exits[m, X_SLDH] = j
                    exits[m, X_DST] = r
                    exits[m, X_BASE] = sld[j, SL_BASE]
                    exits[m, X_IMM] = sld[j, SL_IMM]
                m += 1
        exit_off[e, XO_END] = m
    return m


def exit_loads(end: np.ndarray, sld: np.ndarray, sld_off: np.ndarray, nregs: int) -> tuple[np.ndarray, np.ndarray]:
    """What the scalar side of a run needs, from :func:`build_blocks`' ``end`` and :func:`decode_ops`'
    ``sld``/``sld_off``: ``exits`` rows (sldh number, destination, base register, offset), per run the
    last load of each register it loads, latest first; ``exit_off`` per PC q (columns: sldh before q,
    then the run ending at q's rows ``exits[exit_off[q, XO_FIRST]:exit_off[q, XO_END]]``). A run of ~1300 ``sldh``
    leaves a dozen registers: read per run, the whole list cost ~2 us per run."""
    n = end.shape[0]
    exit_off = np.full((n + 1, 3), -1, np.int64)
    exit_off[:, XO_SLDH] = sld_off
    end = np.ascontiguousarray(end, dtype=np.int64)
    count = _exit_loads(end, sld, sld_off, nregs, np.zeros((0, 4), np.int64), exit_off.copy())
    exits = np.zeros((count, 4), np.int64)
    _exit_loads(end, sld, sld_off, nregs, exits, exit_off)
    return exits, exit_off


@njit(cache=True)
def flush_dsp(d, qs, vregs, mem16, mem32, f16tab, bases, caps, lanes):
    """Execute DSP d's waiting runs and DMA data moves, in order."""
    ops, off, fused, qn, qitem, qregs, qsm, qlen = qs.ops, qs.off, qs.fused, qs.n, qs.item, qs.regs, qs.sm, qs.sm_used
    bc_on, bc_val = qs.bc_on, qs.bc_val
    for i in range(qn[d]):
        if qitem[d, i, QI_START] < 0:
            g = qregs[d, i]
            move(mem16, mem32, g[Q_MODE], g[Q_SRC], g[Q_DST], g[Q_ROWS], g[Q_ROW_BYTES], g[Q_SRC_STRIDE],
                 g[Q_DST_STRIDE])
        else:
            run_plain(d, qitem[d, i, QI_START], qitem[d, i, QI_END], ops, off, fused, qregs[d, i], vregs, mem16, mem32,
                      f16tab, bases, caps, lanes, bc_on, bc_val, qsm[d], qitem[d, i, QI_SM])
    qn[d] = 0
    qlen[d] = 0


@njit(cache=True)
def spread_order(n):
    """0..n-1 in bit-reversed order (the van der Corput sequence, values >= n left out). A static split
    of a parallel loop over it into 2^k equal parts gives each thread DSPs from all over the range, so a
    flush where only a contiguous group of DSPs has work (a kernel's last rows, say) still keeps every
    thread busy: over a 1024^3 GEMM's 16 flushes, the larger of two threads' shares of the waiting
    instructions adds up to 8.7 % above an even split with DSPs 0-11 and 12-23, 0.7 % with the even
    and the odd ones."""
    bits = 0
    while (1 << bits) < n:
        bits += 1
    order = np.empty(n, np.int64)
    m = 0
    for i in range(1 << bits):
        r = 0
        for b in range(bits):
            if (i >> b) & 1:
                r |= 1 << (bits - 1 - b)
        if r < n:
            order[m] = r
            m += 1
    return order


@njit(cache=True, parallel=True)
def _flush_threads(qs, vregs, mem16, mem32, f16tab, bases, caps, lanes):
    qn = qs.n
    order = spread_order(qn.shape[0])
    for i in prange(qn.shape[0]):     # DSPs touch disjoint registers, AM and queue rows
        flush_dsp(order[i], qs, vregs, mem16, mem32, f16tab, bases, caps, lanes)


@njit(cache=True)
def flush(qs, vregs, mem16, mem32, f16tab, bases, caps, lanes, threads):
    """Execute all waiting work (DSP by DSP in order; over threads if ``threads`` and more than one DSP waits)."""
    qn = qs.n
    busy = _busy_dsps(qn)
    if busy == 0:
        return
    if threads and busy > 1:
        _flush_threads(qs, vregs, mem16, mem32, f16tab, bases, caps, lanes)
    else:
        for d in range(qn.shape[0]):
            flush_dsp(d, qs, vregs, mem16, mem32, f16tab, bases, caps, lanes)


@njit(cache=True)
def _busy_dsps(qn):
    n = 0
    for d in range(qn.shape[0]):
        if qn[d] > 0:
            n += 1
    return n


@njit(cache=True)
def waiting_ops(off, qn, qitem):
    """Instructions waiting in every DSP's queue (runs only)."""
    total = 0
    for d in range(qn.shape[0]):
        for i in range(qn[d]):
            if qitem[d, i, QI_START] >= 0:
                total += off[qitem[d, i, QI_END]] - off[qitem[d, i, QI_START]]
    return total


@njit(cache=True)
def settle(d, need, qs, vregs, mem16, mem32, f16tab, bases, caps, lanes, threads):
    """Execute the waiting work :func:`must_flush` asked for (``need``: 1 DSP d's, 2 every DSP's). With
    threads, DSP d's alone become everyone's once other DSPs wait too and PARALLEL_OPS instructions
    wait in all: running the others' early is always allowed (each DSP's own order is kept) and
    spreads the work over the threads."""
    off, qn, qitem = qs.off, qs.n, qs.item
    if need == 0:
        return
    if need == 1 and not (threads and _busy_dsps(qn) > 1 and waiting_ops(off, qn, qitem) >= PARALLEL_OPS):
        flush_dsp(d, qs, vregs, mem16, mem32, f16tab, bases, caps, lanes)
    else:
        flush(qs, vregs, mem16, mem32, f16tab, bases, caps, lanes, threads)


@njit(cache=True)
def accept_data(d, p, e, runs, qs, sregs, vregs, mem16, mem32, f16tab, bases, caps, lanes, threads):
    """Functional mode, a run :func:`try_skip` accepted: queue it with the AM ranges it touches and a
    copy of the SM its ``sldh`` read (the span of its SM classes; SM may be written before the run
    executes), and leave DSP d's scalar registers as the run does. A run with scalar stores runs at once,
    after DSP d's waiting work; a full queue or SM copy buffer first lets the waiting work run."""
    deltas, creg, cmem, lo, hi = runs.deltas, runs.creg, runs.cmem, runs.lo, runs.hi
    ops, off, fused, exits, exit_off = qs.ops, qs.off, qs.fused, qs.exits, qs.exit_off
    qn, qitem, qregs, qrange, qsm, qlen = qs.n, qs.item, qs.regs, qs.ranges, qs.sm, qs.sm_used
    bc_on, bc_val = qs.bc_on, qs.bc_val
    sm0 = bases[0] + d * caps[0]
    if deltas[p, B_SSTH] > 0:
        flush_dsp(d, qs, vregs, mem16, mem32, f16tab, bases, caps, lanes)
        run_plain(d, p, e, ops, off, fused, sregs[d], vregs, mem16, mem32, f16tab, bases, caps, lanes, bc_on, bc_val,
                  mem16, sm0)
        return
    slo = FAR
    shi = -FAR
    for j in range(MAX_CLASSES):
        if lo[p, j] <= hi[p, j] and cmem[p, j] == CLASS_SM:
            base = sregs[d, creg[p, j]]
            slo = min(slo, base + lo[p, j])
            shi = max(shi, base + hi[p, j])
    words = (shi - slo) >> 1 if slo < shi else 0
    if qn[d] == qitem.shape[1] or qlen[d] + words > qsm.shape[1]:
        settle(d, 1, qs, vregs, mem16, mem32, f16tab, bases, caps, lanes, threads)
    i = qn[d]
    at = qlen[d]
    qitem[d, i, QI_START] = p
    qitem[d, i, QI_END] = e
    qitem[d, i, QI_SM] = 2 * at - slo if words > 0 else 0     # SM byte a of the run is qsm[d, (this + a) >> 1]
    if words > 0:
        s0 = (sm0 + slo) >> 1
        qsm[d, at:at + words] = mem16[s0:s0 + words]       # a slice copies ~4x faster than a loop
    qlen[d] = at + words
    for r in range(sregs.shape[1]):
        qregs[d, i, r] = sregs[d, r]
    for j in range(MAX_CLASSES):
        qrange[d, i, j, QR_SPACE] = -1
        if lo[p, j] <= hi[p, j] and cmem[p, j] == CLASS_AM:
            base = sregs[d, creg[p, j]]
            qrange[d, i, j, QR_SPACE] = isa.SP_AM
            qrange[d, i, j, QR_START] = base + lo[p, j]
            qrange[d, i, j, QR_END] = base + hi[p, j]
    qn[d] = i + 1
    _scalar_exit(d, p, e, exits, exit_off, sregs[d], mem16, bases, caps)


@njit(cache=True)
def deferrable(mode, src_space, dst_space):
    """Whether a DMA's data move may wait in the queue of the DSP whose AM it writes (a broadcast: in
    every DSP's, if it reads GSM or DDR, which are the same for all)."""
    if dst_space != isa.SP_AM:
        return False
    return mode != isa.DMA_BROADCAST or src_space == isa.SP_GSM or src_space == isa.SP_DDR


@njit(cache=True)
def defer_dma(d, mode, src_space, sa, sext, sbase, dst_space, da, dext, dbase, rows, row_bytes, src_stride, dst_stride,
              qs, vregs, mem16, mem32, f16tab, bases, caps, lanes, threads):
    """Queue, for DSP d, the data move into its AM of a checked DMA that :func:`deferrable` allows, with
    the ranges it writes (d's AM) and reads (d's SM or AM, GSM or DDR)."""
    qn, qitem, qregs, qrange = qs.n, qs.item, qs.regs, qs.ranges
    if qn[d] == qitem.shape[1]:
        settle(d, 1, qs, vregs, mem16, mem32, f16tab, bases, caps, lanes, threads)
    i = qn[d]
    qitem[d, i, QI_START] = -1
    qitem[d, i, QI_END] = -1
    qitem[d, i, QI_SM] = 0
    g = qregs[d, i]
    g[Q_MODE] = mode
    g[Q_SRC] = sbase + sa
    g[Q_DST] = dbase + da
    g[Q_ROWS] = rows
    g[Q_ROW_BYTES] = row_bytes
    g[Q_SRC_STRIDE] = src_stride
    g[Q_DST_STRIDE] = dst_stride
    for j in range(MAX_CLASSES):
        qrange[d, i, j, QR_SPACE] = -1
    qrange[d, i, 0, QR_SPACE] = dst_space
    qrange[d, i, 0, QR_START] = da
    qrange[d, i, 0, QR_END] = da + dext
    qrange[d, i, 1, QR_SPACE] = src_space
    qrange[d, i, 1, QR_START] = sa
    qrange[d, i, 1, QR_END] = sa + sext
    qn[d] = i + 1


@njit(cache=True)
def _waits_on(d, space, a, b, qn, qrange):
    """Whether waiting work of DSP d touches [a, b) of ``space`` (SM and AM: d's own)."""
    for i in range(qn[d]):
        for j in range(MAX_CLASSES):
            if qrange[d, i, j, QR_SPACE] == space and qrange[d, i, j, QR_START] < b and a < qrange[d, i, j, QR_END]:
                return True
    return False


@njit(cache=True, inline="always")
def may_flush(p, code, touches):
    """Whether :func:`must_flush` can ask anything at bundle p: it touches what waiting work holds or
    issues a DMA (its own first tests; most bundles do neither, and a call passes dozens of array
    fields: a 1024^3 GEMM's loop calls must_flush 1,128 times instead of 11,208)."""
    if touches[p]:
        return True
    for u in range(code.shape[1]):
        if code[p, u, isa.F_OP] == isa.OP_DMA:
            return True
    return False


@njit(cache=True)
def must_flush(d, p, code, descs, desc_off, touches, sregs, qn, qrange):
    """Before DSP d runs bundle p by itself, whose waiting work must execute first: 0 none, 1 DSP d's,
    2 several DSPs'. DSP d's if the bundle touches its vector registers or AM or stores to SM, or has
    a DMA that does not wait (:func:`deferrable`) whose source overlaps what d's waiting work
    touches; several if such a DMA writes a range another DSP's waiting work touches (a broadcast
    into SM or AM, a transfer into GSM or DDR where a waiting DMA reads)."""
    need = 1 if touches[p] else 0
    for u in range(code.shape[1]):
        if code[p, u, isa.F_OP] != isa.OP_DMA:
            continue
        di = desc_off[d] + code[p, u, isa.F_R1]
        rows = descs[di, isa.D_ROWS]
        mode = descs[di, isa.D_MODE]
        if rows <= 0 or deferrable(mode, descs[di, isa.D_SRC], descs[di, isa.D_DST]):
            continue
        for side in range(2):
            space = descs[di, isa.D_SRC + side]
            stride = descs[di, isa.D_SSTR + side]
            a = sregs[d, code[p, u, isa.F_R2 + side]] + code[p, u, isa.F_IMM0 + side]
            b = a + (rows - 1) * stride + descs[di, isa.D_ROWB]
            if stride < 0:                       # not produced by the assembler; be safe
                a = -FAR
                b = FAR
            if side == 0:
                if _waits_on(d, space, a, b, qn, qrange):
                    need = max(need, 1)
                continue
            shared = mode == isa.DMA_BROADCAST or space == isa.SP_GSM or space == isa.SP_DDR
            for e in range(qn.shape[0]):
                if (e == d or shared) and _waits_on(e, space, a, b, qn, qrange):
                    if e != d:
                        return 2
                    need = max(need, 1)
    return need


# bundles that touch what waiting work holds: vector registers, AM, and SM stores (a waiting DMA may
# read SM); scalar loads read SM, which waiting work never writes
_TOUCH_OPS = isa.ops_where(touches_am=True)


def decode_ops(code: np.ndarray, scalar_registers: int | None = None, vector_registers: int | None = None
               ) -> tuple[np.ndarray, ...]:
    """The instructions of ``code`` as one list for :func:`run_plain`: rows (op, r0, r1, r2, imm0,
    fuse end, fuse record) in bundle then unit order, empty slots and nops left out; bundle q's rows
    are ``ops[off[q]:off[q + 1]]``. Also ``fused``, the records of the fused stretches
    (:func:`mtemu.fast.fused.mark_stretches`; register counts default to the largest register number used
    + 1), and ``sld``, the ``sldh`` in order as (destination, base register, offset) rows, bundle q's
    being ``sld[sld_off[q]:sld_off[q + 1]]`` (a compact table: the scalar side reads it for every run).
    Returns ``(ops, off, fused, sld, sld_off)``."""
    live = (code[:, :, isa.F_OP] != 0) & (code[:, :, isa.F_OP] != isa.OP_NOP)
    ops = np.zeros((int(live.sum()), N_OPCOLS), np.int64)
    ops[:, :O_FUSE_END] = code[live][:, [isa.F_OP, isa.F_R0, isa.F_R1, isa.F_R2, isa.F_IMM0]]
    used = int(ops[:, O_R0:O_IMM].max()) + 1 if ops.shape[0] else 1
    fused = mark_stretches(ops, max(scalar_registers or 0, used), max(vector_registers or 0, used), MIN_FUSED_TERMS)
    off = np.zeros(code.shape[0] + 1, np.int64)
    np.cumsum(live.sum(axis=1), out=off[1:])
    loads = code[:, :, isa.F_OP] == isa.OP_SLDH
    sld = np.ascontiguousarray(ops[ops[:, O_OP] == isa.OP_SLDH][:, [O_R0, O_R1, O_IMM]])
    sld_off = np.zeros(code.shape[0] + 1, np.int64)
    np.cumsum(loads.sum(axis=1), out=sld_off[1:])
    return ops, off, fused, sld, sld_off


N_DEFER_TABLES = 6          # arrays defer_tables returns


def defer_tables(code: np.ndarray, nregs: int, vector_registers: int, end: np.ndarray) -> tuple:
    """The static part of deferring, computed once per linked program (``end``: :func:`build_blocks`'):
    ``(touches, ops, off, fused, exits, exit_off)``: per PC whether a bundle touches what waiting work
    holds, :func:`decode_ops`'s instruction tables and :func:`exit_loads`' table of each run's last loads."""
    touches = np.isin(code[:, :, isa.F_OP], _TOUCH_OPS).any(axis=1)
    ops, off, fused, sld, sld_off = decode_ops(code, nregs, vector_registers)
    used = int(sld[:, SL_DST].max()) + 1 if sld.shape[0] else 1
    return (touches, ops, off, fused, *exit_loads(end, sld, sld_off, max(nregs, used)))


def defer_buffers(tables: tuple | None, dsps: int, nregs: int, vector_registers: int, sm_bytes: int) -> Queues:
    """The machine's :class:`Queues` for one run, from :func:`defer_tables` (None: deferring off,
    zero-length arrays): per DSP the queue of waiting work (count; per entry its run's PCs, or -1 for a
    DMA, and where its SM copy sits; a copy of the scalar registers, or what a DMA moves; per class
    (space, start, end) of what it touches), the buffer of its runs' SM copies (SM_COPY_BYTES in all,
    but always room for one whole SM) and how much of it is used; per DSP the broadcast
    scratch of :func:`run_plain`."""
    if tables is None:
        z = np.zeros(0, np.int64)
        return Queues(np.zeros(0, np.bool_), z, np.zeros((0, QUEUE, 3), np.int64),
                      np.zeros((0, QUEUE, nregs), np.int64), np.zeros((0, QUEUE, MAX_CLASSES, 3), np.int64),
                      np.zeros((0, 0), np.uint16), z, np.zeros((0, N_OPCOLS), np.int64), z, np.zeros(1, np.int64),
                      np.zeros((0, 4), np.int64), np.zeros((0, 3), np.int64),
                      np.zeros((0, vector_registers), np.bool_), np.zeros((0, vector_registers), np.float32))
    touches, ops, off, fused, exits, exit_off = tables
    room = max(sm_bytes // 2, SM_COPY_BYTES // (2 * dsps))     # one run always fits
    return Queues(touches, np.zeros(dsps, np.int64), np.zeros((dsps, QUEUE, 3), np.int64),
                  np.zeros((dsps, QUEUE, nregs), np.int64), np.zeros((dsps, QUEUE, MAX_CLASSES, 3), np.int64),
                  np.zeros((dsps, room), np.uint16), np.zeros(dsps, np.int64), ops, off, fused, exits, exit_off,
                  np.zeros((dsps, vector_registers), np.bool_), np.zeros((dsps, vector_registers), np.float32))


# ------------------------------------------------------------------------------------------
# pure-Python reference (tests)
# ------------------------------------------------------------------------------------------
def run_plain_reference(d: int, p: int, e: int, code: np.ndarray, sr: np.ndarray, vregs: np.ndarray,
                        mem16: np.ndarray, f16tab: np.ndarray, bases: np.ndarray, caps: np.ndarray,
                        lanes: int) -> None:
    """:func:`run_plain` written plainly: bundles [p, e) of ``code`` as :mod:`mtemu.semantics` states them,
    on DSP d's scalar registers ``sr`` and its vector registers, SM and AM in the machine's arrays
    (``f16tab``, the machine's FP16 table, is not needed: semantics widens exactly)."""
    u8 = mem16.view(np.uint8)
    sm0 = int(bases[0]) + d * int(caps[0])
    am0 = int(bases[1]) + d * int(caps[1])
    own = semantics.DspState(sr, vregs[d][:, :lanes], u8[sm0:sm0 + int(caps[0])], u8[am0:am0 + int(caps[1])])
    state = semantics.ClusterState([own], np.zeros(0, np.uint8), np.zeros(0, np.uint8))
    for q in range(p, e):
        semantics.step(state, 0, code[q])

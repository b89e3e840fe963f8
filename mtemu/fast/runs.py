"""Straight-line runs: advance a DSP over a run of data-only bundles in one step.

In timing mode (no data) a bundle whose instructions are all *plain* -- ``nop``, ``vfma``,
``svbcast(w)``, ``vexp``, ``vlog``, ``vmax`` and the SM/AM loads and stores -- changes nothing but
counters: it takes one cycle, adds to its units' busy counts (and ``vfma`` or the stall it pads
for), and checks the addresses it would touch against the memory. No scalar register changes
(loads write registers only in functional mode), so every address in a run of plain bundles is
``s[r] + imm`` with ``s[r]`` fixed for the whole run. The counters of the run from any entry
point to its end are therefore a suffix sum, and its addresses are in range and aligned iff, per
(base register, memory, alignment) class, the smallest and largest offsets are.

:func:`build_blocks` tabulates, for every PC, where its run ends, the counter deltas from it to
the end and the offset range per class (at most :data:`MAX_CLASSES` per run; a run with more is
cut). The machine (:mod:`mtemu.machine`) uses them whenever it runs without a trace: at a PC
starting at least :data:`MIN_BUNDLES` plain bundles it checks the ranges against the current
registers and the cycle limit and, if they pass, adds the deltas and jumps to the end. If any
check fails it runs the bundles one by one, which reports the exact error. So the counters,
cycles and errors are those of the bundle-by-bundle run by construction. In functional mode the
run's data effects are then executed by :func:`mtemu.fast.queues.run_plain` (now, or deferred in
the DSP's queue), where loads do write registers: a run there also ends before an access based on a
register an ``sldh`` of the same run loaded, and ``vexp``/``vlog`` are not plain.
``tests/test_blocks.py`` checks the tables against :func:`build_blocks_reference` and whole kernels'
counters and data against runs with ``fast_forward=False``.

Numba caches the machine's loops (``machine._run_timing``, ``_run_functional``) keyed on machine.py
alone, with the functions and constants they use from here compiled in; :mod:`mtemu.jit` therefore
gives every state of the jitted sources (this module, queues.py, fused.py, dma.py, machine.py, ...) its
own cache folder.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .. import isa

MAX_CLASSES = 8             # (register, memory, alignment) classes per run
MIN_BUNDLES = 8             # shorter runs go bundle by bundle (the checks would cost more)
# columns of the per-PC counter deltas
B_BUNDLES, B_VFMA, B_LATENCY, B_BRANCH = 0, 1, 2, 3
B_BUSY0 = 4                 # + unit
B_SSTH = B_BUSY0 + isa.N_UNITS   # scalar stores (functional mode runs them at once: queues.accept_data)
N_BCOLS = B_SSTH + 1
# class memories (index into the machine's caps): SM or AM
CLASS_SM, CLASS_AM = 0, 1
FAR = np.int64(1) << 50     # empty range sentinel: lo = FAR, hi = -FAR



class RunTables(NamedTuple):
    """:func:`build_blocks`' tables, as the machine's loop reads them (zero-length: no run is taken in one
    step): per PC the end of its run and the counter deltas to it (columns ``B_*``); per PC and class its
    base register, memory (``CLASS_*``), alignment, offset range [lo, hi) and misaligned offset bits."""

    end: np.ndarray
    deltas: np.ndarray
    creg: np.ndarray
    cmem: np.ndarray
    calign: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    mis: np.ndarray


PLAIN_OPS = isa.op_table(is_plain=True)
PLAIN_OPS[0] = True         # an empty slot
# functional mode: exp and log stay with the bundle-by-bundle path (one libm call per lane there;
# a vectorised math library here could round differently), and so do the FP64 ops (run_plain and the
# queues hold FP32 registers only)
PLAIN_OPS_FUNCTIONAL = PLAIN_OPS & ~isa.op_table(libm=True) & ~isa.op_table(fp64=True)


@njit(cache=True)
def _access(op, lanes):
    """(memory class, bytes, alignment) of a plain memory op; memory -1 if it touches none."""
    if op == isa.OP_SLDH or op == isa.OP_SSTH:
        return CLASS_SM, 2, 2
    if op == isa.OP_VLDH or op == isa.OP_VSTH:
        return CLASS_AM, 2 * lanes, 2
    if op == isa.OP_VLDW or op == isa.OP_VSTW:
        return CLASS_AM, 4 * lanes, 4
    if op == isa.OP_SLDD or op == isa.OP_SSTD:
        return CLASS_SM, 8, 8
    if op == isa.OP_VLDD or op == isa.OP_VSTD or op == isa.OP_VLDDG or op == isa.OP_VLDDM4:
        return CLASS_AM, 8 * lanes, 8       # (in timing mode only, where lanes is 1 for every type)
    return -1, 0, 0


@njit(cache=True)
def _bundle_classes(code, p, lanes, creg, cmem, calign, ncls):
    """How many classes bundle ``p`` would add to the ``ncls`` in (creg, cmem, calign)."""
    extra = 0
    for u in range(code.shape[1]):
        mem, _size, align = _access(code[p, u, isa.F_OP], lanes)
        if mem < 0:
            continue
        r = code[p, u, isa.F_R1]
        seen = False
        for j in range(ncls + extra):
            if creg[j] == r and cmem[j] == mem and calign[j] == align:
                seen = True
                break
        if not seen:
            creg[ncls + extra] = r
            cmem[ncls + extra] = mem
            calign[ncls + extra] = align
            extra += 1
    return extra


@njit(cache=True)
def _is_plain(code, p, plain, functional):
    """Bundle p may join a run: every instruction plain, and (functional mode) no access based on a
    register an earlier unit of the same bundle loads with ``sldh``."""
    loaded = -1
    for u in range(code.shape[1]):
        op = code[p, u, isa.F_OP]
        if not plain[op]:
            return False
        if functional:
            mem, _size, _align = _access(op, 1)
            if mem >= 0 and code[p, u, isa.F_R1] == loaded:
                return False
            if op == isa.OP_SLDH:
                loaded = code[p, u, isa.F_R0]
    return True


@njit(cache=True)
def _build(code, seg_end, plain, lanes, functional, end, deltas, creg, cmem, calign, lo, hi, mis):
    n = code.shape[0]
    nunits = code.shape[1]
    # forward: cut the code into runs of plain bundles with at most MAX_CLASSES classes each; in
    # functional mode also before an access based on a register an earlier bundle of the run
    # loaded (sldh writes registers there), so every base is the value it had at the run's entry
    tr = np.zeros(MAX_CLASSES + nunits, np.int64)
    tm = np.zeros(MAX_CLASSES + nunits, np.int64)
    ta = np.zeros(MAX_CLASSES + nunits, np.int64)
    nregs = 1
    for p in range(n):
        for u in range(nunits):
            for f in range(1, 5):
                if code[p, u, f] + 1 > nregs:
                    nregs = code[p, u, f] + 1
    loaded = np.zeros(nregs, np.bool_)
    p = 0
    while p < n:
        if not _is_plain(code, p, plain, functional):
            end[p] = p
            p += 1
            continue
        s = p
        ncls = 0
        loaded[:] = False
        while p < n and p < seg_end[s] and _is_plain(code, p, plain, functional):
            clash = False
            for u in range(nunits):
                mem, _size, _align = _access(code[p, u, isa.F_OP], 1)
                if mem >= 0 and loaded[code[p, u, isa.F_R1]]:
                    clash = True
            if clash:
                break
            for j in range(ncls):
                tr[j] = creg[s, j]
                tm[j] = cmem[s, j]
                ta[j] = calign[s, j]
            extra = _bundle_classes(code, p, lanes, tr, tm, ta, ncls)
            if ncls + extra > MAX_CLASSES:
                break
            for j in range(ncls, ncls + extra):
                creg[s, j] = tr[j]
                cmem[s, j] = tm[j]
                calign[s, j] = ta[j]
            ncls += extra
            if functional:
                for u in range(nunits):
                    if code[p, u, isa.F_OP] == isa.OP_SLDH:
                        loaded[code[p, u, isa.F_R0]] = True
            p += 1
        for q in range(s, p):
            end[q] = p
            for j in range(MAX_CLASSES):
                creg[q, j] = creg[s, j]
                cmem[q, j] = cmem[s, j]
                calign[q, j] = calign[s, j]
    # backward: suffix sums of the counters and suffix ranges of every class
    for p in range(n - 1, -1, -1):
        e = end[p]
        if e == p:
            continue
        nxt = p + 1 < e
        for c in range(deltas.shape[1]):
            deltas[p, c] = deltas[p + 1, c] if nxt else 0
        for j in range(MAX_CLASSES):
            lo[p, j] = lo[p + 1, j] if nxt else FAR
            hi[p, j] = hi[p + 1, j] if nxt else -FAR
            mis[p, j] = mis[p + 1, j] if nxt else 0
        deltas[p, B_BUNDLES] += 1
        useful = False
        reason = isa.ST_LATENCY
        found_nop = False
        for u in range(nunits):
            op = code[p, u, isa.F_OP]
            if op == 0:
                continue
            if op == isa.OP_NOP:
                if not found_nop:
                    reason = code[p, u, isa.F_IMM0]
                    found_nop = True
                continue
            useful = True
            deltas[p, B_BUSY0 + u] += 1
            if op == isa.OP_VFMA or op == isa.OP_VFMAD:
                deltas[p, B_VFMA] += 1
            elif op == isa.OP_SSTH:
                deltas[p, B_SSTH] += 1
            mem, size, align = _access(op, lanes)
            if mem < 0:
                continue
            r = code[p, u, isa.F_R1]
            imm = code[p, u, isa.F_IMM0]
            for j in range(MAX_CLASSES):
                if creg[p, j] == r and cmem[p, j] == mem and calign[p, j] == align:
                    if imm < lo[p, j]:
                        lo[p, j] = imm
                    if imm + size > hi[p, j]:
                        hi[p, j] = imm + size
                    mis[p, j] |= imm & (align - 1)
                    break
        if not useful:
            if reason == isa.ST_BRANCH:
                deltas[p, B_BRANCH] += 1
            else:
                deltas[p, B_LATENCY] += 1


def build_blocks(code: np.ndarray, seg_end: np.ndarray, lanes: int, functional: bool = False
                 ) -> tuple[np.ndarray, ...]:
    """Tables of the plain runs of linked ``code`` (bundles, units, fields).

    ``seg_end[p]`` is the end of the program holding PC p (runs never cross programs); ``lanes``
    sizes vector accesses as the machine does; ``functional`` applies that mode's rules (no
    ``vexp``/``vlog``; no access based on a register loaded earlier in the run).

    Returns ``(end, deltas, creg, cmem, calign, lo, hi, mis)``: per PC the end of its run
    (``end[p] == p`` for a bundle that is not plain), the counter deltas from p to the end
    (columns ``B_*``), and per class j its base register, memory (``CLASS_SM``/``CLASS_AM``), alignment,
    smallest offset, largest offset + size and the OR of the offsets' misaligned bits over
    [p, end). Unused classes have ``lo > hi``.
    """
    n = code.shape[0]
    end = np.zeros(n, np.int64)
    deltas = np.zeros((n + 1, N_BCOLS), np.int64)
    creg = np.full((n, MAX_CLASSES), -1, np.int64)
    cmem = np.full((n, MAX_CLASSES), -1, np.int64)
    calign = np.zeros((n, MAX_CLASSES), np.int64)
    lo = np.full((n + 1, MAX_CLASSES), FAR, np.int64)
    hi = np.full((n + 1, MAX_CLASSES), -FAR, np.int64)
    mis = np.zeros((n + 1, MAX_CLASSES), np.int64)
    if n:
        _build(np.ascontiguousarray(code), np.ascontiguousarray(seg_end, dtype=np.int64),
               PLAIN_OPS_FUNCTIONAL if functional else PLAIN_OPS, int(lanes), bool(functional),
               end, deltas, creg, cmem, calign, lo, hi, mis)
    return end, deltas[:n], creg, cmem, calign, lo[:n], hi[:n], mis[:n]


def empty_blocks() -> tuple[np.ndarray, ...]:
    """Zero-length tables: the machine runs bundle by bundle (functional mode, tracing)."""
    z1 = np.zeros(0, np.int64)
    z2 = np.zeros((0, MAX_CLASSES), np.int64)
    return z1, np.zeros((0, N_BCOLS), np.int64), z2, z2, z2, z2, z2, z2


@njit(cache=True)
def try_skip(d, p, t, max_cycles, sregs, caps, stats, s_bundles, s_vfma, s_latency, s_branch, s_busy0, runs):
    """Advance DSP d over the plain run at PC p (``runs``: :class:`RunTables`) if it is long enough, its
    addresses are in range and aligned and it ends within the cycle limit: add its counters to ``stats``
    and return its end PC. Otherwise return -1 and touch nothing (the caller runs the bundles one by one)."""
    end, deltas, creg, cmem, calign, lo, hi, mis = (runs.end, runs.deltas, runs.creg, runs.cmem, runs.calign,
                                                   runs.lo, runs.hi, runs.mis)
    if p >= end.shape[0]:
        return -1
    e = end[p]
    nb = e - p
    if nb < MIN_BUNDLES or t + nb - 1 > max_cycles:
        return -1
    for j in range(MAX_CLASSES):
        if lo[p, j] > hi[p, j]:
            continue
        base = sregs[d, creg[p, j]]
        # compared without forming base + offset, which wraps for a register near 2**63 (offsets
        # are bounded by MAX_ADDRESS_IMM, so -lo and caps - hi cannot)
        if base < -lo[p, j] or base > caps[cmem[p, j]] - hi[p, j]:
            return -1
        if ((base & (calign[p, j] - 1)) | mis[p, j]) != 0:
            return -1
    stats[d, s_bundles] += deltas[p, B_BUNDLES]
    stats[d, s_vfma] += deltas[p, B_VFMA]
    stats[d, s_latency] += deltas[p, B_LATENCY]
    stats[d, s_branch] += deltas[p, B_BRANCH]
    for u in range(isa.N_UNITS):
        stats[d, s_busy0 + u] += deltas[p, B_BUSY0 + u]
    return e


# ------------------------------------------------------------------------------------------
# pure-Python reference (tests)
# ------------------------------------------------------------------------------------------
def _accesses(code: np.ndarray, p: int, lanes: int) -> list[tuple[int, int, int, int, int]]:
    """(base register, memory class, alignment, offset, bytes) of bundle p's SM/AM accesses, in unit order."""
    out = []
    for u in range(code.shape[1]):
        spec = isa.OP_BY_CODE.get(int(code[p, u, isa.F_OP]))
        if spec is None or spec.space not in (isa.SP_SM, isa.SP_AM):
            continue
        size = spec.access_bytes * (lanes if spec.vector else 1)
        out.append((int(code[p, u, isa.F_R1]), CLASS_SM if spec.space == isa.SP_SM else CLASS_AM, spec.access_bytes,
                    int(code[p, u, isa.F_IMM0]), size))
    return out


_SM_AM_OPS = set(isa.ops_where(lambda spec: spec.space in (isa.SP_SM, isa.SP_AM)).tolist())


def build_blocks_reference(code: np.ndarray, seg_end: np.ndarray, lanes: int, functional: bool = False
                           ) -> tuple[np.ndarray, ...]:
    """:func:`build_blocks` written plainly: runs, then each PC's deltas and ranges by direct sums."""
    n = code.shape[0]
    table = PLAIN_OPS_FUNCTIONAL if functional else PLAIN_OPS

    def is_plain(p):
        if not all(table[int(op)] for op in code[p, :, isa.F_OP]):
            return False
        if functional:      # an sldh, then an access based on the register it loads
            units = [(int(code[p, u, isa.F_OP]), int(code[p, u, isa.F_R0]), int(code[p, u, isa.F_R1]))
                     for u in range(code.shape[1])]
            for i, (op, r0, _) in enumerate(units):
                if op == isa.OP_SLDH and any(o in _SM_AM_OPS and base == r0 for o, _, base in units[i + 1:]):
                    return False
        return True

    plain = [is_plain(p) for p in range(n)]

    def accesses(p):
        return _accesses(code, p, lanes)

    end = np.arange(n, dtype=np.int64)
    classes: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    runs = []
    p = 0
    while p < n:
        if not plain[p]:
            p += 1
            continue
        s, cls, loaded = p, [], set()
        while p < n and p < seg_end[s] and plain[p]:
            if any(k[0] in loaded for k in accesses(p)):
                break
            new = [k[:3] for k in accesses(p)]
            merged = list(cls)
            for k in new:
                if k not in merged:
                    merged.append(k)
            if len(merged) > MAX_CLASSES:
                break
            cls = merged
            if functional:
                loaded |= {int(code[p, u, isa.F_R0]) for u in range(code.shape[1])
                           if code[p, u, isa.F_OP] == isa.OP_SLDH}
            p += 1
        runs.append((s, p))
        for q in range(s, p):
            end[q] = p
            classes[q] = cls
    # each bundle's own counters and per-class ranges, then suffix sums / minima / maxima per run
    own = np.zeros((n, N_BCOLS), np.int64)
    own_lo = np.full((n, MAX_CLASSES), FAR, np.int64)
    own_hi = np.full((n, MAX_CLASSES), -FAR, np.int64)
    own_mis = np.zeros((n, MAX_CLASSES), np.int64)
    creg = np.full((n, MAX_CLASSES), -1, np.int64)
    cmem = np.full((n, MAX_CLASSES), -1, np.int64)
    calign = np.zeros((n, MAX_CLASSES), np.int64)
    for p in range(n):
        if end[p] == p:
            continue
        for j, (r, mem, align) in enumerate(classes[p]):
            creg[p, j], cmem[p, j], calign[p, j] = r, mem, align
        ops = [int(op) for op in code[p, :, isa.F_OP]]
        own[p, B_BUNDLES] = 1
        specs = [isa.OP_BY_CODE.get(op) for op in ops]
        own[p, B_VFMA] = sum(1 for spec in specs if spec is not None and spec.is_mac)
        own[p, B_SSTH] = ops.count(isa.OP_SSTH)
        busy = [spec is not None and spec.busy for spec in specs]
        for u in range(len(ops)):
            own[p, B_BUSY0 + u] = int(busy[u])
        if not any(busy):
            nops = [int(code[p, u, isa.F_IMM0]) for u, op in enumerate(ops) if op == isa.OP_NOP]
            reason = nops[0] if nops else isa.ST_LATENCY
            own[p, B_BRANCH if reason == isa.ST_BRANCH else B_LATENCY] = 1
        for r, mem, align, imm, size in accesses(p):
            j = classes[p].index((r, mem, align))
            own_lo[p, j] = min(own_lo[p, j], imm)
            own_hi[p, j] = max(own_hi[p, j], imm + size)
            own_mis[p, j] |= imm & (align - 1)
    deltas = np.zeros((n, N_BCOLS), np.int64)
    lo = np.full((n, MAX_CLASSES), FAR, np.int64)
    hi = np.full((n, MAX_CLASSES), -FAR, np.int64)
    mis = np.zeros((n, MAX_CLASSES), np.int64)
    for a, e in runs:
        deltas[a:e] = np.cumsum(own[a:e][::-1], axis=0)[::-1]
        lo[a:e] = np.minimum.accumulate(own_lo[a:e][::-1], axis=0)[::-1]
        hi[a:e] = np.maximum.accumulate(own_hi[a:e][::-1], axis=0)[::-1]
        mis[a:e] = np.bitwise_or.accumulate(own_mis[a:e][::-1], axis=0)[::-1]
    return end, deltas, creg, cmem, calign, lo, hi, mis

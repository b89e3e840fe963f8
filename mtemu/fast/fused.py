"""Fused stretches: the multiply-accumulate core of a straight-line run, compiled once and executed blocked.

Most of a GEMM micro-kernel's run (:mod:`mtemu.fast.runs`) is a *stretch* of ``sldh``, ``svbcast``,
``vldh`` and ``vfma`` in which every ``vfma`` adds (a broadcast FP16 scalar) x (an FP16 vector loaded
in the stretch) to an accumulator that nothing else in the stretch reads or writes once it is one (it
may start as a broadcast or a load of the stretch), and every address is based on a register the
stretch does not load. Executed instruction by instruction, each ``vfma``
reads and writes all its lanes in memory. :func:`mark_stretches` finds the stretches of a decoded
instruction list and compiles each into a record of what is static (which loads, which broadcast
sources, which terms per accumulator); :func:`run_fused` then

1. reads each broadcast value (from SM, or the copy of SM taken when the run was queued, or a
   register as it was on entry),
2. adds the terms of each *group* of six or four accumulators that read the same rows (a GEMM's rows of
   C over one row of B per term) over all those rows at once, 32 or 48 lanes at a time with twelve
   accumulator vectors held in host registers (:mod:`mtemu.fast.simd`; a register-blocked GEMM
   micro-kernel), each row read straight from AM and widened once for the group;
3. adds the remaining terms :data:`FUSE_DEPTH` at a time per lane, in program order, over
   rounds in which every accumulator takes its next terms (four or two accumulators that share
   loaded rows, a GEMM's rows of C, in one pass), following a schedule fixed when the record is
   compiled (:func:`_schedule`). A pass of four reads its rows straight from AM and widens each once
   for the four; the other passes read rows widened once, just before their first use, into a slot
   freed by a row no longer read (AM does not change inside a stretch: it has no stores), so the
   rows in use stay in the L1 cache (a 1024^3 GEMM's stretch of 512 rows in rounds alone would use 16
   slots; its groups leave it 4, for the rows its registers hold at the end and its last terms),
4. leaves the scalar and vector registers as the instructions would.

Every sum is rounded to FP32 as before (products of FP16 values are exact in FP32, see
:data:`~mtemu.fp16.add_fp16_product`); accumulators are independent of each other and lanes of each
other, so the order of the work changes no bit. ``tests/test_fused.py`` compares it with the
instruction-by-instruction reference on random stretches.

Hot loops index 2-D arrays, and flat memory with an unsigned index: array views cost reference
counting per use, and a signed flat index (which may wrap around) keeps LLVM from vectorising.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import isa
from ..fp16 import add_fp16_product, widen_f16
from .simd import LANES_X16, VECTOR_FP16, fma_x16, load_f16x16, load_f32x16, store_f32x16

MIN_FUSED_TERMS = 16        # shorter stretches run instruction by instruction
FUSE_DEPTH = 8              # terms added per pass over an accumulator's lanes (_add_terms8)
# columns of the decoded instruction list (mtemu.fast.queues.decode_ops)
O_OP, O_R0, O_R1, O_R2, O_IMM = 0, 1, 2, 3, 4
O_FUSE_END = 5              # a fused stretch starts at this op and ends before op O_FUSE_END (0: none)
O_FUSE_AT = 6               # where its record starts in the `fused` array
N_OPCOLS = 7
# A stretch record in the flat int64 `fused` array: a header of counts, then its sections
#   loads    (base register, imm) per vldh, in order                  -> rows of widened lanes
#            (base register -1: only affine group steps read the row, which address it themselves)
#   bcasts   (source, a, b, c) per svbcast, in order: source 0 (_BSRC_SM) = SM[s[a] + b], which the
#            stretch's sldh number c loaded; 1 (_BSRC_REG) = scalar register a as it was on entry;
#            2 (_BSRC_SKIP): as 0, but only affine group steps read it, which address it themselves
#   scalars  (register, base register, imm, sldh number): registers the stretch's sldh leave
#   accs     (vector register, terms, start kind, number) in register order: the accumulator starts from
#            its value on entry (kind 0), or from a broadcast (_K_BCAST) or loaded row (_K_LOAD) the
#            stretch put in it before its first term (a micro-kernel zeroing C by broadcasting s0)
#   terms    (bcast, load) numbers, grouped by accumulator as `accs`, in program order within each
#   finals   (vector register, kind, number): what a broadcast or loaded register holds at the end
#   steps    (kind, then N_STEP - 1 fields) per step of the static schedule (_schedule), which widens
#            each row a step reads from a slot just before its first use and frees the slot after its last,
#            so the rows in use stay in the host's L1 cache; from then on the load numbers of accs, finals
#            and terms are slots, except the terms of STEP_QUAD8 and STEP_GROUP steps, which read their rows
#            straight from AM
#   address blocks (N_AUX each) of the STEP_GROUP steps, in step order (below)
H_LOADS, H_BCASTS, H_SCALARS, H_ACCS, H_TERMS, H_FINALS, H_SLDH, H_STEPS, H_SLOTS = range(9)
N_HEADER = 9
_K_NONE, _K_BCAST, _K_LOAD, _K_ACC = 0, 1, 2, 3
# schedule steps: widen load a into slot b | terms of accumulator(s) (at record-relative offsets) |
# set the accumulators' start values
#   STEP_WIDEN (load, slot)          STEP_PAIR8 (r, q, terms of r, of q)   STEP_ONE8 (r, terms)
#   STEP_TAIL (r, first, end term)   STEP_INIT ()                          STEP_QUAD8 (r0..r3, terms of r0..r3)
#   STEP_GROUP (n, terms, r0..r5, t0..t5, aux): n (six or four) accumulators whose next `terms` terms (at
#   record-relative offsets t0..) read the same rows, all added with the accumulators held in registers
STEP_WIDEN, STEP_PAIR8, STEP_ONE8, STEP_TAIL, STEP_INIT, STEP_QUAD8, STEP_GROUP = 0, 1, 2, 3, 4, 5, 6
GROUP_MAX = 6               # accumulators in one group step (12 host vector registers of 16 lanes)
G_N, G_TERMS, G_REGS = 1, 2, 3          # fields of an STEP_GROUP step; its term offsets follow its registers
G_TERMS_AT = G_REGS + GROUP_MAX
G_AUX = G_TERMS_AT + GROUP_MAX          # record-relative offset of the step's address block (below)
N_STEP = G_AUX + 1
# A group step's address block: (affine, base register, first offset, stride) for its rows, then the
# same for each accumulator's broadcasts (SM addresses): where term t's address is base + first +
# stride * t, the step computes it instead of reading the per-load or per-broadcast tables, which are
# then not filled for what only groups read (a load's base register -1, a broadcast's source _BSRC_SKIP)
N_AFFINE = 4
N_AUX = N_AFFINE * (1 + GROUP_MAX)
_BSRC_SM, _BSRC_REG, _BSRC_SKIP = 0, 1, 2        # broadcast sources
MIN_GROUP_TERMS = 2 * FUSE_DEPTH        # fewer shared terms are left to the rounds


@njit(cache=True)
def _scan(ops, i, vkind, sload):
    """End and term count of the longest stretch starting at op i."""
    n = ops.shape[0]
    vkind[:] = _K_NONE
    sload[:] = False
    terms = 0
    j = i
    while j < n:
        op = ops[j, O_OP]
        r0 = ops[j, O_R0]
        r1 = ops[j, O_R1]
        if op == isa.OP_SLDH:
            if sload[r1]:                       # an address from a register the stretch loaded
                break
            sload[r0] = True
        elif op == isa.OP_SVBCAST:
            if vkind[r0] == _K_ACC:
                break
            vkind[r0] = _K_BCAST
        elif op == isa.OP_VLDH:
            if vkind[r0] == _K_ACC or sload[r1]:
                break
            vkind[r0] = _K_LOAD
        elif op == isa.OP_VFMA:
            k1 = vkind[r1]
            k2 = vkind[ops[j, O_R2]]
            if not ((k1 == _K_BCAST and k2 == _K_LOAD) or (k1 == _K_LOAD and k2 == _K_BCAST)):
                break
            vkind[r0] = _K_ACC      # from its entry value, or the broadcast or row put in it here
            terms += 1
        else:
            break
        j += 1
    return j, terms


@njit(cache=True)
def _compile(ops, i, j, nsregs, nvregs, out, at):
    """Write the record of stretch [i, j) at ``out[at:]``; return where it ends."""
    n = j - i
    vkind = np.zeros(nvregs, np.int64)
    vnum = np.zeros(nvregs, np.int64)
    sload = np.full(nsregs, -1, np.int64)       # the op that last loaded a scalar register
    snum = np.zeros(nsregs, np.int64)           # and its sldh number
    init = np.zeros((nvregs, 2), np.int64)     # per accumulator: start kind, number
    tacc = np.empty(n, np.int64)
    tb = np.empty(n, np.int64)
    tl = np.empty(n, np.int64)
    loads = np.empty((n, 2), np.int64)
    bcasts = np.empty((n, 4), np.int64)
    nl = 0
    nb = 0
    nt = 0
    nsl = 0
    for q in range(i, j):
        op = ops[q, O_OP]
        r0 = ops[q, O_R0]
        r1 = ops[q, O_R1]
        if op == isa.OP_SLDH:
            sload[r0] = q
            snum[r0] = nsl
            nsl += 1
        elif op == isa.OP_SVBCAST:
            s = sload[r1]
            if s >= 0:
                bcasts[nb, 0] = 0
                bcasts[nb, 1] = ops[s, O_R1]
                bcasts[nb, 2] = ops[s, O_IMM]
                bcasts[nb, 3] = snum[r1]
            else:
                bcasts[nb, 0] = 1
                bcasts[nb, 1] = r1
                bcasts[nb, 2] = 0
                bcasts[nb, 3] = 0
            vkind[r0] = _K_BCAST
            vnum[r0] = nb
            nb += 1
        elif op == isa.OP_VLDH:
            loads[nl, 0] = r1
            loads[nl, 1] = ops[q, O_IMM]
            vkind[r0] = _K_LOAD
            vnum[r0] = nl
            nl += 1
        else:
            r2 = ops[q, O_R2]
            tacc[nt] = r0
            if vkind[r1] == _K_BCAST:
                tb[nt] = vnum[r1]
                tl[nt] = vnum[r2]
            else:
                tb[nt] = vnum[r2]
                tl[nt] = vnum[r1]
            if vkind[r0] == _K_BCAST or vkind[r0] == _K_LOAD:
                init[r0, 0] = vkind[r0]
                init[r0, 1] = vnum[r0]
            vkind[r0] = _K_ACC
            nt += 1
    p = at + N_HEADER
    for q in range(nl):
        out[p] = loads[q, 0]
        out[p + 1] = loads[q, 1]
        p += 2
    for q in range(nb):
        for f in range(4):
            out[p + f] = bcasts[q, f]
        p += 4
    ns = 0
    for r in range(nsregs):
        s = sload[r]
        if s >= 0:
            out[p] = r
            out[p + 1] = ops[s, O_R1]
            out[p + 2] = ops[s, O_IMM]
            out[p + 3] = snum[r]
            p += 4
            ns += 1
    count = np.zeros(nvregs, np.int64)
    for t in range(nt):
        count[tacc[t]] += 1
    na = 0
    for r in range(nvregs):
        if count[r] > 0:
            out[p] = r
            out[p + 1] = count[r]
            out[p + 2] = init[r, 0]
            out[p + 3] = init[r, 1]
            p += 4
            na += 1
    for t in np.argsort(tacc[:nt], kind="mergesort"):     # stable: program order per accumulator
        out[p] = tb[t]
        out[p + 1] = tl[t]
        p += 2
    nf = 0
    for r in range(nvregs):
        if vkind[r] == _K_BCAST or vkind[r] == _K_LOAD:
            out[p] = r
            out[p + 1] = vkind[r]
            out[p + 2] = vnum[r]
            p += 3
            nf += 1
    out[at + H_LOADS] = nl
    out[at + H_BCASTS] = nb
    out[at + H_SCALARS] = ns
    out[at + H_ACCS] = na
    out[at + H_TERMS] = nt
    out[at + H_FINALS] = nf
    out[at + H_SLDH] = nsl
    return _schedule(out, at, at + N_HEADER + 2 * nl + 4 * nb + 4 * ns, na, nl, nt, nf, p)


@njit(cache=True)
def _schedule(out, at, pa, na, nl, nt, nf, p):
    """Append the steps of the record at ``out[at]`` (accumulators at ``pa``, ``nt`` terms, ``nf`` finals
    ending at ``p``) and renumber its rows to slots; return where it ends.

    The compute steps are rounds in which every accumulator takes its next FUSE_DEPTH terms, one
    accumulator whose next terms use the same rows as three later ones' (or one later one's) being
    done together with them (a GEMM's rows of C share rows of B). A group of four reads its rows
    straight from AM; for the other steps each row is widened just before the first step that reads
    it, into a slot freed by a row no later step reads (a 1024^3 GEMM's stretch of 512 rows needs 16
    slots, 12 KB). Every accumulator's terms stay in program order, so the sums are those of the
    program."""
    pt = pa + 4 * na
    pf = pt + 2 * nt
    start = np.empty(na, np.int64)
    stop = np.empty(na, np.int64)
    j = pt
    for q in range(na):
        start[q] = j
        j += 2 * out[pa + 4 * q + 1]
        stop[q] = j
    comp = np.zeros((nt + na + 1, N_STEP), np.int64)    # (every step takes at least one term)
    # first the groups: accumulators whose first terms read the same rows (a GEMM's rows of C sharing
    # rows of B), each group's terms added over all its rows with its accumulators held in registers
    nc = 0
    taken = np.zeros(na, np.bool_)
    like = np.empty(na, np.int64)
    for q in range(na):
        if taken[q] or stop[q] - start[q] < 2 * MIN_GROUP_TERMS:
            continue
        m = 1
        like[0] = q
        for o in range(q + 1, na):
            shared = min(stop[q] - start[q], stop[o] - start[o]) >> 1
            if not taken[o] and shared >= MIN_GROUP_TERMS and _same_loads(out, start[q], start[o], shared):
                like[m] = o
                m += 1
        n = GROUP_MAX if m >= GROUP_MAX and m != 8 else 4 if m >= 4 else 0
        if n == 0:
            continue
        terms = (stop[q] - start[q]) >> 1
        for f in range(n):
            terms = min(terms, (stop[like[f]] - start[like[f]]) >> 1)
        comp[nc, 0] = STEP_GROUP
        comp[nc, G_N] = n
        comp[nc, G_TERMS] = terms
        for f in range(n):
            o = like[f]
            taken[o] = True
            comp[nc, G_REGS + f] = out[pa + 4 * o]
            comp[nc, G_TERMS_AT + f] = start[o] - at
            start[o] += 2 * terms
        nc += 1
    # then the rest in rounds
    part = np.empty(3, np.int64)
    done = np.zeros(na, np.int64)
    rnd = 0
    left = na
    while left > 0:
        left = 0
        rnd += 1
        for q in range(na):
            j = start[q]
            if done[q] == rnd or j >= stop[q]:
                if j < stop[q]:
                    left += 1
                continue
            r = out[pa + 4 * q]
            comp[nc, 1] = r
            comp[nc, 2] = j - at
            if j + 2 * FUSE_DEPTH <= stop[q]:
                # up to three later accumulators whose next terms read the same rows (a GEMM's rows of C)
                m = 0
                for o in range(q + 1, na):
                    if done[o] != rnd and start[o] + 2 * FUSE_DEPTH <= stop[o] and _same_loads8(out, j, start[o]):
                        part[m] = o
                        m += 1
                        if m == 3:
                            break
                if m == 3:
                    comp[nc, 0] = STEP_QUAD8
                    comp[nc, 5] = j - at
                    for f in range(3):
                        o = part[f]
                        comp[nc, 2 + f] = out[pa + 4 * o]
                        comp[nc, 6 + f] = start[o] - at
                elif m > 0:
                    m = 1
                    o = part[0]
                    comp[nc, 0] = STEP_PAIR8
                    comp[nc, 2] = out[pa + 4 * o]
                    comp[nc, 3] = j - at
                    comp[nc, 4] = start[o] - at
                else:
                    comp[nc, 0] = STEP_ONE8
                for f in range(m):
                    start[part[f]] += 2 * FUSE_DEPTH
                    done[part[f]] = rnd
                j += 2 * FUSE_DEPTH
            else:
                comp[nc, 0] = STEP_TAIL
                comp[nc, 3] = stop[q] - at
                j = stop[q]
            nc += 1
            start[q] = j
            if j < stop[q]:
                left += 1
    # each row's first and last use in a slot: -1 the accumulators' start, nc the finals (kept to the end);
    # STEP_QUAD8 steps read their rows straight from AM (`direct` marks their terms), so need no slot
    direct = np.zeros(nt, np.bool_)
    first = np.full(nl, nc + 1, np.int64)
    last = np.full(nl, -2, np.int64)
    for q in range(na):
        if out[pa + 4 * q + 2] == _K_LOAD:
            w = out[pa + 4 * q + 3]
            first[w] = -1
            last[w] = max(last[w], -1)
    for c in range(nc):
        if comp[c, 0] == STEP_GROUP:
            for f in range(comp[c, G_N]):
                t0 = (at + comp[c, G_TERMS_AT + f] - pt) >> 1
                direct[t0:t0 + comp[c, G_TERMS]] = True
            continue
        if comp[c, 0] == STEP_QUAD8:
            for f in range(5, 9):
                t0 = (at + comp[c, f] - pt) >> 1
                direct[t0:t0 + FUSE_DEPTH] = True
            continue
        a = at + (comp[c, 3] if comp[c, 0] == STEP_PAIR8 else comp[c, 2])
        b = at + comp[c, 3] if comp[c, 0] == STEP_TAIL else a + 2 * FUSE_DEPTH
        for g in range(a + 1, b, 2):
            w = out[g]
            first[w] = min(first[w], c)
            last[w] = max(last[w], c)
    for f in range(nf):
        g = pf + 3 * f
        if out[g + 1] == _K_LOAD:
            w = out[g + 2]
            first[w] = min(first[w], nc)
            last[w] = nc
    # by_first: the rows in order of first use (stable: load order among equals)
    by_first = np.argsort(first, kind="mergesort")
    slot = np.full(nl, -1, np.int64)
    free = np.empty(nl + 1, np.int64)
    nfree = 0
    nslots = 0
    ends_at = np.argsort(last, kind="mergesort")
    nxt = 0
    fin = 0
    while fin < nl and last[ends_at[fin]] < -1:        # rows nothing reads are not widened
        fin += 1
    nsteps = 0
    base = p
    for c in range(-1, nc + 1):
        while nxt < nl and first[by_first[nxt]] == c:
            w = by_first[nxt]
            nxt += 1
            if nfree > 0:
                nfree -= 1
                slot[w] = free[nfree]
            else:
                slot[w] = nslots
                nslots += 1
            g = base + N_STEP * nsteps
            out[g] = STEP_WIDEN
            out[g + 1] = w
            out[g + 2] = slot[w]
            for f in range(3, N_STEP):
                out[g + f] = 0
            nsteps += 1
        g = base + N_STEP * nsteps
        if c == -1:
            out[g] = STEP_INIT
            for f in range(1, N_STEP):
                out[g + f] = 0
            nsteps += 1
        elif c < nc:
            for f in range(N_STEP):
                out[g + f] = comp[c, f]
            nsteps += 1
        while fin < nl and last[ends_at[fin]] == c:
            free[nfree] = slot[ends_at[fin]]
            nfree += 1
            fin += 1
    # renumber rows to slots
    for q in range(na):
        if out[pa + 4 * q + 2] == _K_LOAD:
            out[pa + 4 * q + 3] = slot[out[pa + 4 * q + 3]]
    for g in range(pt + 1, pf, 2):
        if not direct[(g - pt) >> 1]:
            out[g] = slot[out[g]]
    for f in range(nf):
        g = pf + 3 * f
        if out[g + 1] == _K_LOAD:
            out[g + 2] = slot[out[g + 2]]
    out[at + H_STEPS] = nsteps
    out[at + H_SLOTS] = nslots
    return _address_blocks(out, at, pa, na, nl, nf, base, nsteps)


@njit(cache=True)
def _affine(out, j, terms, rec, width, field, i):
    """Whether the terms out[j], out[j + 2], ... (``terms`` of them) name records out[rec + width * number]
    whose fields (base register, offset) at ``field`` are one base and offsets in arithmetic progression
    (for broadcasts, all from SM: a source field before them); writes (affine, base, first, stride) to
    ``out[i:]`` and returns affine."""
    r0 = rec + width * out[j]
    stride = out[rec + width * out[j + 2] + field + 1] - out[r0 + field + 1] if terms > 1 else 0
    ok = True
    for t in range(terms):
        r = rec + width * out[j + 2 * t]
        if (field > 0 and out[r] != _BSRC_SM) or out[r + field] != out[r0 + field] \
                or out[r + field + 1] != out[r0 + field + 1] + stride * t:
            ok = False
            break
    out[i] = 1 if ok else 0
    out[i + 1] = out[r0 + field]
    out[i + 2] = out[r0 + field + 1]
    out[i + 3] = stride
    return ok


@njit(cache=True)
def _address_blocks(out, at, pa, na, nl, nf, base, nsteps):
    """Append each group step's address block after the steps at ``base``, and mark the loads and
    broadcasts that nothing but affine group steps reads (their tables are not filled at run time);
    return where the record ends."""
    pl = at + N_HEADER
    nb = out[at + H_BCASTS]
    pb = pl + 2 * nl
    pt = pa + 4 * na
    need_l = np.zeros(nl, np.bool_)
    need_b = np.zeros(nb, np.bool_)
    end = base + N_STEP * nsteps
    for g in range(base, base + N_STEP * nsteps, N_STEP):
        kind = out[g]
        if kind == STEP_WIDEN:
            need_l[out[g + 1]] = True
        elif kind == STEP_GROUP:
            out[g + G_AUX] = end - at
            j = at + out[g + G_TERMS_AT]
            terms = out[g + G_TERMS]
            if not _affine(out, j + 1, terms, pl, 2, 0, end):
                for t in range(terms):
                    need_l[out[j + 2 * t + 1]] = True
            for f in range(out[g + G_N]):
                j = at + out[g + G_TERMS_AT + f]
                if not _affine(out, j, terms, pb, 4, 1, end + N_AFFINE * (1 + f)):
                    for t in range(terms):
                        need_b[out[j + 2 * t]] = True
            end += N_AUX
        elif kind != STEP_INIT:
            # rounds: their terms' broadcasts, and the loads a quad reads straight from AM
            if kind == STEP_QUAD8:
                for f in range(5, 9):
                    for t in range(at + out[g + f], at + out[g + f] + 2 * FUSE_DEPTH, 2):
                        need_l[out[t + 1]] = True
                        need_b[out[t]] = True
                continue
            j = at + (out[g + 3] if kind == STEP_PAIR8 else out[g + 2])
            stop = at + out[g + 3] if kind == STEP_TAIL else j + 2 * FUSE_DEPTH
            for t in range(j, stop, 2):
                need_b[out[t]] = True
            if kind == STEP_PAIR8:
                for t in range(at + out[g + 4], at + out[g + 4] + 2 * FUSE_DEPTH, 2):
                    need_b[out[t]] = True
    for q in range(na):
        if out[pa + 4 * q + 2] == _K_BCAST:
            need_b[out[pa + 4 * q + 3]] = True
    for g in range(pt + 2 * out[at + H_TERMS], pt + 2 * out[at + H_TERMS] + 3 * nf, 3):
        if out[g + 1] == _K_BCAST:
            need_b[out[g + 2]] = True
    for q in range(nl):
        if not need_l[q]:
            out[pl + 2 * q] = -1
    for q in range(nb):
        if not need_b[q]:
            out[pb + 4 * q] = _BSRC_SKIP
    return end


@njit(cache=True)
def mark_stretches(ops, nsregs, nvregs, min_terms):
    """Mark the fused stretches in decoded ``ops`` (columns ``O_FUSE_*``) and return their records."""
    n = ops.shape[0]
    vkind = np.zeros(nvregs, np.int64)
    sload = np.zeros(nsregs, np.bool_)
    starts = []
    ends = []
    size = 0
    i = 0
    while i < n:
        op = ops[i, O_OP]
        if op != isa.OP_SLDH and op != isa.OP_SVBCAST and op != isa.OP_VLDH:
            i += 1
            continue
        j, terms = _scan(ops, i, vkind, sload)
        if terms >= min_terms:
            starts.append(i)
            ends.append(j)
            # at most: 4 per op (bcast) or 2 (load) + 2 (term), and a step per load and per term;
            # 4 per scalar, 4 + 3 per vector register, an init step
            size += N_HEADER + (4 + N_STEP) * (j - i) + 4 * nsregs + 7 * nvregs + N_STEP + N_AUX * nvregs
            i = j
        else:
            i = max(j, i + 1)
    out = np.zeros(max(size, 1), np.int64)
    at = 0
    for s in range(len(starts)):
        ops[starts[s], O_FUSE_END] = ends[s]
        ops[starts[s], O_FUSE_AT] = at
        at = _compile(ops, starts[s], ends[s], nsregs, nvregs, out, at)
    return out[:max(at, 1)].copy()


@njit(cache=True)
def run_fused(fused, at, sr, v, on, val, mem16, am0, lanes, smem, sbase):
    """The stretch whose record starts at ``fused[at]``, on one DSP's scalar registers ``sr``, vector
    registers ``v`` and deferred broadcasts ``on``/``val``: the same bits as instruction by instruction.

    Its vector loads read AM (``am0``: the DSP's AM in ``mem16``); its ``sldh`` of SM address a read
    ``smem[(sbase + a) >> 1]`` (the DSP's SM, or the copy of it taken when the run was queued)."""
    nl = fused[at + H_LOADS]
    nb = fused[at + H_BCASTS]
    ns = fused[at + H_SCALARS]
    na = fused[at + H_ACCS]
    nt = fused[at + H_TERMS]
    nf = fused[at + H_FINALS]
    p = at + N_HEADER
    # where each loaded row is (every base register holds its entry value until the scalars below)
    src = np.empty(nl, np.uint64)
    for q in range(nl):
        if fused[p] >= 0:                           # (not only read by an affine group step)
            src[q] = (am0 + sr[fused[p]] + fused[p + 1]) >> 1
        p += 2
    # the broadcast values
    bval = np.empty(nb, np.float32)
    bc = fused[p:p + 4 * nb].reshape(nb, 4)       # (one view per stretch; unsigned indices below)
    for q in range(nb):
        if bc[q, 0] == _BSRC_REG:
            bval[q] = widen_f16(np.uint16(sr[bc[q, 1]] & 0xFFFF))
        elif bc[q, 0] == _BSRC_SM:
            bval[q] = widen_f16(smem[np.uint64(sbase + sr[bc[q, 1]] + bc[q, 2]) >> np.uint64(1)])
    p += 4 * nb
    # the scalar registers the stretch's sldh leave (entry values are no longer needed after this)
    sv = np.empty(ns, np.int64)
    for q in range(ns):
        g = p + 4 * q
        sv[q] = smem[(sbase + sr[fused[g + 1]] + fused[g + 2]) >> 1]
    for q in range(ns):
        sr[fused[p + 4 * q]] = sv[q]
    p += 4 * ns
    pa = p
    pf = pa + 4 * na + 2 * nt
    ps = pf + 3 * nf
    # the schedule (_schedule): rows widened into slots as they are first needed, terms in rounds
    rows = np.empty((max(fused[at + H_SLOTS], 1), lanes), np.float32)
    for g in range(ps, ps + N_STEP * fused[at + H_STEPS], N_STEP):
        kind = fused[g]
        if kind == STEP_QUAD8:
            _add_terms8_quad(v, fused[g + 1], fused[g + 2], fused[g + 3], fused[g + 4], mem16, src, bval, fused,
                             at + fused[g + 5], at + fused[g + 6], at + fused[g + 7], at + fused[g + 8], lanes)
        elif kind == STEP_GROUP:
            _run_group(v, fused, g, at, src, bval, mem16, lanes, sr, am0, smem, sbase)
        elif kind == STEP_WIDEN:
            s0 = src[fused[g + 1]]
            w = fused[g + 2]
            for k in range(lanes):
                rows[w, k] = widen_f16(mem16[s0 + np.uint64(k)])
        elif kind == STEP_PAIR8:
            _add_terms8_pair(v, fused[g + 1], fused[g + 2], rows, bval, fused, at + fused[g + 3],
                             at + fused[g + 4], lanes)
        elif kind == STEP_ONE8:
            _add_terms8(v, fused[g + 1], rows, bval, fused, at + fused[g + 2], lanes)
        elif kind == STEP_TAIL:
            r = fused[g + 1]
            for j in range(at + fused[g + 2], at + fused[g + 3], 2):
                x = bval[fused[j]]
                w = fused[j + 1]
                for k in range(lanes):
                    v[r, k] = add_fp16_product(v[r, k], x, rows[w, k])
        else:                                   # STEP_INIT: the accumulators' start values
            for q in range(na):
                r = fused[pa + 4 * q]
                kind = fused[pa + 4 * q + 2]
                if kind == _K_BCAST:
                    x = bval[fused[pa + 4 * q + 3]]
                    for k in range(lanes):
                        v[r, k] = x
                elif kind == _K_LOAD:
                    w = fused[pa + 4 * q + 3]
                    for k in range(lanes):
                        v[r, k] = rows[w, k]
                elif on[r]:
                    for k in range(lanes):
                        v[r, k] = val[r]
                on[r] = False
    # the vector registers it leaves: broadcasts stay deferred, loaded rows are written
    for g in range(pf, ps, 3):
        r = fused[g]
        o = fused[g + 2]
        if fused[g + 1] == _K_BCAST:
            on[r] = True
            val[r] = bval[o]
        else:
            for k in range(lanes):
                v[r, k] = rows[o, k]
            on[r] = False


@njit(cache=True)
def _run_group(v, fused, g, at, src, bval, mem16, lanes, sr, am0, smem, sbase):
    """The STEP_GROUP step at ``fused[g]``: its accumulators' terms, all over the same rows (read straight
    from AM), added with the accumulators held in host registers (:func:`x16_block` lanes a pass) where the host
    has vector FP16 (:data:`mtemu.fast.simd.VECTOR_FP16`), lane by lane for the rest."""
    n = fused[g + G_N]
    terms = fused[g + G_TERMS]
    regs = np.empty(GROUP_MAX, np.int64)
    for f in range(n):
        regs[f] = fused[g + G_REGS + f]
    # per term: where its row is, and each accumulator's broadcast value (base registers hold their
    # entry values: the stretch loads none of them)
    addr = np.empty(terms, np.uint64)
    x = np.empty((GROUP_MAX, terms), np.float32)
    aux = at + fused[g + G_AUX]
    j = at + fused[g + G_TERMS_AT]
    if fused[aux]:
        first = am0 + sr[fused[aux + 1]] + fused[aux + 2]
        stride = fused[aux + 3]
        for t in range(terms):
            addr[t] = (first + stride * t) >> 1
    else:
        for t in range(terms):
            addr[t] = src[fused[j + 2 * t + 1]]
    for f in range(n):
        b = aux + N_AFFINE * (1 + f)
        if fused[b]:
            first = sbase + sr[fused[b + 1]] + fused[b + 2]
            stride = fused[b + 3]
            if stride == 2:                     # consecutive values (a GEMM's row of A): one vector loop
                h = np.uint64(first) >> np.uint64(1)
                for t in range(terms):
                    x[f, t] = widen_f16(smem[h + np.uint64(t)])
            else:
                for t in range(terms):
                    x[f, t] = widen_f16(smem[np.uint64(first + stride * t) >> np.uint64(1)])
        else:
            j = at + fused[g + G_TERMS_AT + f]
            for t in range(terms):
                x[f, t] = bval[fused[j + 2 * t]]
    k0 = 0
    if VECTOR_FP16:
        k0 = lanes - lanes % x16_block(n)
        group_x16(v, regs, n, mem16, addr, x, terms, k0)
    group_lanes(v, regs, n, mem16, addr, x, terms, k0, lanes)


@njit(cache=True)
def x16_block(n):
    """Lanes a register-blocked pass of a group of n accumulators covers: twelve host vectors."""
    return 2 * LANES_X16 if n == GROUP_MAX else 3 * LANES_X16


@njit(cache=True)
def _group_x16_blocked(v, regs, n, mem16, addr, x, terms, lanes):
    """Lanes [0, lanes) (a multiple of :func:`x16_block`) of a group of n = 6 or 4 accumulators
    (:func:`group_lanes`'s arguments), register-blocked."""
    if n == GROUP_MAX:
        _group6_x16(v, regs[0], regs[1], regs[2], regs[3], regs[4], regs[5], mem16, addr, x, terms, lanes)
    else:
        _group4_x16(v, regs[0], regs[1], regs[2], regs[3], mem16, addr, x, terms, lanes)


@njit(cache=True)
def group_lanes(v, regs, n, mem16, addr, x, terms, k0, lanes):
    """Lanes k0 <= k < lanes of a group step, one accumulator, term and lane after another: the
    reference for the register-blocked kernels (and all of the step where the host lacks them).
    Accumulator ``regs[f]`` adds ``x[f, t]`` x (the FP16 row at ``mem16[addr[t]:]``) for t in order."""
    for f in range(n):
        r = regs[f]
        for t in range(terms):
            s = addr[t]
            b = x[f, t]
            for k in range(k0, lanes):
                v[r, k] = add_fp16_product(v[r, k], b, widen_f16(mem16[s + np.uint64(k)]))


@njit(cache=True)
def _group6_x16(v, r0, r1, r2, r3, r4, r5, mem16, addr, x, terms, lanes):
    """:func:`group_lanes` for six accumulators over lanes [0, lanes) (a multiple of 32): per 32 lanes,
    twelve host vectors hold the accumulators over all the terms, and each row is widened once for
    the six (a register-blocked GEMM micro-kernel)."""
    for c in range(0, lanes, 2 * LANES_X16):
        d = c + LANES_X16
        a0, b0 = load_f32x16(v, r0, c), load_f32x16(v, r0, d)
        a1, b1 = load_f32x16(v, r1, c), load_f32x16(v, r1, d)
        a2, b2 = load_f32x16(v, r2, c), load_f32x16(v, r2, d)
        a3, b3 = load_f32x16(v, r3, c), load_f32x16(v, r3, d)
        a4, b4 = load_f32x16(v, r4, c), load_f32x16(v, r4, d)
        a5, b5 = load_f32x16(v, r5, c), load_f32x16(v, r5, d)
        for t in range(terms):
            s = addr[t] + np.uint64(c)
            w = load_f16x16(mem16, s)
            u = load_f16x16(mem16, s + np.uint64(LANES_X16))
            a0, b0 = fma_x16(x[0, t], w, a0), fma_x16(x[0, t], u, b0)
            a1, b1 = fma_x16(x[1, t], w, a1), fma_x16(x[1, t], u, b1)
            a2, b2 = fma_x16(x[2, t], w, a2), fma_x16(x[2, t], u, b2)
            a3, b3 = fma_x16(x[3, t], w, a3), fma_x16(x[3, t], u, b3)
            a4, b4 = fma_x16(x[4, t], w, a4), fma_x16(x[4, t], u, b4)
            a5, b5 = fma_x16(x[5, t], w, a5), fma_x16(x[5, t], u, b5)
        store_f32x16(v, r0, c, a0), store_f32x16(v, r0, d, b0)
        store_f32x16(v, r1, c, a1), store_f32x16(v, r1, d, b1)
        store_f32x16(v, r2, c, a2), store_f32x16(v, r2, d, b2)
        store_f32x16(v, r3, c, a3), store_f32x16(v, r3, d, b3)
        store_f32x16(v, r4, c, a4), store_f32x16(v, r4, d, b4)
        store_f32x16(v, r5, c, a5), store_f32x16(v, r5, d, b5)


@njit(cache=True)
def _group4_x16(v, r0, r1, r2, r3, mem16, addr, x, terms, lanes):
    """:func:`_group6_x16` for four accumulators, 48 lanes at a time (lanes a multiple of 48): twelve
    host vectors again, each row widened once for the four."""
    sixteen = np.uint64(LANES_X16)
    for c in range(0, lanes, 3 * LANES_X16):
        d, e = c + LANES_X16, c + 2 * LANES_X16
        p0, q0, z0 = load_f32x16(v, r0, c), load_f32x16(v, r0, d), load_f32x16(v, r0, e)
        p1, q1, z1 = load_f32x16(v, r1, c), load_f32x16(v, r1, d), load_f32x16(v, r1, e)
        p2, q2, z2 = load_f32x16(v, r2, c), load_f32x16(v, r2, d), load_f32x16(v, r2, e)
        p3, q3, z3 = load_f32x16(v, r3, c), load_f32x16(v, r3, d), load_f32x16(v, r3, e)
        for t in range(terms):
            s = addr[t] + np.uint64(c)
            w, u, y = load_f16x16(mem16, s), load_f16x16(mem16, s + sixteen), load_f16x16(mem16, s + 2 * sixteen)
            p0, q0, z0 = fma_x16(x[0, t], w, p0), fma_x16(x[0, t], u, q0), fma_x16(x[0, t], y, z0)
            p1, q1, z1 = fma_x16(x[1, t], w, p1), fma_x16(x[1, t], u, q1), fma_x16(x[1, t], y, z1)
            p2, q2, z2 = fma_x16(x[2, t], w, p2), fma_x16(x[2, t], u, q2), fma_x16(x[2, t], y, z2)
            p3, q3, z3 = fma_x16(x[3, t], w, p3), fma_x16(x[3, t], u, q3), fma_x16(x[3, t], y, z3)
        store_f32x16(v, r0, c, p0), store_f32x16(v, r0, d, q0), store_f32x16(v, r0, e, z0)
        store_f32x16(v, r1, c, p1), store_f32x16(v, r1, d, q1), store_f32x16(v, r1, e, z1)
        store_f32x16(v, r2, c, p2), store_f32x16(v, r2, d, q2), store_f32x16(v, r2, e, z2)
        store_f32x16(v, r3, c, p3), store_f32x16(v, r3, d, q3), store_f32x16(v, r3, e, z3)


@njit(cache=True)
def _group_x16_by_lane(v, regs, n, mem16, addr, x, terms, lanes):
    """:func:`group_x16` where the host lacks vector FP16: lane by lane."""
    group_lanes(v, regs, n, mem16, addr, x, terms, 0, lanes)


# Chosen once per process, as fp16.widen_f16 is: without F16C and FMA (simd.VECTOR_FP16) the vector
# intrinsics are never compiled (LLVM would need library routines per lane that the JIT may not have).
group_x16 = _group_x16_blocked if VECTOR_FP16 else _group_x16_by_lane


@njit(cache=True)
def _bcasts8(bval, fused, j):
    """The broadcast values of the eight terms at fused[j:j+16] (bcast, load), in order."""
    return (bval[fused[j]], bval[fused[j + 2]], bval[fused[j + 4]], bval[fused[j + 6]],
            bval[fused[j + 8]], bval[fused[j + 10]], bval[fused[j + 12]], bval[fused[j + 14]])


@njit(cache=True)
def _row_addresses8(src, fused, j):
    """Where in AM (``src``: word address per load) the rows of the eight terms at fused[j:j+16] are."""
    return (src[fused[j + 1]], src[fused[j + 3]], src[fused[j + 5]], src[fused[j + 7]],
            src[fused[j + 9]], src[fused[j + 11]], src[fused[j + 13]], src[fused[j + 15]])


@njit(cache=True)
def _add_terms8(v, r, rows, bval, fused, j, lanes):
    """v[r] += the eight terms at fused[j:j+16] (bcast, load), one after another, each sum rounded."""
    x0, x1, x2, x3, x4, x5, x6, x7 = _bcasts8(bval, fused, j)
    w0, w1, w2, w3, w4, w5, w6, w7 = fused[j + 1], fused[j + 3], fused[j + 5], fused[j + 7], \
        fused[j + 9], fused[j + 11], fused[j + 13], fused[j + 15]
    for k in range(lanes):
        s = add_fp16_product(v[r, k], x0, rows[w0, k])
        s = add_fp16_product(s, x1, rows[w1, k])
        s = add_fp16_product(s, x2, rows[w2, k])
        s = add_fp16_product(s, x3, rows[w3, k])
        s = add_fp16_product(s, x4, rows[w4, k])
        s = add_fp16_product(s, x5, rows[w5, k])
        s = add_fp16_product(s, x6, rows[w6, k])
        v[r, k] = add_fp16_product(s, x7, rows[w7, k])


@njit(cache=True)
def _same_loads(fused, j, jq, terms):
    """Whether the ``terms`` terms at fused[j:] and fused[jq:] (bcast, load) add the same loaded rows."""
    for i in range(1, 2 * terms, 2):
        if fused[j + i] != fused[jq + i]:
            return False
    return True


@njit(cache=True)
def _same_loads8(fused, j, jq):
    """Whether the eight terms at fused[j:j+16] and fused[jq:jq+16] add to the same loaded rows."""
    return _same_loads(fused, j, jq, FUSE_DEPTH)


@njit(cache=True)
def _add_terms8_pair(v, r, q, rows, bval, fused, j, jq, lanes):
    """:func:`_add_terms8` for accumulators r (terms at j) and q (at jq) over the same eight rows:
    each row is read once for both, and the two sums are independent chains (twice the work in
    flight per lane). Each accumulator's terms are still added one after another."""
    x0, x1, x2, x3, x4, x5, x6, x7 = _bcasts8(bval, fused, j)
    y0, y1, y2, y3, y4, y5, y6, y7 = _bcasts8(bval, fused, jq)
    w0, w1, w2, w3, w4, w5, w6, w7 = fused[j + 1], fused[j + 3], fused[j + 5], fused[j + 7], \
        fused[j + 9], fused[j + 11], fused[j + 13], fused[j + 15]
    for k in range(lanes):
        a = rows[w0, k]
        s = add_fp16_product(v[r, k], x0, a)
        t = add_fp16_product(v[q, k], y0, a)
        a = rows[w1, k]
        s = add_fp16_product(s, x1, a)
        t = add_fp16_product(t, y1, a)
        a = rows[w2, k]
        s = add_fp16_product(s, x2, a)
        t = add_fp16_product(t, y2, a)
        a = rows[w3, k]
        s = add_fp16_product(s, x3, a)
        t = add_fp16_product(t, y3, a)
        a = rows[w4, k]
        s = add_fp16_product(s, x4, a)
        t = add_fp16_product(t, y4, a)
        a = rows[w5, k]
        s = add_fp16_product(s, x5, a)
        t = add_fp16_product(t, y5, a)
        a = rows[w6, k]
        s = add_fp16_product(s, x6, a)
        t = add_fp16_product(t, y6, a)
        a = rows[w7, k]
        v[r, k] = add_fp16_product(s, x7, a)
        v[q, k] = add_fp16_product(t, y7, a)


@njit(cache=True)
def _add_terms8_quad(v, r0, r1, r2, r3, mem16, src, bval, fused, j0, j1, j2, j3, lanes):
    """:func:`_add_terms8` for four accumulators (terms at j0..j3) over the same eight rows, each row read
    straight from AM and widened once for the four: four independent chains per lane, a conversion per
    four products (the host's multiply-add ports are the bound; a widened copy in a slot would add a
    store and a load per row). Each accumulator's terms are still added one after another."""
    x0, x1, x2, x3, x4, x5, x6, x7 = _bcasts8(bval, fused, j0)
    y0, y1, y2, y3, y4, y5, y6, y7 = _bcasts8(bval, fused, j1)
    z0, z1, z2, z3, z4, z5, z6, z7 = _bcasts8(bval, fused, j2)
    u0, u1, u2, u3, u4, u5, u6, u7 = _bcasts8(bval, fused, j3)
    s0, s1, s2, s3, s4, s5, s6, s7 = _row_addresses8(src, fused, j0)
    for k in range(lanes):
        kk = np.uint64(k)
        a = widen_f16(mem16[s0 + kk])
        p = add_fp16_product(v[r0, k], x0, a)
        q = add_fp16_product(v[r1, k], y0, a)
        r = add_fp16_product(v[r2, k], z0, a)
        t = add_fp16_product(v[r3, k], u0, a)
        a = widen_f16(mem16[s1 + kk])
        p = add_fp16_product(p, x1, a)
        q = add_fp16_product(q, y1, a)
        r = add_fp16_product(r, z1, a)
        t = add_fp16_product(t, u1, a)
        a = widen_f16(mem16[s2 + kk])
        p = add_fp16_product(p, x2, a)
        q = add_fp16_product(q, y2, a)
        r = add_fp16_product(r, z2, a)
        t = add_fp16_product(t, u2, a)
        a = widen_f16(mem16[s3 + kk])
        p = add_fp16_product(p, x3, a)
        q = add_fp16_product(q, y3, a)
        r = add_fp16_product(r, z3, a)
        t = add_fp16_product(t, u3, a)
        a = widen_f16(mem16[s4 + kk])
        p = add_fp16_product(p, x4, a)
        q = add_fp16_product(q, y4, a)
        r = add_fp16_product(r, z4, a)
        t = add_fp16_product(t, u4, a)
        a = widen_f16(mem16[s5 + kk])
        p = add_fp16_product(p, x5, a)
        q = add_fp16_product(q, y5, a)
        r = add_fp16_product(r, z5, a)
        t = add_fp16_product(t, u5, a)
        a = widen_f16(mem16[s6 + kk])
        p = add_fp16_product(p, x6, a)
        q = add_fp16_product(q, y6, a)
        r = add_fp16_product(r, z6, a)
        t = add_fp16_product(t, u6, a)
        a = widen_f16(mem16[s7 + kk])
        v[r0, k] = add_fp16_product(p, x7, a)
        v[r1, k] = add_fp16_product(q, y7, a)
        v[r2, k] = add_fp16_product(r, z7, a)
        v[r3, k] = add_fp16_product(t, u7, a)

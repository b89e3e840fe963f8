"""The jitted part of ``ratrain.sim.event_loop``: the event loop of ``ratrain.sim.simulator._Sim`` over packed
arrays (see that module for the model and for why it is exact).

This file holds only the jitted functions and their constants: Numba keys each function's on-disk
cache on its own file, so nothing here may come from another module, and editing the conversion in
``ratrain.sim.event_loop`` does not recompile the loop. Numba's compiled code goes to its own folder,
``<numba>/ratrain-sim`` (the ``simulator-jit`` cache of ``rtcommon.caches``), apart from the emulator's.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numba
import numpy as np
from numba import njit

from rtcommon import caches

# the simulator's codes (ratrain.sim.event_loop checks them against ratrain.sim.simulator)
NRES = 6
COMPUTE, DDR, LINK = 0, 1, 2
WAITING, READY, RUNNING, DONE = 0, 1, 2, 3
MAIN, FSR, LIFE = 0, 1, 2
EPS = 1e-9
# the kinds the loop tells apart
K_OTHER, K_F, K_R, K_GRADSYNC = 0, 1, 2, 3
KIND_CODES = {"F": K_F, "R": K_R, "GradSync": K_GRADSYNC}
# counters in ``ctr``
C_SEQ, C_ENT, C_IHEAD, C_ITAIL, C_ROUND, C_NDIRTY, C_NFILL, C_FF, C_ERR = range(9)
E_NO_DEADLINE = 1           # a lifecycle job became ready before its layer's first forward started

CACHE_FOLDER = caches.path("simulator-jit")


@contextmanager
def _numba_cache_here() -> Iterator[None]:
    """Numba picks a function's cache folder when the function is defined, from its config."""
    previous = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(CACHE_FOLDER)
    try:
        yield
    finally:
        numba.config.CACHE_DIR = previous


# Column layout of the packed tables the loop reads and writes (row-major: one row per job, resource,
# stage or stream slot; few arguments per jitted function keep Numba's compile short).
# jobs, integers
J_RES, J_RES2, J_KIND, J_STAGE, J_LAYER, J_FSR, J_MAIN, J_HINT, J_CLS, J_NPRED, J_OTHER, J_STATE, J_MROUND = range(13)
# jobs, floats
F_DUR, F_KEY1, F_KEY2, F_START, F_END, F_PROMOTED, F_MEMO = range(7)
# resources: the running job (-1 none), its queue's slice of the heap storage, dirty and filler marks
R_RUN, R_HOFF, R_HLEN, R_DIRTY, R_FILL = range(5)
# stages: main chain, neighbour resources and stream slots (slices of ``lists`` / of the slot table),
# the position in the main chain, whether state tasks share the link
S_CHAIN_A, S_CHAIN_Z, S_NB_A, S_NB_Z, S_SLOT_A, S_SLOT_Z, S_NEXT, S_SHARED = range(8)
# stream slots: the stream's slice of ``lists``, the position in it
L_A, L_Z, L_POS = range(3)


with _numba_cache_here():

    # ---------------------------------------------------------------- queues
    @njit(cache=True)
    def _less(ent_f, ent_i, a, b):
        """Entry a pops before entry b: (class, key, seq)."""
        if ent_i[a, 0] != ent_i[b, 0]:
            return ent_i[a, 0] < ent_i[b, 0]
        if ent_f[a, 0] != ent_f[b, 0]:
            return ent_f[a, 0] < ent_f[b, 0]
        if ent_f[a, 1] != ent_f[b, 1]:
            return ent_f[a, 1] < ent_f[b, 1]
        return ent_i[a, 1] < ent_i[b, 1]

    @njit(cache=True)
    def _heap_push(heap, ri, ent_f, ent_i, r, e):
        base = ri[r, R_HOFF]
        i = ri[r, R_HLEN]
        ri[r, R_HLEN] = i + 1
        while i > 0:
            parent = (i - 1) >> 1
            q = heap[base + parent]
            if not _less(ent_f, ent_i, e, q):
                break
            heap[base + i] = q
            i = parent
        heap[base + i] = e

    @njit(cache=True)
    def _heap_pop(heap, ri, ent_f, ent_i, r):
        base = ri[r, R_HOFF]
        top = heap[base]
        n = ri[r, R_HLEN] - 1
        ri[r, R_HLEN] = n
        if n > 0:
            last = heap[base + n]
            i = 0
            while True:
                c = 2 * i + 1
                if c >= n:
                    break
                if c + 1 < n and _less(ent_f, ent_i, heap[base + c + 1], heap[base + c]):
                    c += 1
                if not _less(ent_f, ent_i, heap[base + c], last):
                    break
                heap[base + i] = heap[base + c]
                i = c
            heap[base + i] = last
        return top

    @njit(cache=True)
    def _entry(ent_f, ent_i, ctr, cls, key1, key2, job):
        """A new queue entry with the next seq."""
        ctr[C_SEQ] += 1
        e = ctr[C_ENT]
        ctr[C_ENT] = e + 1
        ent_i[e, 0] = cls
        ent_i[e, 1] = ctr[C_SEQ]
        ent_i[e, 2] = job
        ent_f[e, 0] = key1
        ent_f[e, 1] = key2
        return e

    @njit(cache=True)
    def _push(ji, jf, ri, heap, ent_f, ent_i, dirty_list, ctr, job, r):
        """Job into resource r's queue with the next seq; r is dirty."""
        e = _entry(ent_f, ent_i, ctr, ji[job, J_CLS], jf[job, F_KEY1], jf[job, F_KEY2], job)
        _heap_push(heap, ri, ent_f, ent_i, r, e)
        if ri[r, R_DIRTY] == 0:
            ri[r, R_DIRTY] = 1
            dirty_list[ctr[C_NDIRTY]] = r
            ctr[C_NDIRTY] += 1

    @njit(cache=True)
    def _make_ready(ji, jf, si, ri, heap, ent_f, ent_i, dirty_list, instant, first_f, ctr, now, deadline_aware,
                    job):
        if jf[job, F_DUR] == 0.0:
            instant[ctr[C_ITAIL]] = job
            ctr[C_ITAIL] += 1
            return
        ji[job, J_STATE] = READY
        if ji[job, J_CLS] == LIFE:
            if deadline_aware and (ji[job, J_KIND] != K_GRADSYNC or si[ji[job, J_STAGE], S_SHARED] != 0):
                layer = ji[job, J_LAYER]       # earliest deadline first
                if layer < 0 or np.isnan(first_f[layer]):
                    ctr[C_ERR] = E_NO_DEADLINE
                    jf[job, F_KEY1] = 0.0
                else:
                    jf[job, F_KEY1] = first_f[layer]
                jf[job, F_KEY2] = layer
            else:
                jf[job, F_KEY1] = now
                jf[job, F_KEY2] = ji[job, J_HINT]
        _push(ji, jf, ri, heap, ent_f, ent_i, dirty_list, ctr, job, ji[job, J_RES])
        if ji[job, J_RES2] >= 0:
            _push(ji, jf, ri, heap, ent_f, ent_i, dirty_list, ctr, job, ji[job, J_RES2])

    # ---------------------------------------------------------------- window checks
    @njit(cache=True)
    def _lb_end(ji, jf, pred_ptr, pred_idx, stack, ctr, now, root):
        """Lower bound on when a main-path job will finish, memoised for the dispatch round."""
        rnd = ctr[C_ROUND]
        if ji[root, J_MROUND] == rnd:
            return jf[root, F_MEMO]
        stack[0] = root
        top = 1
        while top > 0:
            j = stack[top - 1]
            if ji[j, J_MROUND] == rnd:
                top -= 1
                continue
            if ji[j, J_STATE] >= RUNNING:
                jf[j, F_MEMO] = jf[j, F_END]
                ji[j, J_MROUND] = rnd
                top -= 1
                continue
            pushed = False
            for k in range(pred_ptr[j], pred_ptr[j + 1]):
                q = pred_idx[k]
                if ji[q, J_MROUND] != rnd and ji[q, J_STATE] < RUNNING:
                    stack[top] = q
                    top += 1
                    pushed = True
            if pushed:
                continue
            start = now
            for k in range(pred_ptr[j], pred_ptr[j + 1]):
                q = pred_idx[k]
                v = jf[q, F_MEMO] if ji[q, J_STATE] < RUNNING else jf[q, F_END]
                if v > start:
                    start = v
            jf[j, F_MEMO] = start + jf[j, F_DUR]
            ji[j, J_MROUND] = rnd
            top -= 1
        return jf[root, F_MEMO]

    @njit(cache=True)
    def _compute_window_ok(ji, jf, si, lists, pred_ptr, pred_idx, stack, ctr, now, p, cand):
        a, z = si[p, S_CHAIN_A], si[p, S_CHAIN_Z]
        i = si[p, S_NEXT]
        if i >= z - a:
            return True
        nxt = lists[a + i]
        for k in range(pred_ptr[nxt], pred_ptr[nxt + 1]):
            if pred_idx[k] == cand:
                return True         # the next main task waits for it anyway: running it early is free
        other = now
        need = 0.0
        for k in range(pred_ptr[nxt], pred_ptr[nxt + 1]):
            q = pred_idx[k]
            if ji[q, J_STATE] == DONE:
                continue
            if ji[q, J_KIND] == K_R and ji[q, J_RES] == ji[cand, J_RES] and ji[q, J_STATE] < RUNNING:
                need += jf[q, F_DUR]
                continue
            v = _lb_end(ji, jf, pred_ptr, pred_idx, stack, ctr, now, q)
            if v > other:
                other = v
        return now + jf[cand, F_DUR] + need <= other + EPS

    @njit(cache=True)
    def _link_window_ok(ji, jf, si, sl, lists, pred_ptr, pred_idx, stack, ctr, now, p, cand):
        end = now + jf[cand, F_DUR]
        for slot in range(si[p, S_SLOT_A], si[p, S_SLOT_Z]):
            a, z = sl[slot, L_A], sl[slot, L_Z]
            i = sl[slot, L_POS]
            while a + i < z:
                t = lists[a + i]
                if ji[t, J_STATE] >= RUNNING and (ji[t, J_STATE] == DONE or jf[t, F_END] <= now):
                    i += 1
                else:
                    break
            sl[slot, L_POS] = i
            if a + i >= z:
                continue
            t = lists[a + i]
            if ji[t, J_STATE] == RUNNING:
                continue            # the port is (or will be) busy with it; it ends before any later one
            ready = now
            for k in range(pred_ptr[t], pred_ptr[t + 1]):
                v = _lb_end(ji, jf, pred_ptr, pred_idx, stack, ctr, now, pred_idx[k])
                if v > ready:
                    ready = v
            if end > ready + EPS:
                return False
        return True

    # ---------------------------------------------------------------- the loop
    @njit(cache=True)
    def _loop(ji, jf, ri, si, sl, lists, pred_ptr, pred_idx, succ_ptr, succ_idx, heap, ent_f, ent_i, instant,
              stack, skipped, dirty_list, fill_list, todo, first_f, ff_order, ctr, deadline_aware):
        """``_Sim.run``'s event loop; returns (the number of jobs that never ran, the last event time).
        Completions are the last queue of ``ri``: entries (0, end, 0, seq) pop in (end, seq) order."""
        n = ji.shape[0]
        evq = ri.shape[0] - 1
        ev0 = ri[evq, R_HOFF]
        now = 0.0
        for j in range(n):
            if ji[j, J_NPRED] == 0:
                _make_ready(ji, jf, si, ri, heap, ent_f, ent_i, dirty_list, instant, first_f, ctr, now,
                            deadline_aware, j)
        first = True
        while first or ri[evq, R_HLEN] > 0:
            t = now
            if not first:
                t = ent_f[heap[ev0], 0]
                now = t
            # the completions at t in (end, seq) order, each followed by the zero-length jobs it released
            while first or (ri[evq, R_HLEN] > 0 and ent_f[heap[ev0], 0] == t):
                job = -1
                if not first:
                    job = ent_i[_heap_pop(heap, ri, ent_f, ent_i, evq), 2]
                first = False
                while True:
                    if job < 0:
                        if ctr[C_IHEAD] >= ctr[C_ITAIL]:
                            break
                        job = instant[ctr[C_IHEAD]]
                        ctr[C_IHEAD] += 1
                        jf[job, F_START] = now
                        jf[job, F_END] = now
                        if ji[job, J_KIND] == K_F and np.isnan(first_f[ji[job, J_LAYER]]):
                            first_f[ji[job, J_LAYER]] = now
                            ff_order[ctr[C_FF]] = ji[job, J_LAYER]
                            ctr[C_FF] += 1
                    # complete job
                    ji[job, J_STATE] = DONE
                    if jf[job, F_DUR] > 0.0:
                        for c in range(J_RES, J_RES2 + 1):
                            r = ji[job, c]
                            if r >= 0:
                                ri[r, R_RUN] = -1
                                if ri[r, R_DIRTY] == 0:
                                    ri[r, R_DIRTY] = 1
                                    dirty_list[ctr[C_NDIRTY]] = r
                                    ctr[C_NDIRTY] += 1
                    p = ji[job, J_STAGE]
                    if ji[job, J_MAIN] != 0 and ji[job, J_RES] % NRES == COMPUTE:
                        si[p, S_NEXT] += 1
                    for k in range(si[p, S_NB_A], si[p, S_NB_Z]):
                        r = lists[k]
                        if ri[r, R_DIRTY] == 0:
                            ri[r, R_DIRTY] = 1
                            dirty_list[ctr[C_NDIRTY]] = r
                            ctr[C_NDIRTY] += 1
                    for k in range(succ_ptr[job], succ_ptr[job + 1]):
                        x = succ_idx[k]
                        ji[x, J_NPRED] -= 1
                        rec = ji[x, J_FSR]
                        if rec >= 0 and rec != job:
                            ji[x, J_OTHER] -= 1
                            if ji[x, J_OTHER] == 0 and ji[rec, J_STATE] != DONE and np.isnan(jf[rec, F_PROMOTED]):
                                # FSR promotion: the backward waits only for its recovery now
                                jf[rec, F_PROMOTED] = now
                                ji[rec, J_CLS] = MAIN
                                if ji[rec, J_STATE] == READY:
                                    _push(ji, jf, ri, heap, ent_f, ent_i, dirty_list, ctr, rec, ji[rec, J_RES])
                        if ji[x, J_NPRED] == 0:
                            _make_ready(ji, jf, si, ri, heap, ent_f, ent_i, dirty_list, instant, first_f, ctr, now,
                                        deadline_aware, x)
                    job = -1
            # the dispatch round: dirty resources (and those with fillers waiting) in ascending order
            ctr[C_ROUND] += 1                              # clears the lower-bound memo
            m = 0
            for k in range(ctr[C_NDIRTY]):
                r = dirty_list[k]
                ri[r, R_DIRTY] = 0
                todo[m] = r
                m += 1
            for k in range(ctr[C_NFILL]):
                r = fill_list[k]
                ri[r, R_FILL] = 0
                todo[m] = r
                m += 1
            ctr[C_NDIRTY] = 0
            ctr[C_NFILL] = 0
            for k in range(1, m):                          # insertion sort: a handful of resources
                r = todo[k]
                i = k - 1
                while i >= 0 and todo[i] > r:
                    todo[i + 1] = todo[i]
                    i -= 1
                todo[i + 1] = r
            last = -1
            for k in range(m):
                r = todo[k]
                if r == last:
                    continue
                last = r
                if ri[r, R_RUN] >= 0 or ri[r, R_HLEN] == 0:
                    continue
                # dispatch r: its best entry that may start now
                kind = r % NRES
                nskip = 0
                while ri[r, R_HLEN] > 0:
                    e = _heap_pop(heap, ri, ent_f, ent_i, r)
                    cls = ent_i[e, 0]
                    job = ent_i[e, 2]
                    if ji[job, J_STATE] != READY or cls != ji[job, J_CLS]:
                        continue                                  # stale entry
                    if ji[job, J_RES2] >= 0:
                        o = ji[job, J_RES2] if ji[job, J_RES] == r else ji[job, J_RES]
                        if ri[o, R_RUN] >= 0:
                            skipped[nskip] = e                    # other port busy: let another use this one
                            nskip += 1
                            continue
                    elif cls != MAIN and (kind == COMPUTE or kind == LINK):
                        if kind == COMPUTE:
                            ok = _compute_window_ok(ji, jf, si, lists, pred_ptr, pred_idx, stack, ctr, now,
                                                    r // NRES, job)
                        else:
                            ok = _link_window_ok(ji, jf, si, sl, lists, pred_ptr, pred_idx, stack, ctr, now,
                                                 r // NRES, job)
                        if not ok:
                            skipped[nskip] = e
                            nskip += 1
                            if ri[r, R_FILL] == 0:
                                ri[r, R_FILL] = 1
                                fill_list[ctr[C_NFILL]] = r
                                ctr[C_NFILL] += 1
                            continue
                    # start job
                    ji[job, J_STATE] = RUNNING
                    jf[job, F_START] = now
                    jf[job, F_END] = now + jf[job, F_DUR]
                    if ji[job, J_KIND] == K_F and np.isnan(first_f[ji[job, J_LAYER]]):
                        first_f[ji[job, J_LAYER]] = now
                        ff_order[ctr[C_FF]] = ji[job, J_LAYER]
                        ctr[C_FF] += 1
                    ri[ji[job, J_RES], R_RUN] = job
                    if ji[job, J_RES2] >= 0:
                        ri[ji[job, J_RES2], R_RUN] = job
                    _heap_push(heap, ri, ent_f, ent_i, evq, _entry(ent_f, ent_i, ctr, 0, jf[job, F_END], 0.0, job))
                    break
                for k2 in range(nskip):
                    _heap_push(heap, ri, ent_f, ent_i, r, skipped[k2])
        stuck = 0
        for j in range(n):
            if ji[j, J_STATE] != DONE:
                stuck += 1
        return stuck, now

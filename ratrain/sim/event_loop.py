"""The simulator's event loop compiled (Numba), over flat arrays: the same events in the same order.

``ratrain.sim.simulator._Sim.run`` is the reference: a Python loop over linked ``_Job`` objects.
:func:`run` converts a built ``_Sim`` to arrays, runs :func:`_loop` on them and writes back what the
code after the run reads (each job's start, end, state, promotion time and priority class; the first
forward start of each layer; the stage's main-path position), so the period search and the result
are those of the Python loop, bit for bit. Exactness rests on doing the same float64 operations in
the same order (no fastmath) and on popping every queue in the same order:

* a resource's queue pops in the order of ``(class, key, seq)``, which is unique (``seq`` counts every
  push and every start, as the Python loop's does), so any correct heap gives the same pops. Keys
  become two floats: a main-path job's key ``()`` sorts before every tuple (``-inf, -inf``), an FSR
  recovery's is ``(backward index, -layer)``, a lifecycle job's ``(deadline, layer)`` or
  ``(now, order hint)`` set when it becomes ready;
* the completion queue pops in the order of ``(end, seq)``; zero-length jobs go through a FIFO;
* the dirty resources of a round are dispatched in ascending order, the lower-bound memo is cleared
  once per round, stale entries are dropped and skipped ones pushed back.

The jitted loop is :mod:`ratrain.sim.event_kernel` (its own file: Numba keys its cache on it alone);
:func:`run` checks that its constants agree with the simulator's. Its compiled code goes to its own
folder, ``<numba>/ratrain-sim`` (the ``simulator-jit`` cache of ``rtcommon.caches``), apart from the
emulator's. A process loads or compiles it holding a lock on that folder, so two processes (the main
job's two sides, test workers) never write it at once; that is why its first call does not wait for an
emulator worker as ``mtemu.jit.hold_jit_for`` asks of the emulator's own code (the hold guards the emulator's folder,
which this code never touches).
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from itertools import chain
from operator import attrgetter
from typing import Iterator

import numpy as np

from mtemu.jit import WAIT_VARIABLE
from ratrain.errors import RatrainError
from ratrain.sim import simulator as sim_module
from ratrain.sim.event_kernel import (
    C_ERR,
    C_FF,
    C_SEQ,
    CACHE_FOLDER,
    COMPUTE,
    DDR,
    DONE,
    E_NO_DEADLINE,
    EPS,
    F_DUR,
    F_END,
    F_KEY1,
    F_KEY2,
    F_PROMOTED,
    F_START,
    FSR,
    J_CLS,
    J_FSR,
    J_HINT,
    J_KIND,
    J_LAYER,
    J_MAIN,
    J_NPRED,
    J_OTHER,
    J_RES,
    J_RES2,
    J_STAGE,
    J_STATE,
    K_OTHER,
    KIND_CODES,
    L_A,
    L_POS,
    L_Z,
    LIFE,
    LINK,
    MAIN,
    NRES,
    R_HOFF,
    R_RUN,
    READY,
    RUNNING,
    S_CHAIN_A,
    S_CHAIN_Z,
    S_NB_A,
    S_NB_Z,
    S_NEXT,
    S_SHARED,
    S_SLOT_A,
    S_SLOT_Z,
    WAITING,
    _loop,
)


# ---------------------------------------------------------------- from and back to the simulation
def _check_codes() -> None:
    """The jitted constants are the simulator's (a change there must be made here too)."""
    s = sim_module
    ours = (NRES, COMPUTE, DDR, LINK, WAITING, READY, RUNNING, DONE, MAIN, FSR, LIFE, EPS)
    theirs = (s.NRES, s._COMPUTE, s._DDR, s._LINK, s._WAITING, s._READY, s._RUNNING, s._DONE, s._MAIN, s._FSR,
              s._LIFE, s._EPS)
    if ours != theirs:
        raise RatrainError(f"ratrain.sim.event_loop: its codes {ours} differ from the simulator's {theirs}")


def _column(jobs: list, name: str, dtype) -> np.ndarray:
    return np.fromiter(map(attrgetter(name), jobs), dtype, len(jobs))


def _edges(jobs: list, side: str, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of each job's predecessors or successors (``counts`` of them), in the order the job lists them."""
    ptr = np.zeros(len(jobs) + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    flat = np.fromiter(map(attrgetter("idx"), chain.from_iterable(map(attrgetter(side), jobs))), np.int64,
                       int(ptr[-1]))
    return ptr, flat


def _logged_edges(log: list[int], npred: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Both CSRs from the edges in the order they were made: a stable sort by either end keeps each job's
    predecessors and successors in the order its own lists hold them."""
    n = len(npred)
    edges = np.array(log, np.int64).reshape(-1, 2)
    src, dst = edges[:, 0], edges[:, 1]
    pred_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(npred, out=pred_ptr[1:])
    succ_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
    return (pred_ptr, src[np.argsort(dst, kind="stable")], succ_ptr, dst[np.argsort(src, kind="stable")])


def _slices(groups: list[list[int]], start: int = 0) -> tuple[np.ndarray, list[int]]:
    """(each group's [a, z) in the concatenation, placed from ``start``; the concatenation)."""
    bounds = np.zeros((len(groups), 2), np.int64)
    flat: list[int] = []
    for i, g in enumerate(groups):
        bounds[i] = start + len(flat), start + len(flat) + len(g)
        flat += g
    return bounds, flat


def _tables(sim) -> tuple[dict, np.ndarray, np.ndarray]:
    """The loop's arguments built from ``sim``'s jobs; (arguments, ji, jf)."""
    jobs = sim.jobs
    n = len(jobs)
    P = sim.P
    nres = NRES * P
    ji = np.zeros((n, 13), np.int64)
    jf = np.zeros((n, 7))
    for col, name in ((J_RES, "res"), (J_RES2, "res2"), (J_STAGE, "stage"), (J_HINT, "order_hint"), (J_CLS, "cls"),
                      (J_NPRED, "npred"), (J_OTHER, "other"), (J_MAIN, "main"), (J_STATE, "state")):
        ji[:, col] = _column(jobs, name, np.int64)
    kinds = list(map(attrgetter("kind"), jobs))
    code = {k: KIND_CODES.get(k, K_OTHER) for k in set(kinds)}
    ji[:, J_KIND] = np.fromiter(map(code.__getitem__, kinds), np.int64, n)
    ji[:, J_LAYER] = [-1 if x is None else x for x in map(attrgetter("layer"), jobs)]
    ji[:, J_FSR] = [-1 if r is None else r.idx for r in map(attrgetter("fsr_r"), jobs)]
    jf[:, F_DUR] = _column(jobs, "dur", np.float64)
    jf[:, F_KEY1] = jf[:, F_KEY2] = -np.inf          # a key () sorts before every tuple
    for j in jobs:
        if j.key:
            if len(j.key) != 2:
                raise RatrainError(f"ratrain.sim.event_loop: a queue key of {len(j.key)} entries ({j.kind})")
            jf[j.idx, F_KEY1], jf[j.idx, F_KEY2] = j.key
    jf[:, F_PROMOTED] = np.nan
    npred = ji[:, J_NPRED]                 # a built job's npred counts its preds
    log = sim.edge_log
    if len(log) == 2 * int(npred.sum()):   # every edge logged (offloading adds its own: read from the jobs)
        pred_ptr, pred_idx, succ_ptr, succ_idx = _logged_edges(log, npred)
    else:
        pred_ptr, pred_idx = _edges(jobs, "preds", npred)
        succ_ptr, succ_idx = _edges(jobs, "succs", np.fromiter(map(len, map(attrgetter("succs"), jobs)), np.int64, n))
    # stages: main chain, neighbour resources, stream slots (one per (stage, stream): the position is the stage's)
    chains, lists = _slices([[j.idx for j in chain] for chain in sim.main_chain])
    neighbours, more = _slices([list(nb) for nb in sim.neighbours], len(lists))
    lists += more
    streams = [[j.idx for j in s] for p in range(P) for s in sim.link_streams[p]]
    sl = np.zeros((len(streams), 3), np.int64)
    bounds, more = _slices(streams, len(lists))
    lists += more
    sl[:, [L_A, L_Z]] = bounds
    sl[:, L_POS] = [i for pos in sim.stream_pos for i in pos]
    per_stage = np.cumsum([0] + [len(sim.link_streams[p]) for p in range(P)])
    si = np.zeros((P, 8), np.int64)
    si[:, [S_CHAIN_A, S_CHAIN_Z]] = chains
    si[:, [S_NB_A, S_NB_Z]] = neighbours
    si[:, S_SLOT_A], si[:, S_SLOT_Z] = per_stage[:-1], per_stage[1:]
    si[:, S_NEXT] = sim.next_main
    si[:, S_SHARED] = sim.link_shared
    # a job enters its resource's queue when ready and once more when promoted, a transfer both ports' queues
    res, res2 = ji[:, J_RES], ji[:, J_RES2]
    # and the completions' queue (the last) takes every job once
    cap = np.append(2 * np.bincount(res, minlength=nres) + np.bincount(res2[res2 >= 0], minlength=nres), n)
    ri = np.zeros((nres + 1, 5), np.int64)
    ri[:, R_RUN] = -1
    ri[1:, R_HOFF] = np.cumsum(cap[:-1])
    total = int(cap.sum())
    nlayers = len(sim.flat)
    args = dict(ji=ji, jf=jf, ri=ri, si=si, sl=sl, lists=np.array(lists, np.int64), pred_ptr=pred_ptr,
                pred_idx=pred_idx, succ_ptr=succ_ptr, succ_idx=succ_idx, heap=np.zeros(total, np.int64),
                ent_f=np.zeros((total, 2)), ent_i=np.zeros((total, 3), np.int64), instant=np.zeros(n, np.int64),
                stack=np.zeros(len(pred_idx) + 1, np.int64), skipped=np.zeros(int(cap.max()), np.int64),
                dirty_list=np.zeros(nres, np.int64), fill_list=np.zeros(nres, np.int64),
                todo=np.zeros(2 * nres, np.int64), first_f=np.full(nlayers, np.nan),
                ff_order=np.zeros(nlayers, np.int64), ctr=np.zeros(9, np.int64),
                deadline_aware=bool(sim.mech.deadline_aware))
    return args, ji, jf


_LOADED = [False]


@contextmanager
def _first_load() -> Iterator[None]:
    """The first call in this process loads (or compiles) the loop: one process at a time per folder."""
    if _LOADED[0]:
        yield
        return
    CACHE_FOLDER.mkdir(parents=True, exist_ok=True)
    held = os.environ.pop(WAIT_VARIABLE, None)       # the emulator's hold is for its own folder
    try:
        with open(CACHE_FOLDER / "lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        if held is not None:
            os.environ[WAIT_VARIABLE] = held
    _LOADED[0] = True


def run(sim) -> None:
    """Run a built ``ratrain.sim.simulator._Sim`` here instead of in ``_Sim.run_python``: the same result."""
    if not sim.jobs:
        return
    _check_codes()
    args, ji, jf = _tables(sim)
    with _first_load():
        stuck, now = _loop(**args)
    ctr = args["ctr"]
    if ctr[C_ERR] == E_NO_DEADLINE:
        raise KeyError("a lifecycle task became ready before its layer's first forward")
    jobs = sim.jobs
    start, end = jf[:, F_START].tolist(), jf[:, F_END].tolist()
    if stuck:
        for j, a, b, st in zip(jobs, start, end, ji[:, J_STATE].tolist(), strict=True):
            j.start, j.end, j.state = a, b, st
    else:
        for j, a, b in zip(jobs, start, end, strict=True):
            j.start, j.end, j.state = a, b, DONE
    promoted = jf[:, F_PROMOTED]
    for i in np.flatnonzero(~np.isnan(promoted)).tolist():
        jobs[i].promoted_at = float(promoted[i])
        jobs[i].cls = int(ji[i, J_CLS])
    first_f = args["first_f"]
    sim.first_f_start = {layer: float(first_f[layer]) for layer in args["ff_order"][:ctr[C_FF]].tolist()}
    sim.next_main = args["si"][:, S_NEXT].tolist()
    pos = iter(args["sl"][:, L_POS].tolist())
    sim.stream_pos = [[next(pos) for _ in stream] for stream in sim.stream_pos]
    sim.now = float(now)
    sim.seq = int(ctr[C_SEQ])
    if stuck:
        j = jobs[int(np.flatnonzero(ji[:, J_STATE] != DONE)[0])]
        raise RatrainError(f"simulator deadlock: {stuck} tasks never ran, first "
                           f"{j.kind}(stage {j.stage}, mb {j.mb}, layer {j.layer})")

"""The cluster executor: runs one program per DSP over shared GSM and DDR, with DMA and barriers.

Model
- Every bundle takes one cycle; all of its slots issue together. Results are written at issue
  (equivalent to the exposed pipeline for programs the assembler accepts).
- A taken branch, call or return costs ``latencies.branch_delay`` cycles (stall 'branch').
- DMA: a transfer occupies one bandwidth server: DDR if either end is DDR, else GSM if either
  end is GSM, else the DSP's local SM<->AM engine. Servers are first-come first-served in
  emulated time: a transfer starts at max(issue + dma_latency, server free, channel free) and
  holds the server for bytes / (bandwidth / clock) + rows x row_overhead cycles. A broadcast
  reads its source once. Data moves at issue; programs must wait on the channel before using
  the destination (as on the real machine).
- Scheduling: the DSP with the smallest clock runs until it reaches a bundle with a DMA,
  wait or barrier while another DSP is behind it; so every shared-resource reservation is made
  in emulated-time order and the result is deterministic.
- Two modes with identical cycle counts: functional (data in flat byte memory, FP16 as uint16
  bits, FP32 arithmetic) and timing-only (no data touched). Addresses are checked in both.

Errors come back from the jitted loop as codes and become :class:`MachineError` naming DSP, PC,
unit and address.

Tracing (``Cluster.run(trace=TraceOptions(...))``) records into preallocated arrays: per DSP the
cycles where its state changes (issuing, latency, branch, DMA wait, barrier; equal consecutive
states extend one span), every DMA transfer and every barrier release. A full buffer keeps
counting and the :class:`~mtemu.trace.Trace` reports the truncation. Tracing off passes
zero-length arrays (one compiled signature) and costs one test per bundle.
"""
from __future__ import annotations

import functools
import math
import os
import threading
import warnings
from dataclasses import dataclass, field
from time import monotonic
from typing import NamedTuple

import numpy as np
from numba import njit

from rtcommon.hostmem import check_host_memory, small_pages

from . import isa
from .assembler import Program
from .dma import move
from .errors import MachineError
from .fast import prepared as prepared_store
from .fast.queues import (
    N_DEFER_TABLES,
    accept_data,
    defer_buffers,
    defer_dma,
    defer_tables,
    deferrable,
    flush,
    may_flush,
    must_flush,
    settle,
)
from .fast.runs import RunTables, build_blocks, empty_blocks, try_skip
from .fp16 import f16_to_f32_into_reference, f32_to_f16_bits, widen_f16
from .platform import DEFAULT, Platform, validate_platform
from .trace import DMA_FIELDS, N_DMA_FIELDS, TS_BARRIER, TS_BRANCH, TS_DMA, TS_ISSUE, Trace, TraceOptions

# error codes
E_OK, E_ADDR, E_ALIGN, E_PC, E_DEADLOCK, E_CYCLES, E_CHANNEL, E_DMA_LATE = 0, 1, 2, 3, 4, 5, 6, 7
# run-state control words (``ctl``): DSP whose slice a budget cut (-1: none), finished flag,
# bundles this call may still issue
CTL_RESUME, CTL_DONE, CTL_BUDGET = 0, 1, 2
# Bundles per call of the jitted loop: between calls Python sees Ctrl-C and the wall clock.
CHUNK_BUNDLES = 1 << 22
# Largest cycle limit: emulated times stay far below int64 overflow.
MAX_CYCLES_LIMIT = 1 << 60
# Default of Cluster.run: about 95 minutes of emulated time; program runs derive their own.
DEFAULT_MAX_CYCLES = 10 ** 13
# Address operands and descriptors are bounded (isa.MAX_*): register + immediate cannot wrap into a
# valid address and (rows - 1) * stride + row_bytes, rows * row_bytes stay far below 2**63.
MAX_ADDRESS_IMM, MAX_DESC_ROWS, MAX_DESC_EXTENT = isa.MAX_ADDRESS_IMM, isa.MAX_DESC_ROWS, isa.MAX_DESC_EXTENT
# per-DSP stat columns
S_CYCLES, S_BUNDLES, S_VFMA, S_DMA_BYTES, S_DMAS, S_END = 0, 1, 2, 3, 4, 5
S_STALL0 = 6                      # + isa.ST_* (latency, branch, dma_wait, barrier)
S_BUSY0 = S_STALL0 + len(isa.STALLS)
N_STATS = S_BUSY0 + isa.N_UNITS
# server indices
SRV_DDR, SRV_GSM, SRV_LOCAL = 0, 1, 2
# DMA trace record columns (mtemu.trace.DMA_FIELDS)
TD_ISSUE, TD_SERVER, TD_SRC, TD_DST, TD_BYTES, TD_ROWS, TD_DSP, TD_CHANNEL, TD_MODE = range(N_DMA_FIELDS)
assert DMA_FIELDS[TD_MODE] == "mode"
ERR_FIELDS = 8          # err[:8] code and location; err[8:8+dsps] DSP states, then PCs (deadlock);
#                         E_DMA_LATE: err[7] the transfer's end, err[8] its issue cycle


# FP16 -> FP32 for every bit pattern (scalar broadcasts look it up; exact by construction).
F16_TABLE = np.empty(65536, np.float32)
f16_to_f32_into_reference(np.arange(65536, dtype=np.uint16), F16_TABLE)


@njit(cache=True)
def _space_base_cap(space, d, caps, bases):
    if space == isa.SP_SM:
        return bases[0] + d * caps[0], caps[0]
    if space == isa.SP_AM:
        return bases[1] + d * caps[1], caps[1]
    if space == isa.SP_GSM:
        return bases[2], caps[2]
    return bases[3], caps[3]


@njit(cache=True)
def _fail(err, code, d, pc, unit, space, addr, size):
    err[0] = code
    err[1] = d
    err[2] = pc
    err[3] = unit
    err[4] = space
    err[5] = addr
    err[6] = size


@njit(cache=True)
def _tr_state(ev, nev, last, cut, d, t, st):
    """Record that DSP d is in state ``st`` from cycle t; equal consecutive states extend one span."""
    if last[d] == st:
        return
    last[d] = st
    k = nev[d]
    if k < ev.shape[1]:
        ev[d, k, 0] = t
        ev[d, k, 1] = st
    elif k == ev.shape[1]:
        cut[d] = t             # the recorded timeline of DSP d is exact up to this cycle
    nev[d] = k + 1


class Linked(NamedTuple):
    """The programs as the machine's loop runs them (:func:`_link`): every DSP's code in one array
    (bundles, units, fields ``isa.F_*``), DSP d's PCs [lo[d], hi[d]), the descriptors (columns
    ``isa.D_*``) and where DSP d's start."""

    code: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    descs: np.ndarray
    desc_off: np.ndarray


class MachineState(NamedTuple):
    """The cluster's registers and memory: scalar and vector registers per DSP, the flat memory as
    uint16 and float32 views, each space's size and base (SM, AM, GSM, DDR; SM and AM per DSP), and the
    FP16 -> FP32 table."""

    sregs: np.ndarray
    vregs: np.ndarray
    mem16: np.ndarray
    mem32: np.ndarray
    caps: np.ndarray
    bases: np.ndarray
    f16tab: np.ndarray
    vregs64: np.ndarray         # the FP64 ops' register file (DSP, register, FP64 lane)
    mem64: np.ndarray           # the flat memory as float64 (functional mode; else one dummy word)


class Settings(NamedTuple):
    """What one run does and the platform's timing figures the loop reads."""

    functional: bool
    dsps: int
    lanes: int                  # vector lanes computed (1 in timing mode)
    lat_branch: int             # cycles a taken branch adds
    dma_latency: int            # cycles from issue to a transfer's start
    bpc: np.ndarray             # bytes per cycle of the DDR, GSM and local servers
    row_overhead: float         # cycles per transferred row
    max_cycles: int
    threads: bool               # waiting work may run over threads
    lanes64: int                # FP64 vector lanes computed (1 in timing mode)
    dma_issue: int              # cycles the issuing DSP spends launching a DMA
    units64: int                # FMA units (vlddg gathers one vector per unit)


class Counters(NamedTuple):
    """What the run counts: per DSP ``S_*`` columns, the error record (``E_*`` code and location), bytes
    per server kind and busy cycles per server."""

    stats: np.ndarray
    err: np.ndarray
    server_bytes: np.ndarray
    server_busy: np.ndarray


class TraceBuffers(NamedTuple):
    """The trace's recording arrays (:func:`_trace_buffers`; zero-length when not tracing)."""

    ev: np.ndarray              # (dsps, events, 2): cycle, TS_* state
    nev: np.ndarray
    last: np.ndarray
    cut: np.ndarray
    dma: np.ndarray             # (transfers, TD_*)
    dma_t: np.ndarray
    bar: np.ndarray
    counts: np.ndarray          # transfers, barriers recorded


class RunState(NamedTuple):
    """Where the run stands between calls of the loop: each DSP's cycle, PC and state (0 running, 1 at
    a barrier, 2 halted), the completion cycle of each channel's last transfer, when each DMA server
    frees, and the control words (``CTL_*``)."""

    time: np.ndarray
    pc: np.ndarray
    state: np.ndarray
    chan: np.ndarray
    srv_free: np.ndarray
    ctl: np.ndarray


def _machine_loop(functional: bool):
    """The machine's loop compiled for one mode: ``functional`` is a constant of the compiled code, so
    Numba's branch pruning drops the data paths (and the deferred-work queues) from the timing machine,
    which every timing run uses; compiling that one types and lowers about half the code. Each mode is
    its own module-level function with its own name, so each has its own entries in Numba's cache."""

    def run(prog, machine, settings, counters, trace, runs, queues, run_state):
        """Run until every DSP halts (``ctl[CTL_DONE]`` = 1), a fault (``err``), or ``ctl[CTL_BUDGET]``
        bundles; the run state lives in the caller's arrays, so the next call continues exactly where
        this one stopped. Arguments: :class:`Linked`, :class:`MachineState`, :class:`Settings`,
        :class:`Counters`, :class:`TraceBuffers`, :class:`~mtemu.fast.runs.RunTables`,
        :class:`~mtemu.fast.queues.Queues`, :class:`RunState`."""
        code, lo, hi, descs, desc_off = prog.code, prog.lo, prog.hi, prog.descs, prog.desc_off
        sregs, vregs, mem16, mem32 = machine.sregs, machine.vregs, machine.mem16, machine.mem32
        caps, bases, f16tab = machine.caps, machine.bases, machine.f16tab
        vregs64, mem64 = machine.vregs64, machine.mem64
        lanes64, dma_issue, units64 = settings.lanes64, settings.dma_issue, settings.units64
        dsps, lanes, threads = settings.dsps, settings.lanes, settings.threads
        lat_branch, dma_latency, bpc = settings.lat_branch, settings.dma_latency, settings.bpc
        row_overhead, max_cycles = settings.row_overhead, settings.max_cycles
        stats, err = counters.stats, counters.err
        server_bytes, server_busy = counters.server_bytes, counters.server_busy
        tr_ev, tr_nev, tr_last, tr_cut = trace.ev, trace.nev, trace.last, trace.cut
        tr_dma, tr_dma_t, tr_bar, tr_counts = trace.dma, trace.dma_t, trace.bar, trace.counts
        blk_end = runs.end
        dq_touch, dq_n, dq_range = queues.touches, queues.n, queues.ranges
        time, pc, state, chan = run_state.time, run_state.pc, run_state.state, run_state.chan
        srv_free, ctl = run_state.srv_free, run_state.ctl
        tracing = tr_nev.shape[0] > 0
        skipping = blk_end.shape[0] > 0           # no trace: plain runs in one step
        deferring = dq_n.shape[0] > 0             # functional: their data may wait (mtemu.fast.queues)
        # (tested as `functional and deferring`: a constant first operand prunes the queues' code)
        # time: cycle of each DSP; state: 0 running, 1 at barrier, 2 halted; chan: completion cycle
        # of each channel's last transfer; srv_free: when each DMA server frees
        nunits = code.shape[1]
        budget = ctl[CTL_BUDGET]
        while True:
            d = -1
            if ctl[CTL_RESUME] >= 0:
                # finish the slice the budget cut: the others' clocks (and so `limit`) are unchanged
                d = ctl[CTL_RESUME]
                ctl[CTL_RESUME] = -1
            else:
                best = np.int64(1) << 62
                for i in range(dsps):
                    if state[i] == 0 and time[i] < best:
                        best = time[i]
                        d = i
            if d < 0:
                waiting = 0
                halted = 0
                release = np.int64(0)
                for i in range(dsps):
                    if state[i] == 1:
                        waiting += 1
                        if time[i] > release:
                            release = time[i]
                    elif state[i] == 2:
                        halted += 1
                if waiting == 0:
                    break
                if halted > 0:
                    first = 0
                    for i in range(dsps):
                        if state[i] == 1:
                            first = i
                            break
                    _fail(err, E_DEADLOCK, first, pc[first], isa.SBR, waiting, halted, 0)
                    for i in range(dsps):
                        err[ERR_FIELDS + i] = state[i]
                        err[ERR_FIELDS + dsps + i] = pc[i]
                    return
                if tracing:
                    k = tr_counts[1]
                    if k < tr_bar.shape[0]:
                        first_arrival = release
                        for i in range(dsps):
                            if state[i] == 1 and time[i] < first_arrival:
                                first_arrival = time[i]
                        tr_bar[k, 0] = first_arrival
                        tr_bar[k, 1] = release
                        tr_bar[k, 2] = waiting
                    tr_counts[1] = k + 1
                for i in range(dsps):
                    if state[i] == 1:
                        stats[i, S_STALL0 + isa.ST_BARRIER] += release - time[i]
                        if tracing and release > time[i]:
                            _tr_state(tr_ev, tr_nev, tr_last, tr_cut, i, time[i], TS_BARRIER)
                        time[i] = release
                        state[i] = 0
                        pc[i] += 1
                continue
            limit = np.int64(1) << 62
            for i in range(dsps):
                if i != d and state[i] == 0 and time[i] < limit:
                    limit = time[i]
            t = time[d]
            p = pc[d]
            while True:
                if p < lo[d] or p >= hi[d]:
                    _fail(err, E_PC, d, p, isa.SBR, 0, p, 0)
                    time[d] = t
                    return
                if t > max_cycles:
                    _fail(err, E_CYCLES, d, p, isa.SBR, 0, t, max_cycles)
                    time[d] = t
                    return
                # --- straight-line blocks (mtemu.fast.runs): the same counters as bundle by bundle ---
                # (only where a run starts: a call passes dozens of array fields, and most bundles start
                # none; a 1024^3 GEMM calls try_skip 2,448 times instead of 16,035)
                if skipping and p < blk_end.shape[0] and blk_end[p] > p:
                    e = try_skip(d, p, t, max_cycles, sregs, caps, stats, S_BUNDLES, S_VFMA,
                                 S_STALL0 + isa.ST_LATENCY, S_STALL0 + isa.ST_BRANCH, S_BUSY0, runs)
                    if e >= 0:
                        if functional:
                            accept_data(d, p, e, runs, queues, sregs, vregs, mem16, mem32, f16tab, bases, caps, lanes,
                                        threads)
                        t += e - p
                        p = e
                        continue
                # ---------------------------------------------------------------------------------
                if budget <= 0:
                    # out of bundles for this call: stop before bundle p, resume here next call
                    time[d] = t
                    pc[d] = p
                    ctl[CTL_RESUME] = d
                    return
                budget -= 1
                # yield before a shared-resource interaction if another DSP is behind us
                sync = (code[p, isa.SIEU, isa.F_OP] == isa.OP_DMA) or (code[p, isa.SBR, isa.F_OP] == isa.OP_DMAWAIT) \
                    or (code[p, isa.SBR, isa.F_OP] == isa.OP_BARRIER)
                if sync and t > limit:
                    break
                if functional and deferring:
                    # after the yield: the DSPs behind have queued their work too, so it can run in parallel
                    if may_flush(p, code, dq_touch):
                        need = must_flush(d, p, code, descs, desc_off, dq_touch, sregs, dq_n, dq_range)
                        if need > 0:            # (settle acts only then: 16 calls in a 1024^3 GEMM)
                            settle(d, need, queues, vregs, mem16, mem32, f16tab, bases, caps, lanes, threads)
                next_p = p + 1
                extra = np.int64(0)
                extra_state = TS_BRANCH
                useful = False
                stop = False
                for u in range(nunits):
                    op = code[p, u, isa.F_OP]
                    if op == 0:
                        continue
                    if op == isa.OP_NOP:
                        continue
                    useful = True
                    stats[d, S_BUSY0 + u] += 1
                    if op == isa.OP_VFMA:
                        stats[d, S_VFMA] += 1
                        if functional:
                            vd = code[p, u, isa.F_R0]
                            va = code[p, u, isa.F_R1]
                            vb = code[p, u, isa.F_R2]
                            for k in range(lanes):
                                vregs[d, vd, k] += vregs[d, va, k] * vregs[d, vb, k]
                    elif op == isa.OP_SVBCAST:
                        if functional:
                            x = f16tab[sregs[d, code[p, u, isa.F_R1]] & 0xFFFF]
                            vd = code[p, u, isa.F_R0]
                            for k in range(lanes):
                                vregs[d, vd, k] = x
                    elif op == isa.OP_VEXP or op == isa.OP_VLOG or op == isa.OP_VMAX:
                        if functional:
                            vd = code[p, u, isa.F_R0]
                            va = code[p, u, isa.F_R1]
                            vb = code[p, u, isa.F_R2]
                            for k in range(lanes):
                                xa = vregs[d, va, k]
                                if op == isa.OP_VEXP:
                                    vregs[d, vd, k] = np.exp(xa)
                                elif op == isa.OP_VLOG:
                                    vregs[d, vd, k] = np.log(xa)
                                else:
                                    xb = vregs[d, vb, k]
                                    vregs[d, vd, k] = xa if (xa > xb or xa != xa) else xb
                    elif op == isa.OP_SVBCASTW:
                        if functional:
                            xw = np.uint32(sregs[d, code[p, u, isa.F_R1]] & 0xFFFFFFFF).view(np.float32)
                            vd = code[p, u, isa.F_R0]
                            for k in range(lanes):
                                vregs[d, vd, k] = xw
                    elif op == isa.OP_VFMAD:
                        stats[d, S_VFMA] += 1
                        if functional:
                            vd = code[p, u, isa.F_R0]
                            va = code[p, u, isa.F_R1]
                            vb = code[p, u, isa.F_R2]
                            for k in range(lanes64):
                                vregs64[d, vd, k] += vregs64[d, va, k] * vregs64[d, vb, k]
                    elif op == isa.OP_SVBCASTD:
                        if functional:
                            xd = np.int64(sregs[d, code[p, u, isa.F_R1]]).view(np.float64)
                            vd = code[p, u, isa.F_R0]
                            for k in range(lanes64):
                                vregs64[d, vd, k] = xd
                    elif op == isa.OP_SLDD or op == isa.OP_SSTD:
                        a = sregs[d, code[p, u, isa.F_R1]] + code[p, u, isa.F_IMM0]
                        if a < 0 or a > caps[0] - 8:
                            _fail(err, E_ADDR, d, p, u, isa.SP_SM, a, 8)
                            time[d] = t
                            return
                        if a & 7:
                            _fail(err, E_ALIGN, d, p, u, isa.SP_SM, a, 8)
                            time[d] = t
                            return
                        if functional:
                            i64 = (bases[0] + d * caps[0] + a) >> 3
                            if op == isa.OP_SLDD:
                                word = np.float64(mem64[i64])
                                sregs[d, code[p, u, isa.F_R0]] = word.view(np.int64)
                            else:
                                mem64[i64] = np.int64(sregs[d, code[p, u, isa.F_R2]]).view(np.float64)
                    elif op == isa.OP_VLDD or op == isa.OP_VSTD:
                        a = sregs[d, code[p, u, isa.F_R1]] + code[p, u, isa.F_IMM0]
                        size = lanes64 * 8
                        if a < 0 or a > caps[1] - size:
                            _fail(err, E_ADDR, d, p, u, isa.SP_AM, a, size)
                            time[d] = t
                            return
                        if a & 7:
                            _fail(err, E_ALIGN, d, p, u, isa.SP_AM, a, 8)
                            time[d] = t
                            return
                        if functional:
                            i0 = (bases[1] + d * caps[1] + a) >> 3
                            if op == isa.OP_VLDD:
                                vd = code[p, u, isa.F_R0]
                                for k in range(lanes64):
                                    vregs64[d, vd, k] = mem64[i0 + k]
                            else:
                                vs = code[p, u, isa.F_R2]
                                for k in range(lanes64):
                                    mem64[i0 + k] = vregs64[d, vs, k]
                    elif op == isa.OP_VLDDG or op == isa.OP_VLDDM4:
                        a = sregs[d, code[p, u, isa.F_R1]] + code[p, u, isa.F_IMM0]
                        if op == isa.OP_VLDDG:
                            stride = sregs[d, code[p, u, isa.F_R2]]
                            w = lanes64 // units64          # lanes per unit (lanes past units x w keep their value)
                            lo_a = min(a, a + (units64 - 1) * stride)
                            hi_a = max(a, a + (units64 - 1) * stride) + max(w, 1) * 8
                        else:
                            stride = np.int64(32)
                            w = lanes64
                            lo_a = a
                            hi_a = a + 32 * (lanes64 - 1) + 8
                        if lo_a < 0 or hi_a > caps[1]:
                            _fail(err, E_ADDR, d, p, u, isa.SP_AM, lo_a, hi_a - lo_a)
                            time[d] = t
                            return
                        if (a | stride) & 7:
                            _fail(err, E_ALIGN, d, p, u, isa.SP_AM, a, 8)
                            time[d] = t
                            return
                        if functional:
                            i0 = (bases[1] + d * caps[1] + a) >> 3
                            vd = code[p, u, isa.F_R0]
                            if op == isa.OP_VLDDG:
                                for k in range(w * units64):
                                    vregs64[d, vd, k] = mem64[i0 + (k // w) * (stride >> 3) + k % w]
                            else:
                                for k in range(lanes64):
                                    vregs64[d, vd, k] = mem64[i0 + 4 * k]
                    elif op == isa.OP_SMVD:
                        lane = code[p, u, isa.F_IMM0]
                        if lane < 0 or (functional and lane >= lanes64):
                            _fail(err, E_ADDR, d, p, u, isa.SP_AM, lane, 8)
                            time[d] = t
                            return
                        if functional:
                            xv = np.float64(vregs64[d, code[p, u, isa.F_R1], lane])
                            sregs[d, code[p, u, isa.F_R0]] = xv.view(np.int64)
                    elif op == isa.OP_SFADDD:
                        if functional:
                            xa = np.int64(sregs[d, code[p, u, isa.F_R1]]).view(np.float64)
                            xb = np.int64(sregs[d, code[p, u, isa.F_R2]]).view(np.float64)
                            sregs[d, code[p, u, isa.F_R0]] = np.float64(xa + xb).view(np.int64)
                    elif op == isa.OP_SADDI:
                        sregs[d, code[p, u, isa.F_R0]] = sregs[d, code[p, u, isa.F_R1]] + code[p, u, isa.F_IMM0]
                    elif op == isa.OP_SADD:
                        sregs[d, code[p, u, isa.F_R0]] = sregs[d, code[p, u, isa.F_R1]] + sregs[d, code[p, u, isa.F_R2]]
                    elif op == isa.OP_SMOVI:
                        sregs[d, code[p, u, isa.F_R0]] = code[p, u, isa.F_IMM0]
                    elif op == isa.OP_SLDH or op == isa.OP_SSTH:
                        a = sregs[d, code[p, u, isa.F_R1]] + code[p, u, isa.F_IMM0]
                        if a < 0 or a > caps[0] - 2:
                            _fail(err, E_ADDR, d, p, u, isa.SP_SM, a, 2)
                            time[d] = t
                            return
                        if a & 1:
                            _fail(err, E_ALIGN, d, p, u, isa.SP_SM, a, 2)
                            time[d] = t
                            return
                        if functional:
                            idx = (bases[0] + d * caps[0] + a) >> 1
                            if op == isa.OP_SLDH:
                                sregs[d, code[p, u, isa.F_R0]] = mem16[idx]
                            else:
                                mem16[idx] = np.uint16(sregs[d, code[p, u, isa.F_R2]] & 0xFFFF)
                    elif op == isa.OP_VLDH or op == isa.OP_VSTH or op == isa.OP_VLDW or op == isa.OP_VSTW:
                        a = sregs[d, code[p, u, isa.F_R1]] + code[p, u, isa.F_IMM0]
                        half = op == isa.OP_VLDH or op == isa.OP_VSTH
                        size = lanes * 2 if half else lanes * 4
                        if a < 0 or a > caps[1] - size:
                            _fail(err, E_ADDR, d, p, u, isa.SP_AM, a, size)
                            time[d] = t
                            return
                        if (half and (a & 1)) or ((not half) and (a & 3)):
                            _fail(err, E_ALIGN, d, p, u, isa.SP_AM, a, 2 if half else 4)
                            time[d] = t
                            return
                        if functional:
                            base = bases[1] + d * caps[1] + a
                            if op == isa.OP_VLDH:
                                i0 = base >> 1
                                src = mem16[i0:i0 + lanes]
                                dst = vregs[d, code[p, u, isa.F_R0]]
                                for k in range(lanes):
                                    dst[k] = widen_f16(src[k])
                            elif op == isa.OP_VLDW:
                                vd = code[p, u, isa.F_R0]
                                i0 = base >> 2
                                for k in range(lanes):
                                    vregs[d, vd, k] = mem32[i0 + k]
                            elif op == isa.OP_VSTW:
                                vs = code[p, u, isa.F_R2]
                                i0 = base >> 2
                                for k in range(lanes):
                                    mem32[i0 + k] = vregs[d, vs, k]
                            else:
                                vs = code[p, u, isa.F_R2]
                                i0 = base >> 1
                                for k in range(lanes):
                                    mem16[i0 + k] = f32_to_f16_bits(vregs[d, vs, k])
                    elif op == isa.OP_DMA:
                        ch = code[p, u, isa.F_R0]
                        di = desc_off[d] + code[p, u, isa.F_R1]
                        src_sp = descs[di, isa.D_SRC]
                        dst_sp = descs[di, isa.D_DST]
                        rows = descs[di, isa.D_ROWS]
                        rowb = descs[di, isa.D_ROWB]
                        sstr = descs[di, isa.D_SSTR]
                        dstr = descs[di, isa.D_DSTR]
                        mode = descs[di, isa.D_MODE]
                        sa = sregs[d, code[p, u, isa.F_R2]] + code[p, u, isa.F_IMM0]
                        da = sregs[d, code[p, u, isa.F_R3]] + code[p, u, isa.F_IMM1]
                        sbase, scap = _space_base_cap(src_sp, d, caps, bases)
                        dbase, dcap = _space_base_cap(dst_sp, d, caps, bases)
                        align = 4 if mode == isa.DMA_REDUCE_ADD else 2
                        if rows == 0:
                            # an empty transfer touches no memory
                            sa = 0
                            da = 0
                        # extents are bounded by the descriptor check (< 2**46); test the start
                        # first so that start + extent cannot overflow
                        sext = (rows - 1) * sstr + rowb if rows > 0 else 0
                        dext = (rows - 1) * dstr + rowb if rows > 0 else 0
                        if sa < 0 or sa > scap or sext > scap - sa:
                            _fail(err, E_ADDR, d, p, u, src_sp, sa, sext)
                            time[d] = t
                            return
                        if da < 0 or da > dcap or dext > dcap - da:
                            _fail(err, E_ADDR, d, p, u, dst_sp, da, dext)
                            time[d] = t
                            return
                        if (sa % align) or (da % align) or (sstr % align) or (dstr % align):
                            _fail(err, E_ALIGN, d, p, u, src_sp, sa, align)
                            time[d] = t
                            return
                        if functional and rows > 0:
                            # into AM, the data move waits, in order, with the runs of the DSP it writes
                            wait = deferring and deferrable(mode, src_sp, dst_sp)
                            for tg in range(dsps if mode == isa.DMA_BROADCAST else 1):
                                tq = tg if mode == isa.DMA_BROADCAST else d
                                tb, _c = _space_base_cap(dst_sp, tq, caps, bases)
                                if wait:
                                    defer_dma(tq, mode, src_sp, sa, sext, sbase, dst_sp, da, dext, tb, rows, rowb, sstr,
                                              dstr, queues, vregs, mem16, mem32, f16tab, bases, caps, lanes, threads)
                                else:
                                    move(mem16, mem32, mode, sbase + sa, tb + da, rows, rowb, sstr, dstr)
                        nbytes = rows * rowb
                        if src_sp == isa.SP_DDR or dst_sp == isa.SP_DDR:
                            srv = SRV_DDR
                        elif src_sp == isa.SP_GSM or dst_sp == isa.SP_GSM:
                            srv = SRV_GSM
                        else:
                            srv = SRV_LOCAL + d
                        bw = bpc[min(srv, 2)]
                        start = float(t + dma_latency)
                        if srv_free[srv] > start:
                            start = srv_free[srv]
                        if chan[d, ch] > start:
                            start = float(chan[d, ch])
                        dur = nbytes / bw + rows * row_overhead
                        if start + dur > max_cycles:
                            # the transfer alone runs past the limit: too slow, not a loop
                            _fail(err, E_DMA_LATE, d, p, u, srv, nbytes, max_cycles)
                            err[7] = np.int64(min(start + dur, 4e18))
                            err[ERR_FIELDS] = t
                            time[d] = t
                            return
                        srv_free[srv] = start + dur
                        chan[d, ch] = np.int64(np.ceil(start + dur))
                        server_bytes[min(srv, 2)] += nbytes
                        server_busy[srv] += dur
                        if tracing:
                            k = tr_counts[0]
                            if k < tr_dma.shape[0]:
                                tr_dma[k, TD_ISSUE] = t
                                tr_dma[k, TD_SERVER] = srv
                                tr_dma[k, TD_SRC] = src_sp
                                tr_dma[k, TD_DST] = dst_sp
                                tr_dma[k, TD_BYTES] = nbytes
                                tr_dma[k, TD_ROWS] = rows
                                tr_dma[k, TD_DSP] = d
                                tr_dma[k, TD_CHANNEL] = ch
                                tr_dma[k, TD_MODE] = mode
                                tr_dma_t[k, 0] = start
                                tr_dma_t[k, 1] = start + dur
                            tr_counts[0] = k + 1
                        stats[d, S_DMA_BYTES] += nbytes
                        stats[d, S_DMAS] += 1
                        if dma_issue > 0:
                            # launching the transfer occupies the DSP (the family's DMA set-up cost)
                            extra += dma_issue
                            stats[d, S_STALL0 + isa.ST_DMA] += dma_issue
                            extra_state = TS_DMA
                    elif op == isa.OP_DMAWAIT:
                        ch = code[p, u, isa.F_R0]
                        if chan[d, ch] > t + 1:
                            stats[d, S_STALL0 + isa.ST_DMA] += chan[d, ch] - (t + 1)
                            extra += chan[d, ch] - (t + 1)
                            extra_state = TS_DMA
                    elif op == isa.OP_BARRIER:
                        stop = True
                    elif op == isa.OP_BR:
                        next_p = lo[d] + code[p, u, isa.F_IMM0]
                        extra += lat_branch
                        stats[d, S_STALL0 + isa.ST_BRANCH] += lat_branch
                    elif op == isa.OP_BNZ:
                        if sregs[d, code[p, u, isa.F_R1]] != 0:
                            next_p = lo[d] + code[p, u, isa.F_IMM0]
                            extra += lat_branch
                            stats[d, S_STALL0 + isa.ST_BRANCH] += lat_branch
                    elif op == isa.OP_BDEC:
                        r = code[p, u, isa.F_R1]
                        sregs[d, r] -= 1
                        if sregs[d, r] != 0:
                            next_p = lo[d] + code[p, u, isa.F_IMM0]
                            extra += lat_branch
                            stats[d, S_STALL0 + isa.ST_BRANCH] += lat_branch
                    elif op == isa.OP_CALL:
                        sregs[d, code[p, u, isa.F_R0]] = p + 1 - lo[d]
                        next_p = lo[d] + code[p, u, isa.F_IMM0]
                        extra += lat_branch
                        stats[d, S_STALL0 + isa.ST_BRANCH] += lat_branch
                    elif op == isa.OP_RET:
                        next_p = lo[d] + sregs[d, code[p, u, isa.F_R1]]
                        extra += lat_branch
                        stats[d, S_STALL0 + isa.ST_BRANCH] += lat_branch
                    elif op == isa.OP_HALT:
                        state[d] = 2
                        stop = True
                if not useful:
                    # an all-nop bundle: padding for latency or branch
                    reason = isa.ST_LATENCY
                    for u in range(nunits):
                        if code[p, u, isa.F_OP] == isa.OP_NOP:
                            reason = code[p, u, isa.F_IMM0]
                            break
                    stats[d, S_STALL0 + reason] += 1
                    # (the state test is inlined: a call per bundle would cost more than the bundle)
                    if tracing and tr_last[d] != 1 + reason:
                        _tr_state(tr_ev, tr_nev, tr_last, tr_cut, d, t, 1 + reason)
                elif tracing and tr_last[d] != TS_ISSUE:
                    _tr_state(tr_ev, tr_nev, tr_last, tr_cut, d, t, TS_ISSUE)
                if tracing and extra > 0:
                    _tr_state(tr_ev, tr_nev, tr_last, tr_cut, d, t + 1, extra_state)
                stats[d, S_BUNDLES] += 1
                t += 1 + extra
                if stop:
                    if state[d] == 0:
                        state[d] = 1     # barrier: pc stays on the barrier until release
                    else:
                        p = next_p
                    break
                p = next_p
            time[d] = t
            pc[d] = p
        if functional and deferring:
            flush(queues, vregs, mem16, mem32, f16tab, bases, caps, lanes, threads)
        ctl[CTL_DONE] = 1
        for i in range(dsps):
            stats[i, S_CYCLES] = time[i]
            end = time[i]
            for c in range(64):
                if chan[i, c] > end:
                    end = chan[i, c]
            stats[i, S_END] = end

    run.__name__ = run.__qualname__ = "_run_functional" if functional else "_run_timing"
    return njit(cache=True)(run)


_run_functional = _machine_loop(True)
_run_timing = _machine_loop(False)


@dataclass
class RunStats:
    """Counters of one cluster run; all figures come from the emulated machine."""

    cycles: int                      # makespan: last DSP halt or last DMA completion
    per_dsp: np.ndarray              # (dsps, N_STATS) raw counters
    server_bytes: dict[str, int]
    platform: Platform
    lanes: int
    # cycles each DMA server was busy: "ddr", "gsm", then "local0".."local{dsps-1}" (fractional:
    # a transfer holds its server bytes / (bandwidth / clock) + rows x row overhead cycles)
    server_busy: dict[str, float] = field(default_factory=dict)
    trace: Trace | None = None

    @property
    def vfma(self) -> int:
        return int(self.per_dsp[:, S_VFMA].sum())

    def stall_cycles(self) -> dict[str, int]:
        """Cycles lost per reason, summed over DSPs."""
        out = {name: int(self.per_dsp[:, S_STALL0 + k].sum()) for k, name in enumerate(isa.STALLS)}
        # idle after a DSP halts until the makespan (load imbalance)
        out["imbalance"] = int((self.cycles - self.per_dsp[:, S_CYCLES]).sum())
        return out

    def busy_cycles(self) -> dict[str, int]:
        return {name: int(self.per_dsp[:, S_BUSY0 + u].sum()) for u, name in enumerate(isa.UNITS)}

    @property
    def dma_bytes(self) -> int:
        return int(self.per_dsp[:, S_DMA_BYTES].sum())

    @property
    def bundles(self) -> int:
        return int(self.per_dsp[:, S_BUNDLES].sum())

    def seconds(self) -> float:
        return self.cycles / self.platform.clock_hz


@dataclass
class Cluster:
    """Machine state: memories and registers of one cluster, sized for a workload."""

    platform: Platform = DEFAULT
    ddr_bytes: int = 0
    functional: bool = True
    mem: np.ndarray = field(init=False)
    sregs: np.ndarray = field(init=False)
    vregs: np.ndarray = field(init=False)
    vregs64: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        p = self.platform = validate_platform(self.platform, "Cluster platform")
        if isinstance(self.ddr_bytes, bool) or not isinstance(self.ddr_bytes, (int, np.integer)):
            raise MachineError(f"ddr_bytes must be an integer, got {self.ddr_bytes!r}")
        if self.ddr_bytes < 0 or self.ddr_bytes > p.ddr_bytes:
            raise MachineError(f"workload needs {self.ddr_bytes} bytes of DDR; the platform has {p.ddr_bytes}")
        self.ddr_bytes = (self.ddr_bytes + 63) // 64 * 64
        self.caps = np.array([p.sm_bytes, p.am_bytes, p.gsm_bytes, self.ddr_bytes], dtype=np.int64)
        sm_total = p.dsps * p.sm_bytes
        am_total = p.dsps * p.am_bytes
        self.bases = np.array([0, sm_total, sm_total + am_total, sm_total + am_total + p.gsm_bytes], dtype=np.int64)
        total = int(self.bases[3] + self.ddr_bytes)
        if self.functional:
            regs = p.dsps * p.vector_registers * (p.vector_lanes * 4 + p.fp64_lanes * 8)
            check_host_memory(total + regs, f"a functional cluster of {p.dsps} DSPs with {self.ddr_bytes} bytes "
                              f"of DDR", MachineError)
            with small_pages():         # touched once per run: huge pages cost more to fault than they save
                self.mem = np.zeros(total // 2, dtype=np.uint16)
                self.vregs = np.zeros((p.dsps, p.vector_registers, p.vector_lanes), dtype=np.float32)
                self.vregs64 = np.zeros((p.dsps, p.vector_registers, max(p.fp64_lanes, 1)), dtype=np.float64)
        else:
            self.mem = np.zeros(2, dtype=np.uint16)
            self.vregs = np.zeros((p.dsps, p.vector_registers, 1), dtype=np.float32)
            self.vregs64 = np.zeros((p.dsps, p.vector_registers, 1), dtype=np.float64)
        self.sregs = np.zeros((p.dsps, p.scalar_registers), dtype=np.int64)

    # host access to DDR (functional mode) -------------------------------------------------
    def _ddr_view(self, addr: int, nbytes: int) -> np.ndarray:
        if not self.functional:
            raise MachineError("timing-only cluster holds no data")
        if addr < 0 or addr % 2 or addr + nbytes > self.ddr_bytes:
            raise MachineError(f"host access to DDR [{addr}, {addr + nbytes}) outside 0..{self.ddr_bytes}")
        start = (int(self.bases[3]) + addr) // 2
        return self.mem[start:start + nbytes // 2]

    def write_ddr_u16(self, addr: int, bits: np.ndarray) -> None:
        flat = np.ascontiguousarray(bits, dtype=np.uint16).ravel()
        self._ddr_view(addr, flat.size * 2)[:] = flat

    def read_ddr_u16(self, addr: int, count: int) -> np.ndarray:
        return self._ddr_view(addr, count * 2).copy()

    def read_ddr_f32(self, addr: int, count: int) -> np.ndarray:
        if addr % 4:
            raise MachineError(f"FP32 host read at unaligned DDR address {addr}")
        return self._ddr_view(addr, count * 4).view(np.float32).copy()

    def write_ddr_f32(self, addr: int, values: np.ndarray) -> None:
        if addr % 4:
            raise MachineError(f"FP32 host write at unaligned DDR address {addr}")
        flat = np.ascontiguousarray(values, dtype=np.float32).ravel()
        self._ddr_view(addr, flat.size * 4)[:] = flat.view(np.uint16)

    def read_gsm_f32(self, addr: int, count: int) -> np.ndarray:
        """``count`` FP32 values at ``addr`` in GSM (bounds and 4-byte alignment checked)."""
        if addr % 4:
            raise MachineError(f"FP32 host read at unaligned GSM address {addr}")
        if count < 0:
            raise MachineError(f"FP32 host read of a negative count {count} from GSM")
        return self.region("GSM", addr, count * 4).view(np.float32).copy()

    def region(self, space: str, addr: int, nbytes: int, dsp: int = 0) -> np.ndarray:
        """Writable byte view of ``nbytes`` at ``addr`` in SM/AM (of ``dsp``), GSM or DDR."""
        if not self.functional:
            raise MachineError("timing-only cluster holds no data")
        if space not in isa.SPACES:
            raise MachineError(f"unknown memory space {space!r} (known: {', '.join(isa.SPACES)})")
        sp = isa.SPACES.index(space)
        if not 0 <= dsp < self.platform.dsps:
            raise MachineError(f"{space}: DSP {dsp} outside 0..{self.platform.dsps - 1}")
        cap = int(self.caps[sp])
        if addr < 0 or nbytes < 0 or addr + nbytes > cap:
            raise MachineError(f"host access to {space} [{addr}, {addr + nbytes}) outside 0..{cap}")
        base = int(self.bases[sp]) + (dsp * cap if sp in (isa.SP_SM, isa.SP_AM) else 0)
        return self.mem.view(np.uint8)[base + addr:base + addr + nbytes]

    # running ----------------------------------------------------------------------------
    def run(self, programs: list[Program], dsp_program: list[int] | None = None,
            init_sregs: dict[int, dict[int, int]] | None = None, max_cycles: int = DEFAULT_MAX_CYCLES,
            dsp_descriptors: dict[int, np.ndarray] | None = None,
            trace: TraceOptions | None = None, fast_forward: bool | None = None,
            max_seconds: float | None = None) -> RunStats:
        """Run ``programs[dsp_program[d]]`` on DSP d (default: program 0 everywhere).

        ``dsp_descriptors`` gives a DSP its own DMA descriptor table (same length as its
        program's), so one code array can serve DSPs whose transfers differ in size.
        ``trace`` records the run (``RunStats.trace``); the counters are the same either way.
        ``fast_forward`` (without a trace): advance over straight-line runs of data-only bundles in
        one step (:mod:`mtemu.fast.runs`); the counters and data are the same either way. Default: on,
        unless the environment sets ``MTEMU_FAST_FORWARD=0`` (to check a result against the
        bundle-by-bundle run).
        ``max_cycles`` stops a run whose emulated time passes it; ``max_seconds`` one that takes
        longer on the host (both raise :class:`MachineError` saying whether a loop or a slow DMA
        ran out the limit). The jitted loop runs in chunks, so Ctrl-C interrupts within a second.
        """
        p = self.platform
        max_cycles = _check_limit(max_cycles, "max_cycles", integer=True)
        if max_seconds is not None:
            max_seconds = _check_limit(max_seconds, "max_seconds", integer=False)
        if dsp_program is None:
            dsp_program = [0] * p.dsps
        if len(dsp_program) != p.dsps:
            raise MachineError(f"need one program index per DSP ({p.dsps}), got {len(dsp_program)}")
        if fast_forward is None:
            fast_forward = os.environ.get("MTEMU_FAST_FORWARD", "1").strip() != "0"
        skip = fast_forward and trace is None
        code, descs, lo, hi, desc_off, blocks, tables = _prepare(programs, dsp_program, p, self.functional, skip)
        if not p.fp64_lanes:
            _refuse_fp64(programs, dsp_program, p)
        desc_off = desc_off.copy()
        if dsp_descriptors:
            extra = []
            base = descs.shape[0]
            for d, table in sorted(dsp_descriptors.items()):
                if not 0 <= d < p.dsps:
                    raise MachineError(f"descriptor table given for DSP {d}, outside 0..{p.dsps - 1}")
                own = programs[dsp_program[d]].descriptors
                table = np.asarray(table, dtype=np.int64)
                if table.shape != own.shape:
                    raise MachineError(f"DSP {d}: descriptor table shape {table.shape} differs from its "
                                       f"program's {own.shape}")
                desc_off[d] = base
                base += table.shape[0]
                extra.append((d, table))
            added = np.concatenate([t for _d, t in extra])
            try:            # all tables in one pass (24 checks of a few numpy calls each took ~5 ms)
                _check_descriptor_table(added, "DSP descriptor tables")
            except MachineError:
                for d, table in extra:          # name the DSP, the descriptor and the PC that uses it
                    _check_descriptor_table(table, f"DSP {d}", programs[dsp_program[d]].code)
                raise
            descs = np.ascontiguousarray(np.concatenate([descs, added]))
        self.sregs[:] = 0
        for d, regs in (init_sregs or {}).items():
            if not isinstance(d, (int, np.integer)) or not 0 <= d < p.dsps:
                raise MachineError(f"initial registers given for DSP {d!r}, outside 0..{p.dsps - 1}")
            for r, v in regs.items():
                if not isinstance(r, (int, np.integer)) or not 0 < r < p.scalar_registers:
                    raise MachineError(f"DSP {d}: initial scalar register s{r} out of range "
                                       f"1..{p.scalar_registers - 1}")
                if not isinstance(v, (int, np.integer)) or not -(1 << 63) <= v < (1 << 63):
                    raise MachineError(f"DSP {d}: initial value of s{r} must be a 64-bit integer, got {v!r}")
                self.sregs[d, r] = v
        stats = np.zeros((p.dsps, N_STATS), dtype=np.int64)
        err = np.zeros(ERR_FIELDS + 2 * p.dsps, dtype=np.int64)
        server_bytes = np.zeros(3, dtype=np.int64)
        server_busy = np.zeros(3 + p.dsps, dtype=np.float64)
        buf = _trace_buffers(trace, p.dsps)
        bpc = np.array([p.ddr_bandwidth, p.gsm_bandwidth, p.local_bandwidth]) / p.clock_hz
        mem32 = self.mem[: self.mem.size // 2 * 2].view(np.float32)
        lanes = p.vector_lanes if self.functional else 1
        lanes64 = p.fp64_lanes if self.functional else 1
        mem64 = self.mem.view(np.float64) if self.functional else np.zeros(1, np.float64)
        with small_pages():
            defer = defer_buffers(tables, p.dsps, p.scalar_registers, p.vector_registers, p.sm_bytes)
        # waiting runs execute on threads only from the main thread (one parallel launch at a time)
        threads = p.dsps > 1 and threading.current_thread() is threading.main_thread()
        run_state = RunState(np.zeros(p.dsps, np.int64), lo.copy(), np.zeros(p.dsps, np.int64),
                             np.zeros((p.dsps, 64), np.int64), np.zeros(3 + p.dsps, np.float64),
                             np.array([-1, 0, CHUNK_BUNDLES], np.int64))
        ctl = run_state.ctl
        started = monotonic()
        loop = _run_functional if self.functional else _run_timing
        code = code.view()
        code.flags.writeable = False    # one compiled signature for a program's own (frozen) code and a copy
        records = (Linked(code, lo, hi, descs, desc_off),
                   MachineState(self.sregs, self.vregs, self.mem, mem32, self.caps, self.bases, F16_TABLE,
                                self.vregs64, mem64),
                   Settings(self.functional, p.dsps, lanes, p.latencies.branch_delay, p.dma_latency_cycles, bpc,
                            float(p.dma_row_overhead_cycles), max_cycles, threads, lanes64, int(p.dma_issue_cycles),
                            int(p.fma_units)),
                   Counters(stats, err, server_bytes, server_busy), TraceBuffers(*buf), RunTables(*blocks), defer)
        while True:
            loop(*records, run_state)
            if err[0] != E_OK:
                raise MachineError(_describe_error(err, lo, p.dsps, stats, p))
            if ctl[CTL_DONE]:
                break
            if max_seconds is not None and monotonic() - started > max_seconds:
                raise MachineError(_describe_timeout(run_state, stats, lo, max_seconds, p))
        cycles = int(stats[:, S_END].max())
        busy = {"ddr": float(server_busy[0]), "gsm": float(server_busy[1])}
        busy.update({f"local{d}": float(server_busy[2 + d]) for d in range(p.dsps)})
        recorded = None
        if trace is not None:
            ev, nev, _last, cut, dma, dma_t, bar, counts = buf
            recorded = Trace(p.clock_hz, p.dsps, cycles, stats[:, S_CYCLES].copy(), ev, nev, cut,
                             dma, dma_t, int(counts[0]), bar, int(counts[1]))
        return RunStats(cycles, stats, {"ddr": int(server_bytes[0]), "gsm": int(server_bytes[1]),
                                        "local": int(server_bytes[2])}, p, p.vector_lanes, busy, recorded)


_FP64_OPS = isa.ops_where(fp64=True)


def _refuse_fp64(programs: list[Program], dsp_program: list[int], p: Platform) -> None:
    """An FP64 op in a program the platform (no FP64 lanes) is asked to run: one named error."""
    for k in sorted(set(dsp_program)):
        hits = np.argwhere(np.isin(programs[k].code[:, :, isa.F_OP], _FP64_OPS))
        if hits.size:
            b, u = (int(x) for x in hits[0])
            name = isa.OP_BY_CODE[int(programs[k].code[b, u, isa.F_OP])].name
            raise MachineError(f"program {k}, PC {b}, unit {isa.UNITS[u]}: {name} is an FP64 op and platform "
                               f"{p.name!r} has no FP64 lanes (field 'fp64_lanes' is 0)")


def _check_limit(value, name: str, integer: bool):
    """A positive cycle or seconds limit (cycles at most MAX_CYCLES_LIMIT, so time cannot overflow)."""
    ok = isinstance(value, (int, np.integer)) if integer else isinstance(value, (int, float, np.number))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        raise MachineError(f"{name} must be a positive {'integer' if integer else 'number'}, got {value!r}")
    if integer and value > MAX_CYCLES_LIMIT:
        raise MachineError(f"{name} = {value} is above the largest supported limit {MAX_CYCLES_LIMIT}")
    return int(value) if integer else float(value)


def _trace_buffers(opts: TraceOptions | None, dsps: int) -> tuple[np.ndarray, ...]:
    """Recording arrays for ``_run``; zero-length when tracing is off (same compiled signature)."""
    cap, dcap, bcap, n = (0, 0, 0, 0) if opts is None else (opts.capacity, opts.dma_capacity,
                                                              opts.barrier_capacity, dsps)
    check_host_memory(16 * n * cap + 88 * dcap + 24 * bcap, "the trace buffers", MachineError)
    return (np.zeros((n, cap, 2), np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64),
            np.full(n, -1, np.int64), np.zeros((dcap, N_DMA_FIELDS), np.int64), np.zeros((dcap, 2), np.float64),
            np.zeros((bcap, 3), np.int64), np.zeros(2, np.int64))


# Linked, checked and decoded programs, by the identity of their Program objects, for programs that
# are frozen (read-only arrays, Program.freeze: the kernels' programs): preparing a 1024^3 GEMM takes
# some 30 ms. Entries hold their programs, so an identity is not reused while its entry lives; bounded
# by their bytes too (prepared_store.KEPT_BYTES: a larger one is not kept).
PREPARED_ENTRIES = 8
_PREPARED = prepared_store.SizedMemo(PREPARED_ENTRIES)


def _prepare(programs: list[Program], dsp_program: list[int], p: Platform, functional: bool, skip: bool) -> tuple:
    """``(code, descs, lo, hi, desc_off, blocks, defer_tables)`` of :func:`_link`, :func:`build_blocks` and
    :func:`~mtemu.fast.queues.defer_tables` (None when not deferring), kept for frozen programs; for frozen
    programs with an origin also on disk (:mod:`mtemu.fast.prepared`), so a new process reads them."""
    cacheable = all(isinstance(pr, Program) and pr.frozen for pr in programs)
    key = (tuple(id(pr) for pr in programs), tuple(int(k) for k in dsp_program), p, bool(functional), bool(skip))
    hit = _PREPARED.get(key) if cacheable else None
    if hit is not None:
        return hit[1]
    disk_key = None
    if cacheable and functional and skip and prepared_store.enabled() and all(pr.origin for pr in programs):
        disk_key = prepared_store.cache_key([pr.origin for pr in programs], dsp_program, p, functional, skip)
    with small_pages():
        prepared = _derive_prepared(programs, dsp_program, p, functional, skip, disk_key)
    if cacheable:
        _PREPARED.put(key, (list(programs), prepared))
    return prepared


def _derive_prepared(programs: list[Program], dsp_program: list[int], p: Platform, functional: bool, skip: bool,
                     disk_key: str | None) -> tuple:
    """:func:`_prepare`'s tables, read from disk under ``disk_key`` if there, else derived (and stored)."""
    prepared = _read_prepared(programs, dsp_program, p, disk_key) if disk_key else None
    if disk_key:                            # the program cache keeps their code, to map on a new process's
        prepared_store.kept(programs)       # first call
    if prepared is None:
        code, descs, lo, hi, desc_off = _link(programs, dsp_program, p)
        lanes = p.vector_lanes if functional else 1
        tables = None
        if skip:
            seg_end = np.repeat(np.cumsum([pr.bundles for pr in programs]), [pr.bundles for pr in programs])
            blocks = build_blocks(code, seg_end, lanes, functional)
            if functional:
                tables = defer_tables(code, p.scalar_registers, p.vector_registers, blocks[0])
        else:
            blocks = empty_blocks()
        if disk_key:
            prepared_store.store(disk_key, [blocks, tables])
        prepared = (code, descs, lo, hi, desc_off, blocks, tables)
    return prepared


def _read_prepared(programs: list[Program], dsp_program: list[int], p: Platform, disk_key: str) -> tuple | None:
    """:func:`_prepare`'s tuple (functional, fast-forwarding) with the tables read from disk, or None (none
    there, or unusable: then with a warning). The programs were checked when the tables were derived
    from the same content."""
    groups = prepared_store.load(disk_key)
    if groups is None:
        return None
    if len(groups) == 2 and groups[0] is not None and len(groups[0]) == len(empty_blocks()) \
            and groups[1] is not None and len(groups[1]) == N_DEFER_TABLES:
        code, descs, lo, hi, desc_off = _link(programs, dsp_program, p, check=False)
        blocks, tables = groups
        if blocks[0].shape[0] == code.shape[0] and tables[2].shape[0] == code.shape[0] + 1:
            return code, descs, lo, hi, desc_off, blocks, tables
    warnings.warn(f"prepared program {prepared_store.cache_path(disk_key)}: tables of another program (an origin "
                  "that named two contents?); deriving it again", prepared_store.PreparedCacheWarning, stacklevel=4)
    return None


def _link(programs: list[Program], dsp_program: list[int], p: Platform, check: bool = True):
    """Concatenate programs (checking them, unless ``check`` is False: their tables were derived from
    the same checked content); branch targets stay program-relative (the machine adds lo)."""
    if not programs:
        raise MachineError("no program to run")
    offsets, doffs = [], []
    total, dtotal = 0, 0
    for index, prog in enumerate(programs):
        if not isinstance(prog, Program):
            raise MachineError(f"program {index}: expected an assembled Program, got {type(prog).__name__}")
        offsets.append(total)
        doffs.append(dtotal)
        total += prog.bundles
        dtotal += prog.descriptors.shape[0]
        if not check:
            continue
        if prog.code.shape[1:] != (isa.N_UNITS, isa.N_FIELDS):
            raise MachineError("program code must have shape (bundles, 8, 7)")
        _validate_raw(prog, p)
        if prog.descriptors.shape[0]:
            _check_descriptor_table(prog.descriptors, f"program {index}", prog.code)
    if not check and len(programs) == 1 and programs[0].code.flags.c_contiguous \
            and programs[0].code.dtype == np.int64:
        code = programs[0].code     # tables read from disk: nothing derives from it here, no copy is needed
    else:
        code = _back_to_back(programs, total)
        if code is None:
            code = (np.concatenate([pr.code for pr in programs]) if total
                    else np.zeros((0, isa.N_UNITS, isa.N_FIELDS), np.int64))
    descs = (np.concatenate([pr.descriptors for pr in programs]) if dtotal
             else np.zeros((1, isa.N_DESC), np.int64))
    lo = np.empty(p.dsps, np.int64)
    hi = np.empty(p.dsps, np.int64)
    doff = np.empty(p.dsps, np.int64)
    for d, k in enumerate(dsp_program):
        if not 0 <= k < len(programs):
            raise MachineError(f"DSP {d}: program index {k} out of range 0..{len(programs) - 1}")
        lo[d], hi[d], doff[d] = offsets[k], offsets[k] + programs[k].bundles, doffs[k]
    return np.ascontiguousarray(code), np.ascontiguousarray(descs), lo, hi, doff


def _back_to_back(programs: list[Program], total: int) -> np.ndarray | None:
    """The programs' code as one read-only array without a copy, where they already lie back to back in
    one C-contiguous int64 array, in order (the attention kernels build theirs so: some 10**6 bundles,
    hundreds of MB); None otherwise."""
    if len(programs) < 2 or not total:
        return None
    first = programs[0].code
    root = first
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.dtype != np.int64 or not root.flags.c_contiguous or root.size % (isa.N_UNITS * isa.N_FIELDS):
        return None
    row = isa.N_UNITS * isa.N_FIELDS * 8
    at = first.__array_interface__["data"][0]
    for pr in programs:
        c = pr.code
        if c.dtype != np.int64 or not c.flags.c_contiguous or c.shape[1:] != (isa.N_UNITS, isa.N_FIELDS) \
                or c.__array_interface__["data"][0] != at:
            return None
        at += c.shape[0] * row
    start = (first.__array_interface__["data"][0] - root.__array_interface__["data"][0]) // row
    rows = root.reshape(-1, isa.N_UNITS, isa.N_FIELDS)
    if start < 0 or start + total > rows.shape[0]:
        return None
    code = rows[start:start + total]
    code.flags.writeable = False
    return code


# membership tables over opcodes (isa.op_table): address operands, branch targets, named scalar destinations
_ADDRESSING_OPS = isa.op_table(addresses_memory=True)
_TARGET_OPS = isa.op_table(has_target=True)
_SCALAR_WRITE_OPS = isa.op_table(names_scalar_dest=True)


@njit(cache=True)
def _raw_ok(code, ndesc, allowed, limits, addressing, targets, scalar_writes):
    """Whether ``code`` passes every check of :func:`_validate_raw` (one pass, no temporaries); when it
    does not, the checks run again to name the first problem."""
    halt = code.shape[0] == 0
    for b in range(code.shape[0]):
        for u in range(code.shape[1]):
            op = code[b, u, isa.F_OP]
            if op < 0 or op >= allowed.shape[0] or not allowed[op, u]:
                return False
            for f in range(4):
                lim = limits[op, f]
                x = code[b, u, isa.F_R0 + f]
                if lim >= 0 and (x < 0 or x >= lim):
                    return False
            imm = code[b, u, isa.F_IMM0]
            if op == isa.OP_NOP and imm != isa.ST_LATENCY and imm != isa.ST_BRANCH:
                return False
            if addressing[op]:
                imm1 = code[b, u, isa.F_IMM1]
                if imm > MAX_ADDRESS_IMM or imm < -MAX_ADDRESS_IMM or imm1 > MAX_ADDRESS_IMM \
                        or imm1 < -MAX_ADDRESS_IMM:
                    return False
            if op == isa.OP_DMA and (code[b, u, isa.F_R1] < 0 or code[b, u, isa.F_R1] >= ndesc):
                return False
            if targets[op] and (imm < 0 or imm >= max(code.shape[0], 1)):
                return False
            if scalar_writes[op] and code[b, u, isa.F_R0] == 0:
                return False
            if op == isa.OP_HALT:
                halt = True
    return halt


def _validate_raw(prog: Program, p: Platform) -> None:
    """Checks so that a hand-made array cannot index outside the machine: one jitted pass
    (:func:`_raw_ok`), then, only if it fails, vectorised checks that name the first problem."""
    code = prog.code
    allowed, limits = _operand_rules(p)
    if p.dma_channels <= 64 and _raw_ok(code, prog.descriptors.shape[0], allowed, limits, _ADDRESSING_OPS,
                                        _TARGET_OPS, _SCALAR_WRITE_OPS):
        return
    ops = code[:, :, isa.F_OP]
    bad = (ops < 0) | (ops >= isa.N_OPCODES)
    if bad.any():
        b, u = np.argwhere(bad)[0]
        raise MachineError(f"bundle {b}, unit {isa.UNITS[u]}: unknown opcode {ops[b, u]}")
    lim = limits[ops]                                  # (bundles, units, r0..r3)
    vals = code[:, :, isa.F_R0:isa.F_R0 + 4]
    if not allowed[ops, np.arange(isa.N_UNITS)].all() or ((lim >= 0) & ((vals < 0) | (vals >= lim))).any():
        _report_bad_operands(code, ops, p)
    if p.dma_channels > 64:
        raise MachineError("at most 64 DMA channels per DSP are supported")
    nop = ops == isa.OP_NOP
    if nop.any():
        reasons = code[:, :, isa.F_IMM0][nop]
        if ((reasons != isa.ST_LATENCY) & (reasons != isa.ST_BRANCH)).any():
            raise MachineError("nop reason must be 0 (latency) or 1 (branch)")
    addressing = _ADDRESSING_OPS[ops]
    imms = code[:, :, isa.F_IMM0:isa.F_IMM1 + 1]
    far = addressing & ((imms > MAX_ADDRESS_IMM) | (imms < -MAX_ADDRESS_IMM)).any(axis=2)
    if far.any():
        b, u = np.argwhere(far)[0]
        raise MachineError(f"bundle {b}, unit {isa.UNITS[u]}: address offset {code[b, u, isa.F_IMM0]}/"
                           f"{code[b, u, isa.F_IMM1]} is beyond any memory (|offset| <= {MAX_ADDRESS_IMM})")
    ndesc = prog.descriptors.shape[0]
    dma = ops == isa.OP_DMA
    if dma.any():
        if ((code[:, :, isa.F_R1][dma] >= ndesc) | (code[:, :, isa.F_R1][dma] < 0)).any():
            raise MachineError("DMA refers to an undefined descriptor")
    branches = _TARGET_OPS[ops]
    tgt = code[:, :, isa.F_IMM0][branches]
    if ((tgt < 0) | (tgt >= max(prog.bundles, 1))).any():
        raise MachineError("branch target outside the program")
    writes_s0 = _SCALAR_WRITE_OPS[ops] & (code[:, :, isa.F_R0] == 0)
    if writes_s0.any():
        b, u = np.argwhere(writes_s0)[0]
        raise MachineError(f"bundle {b}, unit {isa.UNITS[u]}: writes s0, the zero register")
    if prog.bundles and not (ops == isa.OP_HALT).any():
        raise MachineError("program has no halt instruction")


def _report_bad_operands(code: np.ndarray, ops: np.ndarray, p: Platform) -> None:
    """Raise the error for the first instruction on a wrong unit or with an operand out of range
    (opcode by opcode, as ``_operand_rules`` found that there is one)."""
    for spec in isa.OPS:
        mask = ops == spec.code
        if not mask.any():
            continue
        wrong_unit = mask & ~np.isin(np.arange(isa.N_UNITS), spec.units)[None, :]
        if wrong_unit.any():
            b, u = np.argwhere(wrong_unit)[0]
            raise MachineError(f"bundle {b}, unit {isa.UNITS[u]}: {spec.name} cannot run on this unit")
    for spec in isa.OPS:
        mask = ops == spec.code
        if not mask.any():
            continue
        for f, kind in enumerate(isa.FIELD_KINDS[spec.name]):
            vals = code[:, :, isa.F_R0 + f][mask]
            limit = {"s": p.scalar_registers, "v": p.vector_registers, "c": p.dma_channels, "": 1}.get(kind)
            if limit is None:
                continue
            if kind == "" :
                if (vals != 0).any():
                    raise MachineError(f"{spec.name}: unused operand field r{f} must be 0")
                continue
            bad = (vals < 0) | (vals >= limit)
            if bad.any():
                b, u = np.argwhere(mask)[np.argmax(bad)]
                raise MachineError(f"bundle {b}, unit {isa.UNITS[u]}: {spec.name} operand r{f} = "
                                   f"{vals[np.argmax(bad)]} out of range for a {kind!r} operand (limit {limit})")


@functools.lru_cache(maxsize=16)
def _operand_rules(p: Platform) -> tuple[np.ndarray, np.ndarray]:
    """Per opcode: the units it may run on (N_OPCODES x units) and per operand field r0..r3 the
    exclusive upper bound of its value (-1: not checked here; 1: unused, must be 0)."""
    allowed = np.ones((isa.N_OPCODES, isa.N_UNITS), np.bool_)     # opcode 0 (empty) anywhere
    limits = np.full((isa.N_OPCODES, 4), -1, np.int64)
    bound = {"s": p.scalar_registers, "v": p.vector_registers, "c": p.dma_channels, "": 1}
    for spec in isa.OPS:
        allowed[spec.code] = np.isin(np.arange(isa.N_UNITS), spec.units)
        for f, kind in enumerate(isa.FIELD_KINDS[spec.name]):
            limits[spec.code, f] = bound.get(kind, -1)
    return allowed, limits


def _check_descriptor_table(table: np.ndarray, who: str, code: np.ndarray | None = None) -> None:
    """Refuse a malformed or absurd descriptor, naming it and the first PC whose DMA uses it."""
    if table.ndim != 2 or table.shape[1] != isa.N_DESC:
        raise MachineError(f"{who}: DMA descriptor table must have shape (n, {isa.N_DESC}), got {table.shape}")
    # sizes first, in float: (rows - 1) * stride could overflow int64 for an absurd descriptor
    rows = table[:, isa.D_ROWS].astype(np.float64)
    rowb = table[:, isa.D_ROWB].astype(np.float64)
    reach = np.maximum(rows - 1, 0) * np.maximum(table[:, isa.D_SSTR], table[:, isa.D_DSTR]).astype(np.float64)
    huge = (rows > MAX_DESC_ROWS) | (rowb > MAX_DESC_EXTENT) | (reach + rowb > MAX_DESC_EXTENT) \
        | (np.abs(table[:, isa.D_SSTR]) > MAX_DESC_EXTENT) | (np.abs(table[:, isa.D_DSTR]) > MAX_DESC_EXTENT)
    if huge.any():
        i = int(np.argmax(huge))
        raise MachineError(f"{who}{_used_at(code, i)}: DMA descriptor {i} spans more than any memory "
                           f"(rows {table[i, isa.D_ROWS]}, row bytes {table[i, isa.D_ROWB]}, strides "
                           f"{table[i, isa.D_SSTR]}/{table[i, isa.D_DSTR]}; limit {MAX_DESC_EXTENT} bytes): "
                           f"{table[i].tolist()}")
    spaces_ok = (table[:, isa.D_SRC] >= 0) & (table[:, isa.D_SRC] < 4) \
        & (table[:, isa.D_DST] >= 0) & (table[:, isa.D_DST] < 4)
    sizes_ok = (table[:, isa.D_ROWS] >= 0) & (table[:, isa.D_ROWB] > 0) & (table[:, isa.D_ROWB] % 2 == 0) \
        & (table[:, isa.D_SSTR] >= 0) & (table[:, isa.D_DSTR] >= 0)
    mode_ok = (table[:, isa.D_MODE] >= 0) & (table[:, isa.D_MODE] < len(isa.DMA_MODES))
    bad = ~(spaces_ok & sizes_ok & mode_ok)
    if bad.any():
        i = int(np.argmax(bad))
        raise MachineError(f"{who}{_used_at(code, i)}: DMA descriptor {i} is malformed: {table[i].tolist()}")


def _used_at(code: np.ndarray | None, desc: int) -> str:
    if code is None:
        return ""
    hits = np.argwhere((code[:, :, isa.F_OP] == isa.OP_DMA) & (code[:, :, isa.F_R1] == desc))
    return f", PC {int(hits[0][0])}" if len(hits) else ""


def _dsp_list(ids: list[int]) -> str:
    """'3' / '0, 2' / '4-23': short, exact."""
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ", ".join(map(str, ids))


def _describe_error(err: np.ndarray, lo: np.ndarray, dsps: int, stats: np.ndarray | None = None,
                    platform: Platform | None = None) -> str:
    code, d, pc, unit, space, addr, size = (int(x) for x in err[:7])
    rel = pc - int(lo[d]) if 0 <= d < len(lo) else pc
    where = f"DSP {d}, PC {rel}, unit {isa.UNITS[unit]}"
    if code == E_ADDR:
        return f"{where}: access of {size} bytes at {isa.SPACES[space]} address {addr} is outside the memory"
    if code == E_ALIGN:
        return f"{where}: unaligned {isa.SPACES[space]} address {addr} (needs {size}-byte alignment)"
    if code == E_PC:
        return f"{where}: PC left the program (jumped to {addr - int(lo[d])})"
    if code == E_DEADLOCK:
        states = err[ERR_FIELDS:ERR_FIELDS + dsps]
        pcs = err[ERR_FIELDS + dsps:ERR_FIELDS + 2 * dsps]
        waiting = [i for i in range(dsps) if states[i] == 1]
        halted = [i for i in range(dsps) if states[i] == 2]
        at = sorted({int(pcs[i] - lo[i]) for i in waiting})
        return (f"{where}: deadlock: DSP(s) {_dsp_list(waiting)} wait at a barrier (PC {', '.join(map(str, at))}) "
                f"that halted DSP(s) {_dsp_list(halted)} will never reach")
    if code == E_CYCLES:
        return f"{where}: cycle limit {size} exceeded" + _why_long(stats, d, addr)
    if code == E_DMA_LATE:
        server = ("DDR", "GSM")[space] if space < 2 else "local SM<->AM"
        rates = "" if platform is None else (
            f"; platform: ddr_bandwidth {platform.ddr_bandwidth:g}, gsm_bandwidth {platform.gsm_bandwidth:g}, "
            f"local_bandwidth {platform.local_bandwidth:g} bytes/s, dma_latency_cycles {platform.dma_latency_cycles}, "
            f"dma_row_overhead_cycles {platform.dma_row_overhead_cycles:g}")
        clock = int(err[ERR_FIELDS])
        own = int(err[7]) - clock          # issue to last byte: latency, queueing and transfer
        head = (f"{where}: a DMA of {addr} bytes on the {server} server would end at cycle {int(err[7])}, past the "
                f"cycle limit {size}")
        if own * 2 > size:
            return (f"{head}: this one transfer takes {own} cycles from issue, too slow, not a loop (check the "
                    f"DMA rates are in bytes/s{rates})")
        return head + _why_long(stats, d, clock)
    return f"{where}: machine error {code}"


def _why_long(stats: np.ndarray | None, d: int, cycles: int) -> str:
    """Tell a loop from slow transfers by where DSP d's cycles went."""
    if stats is None or not 0 <= d < stats.shape[0]:
        return " (infinite loop?)"
    bundles = int(stats[d, S_BUNDLES])
    dma_wait = int(stats[d, S_STALL0 + isa.ST_DMA])
    if cycles > 0 and dma_wait * 2 > cycles:
        return (f" (DSP {d} spent {dma_wait} of its {cycles} cycles waiting for DMA: transfers too slow for the "
                f"limit, not a loop; check the platform's DMA rates are in bytes/s, or raise the limit if this "
                f"much data is intended)")
    return (f" (DSP {d} issued {bundles} bundles without halting: a loop that never ends? raise the limit if "
            f"the program is just long)")


def _describe_timeout(run_state: tuple, stats: np.ndarray, lo: np.ndarray, seconds: float, p: Platform) -> str:
    clock, pc, state = run_state[0], run_state[1], run_state[2]
    running = [i for i in range(p.dsps) if state[i] != 2]
    d = min(running, key=lambda i: int(clock[i])) if running else 0
    return (f"DSP {d}, PC {int(pc[d] - lo[d])}: wall-clock limit of {seconds:g} s reached at emulated cycle "
            f"{int(clock[d])}" + _why_long(stats, d, int(clock[d])))

"""The attention forward on one emulated cluster: O (FP16), and the saved state the Algorithm-1
backward consumes (P^T key-major FP16 in DDR, row logsumexp FP32).

Same layout as the backward (query rows across the vector lanes, score tiles key-major). Pass 1
keeps the online row max and sum (``vmax``, ``vexp``); pass 2 recomputes the scores, writes
P^T = exp(S - lse) to DDR key-major (FP16) and accumulates O^T += V^T P^T in FP32. K/V reach the
DSPs as in the backward: from GSM ("gsm"), lock-stepped broadcast rounds ("broadcast"), or each
DSP's own loads ("own").
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from rtcommon.checks import positive_ints

from ...errors import CapacityError, MtemuError
from ...machine import Cluster, RunStats
from ...platform import DEFAULT, Platform, as_platform
from ...trace import TraceOptions
from ..attention_ref import AttentionSaved, _check_flag, _check_qkv
from ..capacity import AttentionTiles
from ..schedule import Op, check_registers
from . import driver
from .driver import CH_IN, CH_KV, CH_PT, CH_RED, CH_SG, CH_SP, CH_SVK, AttentionProgram, Driver, Library, link
from .microkernels import (
    FP16_MINUS_ONE,
    R_A,
    R_B,
    R_C,
    R_D,
    R_P,
    R_T0,
    R_W,
    assemble,
    bcast_dot,
    fma,
    inv_sqrt_bits,
    vload,
    vstore,
    zero,
)
from .plan import (
    AttentionPlan,
    Item,
    assign,
    check_shape_and_tiles,
    ddr_layout,
    default_tiles,
    layout,
    rounds,
    split_rows,
)

NEG_INF_F16 = 0xFC00
ONE_F16 = 0x3C00
# AM offsets of the per-item softmax statistics (FP32 vectors) relative to R_D
ST_M, ST_L, ST_LSE = 0, 1, 2
# key rows per forward score-kernel call
SCORE_ROWS = 8


# ------------------------------------------------------------------------------------------
# micro-kernels of the forward (the GEMM and write-back kernels are shared)
# ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=128)
def mk_init(platform: Platform) -> np.ndarray:
    """Row statistics of a new query tile: m = -inf, l = 0 (FP32 vectors at R_D)."""
    lanes = platform.vector_lanes
    ops = [Op("smovi", (R_T0, NEG_INF_F16), (), (("s", R_T0),)),
           Op("svbcast", (0, R_T0), (("s", R_T0),), (("v", 0),)), zero(1),
           vstore("vstw", R_D, ST_M * lanes * 4, 0), vstore("vstw", R_D, ST_L * lanes * 4, 1)]
    return assemble(ops, platform)


@functools.lru_cache(maxsize=128)
def mk_lse(platform: Platform) -> np.ndarray:
    """lse = m + log(l) (FP32 vectors at R_D)."""
    lanes = platform.vector_lanes
    ops = [vload("vldw", 0, R_D, ST_M * lanes * 4), vload("vldw", 1, R_D, ST_L * lanes * 4),
           Op("smovi", (R_T0, ONE_F16), (), (("s", R_T0),)),
           Op("svbcast", (2, R_T0), (("s", R_T0),), (("v", 2),)),
           Op("vlog", (3, 1), (("v", 1),), (("v", 3),)),
           fma(0, 2, 3), vstore("vstw", R_D, ST_LSE * lanes * 4, 0)]
    return assemble(ops, platform)


@functools.lru_cache(maxsize=256)
def mk_forward_scores(rows: int, d: int, masked: bool, probs: bool, scale_bits: int, platform: Platform,
                      rotation: int = 2) -> np.ndarray:
    """Scaled scores S^T for ``rows`` keys (lanes = query rows): K (SM, R_A) x Q^T (AM, R_B), times
    1/sqrt(d), plus the causal bias rows at R_P (0 or -inf, FP16) when ``masked``.

    probs False (pass 1): online row statistics at R_D: m' = max(m, s_0..), l' = l exp(m - m')
    + sum_r exp(s_r - m'). probs True (pass 2): P^T = exp(s - lse), stored FP32 at R_W (right
    operand of O^T += V^T P^T) and FP16 at R_C (the saved state)."""
    lanes = platform.vector_lanes
    acc = list(range(rows))
    va0 = rows
    vb = va0 + rotation * rows
    sv0 = vb + rotation                   # scaled scores
    bv0 = sv0 + rows                      # bias rows, later exp results
    vsc, vone, vm1, vx, vy, vz, vw = (bv0 + rows + k for k in range(7))
    check_registers(R_T0 + rotation * rows + 3, vw + 1, platform, f"attention forward kernel {rows} rows")
    st = R_T0 + rotation * rows
    ops: list[Op] = [zero(a) for a in acc]
    bcast_dot(ops, acc, va0, vb, d, rotation, lanes)
    ops.append(Op("smovi", (st, scale_bits), (), (("s", st),)))
    ops.append(Op("svbcastw", (vsc, st), (("s", st),), (("v", vsc),)))
    ops.append(Op("smovi", (st + 1, ONE_F16), (), (("s", st + 1),)))
    ops.append(Op("svbcast", (vone, st + 1), (("s", st + 1),), (("v", vone),)))
    ops.append(Op("smovi", (st + 2, FP16_MINUS_ONE), (), (("s", st + 2),)))
    ops.append(Op("svbcast", (vm1, st + 2), (("s", st + 2),), (("v", vm1),)))
    for r in range(rows):
        ops.append(zero(sv0 + r))
        ops.append(fma(sv0 + r, acc[r], vsc))                     # s = 0 + acc * scale
        if masked:
            ops.append(vload("vldh", bv0 + r, R_P, r * lanes * 2))
            ops.append(fma(sv0 + r, bv0 + r, vone))               # s + bias (0 or -inf)
    if not probs:
        ops.append(vload("vldw", vx, R_D, ST_M * lanes * 4))      # m
        ops.append(vload("vldw", vy, R_D, ST_L * lanes * 4))      # l
        ops.append(Op("vmax", (vz, vx, sv0), (("v", vx), ("v", sv0)), (("v", vz),)))
        for r in range(1, rows):
            ops.append(Op("vmax", (vz, vz, sv0 + r), (("v", vz), ("v", sv0 + r)), (("v", vz),)))
        ops.append(fma(vx, vm1, vz))                              # m - m'
        ops.append(Op("vexp", (vw, vx), (("v", vx),), (("v", vw),)))
        ops.append(zero(vx))
        ops.append(fma(vx, vy, vw))                               # l exp(m - m')
        for r in range(rows):
            ops.append(fma(sv0 + r, vm1, vz))                     # s - m'
            ops.append(Op("vexp", (bv0 + r, sv0 + r), (("v", sv0 + r),), (("v", bv0 + r),)))
            ops.append(fma(vx, bv0 + r, vone))
        ops.append(vstore("vstw", R_D, ST_M * lanes * 4, vz))
        ops.append(vstore("vstw", R_D, ST_L * lanes * 4, vx))
    else:
        ops.append(vload("vldw", vx, R_D, ST_LSE * lanes * 4))
        for r in range(rows):
            ops.append(fma(sv0 + r, vm1, vx))                     # s - lse
            ops.append(Op("vexp", (bv0 + r, sv0 + r), (("v", sv0 + r),), (("v", bv0 + r),)))
            ops.append(vstore("vstw", R_W, r * lanes * 4, bv0 + r))
            ops.append(vstore("vsth", R_C, r * lanes * 2, bv0 + r))
    return assemble(ops, platform)


FORWARD_KERNELS = {"fwd": mk_forward_scores, "lse": mk_lse, "init": mk_init}


# ------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------
def plan_attention_forward(heads: int, kv_heads: int, seq: int, d: int, *, causal: bool = True,
                           tiles: AttentionTiles | None = None, platform: Platform = DEFAULT,
                           schedule: str = "auto") -> AttentionPlan:
    """Shape, tiles and buffers of the forward kernel (Eq. 1 checked as for the backward)."""
    t = check_shape_and_tiles(heads, kv_heads, seq, d, tiles, platform, schedule=schedule,
                              schedule_first=True)
    p = platform
    lanes = p.vector_lanes
    br, bc, bcp = int(t.br), int(t.bc), int(t.bc_prime)
    am, am_used = layout([
        ("q", max(br * d * 2, br * d * 2)), ("qt", d * lanes * 2), ("k0", bc * d * 2), ("k1", bc * d * 2),
        ("v0", bc * d * 2), ("v1", bc * d * 2), ("mask", bc * lanes * 2), ("stats", 3 * lanes * 4),
        ("pf", bcp * lanes * 4), ("ph0", bcp * lanes * 2), ("ph1", bcp * lanes * 2),
        ("ot", d * lanes * 4), ("wb", d * lanes * 2), ("pad", lanes * 4)])
    if am_used > p.am_bytes:
        raise CapacityError(f"AM: attention forward buffers for {t.describe()} need {am_used} bytes, "
                            f"{am_used - p.am_bytes} more than the {p.am_bytes}-byte AM")
    sm, sm_used = layout([("k0", bcp * d * 2), ("v0", bcp * d * 2), ("k1", bcp * d * 2), ("v1", bcp * d * 2)])
    if sm_used > p.sm_bytes:
        raise CapacityError(f"SM: two staged K and V sub-tiles ({bcp} x {d}) FP16 need {sm_used} bytes, "
                            f"{sm_used - p.sm_bytes} more than the {p.sm_bytes}-byte SM")
    mask_rows = br + 2 * bc
    ddr, ddr_bytes = ddr_layout([
        ("q", heads * seq * d * 2), ("k", kv_heads * seq * d * 2), ("v", kv_heads * seq * d * 2),
        ("o", heads * seq * d * 2), ("pt", heads * seq * seq * 2), ("lse", heads * seq * 4),
        ("mask", mask_rows * lanes * 2)], p)
    return AttentionPlan(heads, kv_heads, seq, d, bool(causal), "forward", t, -(-d // lanes), 0, am, sm, ddr,
                         0, am_used, sm_used, ddr_bytes, schedule)


def causal_bias_table(plan: AttentionPlan, lanes: int) -> np.ndarray:
    """FP16 rows k = -Bc .. Br+Bc-1 (table row k + Bc): lane r is 0 if r >= k else -inf."""
    t = plan.tiles
    k = np.arange(-t.bc, t.br + t.bc)[:, None]
    r = np.arange(lanes)[None, :]
    return np.where(r >= k, np.float16(0), np.float16(-np.inf)).astype(np.float16)



# ------------------------------------------------------------------------------------------
# builder: one straight-line driver per DSP
# ------------------------------------------------------------------------------------------
class _ForwardBuilder:
    """Emits the forward's per-DSP drivers: the pieces of one work item (setup, the tile pairs of
    both passes, finish) and the three ways K/V reach the DSPs."""

    def __init__(self, plan: AttentionPlan, platform: Platform):
        p = platform
        self.plan, self.p = plan, p
        self.lanes = p.vector_lanes
        self.t = plan.tiles
        self.d, self.seq, self.bcp = plan.d, plan.seq, int(self.t.bc_prime)
        self.am, self.sm, self.dd = plan.am, plan.sm, plan.ddr
        self.scale_bits = inv_sqrt_bits(self.d)
        self.rounds = rounds(plan, p.dsps)
        # steps: (round, pass, j); pass 0 = statistics (K only), pass 1 = probabilities and O (K, V)
        self.steps = []
        for r, (_g, items) in enumerate(self.rounds):
            n = max(plan.tiles_needed(x[1]) for x in items if x is not None)
            self.steps += [(r, ps, j) for ps in (0, 1) for j in range(n)]
        self.group = plan.heads // plan.kv_heads
        self.kv_bytes = 2 * self.seq * self.d * 2
        self.fit = p.gsm_bytes // self.kv_bytes          # KV heads whose K and V fit GSM together
        mode = plan.schedule
        if mode == "auto":       # as in the backward's _phases
            mode = "gsm" if self.fit >= 1 else (
                "own" if self.group * plan.n_qt < p.dsps and plan.kv_heads > 1 else "broadcast")
        self.mode = mode

    def useful_work(self) -> tuple[int, int]:
        """Useful MACs (2 x query rows x keys x d per visited tile pair) and visited tile pairs."""
        plan = self.plan
        useful, pairs = 0, 0
        for _g, items in self.rounds:
            for it in items:
                if it is not None:
                    for j in range(plan.tiles_needed(it[1])):
                        useful += 2 * plan.q_rows(it[1]) * plan.k_rows(j) * self.d
                        pairs += 1
        return useful, pairs

    # --- K/V loads ------------------------------------------------------------------------------
    def broadcast(self, drv: Driver, s: int) -> None:
        d, seq, t, am, dd = self.d, self.seq, self.t, self.am, self.dd
        r, ps, j = self.steps[s]
        g = self.rounds[r][0]
        rows = self.plan.k_rows(j)
        for name in (("k",) if ps == 0 else ("k", "v")):
            drv.dma(CH_KV, "DDR", "AM", 1, rows * d * 2, 0, 0, dd[name] + (g * seq + j * t.bc) * d * 2,
                    am[f"{name}{s % 2}"], "broadcast")

    def kv_own(self, drv: Driver, g: int, ps: int, j: int, slot: int) -> None:
        d, seq, t, am, dd = self.d, self.seq, self.t, self.am, self.dd
        rows = self.plan.k_rows(j)
        for name in (("k",) if ps == 0 else ("k", "v")):
            drv.dma(CH_KV, "DDR", "AM", 1, rows * d * 2, 0, 0, dd[name] + (g * seq + j * t.bc) * d * 2,
                    am[f"{name}{slot}"])

    # --- one work item --------------------------------------------------------------------------
    def setup(self, drv: Driver, it: Item) -> None:
        d, seq, t, am, dd, lanes = self.d, self.seq, self.t, self.am, self.dd, self.lanes
        h, i = it
        nq, row0 = self.plan.q_rows(i), (h * seq + i * t.br) * d * 2
        drv.dma(CH_IN, "DDR", "AM", 1, nq * d * 2, 0, 0, dd["q"] + row0, am["q"])
        for e in range(d):
            drv.dma(CH_IN, "AM", "AM", nq, 2, d * 2, 2, am["q"] + e * 2, am["qt"] + e * lanes * 2)
        drv.call(("init",), {R_D: am["stats"]})
        drv.wait(CH_IN)

    def tile(self, drv: Driver, it: Item, ps: int, j: int, slot: int, counter: list[int],
             kv: tuple[str, int, int] | None = None) -> None:
        """One tile pair of pass ps: Bc'-row K (and V) sub-tiles double-buffered in SM; K_j, V_j
        from this step's AM slots or from ``kv`` = (space, K_j address, V_j address)."""
        plan, d, seq, t, am, sm, dd, lanes = self.plan, self.d, self.seq, self.t, self.am, self.sm, self.dd, self.lanes
        bcp, mr_s = self.bcp, SCORE_ROWS
        kv_sp, kbase, vbase = kv if kv is not None else ("AM", am[f"k{slot}"], am[f"v{slot}"])
        h, i = it
        nq = plan.q_rows(i)
        nk = plan.k_rows(j)
        j0, i0 = j * t.bc, i * t.br
        masked = plan.causal and j0 + nk - 1 > i0
        if masked:   # bias rows k = j0 - i0 + c of the causal table
            drv.dma(CH_PT, "DDR", "AM", 1, nk * lanes * 2, 0, 0, dd["mask"] + (j0 - i0 + t.bc) * lanes * 2, am["mask"])
            drv.wait(CH_PT)
        chunks = [(c0, min(bcp, nk - c0)) for c0 in range(0, nk, bcp)]

        def stage(q: int) -> None:
            """K (and V) rows of sub-tile q into SM buffer q % 2, on its own channel."""
            c0, cv = chunks[q]
            ch, b = (CH_SVK, 0) if q % 2 == 0 else (CH_SP, 1)
            drv.dma(ch, kv_sp, "SM", 1, cv * d * 2, 0, 0, kbase + c0 * d * 2, sm[f"k{b}"])
            if ps == 1:
                drv.dma(ch, kv_sp, "SM", 1, cv * d * 2, 0, 0, vbase + c0 * d * 2, sm[f"v{b}"])

        stage(0)
        for q, (c0, cv) in enumerate(chunks):
            drv.wait(CH_SVK if q % 2 == 0 else CH_SP)
            if q + 1 < len(chunks):
                stage(q + 1)
            sk, sv = sm[f"k{q % 2}"], sm[f"v{q % 2}"]
            ph = am[f"ph{counter[0] % 2}"]
            ch_out = CH_RED if counter[0] % 2 == 0 else CH_SG
            if ps == 1:
                drv.wait(ch_out)          # this FP16 P^T buffer's last DDR write
            for r0 in range(0, cv, mr_s):
                rows = min(mr_s, cv - r0)
                drv.call(("fwd", rows, d, masked, ps == 1, self.scale_bits),
                         {R_A: sk + r0 * d * 2, R_B: am["qt"], R_D: am["stats"],
                          R_P: am["mask"] + (c0 + r0) * lanes * 2,
                          R_W: am["pf"] + r0 * lanes * 4, R_C: ph + r0 * lanes * 2})
            if ps == 1:
                drv.dma(ch_out, "AM", "DDR", cv, nq * 2, lanes * 2, seq * 2, ph,
                        dd["pt"] + (h * seq * seq + (j0 + c0) * seq + i0) * 2)
                first = j == 0 and c0 == 0
                for r0 in range(0, d, 16):
                    rows = min(16, d - r0)
                    drv.call(("gemm32", rows, 1, cv, first, 2, d * 2, lanes * 4, lanes * 4),
                             {R_A: sv + r0 * 2, R_B: am["pf"], R_C: am["ot"] + r0 * lanes * 4})
                counter[0] += 1

    def finish(self, drv: Driver, it: Item) -> None:
        d, seq, t, am, dd, lanes = self.d, self.seq, self.t, self.am, self.dd, self.lanes
        h, i = it
        nq, row0 = self.plan.q_rows(i), (h * seq + i * t.br) * d * 2
        for r0 in range(0, d, 16):
            rows = min(16, d - r0)
            drv.call(("round", rows, 1, 0, lanes * 4, lanes * 2),
                     {R_C: am["ot"] + r0 * lanes * 4, R_W: am["wb"] + r0 * lanes * 2})
        for e in range(d):
            drv.dma(CH_IN, "AM", "AM", nq, 2, 2, d * 2, am["wb"] + e * lanes * 2, am["q"] + e * 2)
        drv.dma(CH_IN, "AM", "DDR", 1, nq * d * 2, 0, 0, am["q"], dd["o"] + row0)
        drv.dma(CH_IN, "AM", "DDR", 1, nq * 4, 0, 0, am["stats"] + ST_LSE * lanes * 4,
                dd["lse"] + (h * seq + i * t.br) * 4)
        drv.wait(CH_IN)

    # --- walking the items ------------------------------------------------------------------------
    def drive_gsm(self, drv: Driver, dsp: int, counter: list[int]) -> None:
        """K and V of a phase's KV heads loaded once into GSM (rows split over the DSPs); each DSP
        then runs its items without lock step, staging K/V sub-tiles GSM -> SM."""
        plan, p, d, seq, t, am = self.plan, self.p, self.d, self.seq, self.t, self.am
        phases = [list(range(g0, min(g0 + self.fit, plan.kv_heads))) for g0 in range(0, plan.kv_heads, self.fit)]
        r0, cnt = split_rows(seq, p.dsps, dsp)
        for k, heads in enumerate(phases):
            if k:
                drv.barrier()                 # everyone is done with the previous K/V
            for n, g in enumerate(heads):
                for m, name in enumerate(("k", "v")):
                    drv.dma(CH_KV, "DDR", "GSM", 1 if cnt else 0, max(cnt, 1) * d * 2, 0, 0,
                            self.dd[name] + (g * seq + r0) * d * 2, (2 * n + m) * seq * d * 2 + r0 * d * 2)
            drv.wait(CH_KV)
            drv.barrier()
            for it in assign(plan, p.dsps, heads)[dsp]:
                n = heads.index(it[0] // self.group)
                self.setup(drv, it)
                for ps in (0, 1):
                    if ps == 1:
                        drv.call(("lse",), {R_D: am["stats"]})
                    for j in range(plan.tiles_needed(it[1])):
                        off = j * t.bc * d * 2
                        self.tile(drv, it, ps, j, 0, counter,
                                  ("GSM", 2 * n * seq * d * 2 + off, (2 * n + 1) * seq * d * 2 + off))
                self.finish(drv, it)

    def drive_own(self, drv: Driver, mine: list[Item], counter: list[int]) -> None:
        """Each DSP walks its own items, loading K_j (and V_j) itself, double-buffered."""
        s = 0
        for it in mine:
            g, nj = it[0] // self.group, self.plan.tiles_needed(it[1])
            self.setup(drv, it)
            for ps in (0, 1):
                if ps == 1:
                    drv.call(("lse",), {R_D: self.am["stats"]})
                self.kv_own(drv, g, ps, 0, s % 2)
                for j in range(nj):
                    drv.wait(CH_KV)
                    if j + 1 < nj:
                        self.kv_own(drv, g, ps, j + 1, (s + 1) % 2)
                    self.tile(drv, it, ps, j, s % 2, counter)
                    s += 1
            self.finish(drv, it)

    def drive_broadcast(self, drv: Driver, dsp: int, counter: list[int]) -> None:
        """Lock-stepped rounds, DSP 0 broadcasting K_j (and V_j) into every AM a step ahead."""
        plan, steps = self.plan, self.steps
        leader = dsp == 0
        if leader:
            self.broadcast(drv, 0)
        s = 0
        for _g, items in self.rounds:
            it = items[dsp]
            n_steps = max(plan.tiles_needed(x[1]) for x in items if x is not None)
            nj = plan.tiles_needed(it[1]) if it is not None else 0
            if it is not None:
                self.setup(drv, it)
            for ps in (0, 1):
                if it is not None and ps == 1:
                    drv.call(("lse",), {R_D: self.am["stats"]})
                for j in range(n_steps):
                    if leader:
                        drv.wait(CH_KV)
                    drv.barrier()
                    if leader and s + 1 < len(steps):
                        self.broadcast(drv, s + 1)
                    if it is not None and j < nj:
                        self.tile(drv, it, ps, j, s % 2, counter)
                    s += 1
            if it is not None:
                self.finish(drv, it)


def build_attention_forward(plan: AttentionPlan, platform: Platform, *, reference: bool = False) -> AttentionProgram:
    """The per-DSP programs of one forward (shape, tiles and schedule from ``plan``); ``reference``:
    every driver built bundle by bundle through the assembler (:class:`~.driver.ReferenceDriver`)."""
    p = platform
    builder = _ForwardBuilder(plan, p)
    library = Library(p, FORWARD_KERNELS, reference=reference)
    drivers = [library.driver() for _ in range(p.dsps)]
    useful, pairs = builder.useful_work()
    mode = builder.mode
    if mode == "gsm" and builder.fit < 1:
        kv_bytes = builder.kv_bytes
        raise CapacityError(f"GSM: schedule 'gsm' keeps one KV head's K and V (2 x {plan.seq} x {plan.d} FP16) in "
                            f"GSM: {kv_bytes} bytes, {kv_bytes - p.gsm_bytes} more than the {p.gsm_bytes}-byte GSM")
    mine = assign(plan, p.dsps, list(range(plan.kv_heads))) if mode == "own" else None
    for dsp, drv in enumerate(drivers):
        counter = [0]      # P^T sub-tiles written so far: picks the FP16 buffer and its channel
        if mode == "gsm":
            builder.drive_gsm(drv, dsp, counter)
        elif mode == "own":
            builder.drive_own(drv, mine[dsp], counter)
        else:
            builder.drive_broadcast(drv, dsp, counter)
        for ch in (CH_RED, CH_SG, CH_IN):
            drv.wait(ch)
    return AttentionProgram(plan, link(drivers, library), useful, pairs, mode)


# ------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------
@dataclass
class AttentionForwardResult:
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    causal: bool
    mode: str
    tiles: AttentionTiles
    schedule: str              # how K/V reached the DSPs: "gsm", "broadcast" or "own"
    cycles: int
    useful_macs: int           # 2 x (query rows x keys x d) per visited tile pair (pass-2 recompute excluded)
    tile_pairs: int
    utilization: float
    latency_ms: float
    stalls: dict[str, int]
    ddr_bytes: int
    memory: dict[str, int]
    o: np.ndarray | None = None
    saved: AttentionSaved | None = None
    # the run's counters (and trace, if recorded): for mtemu.explain and the trace writer
    stats: RunStats | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("o", "saved", "stats")}
        d["stalls"], d["memory"], d["tiles"] = dict(self.stalls), dict(self.memory), asdict(self.tiles)
        return d


@functools.lru_cache(maxsize=driver.BUILT_KEPT)
def _build_forward_cached(heads, kv_heads, seq, d, causal, tiles, platform, schedule) -> AttentionProgram:
    plan = plan_attention_forward(heads, kv_heads, seq, d, causal=causal, tiles=tiles, platform=platform,
                                  schedule=schedule)
    return build_attention_forward(plan, platform)


def attention_forward_timing(heads: int, kv_heads: int, seq: int, head_dim: int, *, causal: bool = True,
                             tiles: AttentionTiles | None = None, platform: Platform | None = None,
                             schedule: str = "auto", trace: TraceOptions | None = None) -> AttentionForwardResult:
    """Emulate the attention forward in timing-only mode (no data) and return its statistics
    (``result.stats``: the run's counters, with its trace when ``trace`` is given)."""
    platform = as_platform(platform)
    _check_flag("causal", causal)
    heads, kv_heads, seq, head_dim = positive_ints("attention", MtemuError, heads=heads, kv_heads=kv_heads, seq=seq,
                                                   head_dim=head_dim)
    tiles = tiles or default_tiles(head_dim, platform)
    ap = _build_forward_cached(int(heads), int(kv_heads), int(seq), int(head_dim), bool(causal), tiles, platform,
                               schedule)
    stats = Cluster(platform, ddr_bytes=ap.plan.ddr_bytes, functional=False).run(
        ap.programs, dsp_program=list(range(platform.dsps)), trace=trace)
    return _forward_result(ap, stats, "timing", platform)


def _forward_result(ap: AttentionProgram, stats: RunStats, mode: str, platform: Platform) -> AttentionForwardResult:
    plan = ap.plan
    util = ap.useful_macs / (platform.peak_macs_per_cycle * stats.cycles)
    return AttentionForwardResult(plan.heads, plan.kv_heads, plan.seq, plan.d, plan.causal, mode, plan.tiles,
                                  ap.schedule, stats.cycles, ap.useful_macs, ap.tile_pairs, util,
                                  stats.cycles / platform.clock_hz * 1e3, stats.stall_cycles(),
                                  stats.server_bytes["ddr"],
                                  {"sm": plan.sm_used, "am": plan.am_used, "gsm": 0, "ddr": plan.ddr_bytes},
                                  stats=stats)


def run_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = True,
                  tiles: AttentionTiles | None = None, platform: Platform | None = None,
                  mode: str = "functional", schedule: str = "auto",
                  trace: TraceOptions | None = None) -> AttentionForwardResult:
    """Attention forward on the emulated cluster: O (FP16), the saved state Algorithm 1 consumes
    (P as FP16, row logsumexp as FP32) and statistics. Two passes over the key tiles: online row
    max/sum, then P = exp(s - lse) written key-major to DDR and O^T += V^T P^T in FP32."""
    platform = as_platform(platform)
    heads, kv_heads, seq, d = _check_qkv(q, k, v)
    _check_flag("causal", causal)
    if mode not in ("functional", "timing"):
        raise MtemuError(f"mode must be 'functional' or 'timing', got {mode!r}")
    tiles = tiles or default_tiles(d, platform)
    ap = _build_forward_cached(heads, kv_heads, seq, d, bool(causal), tiles, platform, schedule)
    plan = ap.plan
    functional = mode == "functional"
    cluster = Cluster(platform, ddr_bytes=plan.ddr_bytes, functional=functional)
    dd = plan.ddr
    if functional:
        for name, x in (("q", q), ("k", k), ("v", v)):
            cluster.write_ddr_u16(dd[name], np.ascontiguousarray(x).view(np.uint16))
        cluster.write_ddr_u16(dd["mask"], causal_bias_table(plan, platform.vector_lanes).view(np.uint16))
    stats = cluster.run(ap.programs, dsp_program=list(range(platform.dsps)), trace=trace)
    res = _forward_result(ap, stats, mode, platform)
    if functional:
        res.o = cluster.read_ddr_u16(dd["o"], heads * seq * d).view(np.float16).reshape(heads, seq, d)
        pt = cluster.read_ddr_u16(dd["pt"], heads * seq * seq).view(np.float16).reshape(heads, seq, seq)
        lse = cluster.read_ddr_f32(dd["lse"], heads * seq).reshape(heads, seq)
        res.saved = AttentionSaved(np.ascontiguousarray(pt.transpose(0, 2, 1)), lse)
    return res

"""The paper's Algorithm 1 attention backward on one emulated cluster, and a DDR-staged baseline.

With query rows across the vector lanes (see ``plan``), score-shaped tiles are held transposed,
key-major: P^T, GP^T, GS^T are [keys, query lanes]. Left operands are read from SM with scalar
loads at any address, so a transposed *left* operand costs nothing; right operands must be
contiguous rows in AM. The four products of one (i, j) tile pair are then

    (a) GP^T[c, :]  = sum_e V_j[c, e]  GO_i^T[e, :]     left V_j (SM),   right GO_i^T (AM)
        GS^T        = P^T o (GP^T - Delta)              fused into (a): t += (-1) Delta; 0 + P^T o t
    (b) GV_part[c]  = sum_r P^T[c, r]  GO_i[r, :]        left P^T (SM),   right GO_i (AM)
    (c) GQ_i^T[e]  += sum_c K_j[c, e]  GS^T[c, :]        left K_j (SM),   right GS^T (AM)
    (d) GK_part[c]  = sum_r GS^T[c, r] Q_i[r, :]         left GS^T (SM),  right Q_i (AM)

GO_i^T and O_i^T (for Delta = rowsum(GO o O)) are built once per query tile by local AM->AM DMA
(two-byte rows on the DSP's own DMA engine); GQ_i^T is transposed back the same way before its
single write-back. Saved P is kept key-major in DDR (the forward kernel writes it that way), so
one P^T tile is one strided DMA.

Schedule (Algorithm 1). Work items are (query head, query tile) pairs of one KV head; a *round*
gives one item to each DSP and walks the key/value tiles j in lock step: DSP 0 broadcasts K_j and
V_j into every AM (double-buffered, one step ahead), each DSP prefetches its own P^T tile, and
stages Bc' key rows at a time (V, K, P^T, GS^T sub-tiles) into SM as left operands. GV_j/GK_j
partials are reduce-added into FP32 accumulators in GSM (one KV head at a time); GQ_i stays in
AM in FP32 across j and is written back once. After a KV head's last round the DSPs convert its
GSM accumulators to FP16 (dK scaled by 1/sqrt(d)) and zero GSM for the next head. Causal: a
DSP skips key tiles that lie wholly after its query tile (their saved P is zero). When a KV head
has fewer items than DSPs (MHA, short sequences) a broadcast round would idle most DSPs; then
several KV heads share GSM, items are dealt to the least-loaded DSP and each DSP loads its own
K_j, V_j without lock step (see ``_phases``).

The DDR-staged baseline runs the same code and arithmetic but round-trips the intermediates
through DDR: GP^T (FP32) is written to DDR and read back before the softmax backward, GS^T goes
AM -> DDR -> SM instead of AM -> SM, the P^T sub-tiles are re-read from DDR into SM instead of
from AM, and the partial gradients are reduce-added into FP32 accumulators in DDR instead of GSM.

Numerics follow :func:`attention_backward_tiled` (gs_staging="fp16") operation for operation, so
dq equals it bit for bit; dk/dv are summed across DSPs in DMA issue order (bit-exact only when
one DSP does all the adds in loop order).
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, fields
from typing import Callable

import numpy as np

from rtcommon.checks import positive_ints

from ...errors import CapacityError, MtemuError
from ...machine import Cluster, RunStats
from ...platform import DEFAULT, Platform, as_platform
from ...trace import TraceOptions
from ..attention_ref import AttentionSaved, _check_backward_args, _check_flag
from ..capacity import AttentionTiles
from ..schedule import Op, check_registers
from . import driver
from .driver import CH_CONV, CH_IN, CH_KV, CH_PT, CH_RED, CH_SG, CH_SP, CH_SVK, AttentionProgram, Driver, Library, link
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
    align_up,
    assign,
    check_shape_and_tiles,
    ddr_layout,
    default_tiles,
    layout,
    rounds,
    split_rows,
)

# prefetched transposes issued per Bc' sub-tile (a few, so SM staging never waits long behind them)
TRANSPOSES_PER_CHUNK = 16
# under the "gsm" schedule, the next query tile is prefetched behind items of at most this many
# key tiles (timing runs at seq 512-4096, d = 128: thresholds 4-8 agree within 1.5 %; prefetching
# behind every item loses 2-3 % at seq 4096 by crowding the DDR queue; seq 512 gains 15 %)
PREFETCH_MAX_TILES = 4
# key rows per score-kernel call
SCORE_ROWS = 8


# ------------------------------------------------------------------------------------------
# plan: buffers and capacity
# ------------------------------------------------------------------------------------------
def plan_attention(heads: int, kv_heads: int, seq: int, d: int, *, causal: bool = True,
                   tiles: AttentionTiles | None = None, variant: str = "resident",
                   platform: Platform = DEFAULT, schedule: str = "auto") -> AttentionPlan:
    """Check shape and tiles (Eq. 1, then this kernel's own buffers); raise CapacityError.
    ``schedule`` picks how K/V reach the DSPs (see ``_phases``); "auto" chooses."""
    t = check_shape_and_tiles(heads, kv_heads, seq, d, tiles, platform, schedule=schedule, variant=variant)
    p = platform
    lanes = p.vector_lanes
    br, bc, bcp = int(t.br), int(t.bc), int(t.bc_prime)
    nvd = -(-d // lanes)
    dpitch = nvd * lanes
    # conversion chunk lives in the GQ^T buffer (free between rounds)
    conv_rows = max(1, min(64, (d * lanes * 4) // (dpitch * 6)))
    am, am_used = layout([
        ("q", br * d * 2), ("go", br * d * 2), ("got", d * lanes * 2), ("ot", d * lanes * 2),
        ("wbt", d * lanes * 2), ("delta", lanes * 4), ("delta1", lanes * 4), ("gqt", d * lanes * 4),
        ("k0", bc * d * 2), ("k1", bc * d * 2), ("v0", bc * d * 2), ("v1", bc * d * 2),
        ("pt0", bc * lanes * 2), ("pt1", bc * lanes * 2), ("gst", bcp * lanes * 2),
        ("gv", bcp * dpitch * 4), ("gk", bcp * dpitch * 4), ("zero", conv_rows * d * 4),
        ("pad", lanes * 4)])   # vector loads of d-wide rows read up to one vector past a buffer
    am["conv_in"] = am["gqt"]
    am["conv_out"] = am["gqt"] + align_up(conv_rows * dpitch * 4)
    if am_used > p.am_bytes:
        raise CapacityError(
            f"AM: attention kernel buffers for {t.describe()} (Q, GO, GO^T, O^T, GQ^T FP32, write-back, two K/V/P^T "
            f"slots, GS^T and FP32 GV/GK sub-tiles) need {am_used} bytes, {am_used - p.am_bytes} more than the "
            f"{p.am_bytes}-byte AM")
    sm, sm_used = layout([("v", bcp * d * 2), ("k", bcp * d * 2), ("pt", bcp * lanes * 2),
                          ("gst", bcp * lanes * 2)])
    if sm_used > p.sm_bytes:
        raise CapacityError(
            f"SM: staged sub-tiles V, K ({bcp} x {d}) and P^T, GS^T ({bcp} x {lanes} lanes) FP16 need {sm_used} "
            f"bytes, {sm_used - p.sm_bytes} more than the {p.sm_bytes}-byte SM")
    gsm_used = 2 * seq * d * 4 if variant == "resident" else 0
    if gsm_used > p.gsm_bytes:
        raise CapacityError(
            f"GSM: FP32 dK and dV accumulators of one KV head (2 x {seq} x {d}) need {gsm_used} bytes, "
            f"{gsm_used - p.gsm_bytes} more than the {p.gsm_bytes}-byte GSM")
    sizes = [("q", heads * seq * d * 2), ("o", heads * seq * d * 2), ("do", heads * seq * d * 2),
             ("k", kv_heads * seq * d * 2), ("v", kv_heads * seq * d * 2), ("pt", heads * seq * seq * 2),
             ("dq", heads * seq * d * 2), ("dk", kv_heads * seq * d * 2), ("dv", kv_heads * seq * d * 2)]
    if variant == "ddr-staged":
        sizes += [("dkacc", kv_heads * seq * d * 4), ("dvacc", kv_heads * seq * d * 4),
                  ("scratch", p.dsps * align_up(bcp * lanes * 4 + bcp * lanes * 2))]
    ddr, ddr_bytes = ddr_layout(sizes, p)
    if schedule == "gsm" and gsm_used + 2 * seq * d * 2 > p.gsm_bytes:
        raise CapacityError(
            f"GSM: schedule 'gsm' keeps one KV head's K and V (2 x {seq} x {d} FP16) next to its accumulators: "
            f"{gsm_used + 2 * seq * d * 2} bytes, {gsm_used + 2 * seq * d * 2 - p.gsm_bytes} more than the "
            f"{p.gsm_bytes}-byte GSM")
    return AttentionPlan(heads, kv_heads, seq, d, bool(causal), variant, t, nvd, conv_rows, am, sm, ddr,
                         gsm_used, am_used, sm_used, ddr_bytes, schedule)


# ------------------------------------------------------------------------------------------
# micro-kernels of the backward (the GEMM and write-back kernels are shared)
# ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def mk_scores(rows: int, d: int, part: str, platform: Platform, rotation: int = 2) -> np.ndarray:
    """GP^T rows and the softmax backward for ``rows`` keys (lanes = query rows).

    part "fused": GP^T = V (SM, R_A, rows of d) x GO^T (AM, R_B, rows of lanes), then
    GS^T = P^T o (GP^T - Delta) stored FP16 at R_W; "gp": store GP^T FP32 at R_W and stop;
    "gs": load GP^T FP32 from R_C and finish. Delta (FP32) at R_D, P^T rows (FP16) at R_P."""
    lanes = platform.vector_lanes
    acc = list(range(rows))
    va0 = rows
    vb = va0 + rotation * rows
    vdl, vm1 = vb + rotation, vb + rotation + 1
    g0 = vm1 + 1
    p0 = g0 + rows
    check_registers(R_T0 + rotation * rows + 1, p0 + rows, platform, f"attention score kernel {rows} rows")
    ops: list[Op] = []
    if part in ("fused", "gp"):
        for r in range(rows):
            ops.append(zero(acc[r]))
        bcast_dot(ops, acc, va0, vb, d, rotation, lanes)
        if part == "gp":
            for r in range(rows):
                ops.append(vstore("vstw", R_W, r * lanes * 4, acc[r]))
            return assemble(ops, platform)
    else:
        for r in range(rows):
            ops.append(vload("vldw", acc[r], R_C, r * lanes * 4))
    sm1 = R_T0 + rotation * rows
    ops.append(vload("vldw", vdl, R_D, 0))
    ops.append(Op("smovi", (sm1, FP16_MINUS_ONE), (), (("s", sm1),)))
    ops.append(Op("svbcast", (vm1, sm1), (("s", sm1),), (("v", vm1),)))
    for r in range(rows):
        ops.append(fma(acc[r], vm1, vdl))                              # t = GP^T - Delta
    for r in range(rows):
        ops.append(zero(g0 + r))
        ops.append(vload("vldh", p0 + r, R_P, r * lanes * 2))
        ops.append(fma(g0 + r, p0 + r, acc[r]))                        # GS^T = 0 + P^T o t
        ops.append(vstore("vsth", R_W, r * lanes * 2, g0 + r))
    return assemble(ops, platform)


@functools.lru_cache(maxsize=64)
def mk_delta(d: int, platform: Platform, rotation: int = 4) -> np.ndarray:
    """Delta = sum_e GO^T[e] o O^T[e] (AM rows at R_A and R_B), sequential in e, FP32 at R_C."""
    lanes = platform.vector_lanes
    ops = [zero(0)]
    for e in range(d):
        a, b = 1 + 2 * (e % rotation), 2 + 2 * (e % rotation)
        ops.append(vload("vldh", a, R_A, e * lanes * 2))
        ops.append(vload("vldh", b, R_B, e * lanes * 2))
        ops.append(fma(0, a, b))
    ops.append(vstore("vstw", R_C, 0, 0))
    return assemble(ops, platform)


BACKWARD_KERNELS = {"scores": mk_scores, "delta": mk_delta}


# ------------------------------------------------------------------------------------------
# schedule: how K/V reach the DSPs, which KV heads share GSM
# ------------------------------------------------------------------------------------------
def _phases(plan: AttentionPlan, platform: Platform) -> tuple[str, list[list[int]]]:
    """KV heads whose dK/dV accumulators live together in GSM, and how K/V reach the DSPs.

    "broadcast" (Algorithm 1 as written): one KV head per phase; DSP 0 broadcasts K_j, V_j into
    every AM for lock-stepped rounds. With causal masking the DSPs holding short query tiles idle
    at the per-step barriers, and KV heads with fewer items than DSPs leave DSPs idle.
    "gsm": the phase's K and V are loaded once into GSM (next to the accumulators); every DSP runs
    its own items (longest first to the least-loaded DSP) and stages K/V sub-tiles GSM -> SM with
    no lock step. One DDR read of K/V as with the broadcast, no idling at barriers.
    "own": like "gsm" but each DSP reads K_j, V_j from DDR itself (when K/V do not fit GSM and a
    KV head has fewer items than DSPs). "auto": "gsm" if one head fits, else "broadcast" when a
    KV head has a cluster's worth of items, else "own"."""
    acc = 2 * plan.seq * plan.d * 4 if plan.variant == "resident" else 0
    kv = 2 * plan.seq * plan.d * 2
    kvh = plan.kv_heads
    mode = plan.schedule
    if mode == "auto":
        per_kv = (plan.heads // kvh) * plan.n_qt
        mode = "gsm" if acc + kv <= platform.gsm_bytes else (
            "broadcast" if per_kv >= platform.dsps or kvh == 1 else "own")
    if mode == "broadcast":
        return mode, [[g] for g in range(kvh)]
    per_head = acc + (kv if mode == "gsm" else 0)
    fit = kvh if per_head == 0 else max(1, min(kvh, platform.gsm_bytes // per_head))
    return mode, [list(range(g0, min(g0 + fit, kvh))) for g0 in range(0, kvh, fit)]


def _useful_work(plan: AttentionPlan) -> tuple[int, int]:
    """Useful MACs (4 products per visited tile pair) and the number of visited tile pairs."""
    useful, pairs = 0, 0
    for _h in range(plan.heads):
        for i in range(plan.n_qt):
            for j in range(plan.tiles_needed(i)):
                useful += 4 * plan.q_rows(i) * plan.k_rows(j) * plan.d
                pairs += 1
    return useful, pairs


# ------------------------------------------------------------------------------------------
# builder: one straight-line driver per DSP
# ------------------------------------------------------------------------------------------
class _BackwardBuilder:
    """Emits the backward's per-DSP drivers: the pieces of one work item (setup, start, tile
    pairs, finalize), the KV-head conversion, and the two ways to walk the items (lock-stepped
    broadcast rounds, or each DSP on its own list)."""

    def __init__(self, plan: AttentionPlan, platform: Platform):
        p = platform
        self.plan, self.p = plan, p
        self.lanes = lanes = p.vector_lanes
        self.t = t = plan.tiles
        self.d, self.seq, self.bcp = plan.d, plan.seq, int(t.bc_prime)
        self.nvd = plan.nvd
        self.dpitch = plan.nvd * lanes
        self.am, self.sm, self.dd = plan.am, plan.sm, plan.ddr
        self.staged = plan.variant == "ddr-staged"
        self.group = plan.heads // plan.kv_heads
        acc_bytes = 2 * self.seq * self.d * 4          # one KV head's FP32 dK and dV in GSM
        self.scale_bits = inv_sqrt_bits(self.d)
        nvd = self.nvd
        self.mr_g = max(1, min(12, (p.vector_registers - 2 * nvd) // (3 * nvd)))  # rows of a GEMM kernel call
        self.mode, self.phases = _phases(plan, p)
        broadcast = self.mode == "broadcast"
        self.rounds_of = {k: rounds(plan, p.dsps, heads) for k, heads in enumerate(self.phases)} if broadcast else {}
        self.assign_of = {k: assign(plan, p.dsps, heads) for k, heads in enumerate(self.phases)} if not broadcast \
            else {}
        self.acc_g = acc_bytes if not self.staged else 0     # GSM bytes of one head's accumulators
        # lock-step steps over all broadcast rounds: (phase, round, j)
        self.steps = [(k, r, j) for k in sorted(self.rounds_of) for r, (_g, items) in enumerate(self.rounds_of[k])
                      for j in range(max(plan.tiles_needed(x[1]) for x in items if x is not None))]
        # Per-item buffers. Under the "gsm" schedule the AM K/V slots are free and hold a second set,
        # so the next item's loads and transposes run under the current item's compute.
        am = self.am
        self.set_a = {"q": am["q"], "go": am["go"], "got": am["got"], "ot": am["ot"], "delta": am["delta"]}
        self.set_b = {"q": am["k0"], "go": am["k1"], "got": am["v0"], "ot": am["v1"], "delta": am["delta1"]}
        self.two_sets = self.mode == "gsm" and t.bc >= max(t.br, lanes)

    # --- addresses and loads ------------------------------------------------------------------
    def kv_src(self, name: str, g: int, j: int) -> int:
        return self.dd[name] + (g * self.seq + j * self.t.bc) * self.d * 2

    def item_rows(self, it: Item) -> tuple[int, int]:
        h, i = it
        return self.plan.q_rows(i), (h * self.seq + i * self.t.br) * self.d * 2

    def broadcast(self, drv: Driver, s: int) -> None:
        k, r, j = self.steps[s]
        g = self.rounds_of[k][r][0]
        rows = self.plan.k_rows(j)
        for name in ("k", "v"):
            drv.dma(CH_KV, "DDR", "AM", 1, rows * self.d * 2, 0, 0, self.kv_src(name, g, j),
                    self.am[f"{name}{s % 2}"], "broadcast")

    def kv_own(self, drv: Driver, g: int, j: int, slot: int) -> None:
        rows = self.plan.k_rows(j)
        for name in ("k", "v"):
            drv.dma(CH_KV, "DDR", "AM", 1, rows * self.d * 2, 0, 0, self.kv_src(name, g, j), self.am[f"{name}{slot}"])

    def pt_load(self, drv: Driver, h: int, i: int, j: int, slot: int) -> None:
        t, seq, lanes = self.t, self.seq, self.lanes
        src = self.dd["pt"] + (h * seq * seq + j * t.bc * seq + i * t.br) * 2
        drv.dma(CH_PT, "DDR", "AM", self.plan.k_rows(j), self.plan.q_rows(i) * 2, seq * 2, lanes * 2, src,
                self.am[f"pt{slot}"])

    def gsm_base_of(self, k: int, g: int) -> int:
        return self.phases[k].index(g) * self.acc_g

    def gsm_kv(self, k: int, g: int) -> tuple[int, int]:
        """GSM addresses of K and V of KV head g in phase k (after the phase's accumulators)."""
        seq, d, phases = self.seq, self.d, self.phases
        base = len(phases[k]) * self.acc_g + phases[k].index(g) * 2 * seq * d * 2
        return base, base + seq * d * 2

    def load_kv_gsm(self, drv: Driver, dsp: int, k: int) -> None:
        """This DSP's share of the rows of the phase's K and V, DDR -> GSM (not waited)."""
        d = self.d
        r0, cnt = split_rows(self.seq, self.p.dsps, dsp)
        for g in self.phases[k]:
            for name, dst in zip(("k", "v"), self.gsm_kv(k, g), strict=True):
                drv.dma(CH_KV, "DDR", "GSM", 1 if cnt else 0, max(cnt, 1) * d * 2, 0, 0,
                        self.kv_src(name, g, 0) + r0 * d * 2, dst + r0 * d * 2)

    # --- one work item --------------------------------------------------------------------------
    def setup(self, drv: Driver, it: Item | None, slot: int | None, B: dict | None = None,
              queue: list | None = None) -> None:
        """Issue (no waits) the loads and transposes of an item (and its first P^T tile unless
        ``slot`` is None); everything on CH_IN runs in order, so it may follow a write-back unwaited.
        With ``queue`` the transposes are left there for the caller to issue a few at a time, so
        they do not hold up the SM staging DMAs on the DSP's local engine."""
        if it is None:
            return
        B = self.set_a if B is None else B
        am, dd, d, lanes = self.am, self.dd, self.d, self.lanes
        h, i = it
        nq, row0 = self.item_rows(it)
        drv.dma(CH_IN, "DDR", "AM", 1, nq * d * 2, 0, 0, dd["q"] + row0, B["q"])
        drv.dma(CH_IN, "DDR", "AM", 1, nq * d * 2, 0, 0, dd["do"] + row0, B["go"])
        if queue is None:
            drv.dma(CH_IN, "DDR", "AM", 1, nq * d * 2, 0, 0, dd["o"] + row0, am["wbt"])
        else:   # WBT may still hold the previous item's dq, queued ahead of this load
            queue.append(("DDR", "AM", 1, nq * d * 2, 0, 0, dd["o"] + row0, am["wbt"]))
        moves = [("AM", "AM", nq, 2, d * 2, 2, am["wbt"] + e * 2, B["ot"] + e * lanes * 2) for e in range(d)] + \
                [("AM", "AM", nq, 2, d * 2, 2, B["go"] + e * 2, B["got"] + e * lanes * 2) for e in range(d)]
        if queue is None:
            _drain(drv, moves)
        else:
            queue.extend(moves)
        if slot is not None:
            self.pt_load(drv, h, i, 0, slot)

    def start(self, drv: Driver, B: dict | None = None) -> None:
        B = self.set_a if B is None else B
        drv.wait(CH_IN)
        drv.call(("delta", self.d), {R_A: B["got"], R_B: B["ot"], R_C: B["delta"]})

    def finalize(self, drv: Driver, it: Item, B: dict | None = None, queue: list | None = None) -> None:
        """GQ_i: scale, round to FP16 into WBT, transpose back, one write-back, on CH_IN (or left
        in ``queue``, ahead of the next item's loads into WBT)."""
        B = self.set_a if B is None else B
        am, d, lanes = self.am, self.d, self.lanes
        nq, row0 = self.item_rows(it)
        for r0 in range(0, d, 16):
            rows = min(16, d - r0)
            drv.call(("round", rows, 1, self.scale_bits, lanes * 4, lanes * 2),
                     {R_C: am["gqt"] + r0 * lanes * 4, R_W: am["wbt"] + r0 * lanes * 2})
        moves = [("AM", "AM", nq, 2, 2, d * 2, am["wbt"] + e * lanes * 2, B["ot"] + e * 2) for e in range(d)]
        moves.append(("AM", "DDR", 1, nq * d * 2, 0, 0, B["ot"], self.dd["dq"] + row0))
        if queue is None:
            _drain(drv, moves)
        else:
            queue.extend(moves)

    def tile(self, drv: Driver, dsp: int, it: Item, j: int, slot: int, gsm_base: int,
             kv: tuple[str, int, int] | None = None, B: dict | None = None, queue: list | None = None) -> None:
        """One (i, j) tile pair: Bc'-row sub-tiles staged in SM, products (a)-(d), reductions.
        K_j, V_j come from this step's AM slots, or from ``kv`` = (space, K_j address, V_j address)."""
        B = self.set_a if B is None else B
        plan, t, am, sm, dd = self.plan, self.t, self.am, self.sm, self.dd
        d, seq, bcp, lanes, nvd, dpitch = self.d, self.seq, self.bcp, self.lanes, self.nvd, self.dpitch
        staged, mr_g, mr_s = self.staged, self.mr_g, SCORE_ROWS
        h, i = it
        g = h // self.group
        nq, _row0 = self.item_rows(it)
        scratch = dd.get("scratch", 0) + dsp * align_up(bcp * lanes * 4 + bcp * lanes * 2)
        scratch_gs = scratch + bcp * lanes * 4
        nk = plan.k_rows(j)
        chunks = [(c0, min(bcp, nk - c0)) for c0 in range(0, nk, bcp)]
        kv_sp, kslot, vslot = kv if kv is not None else ("AM", am[f"k{slot}"], am[f"v{slot}"])
        ptslot = am[f"pt{slot}"]
        pt_ddr = dd["pt"] + (h * seq * seq + j * t.bc * seq + i * t.br) * 2

        def stage_pt(c0: int, cv: int) -> None:
            if staged:   # re-read the P^T sub-tile from DDR (rows of nq queries)
                drv.dma(CH_SP, "DDR", "SM", cv, nq * 2, seq * 2, lanes * 2, pt_ddr + c0 * seq * 2, sm["pt"])
            else:
                drv.dma(CH_SP, "AM", "SM", 1, cv * lanes * 2, 0, 0, ptslot + c0 * lanes * 2, sm["pt"])

        c0, cv = chunks[0]
        drv.dma(CH_SVK, kv_sp, "SM", 1, cv * d * 2, 0, 0, vslot + c0 * d * 2, sm["v"])
        drv.dma(CH_SVK, kv_sp, "SM", 1, cv * d * 2, 0, 0, kslot + c0 * d * 2, sm["k"])
        stage_pt(c0, cv)
        for q, (c0, cv) in enumerate(chunks):
            nxt = chunks[q + 1] if q + 1 < len(chunks) else None
            drv.wait(CH_SVK)
            # (a) GP^T and GS^T for these keys
            if staged:
                drv.wait(CH_RED)            # the GK buffer holds GP^T for its DDR round trip
            for r0 in range(0, cv, mr_s):
                rows = min(mr_s, cv - r0)
                if staged:
                    drv.call(("scores", rows, d, "gp"), {R_A: sm["v"] + r0 * d * 2, R_B: B["got"],
                                                         R_W: am["gk"] + r0 * lanes * 4})
                else:
                    drv.call(("scores", rows, d, "fused"), {
                        R_A: sm["v"] + r0 * d * 2, R_B: B["got"], R_D: B["delta"],
                        R_P: ptslot + (c0 + r0) * lanes * 2, R_W: am["gst"] + r0 * lanes * 2})
            if staged:   # GP^T -> DDR -> AM, then the softmax backward
                drv.dma(CH_SG, "AM", "DDR", 1, cv * lanes * 4, 0, 0, am["gk"], scratch)
                drv.wait(CH_SG)
                drv.dma(CH_SG, "DDR", "AM", 1, cv * lanes * 4, 0, 0, scratch, am["gk"])
                drv.wait(CH_SG)
                for r0 in range(0, cv, mr_s):
                    rows = min(mr_s, cv - r0)
                    drv.call(("scores", rows, d, "gs"), {
                        R_C: am["gk"] + r0 * lanes * 4, R_D: B["delta"],
                        R_P: ptslot + (c0 + r0) * lanes * 2, R_W: am["gst"] + r0 * lanes * 2})
            if nxt:
                drv.dma(CH_SVK, kv_sp, "SM", 1, nxt[1] * d * 2, 0, 0, vslot + nxt[0] * d * 2, sm["v"])
            # GS^T to SM (left operand of (d))
            if staged:
                drv.dma(CH_SG, "AM", "DDR", 1, cv * lanes * 2, 0, 0, am["gst"], scratch_gs)
                drv.wait(CH_SG)
                drv.dma(CH_SG, "DDR", "SM", 1, cv * lanes * 2, 0, 0, scratch_gs, sm["gst"])
            else:
                drv.dma(CH_SG, "AM", "SM", 1, cv * lanes * 2, 0, 0, am["gst"], sm["gst"])
            drv.wait(CH_RED)
            drv.wait(CH_SP)
            # (b) GV_part = P^T GO
            for r0 in range(0, cv, mr_g):
                rows = min(mr_g, cv - r0)
                drv.call(("gemm", rows, nvd, nq, True, lanes * 2, 2, d * 2, dpitch * 4),
                         {R_A: sm["pt"] + r0 * lanes * 2, R_B: B["go"], R_C: am["gv"] + r0 * dpitch * 4})
            if nxt:
                stage_pt(*nxt)
            row = j * t.bc + c0
            if staged:
                drv.dma(CH_RED, "AM", "DDR", cv, d * 4, dpitch * 4, d * 4, am["gv"],
                        dd["dvacc"] + (g * seq + row) * d * 4, "reduce_add")
            else:
                drv.dma(CH_RED, "AM", "GSM", cv, d * 4, dpitch * 4, d * 4, am["gv"],
                        gsm_base + (seq + row) * d * 4, "reduce_add")
            drv.wait(CH_SG)
            if queue:   # the local engine is idle until the next sub-tile's GS^T staging
                _drain(drv, queue, TRANSPOSES_PER_CHUNK)
            # (d) GK_part = GS^T Q
            for r0 in range(0, cv, mr_g):
                rows = min(mr_g, cv - r0)
                drv.call(("gemm", rows, nvd, nq, True, lanes * 2, 2, d * 2, dpitch * 4),
                         {R_A: sm["gst"] + r0 * lanes * 2, R_B: B["q"], R_C: am["gk"] + r0 * dpitch * 4})
            if staged:
                drv.dma(CH_RED, "AM", "DDR", cv, d * 4, dpitch * 4, d * 4, am["gk"],
                        dd["dkacc"] + (g * seq + row) * d * 4, "reduce_add")
            else:
                drv.dma(CH_RED, "AM", "GSM", cv, d * 4, dpitch * 4, d * 4, am["gk"],
                        gsm_base + row * d * 4, "reduce_add")
            # (c) GQ^T += K^T GS^T (lanes = query rows)
            first = j == 0 and q == 0
            for r0 in range(0, d, 16):
                rows = min(16, d - r0)
                drv.call(("gemm", rows, 1, cv, first, 2, d * 2, lanes * 2, lanes * 4),
                         {R_A: sm["k"] + r0 * 2, R_B: am["gst"], R_C: am["gqt"] + r0 * lanes * 4})
            if nxt:
                drv.dma(CH_SVK, kv_sp, "SM", 1, nxt[1] * d * 2, 0, 0, kslot + nxt[0] * d * 2, sm["k"])

    # --- walking the items ------------------------------------------------------------------------
    def drive_broadcast(self, drv: Driver, dsp: int) -> None:
        """Algorithm 1 as written: lock-stepped rounds, DSP 0 broadcasting K_j, V_j a step ahead."""
        plan, p, rounds_of, phases, steps = self.plan, self.p, self.rounds_of, self.phases, self.steps
        leader = dsp == 0
        if leader and steps:
            self.broadcast(drv, 0)
        s = 0
        flat = [(k, r) for k in sorted(rounds_of) for r in range(len(rounds_of[k]))]
        self.setup(drv, rounds_of[flat[0][0]][flat[0][1]][1][dsp], 0)
        for n, (k, r) in enumerate(flat):
            g, items = rounds_of[k][r]
            nxt_it = rounds_of[flat[n + 1][0]][flat[n + 1][1]][1][dsp] if n + 1 < len(flat) else None
            it = items[dsp]
            n_steps = max(plan.tiles_needed(x[1]) for x in items if x is not None)
            s0_next = s + n_steps
            next_done = False
            nj = plan.tiles_needed(it[1]) if it is not None else 0
            for j in range(n_steps):
                if leader:
                    drv.wait(CH_KV)
                drv.barrier()
                if leader and s + 1 < len(steps):
                    self.broadcast(drv, s + 1)
                if it is not None and j == 0:
                    self.start(drv)
                # idle for the rest of the round: write GQ back and prepare the next item now
                if (it is None and j == 0) or (it is not None and j == nj):
                    if it is not None:
                        self.finalize(drv, it)
                    self.setup(drv, nxt_it, s0_next % 2)
                    next_done = True
                if it is not None and j < nj:
                    drv.wait(CH_PT)
                    if j + 1 < nj:
                        self.pt_load(drv, it[0], it[1], j + 1, (s + 1) % 2)
                    self.tile(drv, dsp, it, j, s % 2, self.gsm_base_of(k, g))
                s += 1
            if not next_done and it is not None:
                self.finalize(drv, it)      # the item ran to the round's last step
            if r == len(rounds_of[k]) - 1:
                _convert(drv, plan, p, dsp, phases[k], more=k + 1 < len(phases))
            if not next_done:
                self.setup(drv, nxt_it, s0_next % 2)

    def drive_unlocked(self, drv: Driver, dsp: int) -> None:
        """Schedules "gsm" and "own": each DSP walks its own items, K/V from GSM or its own loads."""
        plan, p, phases, group, two_sets, t, d = self.plan, self.p, self.phases, self.group, self.two_sets, \
            self.t, self.d
        set_a, set_b = self.set_a, self.set_b
        s = 0
        gsm = self.mode == "gsm"
        if gsm:
            self.load_kv_gsm(drv, dsp, 0)
            drv.wait(CH_KV)
            drv.barrier()
        queue: list = []
        for k, heads in enumerate(phases):
            mine = self.assign_of[k][dsp]
            prefetched = False
            for n, it in enumerate(mine):
                g = it[0] // group
                nj = plan.tiles_needed(it[1])
                # prefetch the next item only behind a short one: a long item's setup is
                # amortized, and prefetching it early only crowds the DDR queue
                nxt = mine[n + 1] if two_sets and n + 1 < len(mine) and nj <= PREFETCH_MAX_TILES else None
                B = set_b if two_sets and n % 2 else set_a
                if not prefetched:
                    self.setup(drv, it, s % 2, B)
                prefetched = nxt is not None
                if not gsm:
                    self.kv_own(drv, g, 0, s % 2)
                self.start(drv, B)
                for j in range(nj):
                    if not gsm:
                        drv.wait(CH_KV)
                    drv.wait(CH_PT)
                    if j + 1 < nj:
                        if not gsm:
                            self.kv_own(drv, g, j + 1, (s + 1) % 2)
                        self.pt_load(drv, it[0], it[1], j + 1, (s + 1) % 2)
                    elif nxt is not None:
                        self.pt_load(drv, nxt[0], nxt[1], 0, (s + 1) % 2)
                    if j == 0 and nxt is not None:
                        # behind the previous item's queued write-back (it reads WBT and O^T)
                        self.setup(drv, nxt, None, set_a if B is set_b else set_b, queue)
                    kv = None
                    if gsm:
                        kb, vb = self.gsm_kv(k, g)
                        kv = ("GSM", kb + j * t.bc * d * 2, vb + j * t.bc * d * 2)
                    self.tile(drv, dsp, it, j, s % 2, self.gsm_base_of(k, g), kv, B, queue)
                    s += 1
                if two_sets:
                    _drain(drv, queue)
                    drv.wait(CH_IN)           # the next item's O transposes have read WBT
                    self.finalize(drv, it, B, queue if nxt is not None else None)
                else:
                    self.finalize(drv, it)
            nxt_load = (lambda drv=drv, dsp=dsp, k=k: self.load_kv_gsm(drv, dsp, k + 1)) \
                if gsm and k + 1 < len(phases) else None
            _convert(drv, plan, p, dsp, heads, more=k + 1 < len(phases), prefetch=nxt_load)


def _drain(drv: Driver, queue: list, count: int | None = None) -> None:
    """Issue up to ``count`` (all if None) queued transfers, in order, on CH_IN."""
    n = len(queue) if count is None else min(count, len(queue))
    for src_sp, dst_sp, rows, rowb, sstr, dstr, src, dst in queue[:n]:
        drv.dma(CH_IN, src_sp, dst_sp, rows, rowb, sstr, dstr, src, dst)
    del queue[:n]


def _convert(drv: Driver, plan: AttentionPlan, p: Platform, dsp: int, heads: list[int], more: bool,
             prefetch: Callable[[], None] | None = None) -> None:
    """After a phase: its KV heads' FP32 dK/dV accumulators -> FP16 in DDR (dK scaled).
    ``prefetch`` issues the next phase's K/V loads once every DSP is done with this phase."""
    lanes = p.vector_lanes
    d, seq = plan.d, plan.seq
    dpitch = plan.nvd * lanes
    am, dd = plan.am, plan.ddr
    staged = plan.variant == "ddr-staged"
    drv.wait(CH_RED)
    drv.barrier()
    if prefetch is not None:
        prefetch()
    first, count = split_rows(seq, p.dsps, dsp)
    scale_bits = inv_sqrt_bits(d)
    for n, g in enumerate(heads):
        for name, acc_gsm, bits in (("dk", n * 2 * seq * d * 4, scale_bits), ("dv", (n * 2 + 1) * seq * d * 4, 0)):
            for r0 in range(first, first + count, plan.conv_rows):
                rows = min(plan.conv_rows, first + count - r0)
                if staged:
                    drv.dma(CH_CONV, "DDR", "AM", rows, d * 4, d * 4, dpitch * 4,
                            dd[name + "acc"] + (g * seq + r0) * d * 4, am["conv_in"])
                else:
                    drv.dma(CH_CONV, "GSM", "AM", rows, d * 4, d * 4, dpitch * 4, acc_gsm + r0 * d * 4,
                            am["conv_in"])
                drv.wait(CH_CONV)
                if more and not staged:
                    drv.dma(CH_CONV, "AM", "GSM", 1, rows * d * 4, 0, 0, am["zero"], acc_gsm + r0 * d * 4)
                step = max(1, 16 // plan.nvd)
                for k0 in range(0, rows, step):
                    drv.call(("round", min(step, rows - k0), plan.nvd, bits, dpitch * 4, dpitch * 2),
                             {R_C: am["conv_in"] + k0 * dpitch * 4, R_W: am["conv_out"] + k0 * dpitch * 2})
                drv.dma(CH_CONV, "AM", "DDR", rows, d * 2, dpitch * 2, d * 2, am["conv_out"],
                        dd[name] + (g * seq + r0) * d * 2)
                drv.wait(CH_CONV)
    if prefetch is not None:
        drv.wait(CH_KV)
    drv.barrier()


def build_attention_backward(plan: AttentionPlan, platform: Platform, *, reference: bool = False) -> AttentionProgram:
    """The per-DSP programs of one backward (shape, tiles, variant and schedule from ``plan``);
    ``reference``: every driver built bundle by bundle through the assembler."""
    builder = _BackwardBuilder(plan, platform)
    library = Library(platform, BACKWARD_KERNELS, reference=reference)
    drivers = [library.driver() for _ in range(platform.dsps)]
    useful, pairs = _useful_work(plan)
    for dsp, drv in enumerate(drivers):
        if builder.mode == "broadcast":
            builder.drive_broadcast(drv, dsp)
        else:
            builder.drive_unlocked(drv, dsp)
        drv.wait(CH_RED)
        drv.wait(CH_IN)
        drv.wait(CH_CONV)
    return AttentionProgram(plan, link(drivers, library), useful, pairs, builder.mode)


# ------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------
@dataclass
class AttentionResult:
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    causal: bool
    variant: str
    mode: str
    tiles: AttentionTiles
    schedule: str           # how K/V reached the DSPs: "gsm", "broadcast" or "own"
    cycles: int
    useful_macs: int
    tile_pairs: int
    utilization: float
    latency_ms: float
    stalls: dict[str, int]
    ddr_bytes: int          # DDR traffic moved by DMA
    gsm_bytes: int          # GSM traffic moved by DMA
    memory: dict[str, int]
    dq: np.ndarray | None = None
    dk: np.ndarray | None = None
    dv: np.ndarray | None = None
    # the run's counters (and trace, if recorded): for mtemu.explain and the trace writer
    stats: RunStats | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("dq", "dk", "dv", "stats")}
        d["stalls"], d["memory"], d["tiles"] = dict(self.stalls), dict(self.memory), asdict(self.tiles)
        return d


@functools.lru_cache(maxsize=driver.BUILT_KEPT)
def _build_cached(heads, kv_heads, seq, d, causal, tiles, variant, platform, schedule="auto") -> AttentionProgram:
    plan = plan_attention(heads, kv_heads, seq, d, causal=causal, tiles=tiles, variant=variant, platform=platform,
                          schedule=schedule)
    return build_attention_backward(plan, platform)


def _result(ap: AttentionProgram, stats: RunStats, mode: str, platform: Platform) -> AttentionResult:
    plan = ap.plan
    util = ap.useful_macs / (platform.peak_macs_per_cycle * stats.cycles)
    return AttentionResult(plan.heads, plan.kv_heads, plan.seq, plan.d, plan.causal, plan.variant, mode, plan.tiles,
                           ap.schedule, stats.cycles, ap.useful_macs, ap.tile_pairs, util,
                           stats.cycles / platform.clock_hz * 1e3,
                           stats.stall_cycles(), stats.server_bytes["ddr"], stats.server_bytes["gsm"],
                           {"sm": plan.sm_used, "am": plan.am_used, "gsm": plan.gsm_used, "ddr": plan.ddr_bytes},
                           stats=stats)


def attention_backward_timing(heads: int, kv_heads: int, seq: int, head_dim: int, *, causal: bool = True,
                              tiles: AttentionTiles | None = None, variant: str = "resident",
                              platform: Platform | None = None, schedule: str = "auto",
                              trace: TraceOptions | None = None) -> AttentionResult:
    """Emulate Algorithm 1 in timing-only mode (no data) for a shape and return its statistics
    (``result.stats``: the run's counters, with its trace when ``trace`` is given)."""
    platform = as_platform(platform)
    _check_flag("causal", causal)
    heads, kv_heads, seq, head_dim = positive_ints("attention", MtemuError, heads=heads, kv_heads=kv_heads, seq=seq,
                                                   head_dim=head_dim)
    tiles = tiles or default_tiles(head_dim, platform)
    ap = _build_cached(int(heads), int(kv_heads), int(seq), int(head_dim), bool(causal), tiles, variant, platform,
                       schedule)
    cluster = Cluster(platform, ddr_bytes=ap.plan.ddr_bytes, functional=False)
    stats = cluster.run(ap.programs, dsp_program=list(range(platform.dsps)), trace=trace)
    return _result(ap, stats, "timing", platform)


def run_attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, do: np.ndarray,
                           saved: AttentionSaved, *, causal: bool = True, tiles: AttentionTiles | None = None,
                           variant: str = "resident", platform: Platform | None = None,
                           mode: str = "functional", schedule: str = "auto",
                           trace: TraceOptions | None = None) -> AttentionResult:
    """Algorithm 1 on the emulated cluster. FP16 (heads, seq, d) q, o, do; (kv_heads, seq, d) k, v;
    ``saved.p`` FP16 probabilities. Returns dq, dk, dv (FP16, functional mode) and statistics.
    ``schedule``: how K/V reach the DSPs, "auto", "gsm", "broadcast" or "own" (``_phases``)."""
    platform = as_platform(platform)
    heads, kv_heads, seq, d = _check_backward_args(q, k, v, o, do, saved)
    _check_flag("causal", causal)
    if mode not in ("functional", "timing"):
        raise MtemuError(f"mode must be 'functional' or 'timing', got {mode!r}")
    if mode == "timing":
        return attention_backward_timing(heads, kv_heads, seq, d, causal=causal, tiles=tiles, variant=variant,
                                         platform=platform, schedule=schedule, trace=trace)
    tiles = tiles or default_tiles(d, platform)
    ap = _build_cached(heads, kv_heads, seq, d, bool(causal), tiles, variant, platform, schedule)
    plan = ap.plan
    cluster = Cluster(platform, ddr_bytes=plan.ddr_bytes, functional=True)
    dd = plan.ddr
    for name, x in (("q", q), ("o", o), ("do", do), ("k", k), ("v", v)):
        cluster.write_ddr_u16(dd[name], np.ascontiguousarray(x).view(np.uint16))
    # the kernel keeps P key-major (P^T per head), as the forward kernel stores it
    cluster.write_ddr_u16(dd["pt"], np.ascontiguousarray(saved.p.transpose(0, 2, 1)).view(np.uint16))
    stats = cluster.run(ap.programs, dsp_program=list(range(platform.dsps)), trace=trace)
    res = _result(ap, stats, "functional", platform)
    res.dq = cluster.read_ddr_u16(dd["dq"], heads * seq * d).view(np.float16).reshape(heads, seq, d)
    res.dk = cluster.read_ddr_u16(dd["dk"], kv_heads * seq * d).view(np.float16).reshape(kv_heads, seq, d)
    res.dv = cluster.read_ddr_u16(dd["dv"], kv_heads * seq * d).view(np.float16).reshape(kv_heads, seq, d)
    return res

"""Attention on one emulated cluster: the paper's Algorithm 1 backward, a DDR-staged baseline of
it, and the forward kernel that produces O and the saved state Algorithm 1 consumes.

Layout choice. Vector lanes run across the query rows of a tile (``br <= vector_lanes``), so
row-wise quantities (Delta = rowsum(GO o O)) are vectors and the score-shaped tiles are held
transposed, key-major: P^T, GP^T, GS^T are [keys, query lanes]. Left operands are read from SM
with scalar loads at any address, so a transposed *left* operand costs nothing; right operands
must be contiguous rows in AM. The four products of one (i, j) tile pair are then

    (a) GP^T[c, :]  = sum_e V_j[c, e]  GO_i^T[e, :]     left V_j (SM),   right GO_i^T (AM)
        GS^T        = P^T o (GP^T - Delta)              fused into (a): t += (-1) Delta; 0 + P^T o t
    (b) GV_part[c]  = sum_r P^T[c, r]  GO_i[r, :]        left P^T (SM),   right GO_i (AM)
    (c) GQ_i^T[e]  += sum_c K_j[c, e]  GS^T[c, :]        left K_j (SM),   right GS^T (AM)
    (d) GK_part[c]  = sum_r GS^T[c, r] Q_i[r, :]         left GS^T (SM),  right Q_i (AM)

GO_i^T and O_i^T (for Delta) are built once per query tile by local AM->AM DMA (two-byte rows on
the DSP's own DMA engine); GQ_i^T is transposed back the same way before its single write-back.
Saved P is kept key-major in DDR (the forward kernel would write it that way), so one P^T tile is
one strided DMA.

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

The forward (:func:`run_attention`) uses the same layout: pass 1 keeps the online row max and sum
(``vmax``, ``vexp``), pass 2 recomputes the scores, writes P^T = exp(S - lse) to DDR key-major
(FP16) and accumulates O^T += V^T P^T in FP32.
"""
from __future__ import annotations

import functools
import math
import struct
from dataclasses import asdict, dataclass, field

import numpy as np

from .. import isa
from ..assembler import Program, ProgramBuilder, ins
from ..errors import CapacityError, MtemuError
from ..machine import Cluster, RunStats
from ..platform import DEFAULT, Platform
from .attention_ref import AttentionSaved, _check_backward_args, _check_flag
from .capacity import AttentionTiles, check_attention_tiles
from .schedule import Op, check_registers, schedule

ALIGN = 64
VARIANTS = ("resident", "ddr-staged")

# scalar registers used by the micro-kernels (set by the driver with smovi before each call)
R_A, R_B, R_C, R_W, R_D, R_P = 1, 2, 3, 4, 5, 6
R_T0 = 16
# DMA channels
CH_KV, CH_PT, CH_SVK, CH_SP, CH_SG, CH_RED, CH_IN, CH_CONV = range(8)
# prefetched transposes issued per Bc' sub-tile (a few, so SM staging never waits long behind them)
TRANSPOSES_PER_CHUNK = 16
# under the "gsm" schedule, the next query tile is prefetched behind items of at most this many
# key tiles (timing runs at seq 512-4096, d = 128: thresholds 4-8 agree within 1.5 %; prefetching
# behind every item loses 2-3 % at seq 4096 by crowding the DDR queue; seq 512 gains 15 %)
PREFETCH_MAX_TILES = 4


def default_tiles(head_dim: int, platform: Platform = DEFAULT) -> AttentionTiles:
    """Br = Bc = one vector of query rows (192 on the default platform), Bc' = Br' = 32."""
    lanes = platform.vector_lanes
    sub = min(32, lanes)
    return AttentionTiles(br=lanes, bc=lanes, d=int(head_dim), br_prime=sub, bc_prime=sub)


def _up(x: int, a: int = ALIGN) -> int:
    return (x + a - 1) // a * a


# ------------------------------------------------------------------------------------------
# plan: shapes, buffers, capacity
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionPlan:
    heads: int
    kv_heads: int
    seq: int
    d: int
    causal: bool
    variant: str
    tiles: AttentionTiles
    nvd: int                 # vectors per head_dim row
    conv_rows: int           # rows per GSM->FP16 conversion chunk
    am: dict = field(hash=False, compare=False)
    sm: dict = field(hash=False, compare=False)
    ddr: dict = field(hash=False, compare=False)
    gsm_used: int = 0
    am_used: int = 0
    sm_used: int = 0
    ddr_bytes: int = 0
    schedule: str = "auto"

    @property
    def n_qt(self) -> int:
        return -(-self.seq // self.tiles.br)

    @property
    def n_kt(self) -> int:
        return -(-self.seq // self.tiles.bc)

    def q_rows(self, i: int) -> int:
        return min(self.tiles.br, self.seq - i * self.tiles.br)

    def k_rows(self, j: int) -> int:
        return min(self.tiles.bc, self.seq - j * self.tiles.bc)

    def tiles_needed(self, i: int) -> int:
        """Key tiles a query tile visits (causal: those starting at or before its last query)."""
        if not self.causal:
            return self.n_kt
        last_q = i * self.tiles.br + self.q_rows(i) - 1
        return last_q // self.tiles.bc + 1


def _layout(sizes: list[tuple[str, int]]) -> tuple[dict, int]:
    out, off = {}, 0
    for name, size in sizes:
        out[name] = off
        off += _up(size)
    return out, off


SCHEDULES = ("auto", "gsm", "broadcast", "own")


def _check_shape_and_tiles(heads: int, kv_heads: int, seq: int, d: int, tiles: AttentionTiles | None,
                           platform: Platform, *, schedule: str, variant: str | None = None,
                           schedule_first: bool = False) -> AttentionTiles:
    """Checks shared by the backward and forward plans; returns the tiles (default if None).

    Order of the errors: positive dims, kv_heads | heads, variant (backward only), schedule, then
    the tiles (Eq. 1, d == head_dim, br within one vector). The forward plan has always checked
    ``schedule`` before anything else; ``schedule_first`` keeps that order."""
    def check_schedule() -> None:
        if schedule not in SCHEDULES:
            raise MtemuError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")

    if schedule_first:
        check_schedule()
    for name, v in (("heads", heads), ("kv_heads", kv_heads), ("seq", seq), ("head_dim", d)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise MtemuError(f"attention {name} must be a positive integer, got {v!r}")
    if heads % kv_heads:
        raise MtemuError(f"attention kv_heads={kv_heads} must divide heads={heads}")
    if variant is not None and variant not in VARIANTS:
        raise MtemuError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if not schedule_first:
        check_schedule()
    lanes = platform.vector_lanes
    t = tiles or default_tiles(d, platform)
    check_attention_tiles(t, platform)
    if t.d != d:
        raise MtemuError(f"attention tile 'd' ({t.d}) must equal head_dim ({d})")
    if t.br > lanes:
        raise CapacityError(f"attention tile br={t.br} exceeds one vector ({lanes} lanes): this kernel "
                            f"puts the query rows of a tile across the lanes")
    return t


def _ddr_layout(sizes: list[tuple[str, int]], platform: Platform) -> tuple[dict, int]:
    """Lay out the DDR tensors of a plan; CapacityError if they exceed the platform's DDR."""
    ddr, ddr_bytes = _layout(sizes)
    if ddr_bytes > platform.ddr_bytes:
        raise CapacityError(f"DDR: attention tensors need {ddr_bytes} bytes, {ddr_bytes - platform.ddr_bytes} "
                            f"more than the platform's {platform.ddr_bytes}")
    return ddr, ddr_bytes


def plan_attention(heads: int, kv_heads: int, seq: int, d: int, *, causal: bool = True,
                   tiles: AttentionTiles | None = None, variant: str = "resident",
                   platform: Platform = DEFAULT, schedule: str = "auto") -> AttentionPlan:
    """Check shape and tiles (Eq. 1, then this kernel's own buffers); raise CapacityError.
    ``schedule`` picks how K/V reach the DSPs (see ``_phases``); "auto" chooses."""
    t = _check_shape_and_tiles(heads, kv_heads, seq, d, tiles, platform, schedule=schedule, variant=variant)
    p = platform
    lanes = p.vector_lanes
    br, bc, bcp = int(t.br), int(t.bc), int(t.bc_prime)
    nvd = -(-d // lanes)
    dpitch = nvd * lanes
    # conversion chunk lives in the GQ^T buffer (free between rounds)
    conv_rows = max(1, min(64, (d * lanes * 4) // (dpitch * 6)))
    am, am_used = _layout([
        ("q", br * d * 2), ("go", br * d * 2), ("got", d * lanes * 2), ("ot", d * lanes * 2),
        ("wbt", d * lanes * 2), ("delta", lanes * 4), ("delta1", lanes * 4), ("gqt", d * lanes * 4),
        ("k0", bc * d * 2), ("k1", bc * d * 2), ("v0", bc * d * 2), ("v1", bc * d * 2),
        ("pt0", bc * lanes * 2), ("pt1", bc * lanes * 2), ("gst", bcp * lanes * 2),
        ("gv", bcp * dpitch * 4), ("gk", bcp * dpitch * 4), ("zero", conv_rows * d * 4),
        ("pad", lanes * 4)])   # vector loads of d-wide rows read up to one vector past a buffer
    am["conv_in"] = am["gqt"]
    am["conv_out"] = am["gqt"] + _up(conv_rows * dpitch * 4)
    if am_used > p.am_bytes:
        raise CapacityError(
            f"AM: attention kernel buffers for {t.describe()} (Q, GO, GO^T, O^T, GQ^T FP32, write-back, two K/V/P^T "
            f"slots, GS^T and FP32 GV/GK sub-tiles) need {am_used} bytes, {am_used - p.am_bytes} more than the "
            f"{p.am_bytes}-byte AM")
    sm, sm_used = _layout([("v", bcp * d * 2), ("k", bcp * d * 2), ("pt", bcp * lanes * 2),
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
                  ("scratch", p.dsps * _up(bcp * lanes * 4 + bcp * lanes * 2))]
    ddr, ddr_bytes = _ddr_layout(sizes, p)
    if schedule == "gsm" and gsm_used + 2 * seq * d * 2 > p.gsm_bytes:
        raise CapacityError(
            f"GSM: schedule 'gsm' keeps one KV head's K and V (2 x {seq} x {d} FP16) next to its accumulators: "
            f"{gsm_used + 2 * seq * d * 2} bytes, {gsm_used + 2 * seq * d * 2 - p.gsm_bytes} more than the "
            f"{p.gsm_bytes}-byte GSM")
    return AttentionPlan(heads, kv_heads, seq, d, bool(causal), variant, t, nvd, conv_rows, am, sm, ddr,
                         gsm_used, am_used, sm_used, ddr_bytes, schedule)


# ------------------------------------------------------------------------------------------
# micro-kernels (straight-line, list-scheduled, end in ret)
# ------------------------------------------------------------------------------------------
def _fp32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _vload(op: str, v: int, reg: int, off: int, fence: bool = False) -> Op:
    return Op(op, (v, (reg, off)), (("s", reg),), (("v", v),), fence)


def _vstore(op: str, reg: int, off: int, v: int) -> Op:
    return Op(op, ((reg, off), v), (("s", reg), ("v", v)))


def _fma(acc: int, a: int, b: int) -> Op:
    return Op("vfma", (acc, a, b), (("v", a), ("v", b), ("v", acc)), (("v", acc),))


def _zero(v: int) -> Op:
    return Op("svbcast", (v, 0), (("s", 0),), (("v", v),))


def _assemble(ops: list[Op], platform: Platform) -> np.ndarray:
    b = ProgramBuilder(platform)
    for bundle in schedule(ops, platform):
        b.bundle(*bundle)
    b.bundle(ins("ret"))
    return b.assemble().code


@functools.lru_cache(maxsize=512)
def mk_gemm(rows: int, nv: int, ks: int, first: bool, astride: int, akstride: int, bstride: int,
            cstride: int, platform: Platform, rotation: int = 2, b_fp32: bool = False) -> np.ndarray:
    """C[rows, nv vectors] (+)= A[rows, ks] B[ks, nv vectors]; A in SM at R_A + r*astride + k*akstride
    (FP16 scalars), B rows in AM at R_B + k*bstride, C in FP32 at R_C + r*cstride (loaded unless
    ``first``, always stored). Accumulation is sequential in k, as in the references."""
    lanes = platform.vector_lanes
    acc = [[r * nv + c for c in range(nv)] for r in range(rows)]
    va0 = rows * nv
    vb0 = va0 + rotation * rows
    check_registers(R_T0 + rotation * rows, vb0 + rotation * nv, platform, f"attention GEMM kernel {rows}x{nv}")
    ops: list[Op] = []
    for r in range(rows):
        for c in range(nv):
            ops.append(_zero(acc[r][c]) if first else _vload("vldw", acc[r][c], R_C, r * cstride + c * lanes * 4))
    for kk in range(ks):
        rs = kk % rotation
        for r in range(rows):
            s = R_T0 + rs * rows + r
            ops.append(Op("sldh", (s, (R_A, r * astride + kk * akstride)), (("s", R_A),), (("s", s),)))
        for r in range(rows):
            s, v = R_T0 + rs * rows + r, va0 + rs * rows + r
            ops.append(Op("svbcast", (v, s), (("s", s),), (("v", v),)))
        for c in range(nv):
            if b_fp32:
                ops.append(_vload("vldw", vb0 + rs * nv + c, R_B, kk * bstride + c * lanes * 4))
            else:
                ops.append(_vload("vldh", vb0 + rs * nv + c, R_B, kk * bstride + c * lanes * 2))
        for r in range(rows):
            for c in range(nv):
                ops.append(_fma(acc[r][c], va0 + rs * rows + r, vb0 + rs * nv + c))
    for r in range(rows):
        for c in range(nv):
            ops.append(_vstore("vstw", R_C, r * cstride + c * lanes * 4, acc[r][c]))
    return _assemble(ops, platform)


def _bcast_dot(ops: list[Op], acc: list[int], va0: int, vb: int, d: int, rotation: int, lanes: int) -> None:
    """Append acc[r] += A[r, e] * B[e] for e < d (the shared inner loop of the score kernels).

    A: len(acc) rows of d FP16 in SM at R_A, read one scalar at a time and broadcast; B: d FP16
    vector rows in AM at R_B. Scalar/vector registers rotate over ``rotation`` sets so a step's
    loads do not wait on the previous step's FMAs."""
    rows = len(acc)
    for e in range(d):
        rs = e % rotation
        for r in range(rows):
            s = R_T0 + rs * rows + r
            ops.append(Op("sldh", (s, (R_A, r * d * 2 + e * 2)), (("s", R_A),), (("s", s),)))
        for r in range(rows):
            s, v = R_T0 + rs * rows + r, va0 + rs * rows + r
            ops.append(Op("svbcast", (v, s), (("s", s),), (("v", v),)))
        ops.append(_vload("vldh", vb + rs, R_B, e * lanes * 2))
        for r in range(rows):
            ops.append(_fma(acc[r], va0 + rs * rows + r, vb + rs))


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
            ops.append(_zero(acc[r]))
        _bcast_dot(ops, acc, va0, vb, d, rotation, lanes)
        if part == "gp":
            for r in range(rows):
                ops.append(_vstore("vstw", R_W, r * lanes * 4, acc[r]))
            return _assemble(ops, platform)
    else:
        for r in range(rows):
            ops.append(_vload("vldw", acc[r], R_C, r * lanes * 4))
    sm1 = R_T0 + rotation * rows
    ops.append(_vload("vldw", vdl, R_D, 0))
    ops.append(Op("smovi", (sm1, 0xBC00), (), (("s", sm1),)))           # FP16 bits of -1.0
    ops.append(Op("svbcast", (vm1, sm1), (("s", sm1),), (("v", vm1),)))
    for r in range(rows):
        ops.append(_fma(acc[r], vm1, vdl))                              # t = GP^T - Delta
    for r in range(rows):
        ops.append(_zero(g0 + r))
        ops.append(_vload("vldh", p0 + r, R_P, r * lanes * 2))
        ops.append(_fma(g0 + r, p0 + r, acc[r]))                        # GS^T = 0 + P^T o t
        ops.append(_vstore("vsth", R_W, r * lanes * 2, g0 + r))
    return _assemble(ops, platform)


@functools.lru_cache(maxsize=64)
def mk_delta(d: int, platform: Platform, rotation: int = 4) -> np.ndarray:
    """Delta = sum_e GO^T[e] o O^T[e] (AM rows at R_A and R_B), sequential in e, FP32 at R_C."""
    lanes = platform.vector_lanes
    ops = [_zero(0)]
    for e in range(d):
        a, b = 1 + 2 * (e % rotation), 2 + 2 * (e % rotation)
        ops.append(_vload("vldh", a, R_A, e * lanes * 2))
        ops.append(_vload("vldh", b, R_B, e * lanes * 2))
        ops.append(_fma(0, a, b))
    ops.append(_vstore("vstw", R_C, 0, 0))
    return _assemble(ops, platform)


@functools.lru_cache(maxsize=256)
def mk_round(rows: int, nv: int, scale_bits: int, cstride: int, wstride: int, platform: Platform) -> np.ndarray:
    """FP16 write-back: W[r] = fp16(C[r] * scale) (or fp16(C[r]) when scale_bits == 0)."""
    lanes = platform.vector_lanes
    n = rows * nv
    check_registers(R_T0 + 1, 2 * n + 1, platform, f"attention write-back kernel {rows}x{nv}")
    ops: list[Op] = []
    vs = 2 * n
    if scale_bits:
        ops.append(Op("smovi", (R_T0, scale_bits), (), (("s", R_T0),)))
        ops.append(Op("svbcastw", (vs, R_T0), (("s", R_T0),), (("v", vs),)))
    for r in range(rows):
        for c in range(nv):
            x, y = 2 * (r * nv + c), 2 * (r * nv + c) + 1
            ops.append(_vload("vldw", x, R_C, r * cstride + c * lanes * 4))
            if scale_bits:
                ops.append(_zero(y))
                ops.append(_fma(y, x, vs))
                ops.append(_vstore("vsth", R_W, r * wstride + c * lanes * 2, y))
            else:
                ops.append(_vstore("vsth", R_W, r * wstride + c * lanes * 2, x))
    return _assemble(ops, platform)


# ------------------------------------------------------------------------------------------
# per-DSP driver programs
# ------------------------------------------------------------------------------------------
class _Driver:
    """Straight-line driver of one DSP: DMAs, waits, barriers and calls into a shared library."""

    def __init__(self, platform: Platform, library: "_Library"):
        self.b = ProgramBuilder(platform)
        self.lib = library
        self.calls: list[tuple[int, tuple]] = []

    def dma(self, ch: int, src_sp: str, dst_sp: str, rows: int, row_bytes: int, sstr: int, dstr: int,
            src: int, dst: int, mode: str = "copy") -> None:
        if rows <= 0:
            return
        desc = self.b.descriptor(src_sp, dst_sp, rows, row_bytes, sstr, dstr, mode)
        self.b.bundle(ins("dma", ch, desc, (0, src), (0, dst)))

    def wait(self, ch: int) -> None:
        self.b.bundle(ins("dmawait", ch))

    def barrier(self) -> None:
        self.b.bundle(ins("barrier"))

    def call(self, key: tuple, regs: dict[int, int]) -> None:
        self.lib.need(key)
        movs = [ins("smovi", r, v) for r, v in regs.items()]
        while len(movs) > 2:
            self.b.bundle(*movs[:3])
            movs = movs[3:]
        self.calls.append((self.b.bundle(*movs, ins("call", 0)), key))

    def finish(self, lib_code: np.ndarray, lib_offsets: dict) -> Program:
        self.b.bundle(ins("halt"))
        prog = self.b.assemble()
        n = prog.bundles
        code = np.concatenate([prog.code, lib_code])
        for bundle, key in self.calls:
            code[bundle, isa.SBR, isa.F_IMM0] = n + lib_offsets[key]
        return Program(code, prog.descriptors, {"main": 0}, prog.descriptor_names)


class _Library:
    def __init__(self, platform: Platform):
        self.platform = platform
        self.keys: dict[tuple, None] = {}

    def need(self, key: tuple) -> None:
        self.keys.setdefault(key, None)

    def build(self) -> tuple[np.ndarray, dict]:
        parts, offsets, off = [], {}, 0
        for key in self.keys:
            kind, args = key[0], key[1:]
            if kind == "gemm32":
                code = mk_gemm(*args, self.platform, 2, True)
            else:
                fn = {"gemm": mk_gemm, "scores": mk_scores, "delta": mk_delta, "round": mk_round,
                      "fwd": mk_forward_scores, "lse": mk_lse, "init": mk_init}[kind]
                code = fn(*args, self.platform)
            offsets[key] = off
            off += code.shape[0]
            parts.append(code)
        if not parts:
            return np.zeros((0, isa.N_UNITS, isa.N_FIELDS), np.int64), offsets
        return np.concatenate(parts), offsets


@dataclass
class AttentionProgram:
    plan: AttentionPlan
    programs: list[Program]
    useful_macs: int
    tile_pairs: int
    schedule: str = ""


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


def _rounds(plan: AttentionPlan, dsps: int, heads: list[int] | None = None
            ) -> list[tuple[int, list[tuple[int, int] | None]]]:
    """(kv head, items per DSP) per lock-step round; items (query head, query tile), longest first."""
    group = plan.heads // plan.kv_heads
    out = []
    for g in (range(plan.kv_heads) if heads is None else heads):
        items = [(h, i) for h in range(g * group, (g + 1) * group) for i in range(plan.n_qt)]
        items.sort(key=lambda it: (-plan.tiles_needed(it[1]), it[0], it[1]))
        for r0 in range(0, len(items), dsps):
            chunk = items[r0:r0 + dsps]
            out.append((g, chunk + [None] * (dsps - len(chunk))))
    return out


def _assign(plan: AttentionPlan, dsps: int, heads: list[int]) -> list[list[tuple[int, int]]]:
    """Items of several KV heads dealt longest-first to the least-loaded DSP (no lock step)."""
    group = plan.heads // plan.kv_heads
    items = [(h, i) for g in heads for h in range(g * group, (g + 1) * group) for i in range(plan.n_qt)]
    items.sort(key=lambda it: (-plan.tiles_needed(it[1]), it[0], it[1]))
    load = [0] * dsps
    out: list[list[tuple[int, int]]] = [[] for _ in range(dsps)]
    for it in items:
        k = min(range(dsps), key=lambda x: (load[x], x))
        out[k].append(it)
        load[k] += plan.tiles_needed(it[1])
    return out


def build_attention_backward(plan: AttentionPlan, platform: Platform) -> AttentionProgram:
    p = platform
    lanes = p.vector_lanes
    t = plan.tiles
    d, seq, bcp = plan.d, plan.seq, int(t.bc_prime)
    nvd = plan.nvd
    dpitch = nvd * lanes
    am, sm, dd = plan.am, plan.sm, plan.ddr
    staged = plan.variant == "ddr-staged"
    group = plan.heads // plan.kv_heads
    acc_bytes = 2 * seq * d * 4                 # one KV head's FP32 dK and dV in GSM
    scale_bits = _fp32_bits(float(np.float32(1.0 / math.sqrt(d))))
    mr_g = max(1, min(12, (p.vector_registers - 2 * nvd) // (3 * nvd)))  # rows of a GEMM kernel call
    mr_s = 8                                                               # key rows per score call
    mode, phases = _phases(plan, p)
    rounds_of = {k: _rounds(plan, p.dsps, heads) for k, heads in enumerate(phases)} if mode == "broadcast" else {}
    assign_of = {k: _assign(plan, p.dsps, heads) for k, heads in enumerate(phases)} if mode != "broadcast" else {}
    acc_g = acc_bytes if not staged else 0        # GSM bytes of one head's accumulators
    # lock-step steps over all broadcast rounds: (phase, round, j)
    steps = [(k, r, j) for k in sorted(rounds_of) for r, (_g, items) in enumerate(rounds_of[k])
             for j in range(max(plan.tiles_needed(x[1]) for x in items if x is not None))]
    library = _Library(p)
    drivers = [_Driver(p, library) for _ in range(p.dsps)]
    useful, pairs = 0, 0
    for h in range(plan.heads):
        for i in range(plan.n_qt):
            for j in range(plan.tiles_needed(i)):
                useful += 4 * plan.q_rows(i) * plan.k_rows(j) * d
                pairs += 1

    def kv_src(name: str, g: int, j: int) -> int:
        return dd[name] + (g * seq + j * t.bc) * d * 2

    def broadcast(drv: _Driver, s: int) -> None:
        k, r, j = steps[s]
        g = rounds_of[k][r][0]
        rows = plan.k_rows(j)
        for name in ("k", "v"):
            drv.dma(CH_KV, "DDR", "AM", 1, rows * d * 2, 0, 0, kv_src(name, g, j), am[f"{name}{s % 2}"], "broadcast")

    def kv_own(drv: _Driver, g: int, j: int, slot: int) -> None:
        rows = plan.k_rows(j)
        for name in ("k", "v"):
            drv.dma(CH_KV, "DDR", "AM", 1, rows * d * 2, 0, 0, kv_src(name, g, j), am[f"{name}{slot}"])

    def pt_load(drv: _Driver, h: int, i: int, j: int, slot: int) -> None:
        src = dd["pt"] + (h * seq * seq + j * t.bc * seq + i * t.br) * 2
        drv.dma(CH_PT, "DDR", "AM", plan.k_rows(j), plan.q_rows(i) * 2, seq * 2, lanes * 2, src, am[f"pt{slot}"])

    def transpose(drv: _Driver, src: int, dst: int, nq: int, to_lanes: bool) -> None:
        """[nq, d] natural <-> [d, lanes] lane-major, one local DMA of nq two-byte rows per e."""
        for e in range(d):
            if to_lanes:
                drv.dma(CH_IN, "AM", "AM", nq, 2, d * 2, 2, src + e * 2, dst + e * lanes * 2)
            else:
                drv.dma(CH_IN, "AM", "AM", nq, 2, 2, d * 2, src + e * lanes * 2, dst + e * 2)

    def item_rows(it: tuple[int, int]) -> tuple[int, int]:
        h, i = it
        return plan.q_rows(i), (h * seq + i * t.br) * d * 2

    # Per-item buffers. Under the "gsm" schedule the AM K/V slots are free and hold a second set,
    # so the next item's loads and transposes run under the current item's compute.
    set_a = {"q": am["q"], "go": am["go"], "got": am["got"], "ot": am["ot"], "delta": am["delta"]}
    set_b = {"q": am["k0"], "go": am["k1"], "got": am["v0"], "ot": am["v1"], "delta": am["delta1"]}
    two_sets = mode == "gsm" and t.bc >= max(t.br, lanes)

    def setup(drv: _Driver, it: tuple[int, int] | None, slot: int | None, B: dict = set_a,
              queue: list | None = None) -> None:
        """Issue (no waits) the loads and transposes of an item (and its first P^T tile unless
        ``slot`` is None); everything on CH_IN runs in order, so it may follow a write-back unwaited.
        With ``queue`` the transposes are left there for the caller to issue a few at a time, so
        they do not hold up the SM staging DMAs on the DSP's local engine."""
        if it is None:
            return
        h, i = it
        nq, row0 = item_rows(it)
        drv.dma(CH_IN, "DDR", "AM", 1, nq * d * 2, 0, 0, dd["q"] + row0, B["q"])
        drv.dma(CH_IN, "DDR", "AM", 1, nq * d * 2, 0, 0, dd["do"] + row0, B["go"])
        if queue is None:
            drv.dma(CH_IN, "DDR", "AM", 1, nq * d * 2, 0, 0, dd["o"] + row0, am["wbt"])
        else:   # WBT may still hold the previous item's dq, queued ahead of this load
            queue.append(("DDR", "AM", 1, nq * d * 2, 0, 0, dd["o"] + row0, am["wbt"]))
        moves = [("AM", "AM", nq, 2, d * 2, 2, am["wbt"] + e * 2, B["ot"] + e * lanes * 2) for e in range(d)] + \
                [("AM", "AM", nq, 2, d * 2, 2, B["go"] + e * 2, B["got"] + e * lanes * 2) for e in range(d)]
        if queue is None:
            drain(drv, moves)
        else:
            queue.extend(moves)
        if slot is not None:
            pt_load(drv, h, i, 0, slot)

    def drain(drv: _Driver, queue: list, count: int | None = None) -> None:
        """Issue up to ``count`` (all if None) queued transfers, in order, on CH_IN."""
        n = len(queue) if count is None else min(count, len(queue))
        for src_sp, dst_sp, rows, rowb, sstr, dstr, src, dst in queue[:n]:
            drv.dma(CH_IN, src_sp, dst_sp, rows, rowb, sstr, dstr, src, dst)
        del queue[:n]

    def start(drv: _Driver, B: dict = set_a) -> None:
        drv.wait(CH_IN)
        drv.call(("delta", d), {R_A: B["got"], R_B: B["ot"], R_C: B["delta"]})

    def finalize(drv: _Driver, it: tuple[int, int], B: dict = set_a, queue: list | None = None) -> None:
        """GQ_i: scale, round to FP16 into WBT, transpose back, one write-back, on CH_IN (or left
        in ``queue``, ahead of the next item's loads into WBT)."""
        nq, row0 = item_rows(it)
        for r0 in range(0, d, 16):
            rows = min(16, d - r0)
            drv.call(("round", rows, 1, scale_bits, lanes * 4, lanes * 2),
                     {R_C: am["gqt"] + r0 * lanes * 4, R_W: am["wbt"] + r0 * lanes * 2})
        moves = [("AM", "AM", nq, 2, 2, d * 2, am["wbt"] + e * lanes * 2, B["ot"] + e * 2) for e in range(d)]
        moves.append(("AM", "DDR", 1, nq * d * 2, 0, 0, B["ot"], dd["dq"] + row0))
        if queue is None:
            drain(drv, moves)
        else:
            queue.extend(moves)

    def tile(drv: _Driver, dsp: int, it: tuple[int, int], j: int, slot: int, gsm_base: int,
             kv: tuple[str, int, int] | None = None, B: dict = set_a, queue: list | None = None) -> None:
        """One (i, j) tile pair: Bc'-row sub-tiles staged in SM, products (a)-(d), reductions.
        K_j, V_j come from this step's AM slots, or from ``kv`` = (space, K_j address, V_j address)."""
        h, i = it
        g = h // group
        nq, _row0 = item_rows(it)
        scratch = dd.get("scratch", 0) + dsp * _up(bcp * lanes * 4 + bcp * lanes * 2)
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
                drain(drv, queue, TRANSPOSES_PER_CHUNK)
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

    def gsm_base_of(k: int, g: int) -> int:
        return phases[k].index(g) * acc_g

    def gsm_kv(k: int, g: int) -> tuple[int, int]:
        """GSM addresses of K and V of KV head g in phase k (after the phase's accumulators)."""
        base = len(phases[k]) * acc_g + phases[k].index(g) * 2 * seq * d * 2
        return base, base + seq * d * 2

    def load_kv_gsm(drv: _Driver, dsp: int, k: int) -> None:
        """This DSP's share of the rows of the phase's K and V, DDR -> GSM (not waited)."""
        base, extra = divmod(seq, p.dsps)
        r0 = dsp * base + min(dsp, extra)
        cnt = base + (1 if dsp < extra else 0)
        for g in phases[k]:
            for name, dst in zip(("k", "v"), gsm_kv(k, g)):
                drv.dma(CH_KV, "DDR", "GSM", 1 if cnt else 0, max(cnt, 1) * d * 2, 0, 0,
                        kv_src(name, g, 0) + r0 * d * 2, dst + r0 * d * 2)

    for dsp, drv in enumerate(drivers):
        leader = dsp == 0
        if mode == "broadcast":
            if leader and steps:
                broadcast(drv, 0)
            s = 0
            flat = [(k, r) for k in sorted(rounds_of) for r in range(len(rounds_of[k]))]
            setup(drv, rounds_of[flat[0][0]][flat[0][1]][1][dsp], 0)
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
                        broadcast(drv, s + 1)
                    if it is not None and j == 0:
                        start(drv)
                    # idle for the rest of the round: write GQ back and prepare the next item now
                    if (it is None and j == 0) or (it is not None and j == nj):
                        if it is not None:
                            finalize(drv, it)
                        setup(drv, nxt_it, s0_next % 2)
                        next_done = True
                    if it is not None and j < nj:
                        drv.wait(CH_PT)
                        if j + 1 < nj:
                            pt_load(drv, it[0], it[1], j + 1, (s + 1) % 2)
                        tile(drv, dsp, it, j, s % 2, gsm_base_of(k, g))
                    s += 1
                if not next_done and it is not None:
                    finalize(drv, it)      # the item ran to the round's last step
                if r == len(rounds_of[k]) - 1:
                    _convert(drv, plan, p, dsp, phases[k], more=k + 1 < len(phases))
                if not next_done:
                    setup(drv, nxt_it, s0_next % 2)
        else:
            s = 0
            gsm = mode == "gsm"
            if gsm:
                load_kv_gsm(drv, dsp, 0)
                drv.wait(CH_KV)
                drv.barrier()
            queue: list = []
            for k, heads in enumerate(phases):
                mine = assign_of[k][dsp]
                prefetched = False
                for n, it in enumerate(mine):
                    g = it[0] // group
                    nj = plan.tiles_needed(it[1])
                    # prefetch the next item only behind a short one: a long item's setup is
                    # amortized, and prefetching it early only crowds the DDR queue
                    nxt = mine[n + 1] if two_sets and n + 1 < len(mine) and nj <= PREFETCH_MAX_TILES else None
                    B = set_b if two_sets and n % 2 else set_a
                    if not prefetched:
                        setup(drv, it, s % 2, B)
                    prefetched = nxt is not None
                    if not gsm:
                        kv_own(drv, g, 0, s % 2)
                    start(drv, B)
                    for j in range(nj):
                        if not gsm:
                            drv.wait(CH_KV)
                        drv.wait(CH_PT)
                        if j + 1 < nj:
                            if not gsm:
                                kv_own(drv, g, j + 1, (s + 1) % 2)
                            pt_load(drv, it[0], it[1], j + 1, (s + 1) % 2)
                        elif nxt is not None:
                            pt_load(drv, nxt[0], nxt[1], 0, (s + 1) % 2)
                        if j == 0 and nxt is not None:
                            # behind the previous item's queued write-back (it reads WBT and O^T)
                            setup(drv, nxt, None, set_a if B is set_b else set_b, queue)
                        kv = None
                        if gsm:
                            kb, vb = gsm_kv(k, g)
                            kv = ("GSM", kb + j * t.bc * d * 2, vb + j * t.bc * d * 2)
                        tile(drv, dsp, it, j, s % 2, gsm_base_of(k, g), kv, B, queue)
                        s += 1
                    if two_sets:
                        drain(drv, queue)
                        drv.wait(CH_IN)           # the next item's O transposes have read WBT
                        finalize(drv, it, B, queue if nxt is not None else None)
                    else:
                        finalize(drv, it)
                nxt_load = (lambda drv=drv, dsp=dsp, k=k: load_kv_gsm(drv, dsp, k + 1)) \
                    if gsm and k + 1 < len(phases) else None
                _convert(drv, plan, p, dsp, heads, more=k + 1 < len(phases), prefetch=nxt_load)
        drv.wait(CH_RED)
        drv.wait(CH_IN)
        drv.wait(CH_CONV)
    lib_code, offsets = library.build()
    programs = [drv.finish(lib_code, offsets) for drv in drivers]
    return AttentionProgram(plan, programs, useful, pairs, mode)


def _convert(drv: _Driver, plan: AttentionPlan, p: Platform, dsp: int, heads: list[int], more: bool,
             prefetch=None) -> None:
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
    base, extra = divmod(seq, p.dsps)
    first = dsp * base + min(dsp, extra)
    count = base + (1 if dsp < extra else 0)
    scale_bits = _fp32_bits(float(np.float32(1.0 / math.sqrt(d))))
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

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("dq", "dk", "dv")}
        d["tiles"] = asdict(self.tiles)
        return d


@functools.lru_cache(maxsize=16)
def _build_cached(heads, kv_heads, seq, d, causal, tiles, variant, platform, schedule="auto") -> AttentionProgram:
    plan = plan_attention(heads, kv_heads, seq, d, causal=causal, tiles=tiles, variant=variant, platform=platform,
                          schedule=schedule)
    return build_attention_backward(plan, platform)


def _result(ap: AttentionProgram, stats: RunStats, mode: str, platform: Platform) -> AttentionResult:
    plan = ap.plan
    util = ap.useful_macs / (platform.peak_macs_per_cycle * stats.cycles)
    return AttentionResult(plan.heads, plan.kv_heads, plan.seq, plan.d, plan.causal, plan.variant, mode, plan.tiles,
                           ap.schedule, stats.cycles, ap.useful_macs, ap.tile_pairs, util, stats.cycles / platform.clock_hz * 1e3,
                           stats.stall_cycles(), stats.server_bytes["ddr"], stats.server_bytes["gsm"],
                           {"sm": plan.sm_used, "am": plan.am_used, "gsm": plan.gsm_used, "ddr": plan.ddr_bytes})


def attention_backward_timing(heads: int, kv_heads: int, seq: int, head_dim: int, *, causal: bool = True,
                              tiles: AttentionTiles | None = None, variant: str = "resident",
                              platform: Platform | None = None, schedule: str = "auto") -> AttentionResult:
    """Emulate Algorithm 1 in timing-only mode (no data) for a shape and return its statistics."""
    platform = platform or DEFAULT
    _check_flag("causal", causal)
    tiles = tiles or default_tiles(head_dim, platform)
    ap = _build_cached(int(heads), int(kv_heads), int(seq), int(head_dim), bool(causal), tiles, variant, platform,
                       schedule)
    cluster = Cluster(platform, ddr_bytes=ap.plan.ddr_bytes, functional=False)
    stats = cluster.run(ap.programs, dsp_program=list(range(platform.dsps)))
    return _result(ap, stats, "timing", platform)


def run_attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, do: np.ndarray,
                           saved: AttentionSaved, *, causal: bool = True, tiles: AttentionTiles | None = None,
                           variant: str = "resident", platform: Platform | None = None,
                           mode: str = "functional", schedule: str = "auto") -> AttentionResult:
    """Algorithm 1 on the emulated cluster. FP16 (heads, seq, d) q, o, do; (kv_heads, seq, d) k, v;
    ``saved.p`` FP16 probabilities. Returns dq, dk, dv (FP16, functional mode) and statistics.
    ``schedule``: how K/V reach the DSPs, "auto", "gsm", "broadcast" or "own" (``_phases``)."""
    platform = platform or DEFAULT
    heads, kv_heads, seq, d = _check_backward_args(q, k, v, o, do, saved)
    _check_flag("causal", causal)
    if mode not in ("functional", "timing"):
        raise MtemuError(f"mode must be 'functional' or 'timing', got {mode!r}")
    if mode == "timing":
        return attention_backward_timing(heads, kv_heads, seq, d, causal=causal, tiles=tiles, variant=variant,
                                         platform=platform, schedule=schedule)
    tiles = tiles or default_tiles(d, platform)
    ap = _build_cached(heads, kv_heads, seq, d, bool(causal), tiles, variant, platform, schedule)
    plan = ap.plan
    cluster = Cluster(platform, ddr_bytes=plan.ddr_bytes, functional=True)
    dd = plan.ddr
    for name, x in (("q", q), ("o", o), ("do", do), ("k", k), ("v", v)):
        cluster.write_ddr_u16(dd[name], np.ascontiguousarray(x).view(np.uint16))
    # the kernel keeps P key-major (P^T per head), as the forward kernel stores it
    cluster.write_ddr_u16(dd["pt"], np.ascontiguousarray(saved.p.transpose(0, 2, 1)).view(np.uint16))
    stats = cluster.run(ap.programs, dsp_program=list(range(platform.dsps)))
    res = _result(ap, stats, "functional", platform)
    res.dq = cluster.read_ddr_u16(dd["dq"], heads * seq * d).view(np.float16).reshape(heads, seq, d)
    res.dk = cluster.read_ddr_u16(dd["dk"], kv_heads * seq * d).view(np.float16).reshape(kv_heads, seq, d)
    res.dv = cluster.read_ddr_u16(dd["dv"], kv_heads * seq * d).view(np.float16).reshape(kv_heads, seq, d)
    return res


# ------------------------------------------------------------------------------------------
# validation against the paper's Fig. 10 (resident over DDR-staged speedup)
# ------------------------------------------------------------------------------------------
PAPER_SPEEDUP = (1.24, 1.54)     # Fig. 10 range; a target only
VALIDATE_SEQS = (512, 1024, 2048, 4096)


def validate_heads(seq: int, platform: Platform = DEFAULT) -> int:
    """Query heads (one shared KV head) giving about two full rounds of work items: enough to
    show the steady state while every sequence length emulates in seconds."""
    n_qt = -(-seq // platform.vector_lanes)
    return max(1, round(2 * platform.dsps / n_qt))


def validate_attention(platform: Platform | None = None, seqs: tuple[int, ...] = VALIDATE_SEQS,
                       head_dim: int = 128, causal: bool = True) -> list[dict]:
    """Resident (Algorithm 1) vs DDR-staged backward in timing mode, one row per sequence length."""
    platform = platform or DEFAULT
    rows = []
    for seq in seqs:
        heads = validate_heads(seq, platform)
        res = attention_backward_timing(heads, 1, seq, head_dim, causal=causal, variant="resident", platform=platform)
        stg = attention_backward_timing(heads, 1, seq, head_dim, causal=causal, variant="ddr-staged", platform=platform)
        rows.append({"seq": seq, "heads": heads, "kv_heads": 1, "head_dim": head_dim, "causal": causal,
                     "schedule": res.schedule, "speedup": stg.cycles / res.cycles,
                     "resident_ms": res.latency_ms, "staged_ms": stg.latency_ms,
                     "resident_utilization": res.utilization, "staged_utilization": stg.utilization,
                     "resident_ddr_bytes": res.ddr_bytes, "staged_ddr_bytes": stg.ddr_bytes,
                     "paper_speedup_range": list(PAPER_SPEEDUP)})
    return rows


# ------------------------------------------------------------------------------------------
# forward kernel: O, the saved P (key-major FP16) and the row logsumexp
# ------------------------------------------------------------------------------------------
NEG_INF_F16 = 0xFC00
ONE_F16 = 0x3C00
# AM offsets of the per-item softmax statistics (FP32 vectors) relative to R_D
ST_M, ST_L, ST_LSE = 0, 1, 2


@functools.lru_cache(maxsize=128)
def mk_init(platform: Platform) -> np.ndarray:
    """Row statistics of a new query tile: m = -inf, l = 0 (FP32 vectors at R_D)."""
    lanes = platform.vector_lanes
    ops = [Op("smovi", (R_T0, NEG_INF_F16), (), (("s", R_T0),)),
           Op("svbcast", (0, R_T0), (("s", R_T0),), (("v", 0),)), _zero(1),
           _vstore("vstw", R_D, ST_M * lanes * 4, 0), _vstore("vstw", R_D, ST_L * lanes * 4, 1)]
    return _assemble(ops, platform)


@functools.lru_cache(maxsize=128)
def mk_lse(platform: Platform) -> np.ndarray:
    """lse = m + log(l) (FP32 vectors at R_D)."""
    lanes = platform.vector_lanes
    ops = [_vload("vldw", 0, R_D, ST_M * lanes * 4), _vload("vldw", 1, R_D, ST_L * lanes * 4),
           Op("smovi", (R_T0, ONE_F16), (), (("s", R_T0),)),
           Op("svbcast", (2, R_T0), (("s", R_T0),), (("v", 2),)),
           Op("vlog", (3, 1), (("v", 1),), (("v", 3),)),
           _fma(0, 2, 3), _vstore("vstw", R_D, ST_LSE * lanes * 4, 0)]
    return _assemble(ops, platform)


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
    ops: list[Op] = [_zero(a) for a in acc]
    _bcast_dot(ops, acc, va0, vb, d, rotation, lanes)
    ops.append(Op("smovi", (st, scale_bits), (), (("s", st),)))
    ops.append(Op("svbcastw", (vsc, st), (("s", st),), (("v", vsc),)))
    ops.append(Op("smovi", (st + 1, ONE_F16), (), (("s", st + 1),)))
    ops.append(Op("svbcast", (vone, st + 1), (("s", st + 1),), (("v", vone),)))
    ops.append(Op("smovi", (st + 2, 0xBC00), (), (("s", st + 2),)))
    ops.append(Op("svbcast", (vm1, st + 2), (("s", st + 2),), (("v", vm1),)))
    for r in range(rows):
        ops.append(_zero(sv0 + r))
        ops.append(_fma(sv0 + r, acc[r], vsc))                     # s = 0 + acc * scale
        if masked:
            ops.append(_vload("vldh", bv0 + r, R_P, r * lanes * 2))
            ops.append(_fma(sv0 + r, bv0 + r, vone))               # s + bias (0 or -inf)
    if not probs:
        ops.append(_vload("vldw", vx, R_D, ST_M * lanes * 4))      # m
        ops.append(_vload("vldw", vy, R_D, ST_L * lanes * 4))      # l
        ops.append(Op("vmax", (vz, vx, sv0), (("v", vx), ("v", sv0)), (("v", vz),)))
        for r in range(1, rows):
            ops.append(Op("vmax", (vz, vz, sv0 + r), (("v", vz), ("v", sv0 + r)), (("v", vz),)))
        ops.append(_fma(vx, vm1, vz))                              # m - m'
        ops.append(Op("vexp", (vw, vx), (("v", vx),), (("v", vw),)))
        ops.append(_zero(vx))
        ops.append(_fma(vx, vy, vw))                               # l exp(m - m')
        for r in range(rows):
            ops.append(_fma(sv0 + r, vm1, vz))                     # s - m'
            ops.append(Op("vexp", (bv0 + r, sv0 + r), (("v", sv0 + r),), (("v", bv0 + r),)))
            ops.append(_fma(vx, bv0 + r, vone))
        ops.append(_vstore("vstw", R_D, ST_M * lanes * 4, vz))
        ops.append(_vstore("vstw", R_D, ST_L * lanes * 4, vx))
    else:
        ops.append(_vload("vldw", vx, R_D, ST_LSE * lanes * 4))
        for r in range(rows):
            ops.append(_fma(sv0 + r, vm1, vx))                     # s - lse
            ops.append(Op("vexp", (bv0 + r, sv0 + r), (("v", sv0 + r),), (("v", bv0 + r),)))
            ops.append(_vstore("vstw", R_W, r * lanes * 4, bv0 + r))
            ops.append(_vstore("vsth", R_C, r * lanes * 2, bv0 + r))
    return _assemble(ops, platform)


def plan_attention_forward(heads: int, kv_heads: int, seq: int, d: int, *, causal: bool = True,
                           tiles: AttentionTiles | None = None, platform: Platform = DEFAULT,
                           schedule: str = "auto") -> AttentionPlan:
    """Shape, tiles and buffers of the forward kernel (Eq. 1 checked as for the backward)."""
    t = _check_shape_and_tiles(heads, kv_heads, seq, d, tiles, platform, schedule=schedule,
                               schedule_first=True)
    p = platform
    lanes = p.vector_lanes
    br, bc, bcp = int(t.br), int(t.bc), int(t.bc_prime)
    am, am_used = _layout([
        ("q", max(br * d * 2, br * d * 2)), ("qt", d * lanes * 2), ("k0", bc * d * 2), ("k1", bc * d * 2),
        ("v0", bc * d * 2), ("v1", bc * d * 2), ("mask", bc * lanes * 2), ("stats", 3 * lanes * 4),
        ("pf", bcp * lanes * 4), ("ph0", bcp * lanes * 2), ("ph1", bcp * lanes * 2),
        ("ot", d * lanes * 4), ("wb", d * lanes * 2), ("pad", lanes * 4)])
    if am_used > p.am_bytes:
        raise CapacityError(f"AM: attention forward buffers for {t.describe()} need {am_used} bytes, "
                            f"{am_used - p.am_bytes} more than the {p.am_bytes}-byte AM")
    sm, sm_used = _layout([("k0", bcp * d * 2), ("v0", bcp * d * 2), ("k1", bcp * d * 2), ("v1", bcp * d * 2)])
    if sm_used > p.sm_bytes:
        raise CapacityError(f"SM: two staged K and V sub-tiles ({bcp} x {d}) FP16 need {sm_used} bytes, "
                            f"{sm_used - p.sm_bytes} more than the {p.sm_bytes}-byte SM")
    mask_rows = br + 2 * bc
    ddr, ddr_bytes = _ddr_layout([
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


def build_attention_forward(plan: AttentionPlan, platform: Platform) -> AttentionProgram:
    p = platform
    lanes = p.vector_lanes
    t = plan.tiles
    d, seq, bcp = plan.d, plan.seq, int(t.bc_prime)
    am, sm, dd = plan.am, plan.sm, plan.ddr
    scale_bits = _fp32_bits(float(np.float32(1.0 / math.sqrt(d))))
    mr_s = 8
    rounds = _rounds(plan, p.dsps)
    # steps: (round, pass, j); pass 0 = statistics (K only), pass 1 = probabilities and O (K, V)
    steps = []
    for r, (_g, items) in enumerate(rounds):
        n = max(plan.tiles_needed(x[1]) for x in items if x is not None)
        steps += [(r, ps, j) for ps in (0, 1) for j in range(n)]
    library = _Library(p)
    drivers = [_Driver(p, library) for _ in range(p.dsps)]
    useful, pairs = 0, 0
    for _g, items in rounds:
        for it in items:
            if it is not None:
                for j in range(plan.tiles_needed(it[1])):
                    useful += 2 * plan.q_rows(it[1]) * plan.k_rows(j) * d
                    pairs += 1

    def broadcast(drv: _Driver, s: int) -> None:
        r, ps, j = steps[s]
        g = rounds[r][0]
        rows = plan.k_rows(j)
        for name in (("k",) if ps == 0 else ("k", "v")):
            drv.dma(CH_KV, "DDR", "AM", 1, rows * d * 2, 0, 0, dd[name] + (g * seq + j * t.bc) * d * 2,
                    am[f"{name}{s % 2}"], "broadcast")

    def f_setup(drv: _Driver, it: tuple[int, int]) -> None:
        h, i = it
        nq, row0 = plan.q_rows(i), (h * seq + i * t.br) * d * 2
        drv.dma(CH_IN, "DDR", "AM", 1, nq * d * 2, 0, 0, dd["q"] + row0, am["q"])
        for e in range(d):
            drv.dma(CH_IN, "AM", "AM", nq, 2, d * 2, 2, am["q"] + e * 2, am["qt"] + e * lanes * 2)
        drv.call(("init",), {R_D: am["stats"]})
        drv.wait(CH_IN)

    def f_tile(drv: _Driver, it: tuple[int, int], ps: int, j: int, slot: int, counter: list[int],
               kv: tuple[str, int, int] | None = None) -> None:
        """One tile pair of pass ps: Bc'-row K (and V) sub-tiles double-buffered in SM; K_j, V_j
        from this step's AM slots or from ``kv`` = (space, K_j address, V_j address)."""
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
                drv.call(("fwd", rows, d, masked, ps == 1, scale_bits),
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

    def f_finish(drv: _Driver, it: tuple[int, int]) -> None:
        h, i = it
        nq, row0 = plan.q_rows(i), (h * seq + i * t.br) * d * 2
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

    def kv_own(drv: _Driver, g: int, ps: int, j: int, slot: int) -> None:
        rows = plan.k_rows(j)
        for name in (("k",) if ps == 0 else ("k", "v")):
            drv.dma(CH_KV, "DDR", "AM", 1, rows * d * 2, 0, 0, dd[name] + (g * seq + j * t.bc) * d * 2,
                    am[f"{name}{slot}"])

    group = plan.heads // plan.kv_heads
    kv_bytes = 2 * seq * d * 2
    fit = p.gsm_bytes // kv_bytes                 # KV heads whose K and V fit GSM together
    mode = plan.schedule
    if mode == "auto":       # as in the backward's _phases
        mode = "gsm" if fit >= 1 else ("own" if group * plan.n_qt < p.dsps and plan.kv_heads > 1 else "broadcast")
    if mode == "gsm" and fit < 1:
        raise CapacityError(f"GSM: schedule 'gsm' keeps one KV head's K and V (2 x {seq} x {d} FP16) in GSM: "
                            f"{kv_bytes} bytes, {kv_bytes - p.gsm_bytes} more than the {p.gsm_bytes}-byte GSM")
    gsm, own = mode == "gsm", mode == "own"
    mine = _assign(plan, p.dsps, list(range(plan.kv_heads))) if own else None
    phases = [list(range(g0, min(g0 + fit, plan.kv_heads))) for g0 in range(0, plan.kv_heads, fit)] if gsm else []
    for dsp, drv in enumerate(drivers):
        counter = [0]
        if gsm:
            # K and V of a phase's KV heads loaded once into GSM (rows split over the DSPs); each DSP
            # then runs its items without lock step, staging K/V sub-tiles GSM -> SM
            base, extra = divmod(seq, p.dsps)
            r0 = dsp * base + min(dsp, extra)
            cnt = base + (1 if dsp < extra else 0)
            for k, heads in enumerate(phases):
                if k:
                    drv.barrier()                 # everyone is done with the previous K/V
                for n, g in enumerate(heads):
                    for m, name in enumerate(("k", "v")):
                        drv.dma(CH_KV, "DDR", "GSM", 1 if cnt else 0, max(cnt, 1) * d * 2, 0, 0,
                                dd[name] + (g * seq + r0) * d * 2, (2 * n + m) * seq * d * 2 + r0 * d * 2)
                drv.wait(CH_KV)
                drv.barrier()
                for it in _assign(plan, p.dsps, heads)[dsp]:
                    n = heads.index(it[0] // group)
                    f_setup(drv, it)
                    for ps in (0, 1):
                        if ps == 1:
                            drv.call(("lse",), {R_D: am["stats"]})
                        for j in range(plan.tiles_needed(it[1])):
                            off = j * t.bc * d * 2
                            f_tile(drv, it, ps, j, 0, counter,
                                   ("GSM", 2 * n * seq * d * 2 + off, (2 * n + 1) * seq * d * 2 + off))
                    f_finish(drv, it)
        elif own:
            s = 0
            for it in mine[dsp]:
                g, nj = it[0] // group, plan.tiles_needed(it[1])
                f_setup(drv, it)
                for ps in (0, 1):
                    if ps == 1:
                        drv.call(("lse",), {R_D: am["stats"]})
                    kv_own(drv, g, ps, 0, s % 2)
                    for j in range(nj):
                        drv.wait(CH_KV)
                        if j + 1 < nj:
                            kv_own(drv, g, ps, j + 1, (s + 1) % 2)
                        f_tile(drv, it, ps, j, s % 2, counter)
                        s += 1
                f_finish(drv, it)
        else:
            leader = dsp == 0
            if leader:
                broadcast(drv, 0)
            s = 0
            for r, (g, items) in enumerate(rounds):
                it = items[dsp]
                n_steps = max(plan.tiles_needed(x[1]) for x in items if x is not None)
                nj = plan.tiles_needed(it[1]) if it is not None else 0
                if it is not None:
                    f_setup(drv, it)
                for ps in (0, 1):
                    if it is not None and ps == 1:
                        drv.call(("lse",), {R_D: am["stats"]})
                    for j in range(n_steps):
                        if leader:
                            drv.wait(CH_KV)
                        drv.barrier()
                        if leader and s + 1 < len(steps):
                            broadcast(drv, s + 1)
                        if it is not None and j < nj:
                            f_tile(drv, it, ps, j, s % 2, counter)
                        s += 1
                if it is not None:
                    f_finish(drv, it)
        for ch in (CH_RED, CH_SG, CH_IN):
            drv.wait(ch)
    lib_code, offsets = library.build()
    programs = [drv.finish(lib_code, offsets) for drv in drivers]
    return AttentionProgram(plan, programs, useful, pairs, mode)


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

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("o", "saved")}
        d["tiles"] = asdict(self.tiles)
        return d


@functools.lru_cache(maxsize=16)
def _build_forward_cached(heads, kv_heads, seq, d, causal, tiles, platform, schedule) -> AttentionProgram:
    plan = plan_attention_forward(heads, kv_heads, seq, d, causal=causal, tiles=tiles, platform=platform,
                                  schedule=schedule)
    return build_attention_forward(plan, platform)


def attention_forward_timing(heads: int, kv_heads: int, seq: int, head_dim: int, *, causal: bool = True,
                             tiles: AttentionTiles | None = None, platform: Platform | None = None,
                             schedule: str = "auto") -> AttentionForwardResult:
    """Emulate the attention forward in timing-only mode (no data) and return its statistics."""
    platform = platform or DEFAULT
    _check_flag("causal", causal)
    tiles = tiles or default_tiles(head_dim, platform)
    ap = _build_forward_cached(int(heads), int(kv_heads), int(seq), int(head_dim), bool(causal), tiles, platform,
                               schedule)
    plan = ap.plan
    stats = Cluster(platform, ddr_bytes=plan.ddr_bytes, functional=False).run(
        ap.programs, dsp_program=list(range(platform.dsps)))
    util = ap.useful_macs / (platform.peak_macs_per_cycle * stats.cycles)
    return AttentionForwardResult(heads, kv_heads, seq, head_dim, bool(causal), "timing", plan.tiles, ap.schedule,
                                  stats.cycles, ap.useful_macs, ap.tile_pairs, util,
                                  stats.cycles / platform.clock_hz * 1e3, stats.stall_cycles(),
                                  stats.server_bytes["ddr"],
                                  {"sm": plan.sm_used, "am": plan.am_used, "gsm": 0, "ddr": plan.ddr_bytes})


def run_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = True,
                  tiles: AttentionTiles | None = None, platform: Platform | None = None,
                  mode: str = "functional", schedule: str = "auto") -> AttentionForwardResult:
    """Attention forward on the emulated cluster: O (FP16), the saved state Algorithm 1 consumes
    (P as FP16, row logsumexp as FP32) and statistics. Two passes over the key tiles: online row
    max/sum, then P = exp(s - lse) written key-major to DDR and O^T += V^T P^T in FP32."""
    from .attention_ref import _check_qkv
    platform = platform or DEFAULT
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
    stats = cluster.run(ap.programs, dsp_program=list(range(platform.dsps)))
    util = ap.useful_macs / (platform.peak_macs_per_cycle * stats.cycles)
    res = AttentionForwardResult(heads, kv_heads, seq, d, bool(causal), mode, plan.tiles, ap.schedule, stats.cycles,
                                 ap.useful_macs,
                                 ap.tile_pairs, util, stats.cycles / platform.clock_hz * 1e3, stats.stall_cycles(),
                                 stats.server_bytes["ddr"],
                                 {"sm": plan.sm_used, "am": plan.am_used, "gsm": 0, "ddr": plan.ddr_bytes})
    if functional:
        res.o = cluster.read_ddr_u16(dd["o"], heads * seq * d).view(np.float16).reshape(heads, seq, d)
        pt = cluster.read_ddr_u16(dd["pt"], heads * seq * seq).view(np.float16).reshape(heads, seq, seq)
        lse = cluster.read_ddr_f32(dd["lse"], heads * seq).reshape(heads, seq)
        res.saved = AttentionSaved(np.ascontiguousarray(pt.transpose(0, 2, 1)), lse)
    return res

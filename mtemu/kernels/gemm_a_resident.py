"""FP16 GEMM in Fig. 4's literal loop order: ``A_g`` resident in GSM, C through DDR between k-blocks.

The default GEMM (:mod:`mtemu.kernels.gemm`) keeps C in AM for the whole K and re-reads A for
every N panel. This variant is the other loop order Fig. 4 allows: for each m-block and each
k-block of ``kg`` columns, ``A_g[mg, kg]`` moves DDR -> GSM once (two slots, the next block
loading while this one is used) and serves every N panel; per (panel, k2 sub-block) step
``A_2`` moves GSM -> SM and ``B_2`` is broadcast DDR -> AM as in the default kernel. C lives
in AM only within a k-block: it leaves as FP16 at the block's end (the micro-kernel's rounding
store) and comes back, widened to FP32, at the next block's start. A is read once; C pays
``2 (nk - 1) + 1`` FP16 passes for ``nk`` k-blocks.

Numerics: FP32 accumulation within a k-block, FP16 rounding between k-blocks, which is what a
kernel accumulating in FP16 registers between passes does. :func:`reference_gemm_a_resident`
follows the same order, so results are bit-exact against it (not against the single-pass
:func:`mtemu.kernels.gemm.reference_gemm` unless ``kg >= k``).

The micro-kernel, row partition, result type and runner are the default kernel's.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from rtcommon.checks import positive_ints

from .. import isa, timing_memo
from ..assembler import Instr, Program, ProgramBuilder, ins, one
from ..errors import CapacityError, MtemuError
from ..fast.prepared import sized_memo
from ..platform import DEFAULT, Platform, as_platform
from ..trace import TraceOptions
from .gemm import (
    ALIGN,
    R_AROW,
    R_AROW2,
    R_CROW,
    R_CROW2,
    R_GROW,
    R_GROW2,
    GemmProgram,
    GemmResult,
    GemmTiles,
    _call_tiles,
    _check_tiles,
    _Descriptors,
    _dsp_tables,
    _emit_microkernels,
    _leader_only,
    _partition,
    _result,
    _round_up,
    _run,
    plan_gemm,
)
from .gemm_tiles import DEFAULT_A_RESIDENT_TILES, AResidentGemmTiles
from .program_cache import cached_program
from .schedule import Op, schedule

CH_A_GSM, CH_A_SM, CH_B, CH_C, CH_CIN, CH_B2 = 0, 1, 2, 3, 4, 5


@dataclass(frozen=True)
class AResidentPlan:
    m: int
    k: int
    n: int
    tiles: AResidentGemmTiles
    rows_max: int
    n2p: int
    a_addr: int
    b_addr: int
    c_addr: int
    ddr_bytes: int
    sm_slots: tuple[int, int]
    gsm_slots: tuple[int, int]
    am_b_slots: tuple[int, ...]
    am_c: int
    am_wb: int
    am_cin: int
    sm_used: int
    am_used: int
    gsm_used: int


def plan_a_resident(m: int, k: int, n: int, tiles: AResidentGemmTiles = DEFAULT_A_RESIDENT_TILES,
                    platform: Platform = DEFAULT) -> AResidentPlan:
    """Check shape and tiles against the platform; raise CapacityError naming the memory."""
    t = tiles
    if not isinstance(t.kg, (int, np.integer)) or t.kg <= 0:
        raise CapacityError(f"tile 'kg' must be a positive integer, got {t.kg!r}")
    if t.b_slots not in (2, 3):
        raise CapacityError(f"tile 'b_slots' must be 2 or 3, got {t.b_slots!r}")
    # The default kernel's plan checks the shape, the other tiles, registers, SM, AM for B and C
    # and lays out DDR; its GSM rule (three A_g slots of k2 columns) is not this kernel's.
    kg = min(t.kg, k) if isinstance(k, (int, np.integer)) and k > 0 else t.kg
    base = plan_gemm(m, k, n, GemmTiles(mg=t.mg, k2=min(t.k2, kg), n2=t.n2, mr=t.mr, nv=t.nv, rotation=t.rotation),
                     replace(platform, gsm_bytes=1 << 62))
    bt = base.tiles
    gsm_slot = _round_up(bt.mg * kg * 2, ALIGN)
    gsm_used = 2 * gsm_slot
    if gsm_used > platform.gsm_bytes:
        raise CapacityError(f"GSM: two A_g tiles of mg={bt.mg} x kg={kg} FP16 need {gsm_used} bytes, "
                            f"{gsm_used - platform.gsm_bytes} more than the {platform.gsm_bytes}-byte GSM")
    # AM: the default kernel's layout plus a second FP16 C buffer for the partial coming back
    cin = base.am_wb + _round_up(base.rows_max * base.n2p * 2, ALIGN)
    am_used = cin + _round_up(base.rows_max * base.n2p * 2, ALIGN)
    b_slots = base.am_b_slots
    if t.b_slots == 3:
        b_slots = (*b_slots, am_used)
        am_used += base.am_b_slots[1]
    if am_used > platform.am_bytes:
        raise CapacityError(f"AM: {t.b_slots} B tiles (k2={bt.k2} x {base.n2p}) + FP32 C and two FP16 C buffers "
                            f"({base.rows_max} x {base.n2p}) need {am_used} bytes, "
                            f"{am_used - platform.am_bytes} more than the {platform.am_bytes}-byte AM")
    eff = AResidentGemmTiles(bt.mg, kg, bt.k2, bt.n2, bt.mr, bt.nv, bt.rotation, t.b_slots)
    return AResidentPlan(m, k, n, eff, base.rows_max, base.n2p, base.a_addr, base.b_addr, base.c_addr, base.ddr_bytes,
                         base.sm_slots, (0, gsm_slot), b_slots, base.am_c, base.am_wb, cin,
                         base.sm_used, am_used, gsm_used)


@dataclass(frozen=True)
class _Step:
    block: int      # (m-block, k-block) index: which A_g
    kb: int         # k-block within the m-block
    row0: int
    mrows: int
    n0: int
    nw: int
    kg0: int        # first column of the k-block
    kgw: int        # its width
    koff: int       # this sub-block's offset within the k-block
    kw: int
    first: bool     # first sub-block of (k-block, panel)
    last: bool      # last sub-block of (k-block, panel)
    block_first: bool


def _steps(plan: AResidentPlan) -> list[_Step]:
    t = plan.tiles
    out, block = [], 0
    for row0 in range(0, plan.m, t.mg):
        mrows = min(t.mg, plan.m - row0)
        for kb, kg0 in enumerate(range(0, plan.k, t.kg)):
            kgw = min(t.kg, plan.k - kg0)
            subs = list(range(0, kgw, t.k2))
            for pi, n0 in enumerate(range(0, plan.n, t.n2)):
                nw = min(t.n2, plan.n - n0)
                for si, koff in enumerate(subs):
                    out.append(_Step(block, kb, row0, mrows, n0, nw, kg0, kgw, koff, min(t.k2, kgw - koff),
                                     si == 0, si == len(subs) - 1, pi == 0 and si == 0))
            block += 1
    return out


@functools.lru_cache(maxsize=32)
def _widen(rows: int, nvec: int, cin: int, am_c: int, pitch: int, platform: Platform) -> tuple:
    """Bundles that widen the FP16 partial C (``cin``) into the FP32 accumulator buffer, then ``ret``."""
    lanes = platform.vector_lanes
    ops, slot = [], 0
    for r in range(rows):
        for c in range(nvec):
            v = slot % 16
            slot += 1
            ops.append(Op("vldh", (v, (0, cin + r * pitch * 2 + c * lanes * 2)), (), (("v", v),)))
            ops.append(Op("vstw", ((0, am_c + r * pitch * 4 + c * lanes * 4), v), (("v", v),)))
    bundles = schedule(ops, platform)
    bundles.append([ins("ret")])
    return tuple(tuple(b) for b in bundles)


def _desc_fields(key: tuple, plan: AResidentPlan, rows: int | None) -> np.ndarray:
    t = plan.tiles
    kind = key[0]
    if kind == "a_gsm":
        f = (isa.SP_DDR, isa.SP_GSM, rows, key[2] * 2, plan.k * 2, t.kg * 2, isa.DMA_COPY)
    elif kind == "a_sm":
        f = (isa.SP_GSM, isa.SP_SM, rows, key[2] * 2, t.kg * 2, t.k2 * 2, isa.DMA_COPY)
    elif kind == "b":
        f = (isa.SP_DDR, isa.SP_AM, key[1], key[2] * 2, plan.n * 2, plan.n2p * 2, isa.DMA_BROADCAST)
    elif kind == "c":
        f = (isa.SP_AM, isa.SP_DDR, rows, key[2] * 2, plan.n2p * 2, plan.n * 2, isa.DMA_COPY)
    else:                                                          # "cin": the partial coming back
        f = (isa.SP_DDR, isa.SP_AM, rows, key[2] * 2, plan.n * 2, plan.n2p * 2, isa.DMA_COPY)
    return np.array(f, dtype=np.int64)


def build_a_resident(m: int, k: int, n: int, tiles: AResidentGemmTiles = DEFAULT_A_RESIDENT_TILES,
                     platform: Platform = DEFAULT) -> GemmProgram:
    m, k, n = positive_ints("GEMM dimension", MtemuError, m=m, k=k, n=n)
    return _build_cached(m, k, n, tiles, platform)


@sized_memo(entries=16)       # a few programs are hundreds of MB (naive tiles)
def _build_cached(m: int, k: int, n: int, tiles: AResidentGemmTiles, platform: Platform) -> GemmProgram:
    plan = plan_a_resident(m, k, n, tiles, platform)
    program, dsp_desc, init = cached_program("gemm_a_resident", (m, k, n), tiles, platform,
                                             lambda: _assemble(plan, platform))
    return GemmProgram(plan, program, dsp_desc, init, m * k * n)


def _assemble(plan: AResidentPlan, platform: Platform) -> tuple[Program, dict[int, np.ndarray],
                                                                 dict[int, dict[int, int]]]:
    """The program of ``plan``, its per-DSP descriptor tables and initial registers."""
    t = plan.tiles
    lanes = platform.vector_lanes
    steps = _steps(plan)
    partitions = {}
    for s in steps:                     # few distinct m-block heights among ~10**4 steps
        if s.mrows not in partitions:
            partitions[s.mrows] = _partition(s.mrows, platform.dsps)
    b = ProgramBuilder(platform)
    desc = _Descriptors(b, lambda key, rows: _desc_fields(key, plan, rows), plan.rows_max)

    full_rows = steps[0].mrows

    def regs(s: _Step) -> tuple[int, int, int]:
        return (R_AROW, R_GROW, R_CROW) if s.mrows == full_rows else (R_AROW2, R_GROW2, R_CROW2)

    def a_to_gsm(s: _Step) -> Instr:
        arow, grow, _ = regs(s)
        src = plan.a_addr + s.row0 * plan.k * 2 + s.kg0 * 2
        return ins("dma", CH_A_GSM, desc(("a_gsm", s.mrows, s.kgw)), (arow, src), (grow, plan.gsm_slots[s.block % 2]))

    def a_to_sm(i: int) -> Instr:
        s = steps[i]
        return ins("dma", CH_A_SM, desc(("a_sm", s.mrows, s.kw)),
                   (regs(s)[1], plan.gsm_slots[s.block % 2] + s.koff * 2), (0, plan.sm_slots[i % 2]))

    ahead = t.b_slots - 1            # broadcasts in flight; one channel each, so a wait is exact

    def b_channel(i: int) -> int:
        return (CH_B, CH_B2)[i % ahead]

    def b_bcast(i: int) -> Instr:
        s = steps[i]
        src = plan.b_addr + (s.kg0 + s.koff) * plan.n * 2 + s.n0 * 2
        return ins("dma", b_channel(i), desc(("b", s.kw, s.nw)), (0, src), (0, plan.am_b_slots[i % t.b_slots]))

    def c_dma(s: _Step, back: bool) -> Instr:
        at = plan.c_addr + s.row0 * plan.n * 2 + s.n0 * 2
        if back:
            return ins("dma", CH_C, desc(("c", s.mrows, s.nw)), (0, plan.am_wb), (regs(s)[2], at))
        return ins("dma", CH_CIN, desc(("cin", s.mrows, s.nw)), (regs(s)[2], at), (0, plan.am_cin))

    def leader_only(body: list[Instr], skip: str) -> None:
        _leader_only(b, body, skip)

    # When each partial C comes back: after the write of the same panel's previous k-block was
    # issued (DDR read after write) and after the previous partial was widened (one AM buffer).
    fetch_after: dict[int, list[int]] = {}
    last_write: dict[tuple, int] = {}
    prev_first = None
    for i, s in enumerate(steps):
        if s.last:
            last_write[(s.block, s.n0)] = i
        if s.first and s.kb > 0:
            w = last_write[(s.block - 1, s.n0)]
            at = max(w, prev_first if prev_first is not None else 0)
            fetch_after.setdefault(at, []).append(i)
        if s.first:
            prev_first = i

    mk_labels: dict[tuple, str] = {}
    sites: dict[tuple, list] = {}
    widen_labels: dict[int, str] = {}
    b.bundle(a_to_gsm(steps[0]))
    b.add(one("dmawait", CH_A_GSM))
    b.bundle(a_to_sm(0))
    later = [s for s in steps if s.block_first and s.block == 1]
    if later:
        b.bundle(a_to_gsm(later[0]))
    leader_only([b_bcast(j) for j in range(min(ahead, len(steps)))], "pro_lead")
    n_steps = len(steps)
    for i, s in enumerate(steps):
        leader_only([one("dmawait", b_channel(i))], f"s{i}_w")
        b.add(one("barrier"))
        if i + ahead < n_steps:          # its slot was step i - 1's: every DSP passed the barrier
            leader_only([b_bcast(i + ahead)], f"s{i}_b")
        if s.block_first and i > 0:
            nxt = [x for x in steps[i:] if x.block_first and x.block == s.block + 1]
            if nxt:            # the slot of block - 1 is free: every DSP passed the barrier
                b.bundle(a_to_gsm(nxt[0]))
        b.add(one("dmawait", CH_A_SM))
        if i + 1 < n_steps:
            if steps[i + 1].block_first:
                b.add(one("dmawait", CH_A_GSM))
            b.bundle(a_to_sm(i + 1))
        nvec = math.ceil(s.nw / lanes)
        if s.first and s.kb > 0:
            b.add(one("dmawait", CH_CIN))
            widen_labels.setdefault(nvec, f"widen_{nvec}")
            b.bundle(ins("call", widen_labels[nvec]))
        if s.last:
            b.add(one("dmawait", CH_C))
        # C starts from zero only in the first k-block; later ones resume from the widened partial
        _call_tiles(b, mk_labels, t, plan.rows_max, plan.n2p, nvec, s.kw, s.first and s.kb == 0, s.last,
                    plan.sm_slots[i % 2], plan.am_b_slots[i % t.b_slots], plan.am_c, plan.am_wb, lanes, sites)
        if s.last:
            b.bundle(c_dma(s, back=True))
        for j in fetch_after.get(i, ()):
            b.bundle(c_dma(steps[j], back=False))
    b.add(one("dmawait", CH_C))
    b.add(one("halt"))
    _emit_microkernels(b, mk_labels, t, plan.n2p, True, platform)
    for nvec, label in widen_labels.items():
        b.label(label)
        b.extend_portable(_widen(plan.rows_max, nvec, plan.am_cin, plan.am_c, plan.n2p, platform))
    program = b.assemble()
    dsp_desc, init = _dsp_tables(program, desc, partitions, full_rows, steps[-1].mrows, plan.k, t.kg, plan.n,
                                 platform.dsps)
    return program, dsp_desc, init


def reference_gemm_a_resident(a: np.ndarray, b: np.ndarray, kg: int) -> np.ndarray:
    """The kernel's order: FP32 sequential-k accumulation within k-blocks of ``kg``, FP16 between."""
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    for k0 in range(0, a.shape[1], kg):
        for kk in range(k0, min(k0 + kg, a.shape[1])):
            acc += a32[:, kk:kk + 1] * b32[kk:kk + 1, :]
        acc = acc.astype(np.float16).astype(np.float32)
    return acc.astype(np.float16)


@timing_memo.memoized
def a_resident_timing(m: int, k: int, n: int, *, tiles: AResidentGemmTiles | None = None,
                      platform: Platform | None = None, trace: TraceOptions | None = None) -> GemmResult:
    """Emulate the A-resident GEMM in timing-only mode (``trace``: record the run in ``result.stats``)."""
    platform = as_platform(platform)
    _check_tiles(tiles, AResidentGemmTiles)
    gp = build_a_resident(m, k, n, tiles or AResidentGemmTiles(), platform)
    stats, _ = _run(gp, platform, False, trace=trace)
    return _result(gp, stats, "timing", platform)


def run_a_resident(a: np.ndarray, b: np.ndarray, *, platform: Platform | None = None,
                   tiles: AResidentGemmTiles | None = None, trace: TraceOptions | None = None) -> GemmResult:
    """Multiply FP16 matrices with the A-resident kernel (functional); ``result.c`` is the product."""
    platform = as_platform(platform)
    _check_tiles(tiles, AResidentGemmTiles)
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, np.ndarray) or x.ndim != 2 or x.dtype != np.float16:
            raise MtemuError(f"{name} must be a 2-D float16 NumPy array")
    if a.shape[1] != b.shape[0]:
        raise MtemuError(f"inner dimensions differ: a is {a.shape}, b is {b.shape}")
    m, k = a.shape
    n = b.shape[1]
    gp = build_a_resident(m, k, n, tiles or AResidentGemmTiles(), platform)
    stats, cluster = _run(gp, platform, True, np.ascontiguousarray(a), np.ascontiguousarray(b), trace)
    c = cluster.read_ddr_u16(gp.plan.c_addr, m * n).view(np.float16).reshape(m, n)
    return _result(gp, stats, "functional", platform, c)

"""FP16 GEMM ``C[M,N] = A[M,K] B[K,N]`` for one cluster (paper Fig. 4 dataflow, Table 1 pipeline).

Dataflow. The M rows are processed in m-blocks of ``mg`` rows spread over the DSPs (each DSP
owns a contiguous slice of rows). For each m-block, N is walked in panels of ``n2`` columns and
K in blocks of ``k2``; one (m-block, panel, k-block) triple is a *step*:

- ``A_g[mg, k2]`` moves DDR -> GSM (each DSP moves its own rows; GSM holds three slots),
  then ``A_2[rows, k2]`` moves GSM -> the DSP's SM (two slots);
- ``B_2[k2, n2]`` is broadcast DDR -> every DSP's AM by DSP 0 (two slots);
- ``C_2[rows, n2]`` accumulates in FP32 in AM across the panel's k-blocks and is written back
  to DDR as FP16 once per panel (round to nearest even).

Software pipeline. DMAs for step s+1 (and the DDR->GSM leg of s+2) are issued before step s
computes (double/triple buffering); a barrier per step lets DSP 0 reuse a B slot only when
every DSP is done with it. The micro-kernel (``mr`` rows x ``nv`` vectors, fully unrolled over
the k-block) is list-scheduled so the next k's scalar loads, broadcasts and B-row loads issue
under the current k's VMACs, as in the paper's Table 1. ``pipelined=False`` builds the variant
without either overlap, to show what the pipeline buys.

Numerics. FP16 inputs are widened exactly to FP32; products of two FP16 values are exact in
FP32 and accumulation is sequential in k in FP32, so the result equals
:func:`reference_gemm` bit for bit.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from rtcommon.checks import positive_ints

from .. import isa, timing_memo
from ..assembler import Instr, Program, ProgramBuilder, ins, one
from ..errors import CapacityError, MtemuError
from ..fast.prepared import sized_memo
from ..machine import Cluster, RunStats
from ..platform import DEFAULT, Platform, as_platform
from ..trace import TraceOptions
from .gemm_tiles import DEFAULT_TILES, GemmTiles
from .program_cache import cached_program
from .schedule import Op, check_registers, schedule

# fixed scalar registers
R_AROW, R_GROW, R_CROW = 1, 2, 3            # this DSP's row offsets: DDR A, GSM A_g, DDR C
R_LEADER_SKIP = 4                            # non-zero on DSPs other than the leader
R_ABASE, R_BBASE, R_CBASE, R_WBASE = 7, 8, 9, 10
R_AROW2, R_GROW2, R_CROW2 = 11, 12, 13      # row offsets in a short last m-block
R_TEMP0 = 16                                 # micro-kernel scalar temporaries start here

CH_A_GSM, CH_A_SM, CH_B, CH_C = 0, 1, 2, 3

ALIGN = 64


@dataclass(frozen=True)
class GemmPlan:
    """Everything derived from shape, tiles and platform; memory use is checked here."""

    m: int
    k: int
    n: int
    tiles: GemmTiles
    rows_max: int          # rows of the busiest DSP in an m-block
    n2p: int               # padded panel width (whole vectors)
    a_addr: int
    b_addr: int
    c_addr: int
    ddr_bytes: int
    sm_slots: tuple[int, int]
    gsm_slots: tuple[int, int, int]
    am_b_slots: tuple[int, int]
    am_c: int
    am_wb: int
    sm_used: int
    am_used: int
    gsm_used: int


def _round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _partition(rows: int, dsps: int) -> list[tuple[int, int]]:
    """Balanced contiguous split: (first row, count) per DSP."""
    base, extra = divmod(rows, dsps)
    out, r0 = [], 0
    for d in range(dsps):
        cnt = base + (1 if d < extra else 0)
        out.append((r0, cnt))
        r0 += cnt
    return out


def plan_gemm(m: int, k: int, n: int, tiles: GemmTiles = DEFAULT_TILES, platform: Platform = DEFAULT) -> GemmPlan:
    """Check shape and tiles against the platform; raise CapacityError naming the memory."""
    for name, v in (("m", m), ("k", k), ("n", n)):
        if not isinstance(v, (int, np.integer)) or v <= 0:
            raise MtemuError(f"GEMM dimension {name} must be a positive integer, got {v!r}")
    t = tiles
    for name in ("mg", "k2", "n2", "mr", "nv", "rotation"):
        v = getattr(t, name)
        if not isinstance(v, (int, np.integer)) or v <= 0:
            raise CapacityError(f"tile '{name}' must be a positive integer, got {v!r}")
    lanes = platform.vector_lanes
    mg = min(t.mg, m)
    rows_max = math.ceil(mg / platform.dsps)
    n2 = min(t.n2, _round_up(n, lanes))
    n2p = _round_up(n2, lanes)
    k2 = min(t.k2, k)
    mr = min(t.mr, rows_max)
    nv = min(t.nv, n2p // lanes)
    # registers
    check_registers(R_TEMP0 + t.rotation * mr, mr * nv + t.rotation * (mr + nv), platform,
                    f"micro-kernel {mr}x{nv} with rotation {t.rotation}")
    # SM: two A_2 slots
    sm_slot = _round_up(rows_max * k2 * 2, ALIGN)
    sm_used = 2 * sm_slot
    if sm_used > platform.sm_bytes:
        raise CapacityError(f"SM: two A_2 tiles of {rows_max} rows x k2={k2} FP16 need {sm_used} bytes, "
                            f"{sm_used - platform.sm_bytes} more than the {platform.sm_bytes}-byte SM")
    # GSM: three A_g slots of mg x k2
    gsm_slot = _round_up(mg * k2 * 2, ALIGN)
    gsm_used = 3 * gsm_slot
    if gsm_used > platform.gsm_bytes:
        raise CapacityError(f"GSM: three A_g tiles of mg={mg} x k2={k2} FP16 need {gsm_used} bytes, "
                            f"{gsm_used - platform.gsm_bytes} more than the {platform.gsm_bytes}-byte GSM")
    # AM: two B slots, FP32 C, FP16 write-back buffer
    b_slot = _round_up(k2 * n2p * 2, ALIGN)
    c_bytes = _round_up(rows_max * n2p * 4, ALIGN)
    wb_bytes = _round_up(rows_max * n2p * 2, ALIGN)
    am_used = 2 * b_slot + c_bytes + wb_bytes
    if am_used > platform.am_bytes:
        raise CapacityError(f"AM: two B tiles (k2={k2} x {n2p}) + FP32 C and FP16 write-back ({rows_max} x {n2p}) "
                            f"need {am_used} bytes, {am_used - platform.am_bytes} more than the "
                            f"{platform.am_bytes}-byte AM")
    a_addr = 0
    b_addr = _round_up(m * k * 2, ALIGN)
    c_addr = _round_up(b_addr + k * n * 2, ALIGN)
    ddr = _round_up(c_addr + m * n * 2, ALIGN)
    if ddr > platform.ddr_bytes:
        raise CapacityError(f"DDR: A, B and C need {ddr} bytes, {ddr - platform.ddr_bytes} more than the "
                            f"platform's {platform.ddr_bytes}")
    eff = replace(t, mg=mg, k2=k2, n2=n2, mr=mr, nv=nv)
    return GemmPlan(m, k, n, eff, rows_max, n2p, a_addr, b_addr, c_addr, ddr,
                    (0, sm_slot), (0, gsm_slot, 2 * gsm_slot), (0, b_slot), 2 * b_slot, 2 * b_slot + c_bytes,
                    sm_used, am_used, gsm_used)


# ------------------------------------------------------------------------------------------
# micro-kernel
# ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def microkernel(mr: int, nv: int, ks: int, first: bool, last: bool, astride: int, bstride: int,
                cstride: int, wstride: int, rotation: int, pipelined: bool,
                platform: Platform) -> tuple[tuple[Instr, ...], ...]:
    """Bundles of C[mr, nv vectors] (+)= A_2[mr, ks] B_2[ks, nv vectors], ending in ``ret``."""
    lanes = platform.vector_lanes
    acc = [[r * nv + c for c in range(nv)] for r in range(mr)]
    va0 = mr * nv
    vb0 = va0 + rotation * mr
    ops: list[Op] = []
    for r in range(mr):
        for c in range(nv):
            v = acc[r][c]
            if first:
                ops.append(Op("svbcast", (v, 0), (("s", 0),), (("v", v),)))
            else:
                ops.append(Op("vldw", (v, (R_CBASE, r * cstride + c * lanes * 4)), (("s", R_CBASE),), (("v", v),)))
    for kk in range(ks):
        rs = kk % rotation
        fence = not pipelined
        for r in range(mr):
            s = R_TEMP0 + rs * mr + r
            ops.append(Op("sldh", (s, (R_ABASE, r * astride + kk * 2)), (("s", R_ABASE),), (("s", s),), fence=fence))
            fence = False
        for r in range(mr):
            s = R_TEMP0 + rs * mr + r
            v = va0 + rs * mr + r
            ops.append(Op("svbcast", (v, s), (("s", s),), (("v", v),)))
        for c in range(nv):
            v = vb0 + rs * nv + c
            ops.append(Op("vldh", (v, (R_BBASE, kk * bstride + c * lanes * 2)), (("s", R_BBASE),), (("v", v),)))
        for r in range(mr):
            for c in range(nv):
                a = va0 + rs * mr + r
                b = vb0 + rs * nv + c
                ops.append(Op("vfma", (acc[r][c], a, b), (("v", a), ("v", b), ("v", acc[r][c])), (("v", acc[r][c]),)))
    for r in range(mr):
        for c in range(nv):
            v = acc[r][c]
            if last:
                ops.append(Op("vsth", ((R_WBASE, r * wstride + c * lanes * 2), v), (("s", R_WBASE), ("v", v))))
            else:
                ops.append(Op("vstw", ((R_CBASE, r * cstride + c * lanes * 4), v), (("s", R_CBASE), ("v", v))))
    bundles = schedule(ops, platform)
    bundles.append([ins("ret")])
    return tuple(tuple(b) for b in bundles)


# ------------------------------------------------------------------------------------------
# whole-cluster program
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Step:
    mb: int
    panel: int
    kb: int
    row0: int       # first row of the m-block
    mrows: int      # rows in this m-block
    n0: int
    nw: int         # valid columns in this panel
    k0: int
    kw: int         # valid k in this block
    first: bool
    last: bool


def _steps(plan: GemmPlan) -> list[_Step]:
    t = plan.tiles
    out = []
    for mb, row0 in enumerate(range(0, plan.m, t.mg)):
        mrows = min(t.mg, plan.m - row0)
        for panel, n0 in enumerate(range(0, plan.n, t.n2)):
            nw = min(t.n2, plan.n - n0)
            kbs = list(range(0, plan.k, t.k2))
            for kb, k0 in enumerate(kbs):
                out.append(_Step(mb, panel, kb, row0, mrows, n0, nw, k0, min(t.k2, plan.k - k0),
                                 kb == 0, kb == len(kbs) - 1))
    return out


@dataclass
class GemmProgram:
    plan: GemmPlan
    program: Program
    dsp_descriptors: dict[int, np.ndarray]
    init_sregs: dict[int, dict[int, int]]
    useful_macs: int


class _Descriptors:
    """DMA descriptors keyed by a symbolic name (kind, rows key, ...), registered on first use with
    the busiest DSP's rows; :func:`_dsp_tables` later gives each DSP its own row counts."""

    def __init__(self, b: ProgramBuilder, fields, rows_max: int):
        self.b, self.fields, self.rows_max, self.keys = b, fields, max(rows_max, 1), []

    def __call__(self, key: tuple) -> int:
        if key not in self.keys:
            self.keys.append(key)
            f = self.fields(key, self.rows_max)
            self.b.descriptor(isa.SPACES[f[0]], isa.SPACES[f[1]], int(f[2]), int(f[3]), int(f[4]), int(f[5]),
                              isa.DMA_MODES[f[6]], name=f"{key[0]}{len(self.keys) - 1}")
        return self.keys.index(key)


def _leader_only(b: ProgramBuilder, body: list, skip_label: str) -> None:
    """Instructions (or one-instruction bundles, :func:`~mtemu.assembler.one`) only DSP 0 runs (the
    others branch over them), one a bundle."""
    b.bundle(ins("bnz", R_LEADER_SKIP, skip_label))
    for item in body:
        if type(item) is tuple:
            b.add(item)
        else:
            b.bundle(item)
    b.label(skip_label)


def _call_tiles(b: ProgramBuilder, mk_labels: dict, t, rows_max: int, n2p: int, nvec: int, kw: int,
                first: bool, last: bool, sm: int, bslot: int, am_c: int, am_wb: int, lanes: int,
                sites: dict | None = None) -> None:
    """Call the micro-kernel over the busiest DSP's rows (groups of mr) and the panel's vectors (nv).

    ``sites``: the program's call sites so far, by these arguments. A program makes the same call
    sites at every step with the same slots and widths (hundreds of thousands of bundles in a big
    GEMM); they are built once and appended again as the same bundle objects, which the assembler also
    encodes once. Without it every bundle is built anew (the reference; the program is the same)."""
    key = (t, rows_max, n2p, nvec, kw, first, last, sm, bslot, am_c, am_wb, lanes)
    got = sites.get(key) if sites is not None else None
    if got is None:
        got = _call_sites(mk_labels, t, rows_max, n2p, nvec, kw, first, last, sm, bslot, am_c, am_wb, lanes)
        if sites is not None:
            sites[key] = got
    b.extend(got)


def _call_sites(mk_labels: dict, t, rows_max: int, n2p: int, nvec: int, kw: int, first: bool, last: bool,
                sm: int, bslot: int, am_c: int, am_wb: int, lanes: int) -> list[tuple[Instr, ...]]:
    """The bundles of :func:`_call_tiles`, registering each micro-kernel it calls in ``mk_labels``."""
    astride, cstride, wstride = t.k2 * 2, n2p * 4, n2p * 2
    out = []
    for r0 in range(0, rows_max, t.mr):
        mr = min(t.mr, rows_max - r0)
        for c0 in range(0, nvec, t.nv):
            nv = min(t.nv, nvec - c0)
            key = (mr, nv, kw, first, last)
            label = mk_labels.get(key)
            if label is None:
                label = mk_labels[key] = f"mk_{mr}x{nv}_k{kw}_{'f' if first else ''}{'l' if last else ''}"
            # Instr directly, not ins(): a big GEMM makes ~10**5 of these call sites
            out.append((Instr("smovi", (R_ABASE, sm + r0 * astride)), Instr("smovi", (R_BBASE, bslot + c0 * lanes * 2)),
                        Instr("smovi", (R_CBASE, am_c + r0 * cstride + c0 * lanes * 4))))
            out.append((Instr("smovi", (R_WBASE, am_wb + r0 * wstride + c0 * lanes * 2)), Instr("call", (label,))))
    return out


def _emit_microkernels(b: ProgramBuilder, mk_labels: dict, t, n2p: int, pipelined: bool, platform: Platform) -> None:
    for (mr, nv, ks, first, last), label in mk_labels.items():
        b.label(label)
        # encoded once per micro-kernel, not once per program that calls it (~10**4 bundles a GEMM)
        b.extend_portable(microkernel(mr, nv, ks, first, last, t.k2 * 2, n2p * 2, n2p * 4, n2p * 2,
                                      t.rotation, pipelined, platform))


def _dsp_tables(program: Program, descs: _Descriptors, partitions: dict, full_rows: int, last_rows: int,
                k: int, gsm_pitch: int, n: int, dsps: int) -> tuple[dict[int, np.ndarray], dict[int, dict[int, int]]]:
    """Per-DSP descriptor tables (each DSP moves its own rows) and row-offset registers."""
    dsp_desc: dict[int, np.ndarray] = {}
    init: dict[int, dict[int, int]] = {}
    full_part, last_part = partitions[full_rows], partitions[last_rows]
    for d in range(dsps):
        table = program.descriptors.copy()
        for j, key in enumerate(descs.keys):
            table[j] = descs.fields(key, partitions[key[1]][d][1] if key[0] != "b" else None)
        dsp_desc[d] = table
        r0, r0_last = full_part[d][0], last_part[d][0]
        init[d] = {R_AROW: r0 * k * 2, R_GROW: r0 * gsm_pitch * 2, R_CROW: r0 * n * 2,
                   R_AROW2: r0_last * k * 2, R_GROW2: r0_last * gsm_pitch * 2, R_CROW2: r0_last * n * 2,
                   R_LEADER_SKIP: 0 if d == 0 else 1}
    return dsp_desc, init


def build_gemm(m: int, k: int, n: int, tiles: GemmTiles = DEFAULT_TILES, platform: Platform = DEFAULT) -> GemmProgram:
    m, k, n = positive_ints("GEMM dimension", MtemuError, m=m, k=k, n=n)   # 64.0 or "64" is refused, not cast
    return _build_cached(m, k, n, tiles, platform)


@sized_memo(entries=32)       # a few programs are hundreds of MB (naive tiles)
def _build_cached(m: int, k: int, n: int, tiles: GemmTiles, platform: Platform) -> GemmProgram:
    plan = plan_gemm(m, k, n, tiles, platform)
    program, dsp_desc, init = cached_program("gemm", (m, k, n), tiles, platform, lambda: _assemble(plan, platform))
    return GemmProgram(plan, program, dsp_desc, init, m * k * n)


def _assemble(plan: GemmPlan, platform: Platform) -> tuple[Program, dict[int, np.ndarray], dict[int, dict[int, int]]]:
    """The program of ``plan``, its per-DSP descriptor tables and initial registers."""
    t = plan.tiles
    lanes = platform.vector_lanes
    steps = _steps(plan)
    # m-blocks share a partition unless the last one is short: descriptors carry per-DSP rows.
    partitions = {}
    for s in steps:
        if s.mrows not in partitions:
            partitions[s.mrows] = _partition(s.mrows, platform.dsps)
    b = ProgramBuilder(platform)
    desc = _Descriptors(b, lambda key, rows: _desc_fields_arr(key, plan, rows), plan.rows_max)

    full_rows = steps[0].mrows

    def row_regs(s: _Step) -> tuple[int, int, int]:
        return (R_AROW, R_GROW, R_CROW) if s.mrows == full_rows else (R_AROW2, R_GROW2, R_CROW2)

    def a_to_gsm_i(i: int) -> Instr:
        s = steps[i]
        d = desc(("a_gsm", s.mrows, s.kw))
        src = plan.a_addr + s.row0 * plan.k * 2 + s.k0 * 2
        arow, grow, _ = row_regs(s)
        return ins("dma", CH_A_GSM, d, (arow, src), (grow, plan.gsm_slots[i % 3]))

    def a_to_sm_i(i: int) -> Instr:
        s = steps[i]
        d = desc(("a_sm", s.mrows, s.kw))
        return ins("dma", CH_A_SM, d, (row_regs(s)[1], plan.gsm_slots[i % 3]), (0, plan.sm_slots[i % 2]))

    def b_bcast_i(i: int) -> Instr:
        s = steps[i]
        d = desc(("b", s.kw, s.nw))
        src = plan.b_addr + s.k0 * plan.n * 2 + s.n0 * 2
        return ins("dma", CH_B, d, (0, src), (0, plan.am_b_slots[i % 2]))

    def c_back(s: _Step) -> Instr:
        d = desc(("c", s.mrows, s.nw))
        dst = plan.c_addr + s.row0 * plan.n * 2 + s.n0 * 2
        return ins("dma", CH_C, d, (0, plan.am_wb), (row_regs(s)[2], dst))

    pipelined = t.pipelined
    mk_labels: dict[tuple, str] = {}
    sites: dict[tuple, list] = {}

    def leader_only(body: list[Instr], skip_label: str) -> None:
        _leader_only(b, body, skip_label)

    # prologue
    b.bundle(a_to_gsm_i(0))
    b.add(one("dmawait", CH_A_GSM))
    b.bundle(a_to_sm_i(0))
    if len(steps) > 1:
        b.bundle(a_to_gsm_i(1))
    leader_only([b_bcast_i(0)], "pro_lead")
    n_steps = len(steps)
    for i, s in enumerate(steps):
        leader_only([one("dmawait", CH_B)], f"s{i}_w")
        b.add(one("barrier"))
        if i + 1 < n_steps:
            leader_only([b_bcast_i(i + 1)], f"s{i}_b")
        if pipelined:
            b.add(one("dmawait", CH_A_SM))
            if i + 1 < n_steps:
                b.add(one("dmawait", CH_A_GSM))
                b.bundle(a_to_sm_i(i + 1))
            if i + 2 < n_steps:
                b.bundle(a_to_gsm_i(i + 2))
        else:
            # no overlap: this step's A_2 arrived; the next loads are issued after compute
            b.add(one("dmawait", CH_A_SM))
        if s.last:
            b.add(one("dmawait", CH_C))
        # compute: row groups x column groups of the micro-kernel
        _call_tiles(b, mk_labels, t, plan.rows_max, plan.n2p, math.ceil(s.nw / lanes), s.kw, s.first, s.last,
                    plan.sm_slots[i % 2], plan.am_b_slots[i % 2], plan.am_c, plan.am_wb, lanes, sites)
        if not pipelined:
            if i + 1 < n_steps:
                b.bundle(a_to_gsm_i(i + 1))
                b.add(one("dmawait", CH_A_GSM))
                b.bundle(a_to_sm_i(i + 1))
        if s.last:
            b.bundle(c_back(s))
            if not pipelined:
                b.add(one("dmawait", CH_C))
    b.add(one("dmawait", CH_C))
    b.add(one("halt"))
    _emit_microkernels(b, mk_labels, t, plan.n2p, pipelined, platform)
    program = b.assemble()
    dsp_desc, init = _dsp_tables(program, desc, partitions, full_rows, steps[-1].mrows, plan.k, t.k2, plan.n,
                                 platform.dsps)
    return program, dsp_desc, init


def _desc_fields_arr(key: tuple, plan: GemmPlan, rows: int | None) -> np.ndarray:
    t = plan.tiles
    kind = key[0]
    if kind == "a_gsm":
        _, _mrows, kw = key
        f = (isa.SP_DDR, isa.SP_GSM, rows, kw * 2, plan.k * 2, t.k2 * 2, isa.DMA_COPY)
    elif kind == "a_sm":
        _, _mrows, kw = key
        # GSM and SM rows have the same pitch (k2): one contiguous transfer
        f = (isa.SP_GSM, isa.SP_SM, 1 if rows else 0, max(rows, 1) * t.k2 * 2, 0, 0, isa.DMA_COPY)
    elif kind == "b":
        _, kw, nw = key
        f = (isa.SP_DDR, isa.SP_AM, kw, nw * 2, plan.n * 2, plan.n2p * 2, isa.DMA_BROADCAST)
    else:
        _, _mrows, nw = key
        f = (isa.SP_AM, isa.SP_DDR, rows, nw * 2, plan.n2p * 2, plan.n * 2, isa.DMA_COPY)
    return np.array(f, dtype=np.int64)


# ------------------------------------------------------------------------------------------
# running and results
# ------------------------------------------------------------------------------------------
@dataclass
class GemmResult:
    m: int
    k: int
    n: int
    tiles: GemmTiles
    mode: str
    cycles: int
    utilization: float
    tmac_per_s: float
    latency_ms: float
    stalls: dict[str, int]
    busy: dict[str, int]
    ddr_bytes: int
    memory: dict[str, int]
    c: np.ndarray | None = None
    # the run's counters (and trace, if recorded): for mtemu.explain and the trace writer
    stats: RunStats | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        return result_json(self, ("c", "stats"))


def result_json(result, skip: tuple[str, ...]) -> dict:
    """A kernel result's fields as plain JSON values, without the arrays and run counters in ``skip``."""
    d = {f.name: getattr(result, f.name) for f in fields(result) if f.name not in skip}
    for k, v in d.items():
        if isinstance(v, dict):
            d[k] = dict(v)
    d["tiles"] = asdict(result.tiles)
    return d


def reference_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy reference with the emulator's order: FP16 in, FP32 sequential-k accumulation, FP16 out."""
    a32 = a.astype(np.float32)
    b32 = b.astype(np.float32)
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for kk in range(a.shape[1]):
        acc += a32[:, kk:kk + 1] * b32[kk:kk + 1, :]
    return acc.astype(np.float16)


def _result(gp: GemmProgram, stats: RunStats, mode: str, platform: Platform, c=None) -> GemmResult:
    plan = gp.plan
    util = gp.useful_macs / (platform.peak_macs_per_cycle * stats.cycles)
    secs = stats.cycles / platform.clock_hz
    return GemmResult(plan.m, plan.k, plan.n, plan.tiles, mode, stats.cycles, util,
                      gp.useful_macs / secs / 1e12, secs * 1e3, stats.stall_cycles(), stats.busy_cycles(),
                      stats.server_bytes["ddr"],
                      {"sm": plan.sm_used, "am": plan.am_used, "gsm": plan.gsm_used, "ddr": plan.ddr_bytes}, c, stats)


def _run(gp: GemmProgram, platform: Platform, functional: bool, a=None, b=None,
         trace: TraceOptions | None = None) -> tuple[RunStats, Cluster]:
    plan = gp.plan
    cluster = Cluster(platform, ddr_bytes=plan.ddr_bytes, functional=functional)
    if functional:
        cluster.write_ddr_u16(plan.a_addr, a.view(np.uint16))
        cluster.write_ddr_u16(plan.b_addr, b.view(np.uint16))
    stats = cluster.run([gp.program], init_sregs=gp.init_sregs, dsp_descriptors=gp.dsp_descriptors, trace=trace)
    return stats, cluster


def _check_tiles(tiles, kind: type) -> None:
    """A library caller's ``tiles``: None (the defaults) or the loop order's own tile type."""
    if tiles is not None and not isinstance(tiles, kind):
        raise MtemuError(f"tiles must be a {kind.__name__} (or None for the defaults), got {tiles!r}")


@timing_memo.memoized
def gemm_timing(m: int, k: int, n: int, *, tiles: GemmTiles | None = None,
                platform: Platform | None = None, trace: TraceOptions | None = None) -> GemmResult:
    """Emulate the GEMM in timing-only mode (no data) and return its statistics
    (``result.stats``: the run's counters, with its trace when ``trace`` is given)."""
    platform = as_platform(platform)
    _check_tiles(tiles, GemmTiles)
    gp = build_gemm(m, k, n, tiles or DEFAULT_TILES, platform)
    stats, _ = _run(gp, platform, False, trace=trace)
    return _result(gp, stats, "timing", platform)


def run_gemm(a: np.ndarray, b: np.ndarray, *, platform: Platform | None = None,
             tiles: GemmTiles | None = None, mode: str = "functional",
             trace: TraceOptions | None = None) -> GemmResult:
    """Multiply FP16 matrices on the emulated cluster; ``result.c`` holds the FP16 product."""
    platform = as_platform(platform)
    _check_tiles(tiles, GemmTiles)
    if mode not in ("functional", "timing"):
        raise MtemuError(f"mode must be 'functional' or 'timing', got {mode!r}")
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, np.ndarray) or x.ndim != 2:
            raise MtemuError(f"{name} must be a 2-D NumPy array")
        if x.dtype != np.float16:
            raise MtemuError(f"{name} must be float16 (got {x.dtype}); convert with .astype(np.float16)")
    if a.shape[1] != b.shape[0]:
        raise MtemuError(f"inner dimensions differ: a is {a.shape}, b is {b.shape}")
    m, k = a.shape
    n = b.shape[1]
    gp = build_gemm(m, k, n, tiles or DEFAULT_TILES, platform)
    if mode == "timing":
        stats, _ = _run(gp, platform, False, trace=trace)
        return _result(gp, stats, mode, platform)
    stats, cluster = _run(gp, platform, True, np.ascontiguousarray(a), np.ascontiguousarray(b), trace)
    c = cluster.read_ddr_u16(gp.plan.c_addr, m * n).view(np.float16).reshape(m, n)
    return _result(gp, stats, mode, platform, c)

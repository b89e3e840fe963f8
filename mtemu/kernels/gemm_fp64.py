"""FP64 GEMM for the DSP family (FT-M7032): the NN micro-kernel and the single-core NN GEMM of the
multi-level-pipelined Goto loop nest (docs/DSP-FAMILY.md).

Micro-kernel (NN): C[6, 48] += A[6, K_A] B[K_A, 48]. A sits row-major in SM; each step kk loads the
six scalars A[r, kk] (``sldd``), broadcasts them (``svbcastd``), loads B's row kk (one 48-lane FP64
vector: the three FMA units' 3 x 16 elements, ``vldd``) and issues six ``vfmad``; C is loaded from
AM at the start and stored back at the end. The list scheduler software-pipelines the unrolled steps
(registers rotate over ``ROTATION`` sets), so the main loop issues one ``vfmad`` per cycle.

GEMM (NN, one core): for each K_A-block of K (``ko``) and each M_G-block of rows (``mo``) the A block
moves DDR -> GSM (one buffer; the wait is not hidden); then the C tiles (M_A x N_A) are visited
column block by column block (``ni`` over N_A, then ``mi`` over M_A): B's K_A x N_A tile DDR -> AM
double-buffered, C's tile DDR -> AM -> DDR triple-buffered (load of the next, compute of this, store
of the previous), and A's M_S x K_A tiles GSM -> SM double-buffered; each A tile is multiplied by
(M_S / 6) x (N_A / 48) micro-kernel calls. The ko and mo loops are machine loops (``bdec``); what
is inside a block is unrolled.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from rtcommon.checks import positive_ints

from ..assembler import Instr, Program, ProgramBuilder, ins
from ..errors import CapacityError, MtemuError, PlatformError
from ..machine import Cluster, RunStats
from ..platform import Platform
from .program_cache import cached_program
from .schedule import Op, schedule

MR = 6                      # rows of A per micro-kernel call (the paper's m)
# The GEMM driver's own cycles per micro-kernel call beyond the call itself (its loop and argument
# bookkeeping), fitted with the platform's dma_issue_cycles on the single-core NN measurements
# (docs/DSP-FAMILY.md, "Calibration"); the driver spends them in a stub on the way to the micro-kernel.
DRIVER_CYCLES_PER_CALL = 28
R_SPIN = 7                  # the stub's bookkeeping register
ROTATION = 4                # register sets the unrolled steps rotate over
F64 = 8                     # bytes per element
# scalar registers: micro-kernel arguments and temporaries, then the driver's
R_A, R_B, R_C = 1, 2, 3
R_TEMP0 = 8                 # ROTATION x MR temporaries
R_ABLK, R_BROW, R_CROW, R_KO, R_MO = 40, 41, 42, 43, 44
R_DOFF, R_FOLLOWER = 45, 46   # this DSP's column offset in bytes (N_G x 8 x DSP); 0 on the leader, else 1
R_DOFFB = 47                  # NT: this DSP's first row of B^T in bytes (N_G x K x 8 x DSP)
# DMA channels: A block, B tiles, C loads, C stores (one per C buffer), A tiles
CH_AG, CH_B, CH_CL, CH_CS0, CH_AS = 0, 1, 2, 3, 6


def _need_fp64(platform: Platform, what: str) -> int:
    if not platform.fp64_lanes:
        raise PlatformError(f"{what}: platform {platform.name!r} has no FP64 lanes (field 'fp64_lanes' is 0)")
    return platform.fp64_lanes


# ------------------------------------------------------------------------------------------
# micro-kernel
# ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=32)
def nn_microkernel(ka: int, a_stride: int, bc_stride: int, platform: Platform) -> tuple[tuple[Instr, ...], ...]:
    """Bundles of C[6, lanes] += A[6, ka] B[ka, lanes] ending in ``ret``: A at SM ``s1`` (row pitch
    ``a_stride`` bytes), B at AM ``s2`` and C at AM ``s3`` (row pitch ``bc_stride`` bytes)."""
    _need_fp64(platform, "FP64 NN micro-kernel")
    acc = list(range(MR))
    va0 = MR
    vb0 = va0 + ROTATION * MR
    if vb0 + ROTATION > platform.vector_registers:
        raise MtemuError(f"FP64 NN micro-kernel: needs {vb0 + ROTATION} vector registers, the platform has "
                         f"{platform.vector_registers}")
    ops: list[Op] = [Op("vldd", (v, (R_C, r * bc_stride)), (("s", R_C),), (("v", v),)) for r, v in enumerate(acc)]
    for kk in range(ka):
        rs = kk % ROTATION
        for r in range(MR):
            s = R_TEMP0 + rs * MR + r
            ops.append(Op("sldd", (s, (R_A, r * a_stride + kk * F64)), (("s", R_A),), (("s", s),)))
        for r in range(MR):
            s, v = R_TEMP0 + rs * MR + r, va0 + rs * MR + r
            ops.append(Op("svbcastd", (v, s), (("s", s),), (("v", v),)))
        vb = vb0 + rs
        ops.append(Op("vldd", (vb, (R_B, kk * bc_stride)), (("s", R_B),), (("v", vb),)))
        for r in range(MR):
            va = va0 + rs * MR + r
            ops.append(Op("vfmad", (acc[r], va, vb), (("v", va), ("v", vb), ("v", acc[r])), (("v", acc[r]),)))
    ops += [Op("vstd", ((R_C, r * bc_stride), v), (("s", R_C), ("v", v))) for r, v in enumerate(acc)]
    bundles = schedule(ops, platform)
    bundles.append([ins("ret")])
    return tuple(tuple(b) for b in bundles)


def _call(a: int, b: int, c: int, label: str) -> tuple[Instr, ...]:
    """One bundle: the three argument registers and the call (the callee reads them after the branch)."""
    return (ins("smovi", R_A, a), ins("smovi", R_B, b), ins("smovi", R_C, c), ins("call", label))


# NT micro-kernel: C[6, 8] += A[6, K_A] B^T[8, K_A]^T with A and B^T row-major in AM and C in SM. The
# FP64 register's lanes are fma_units hardware vectors of NT_UNIT_LANES lanes; accumulator (h, j) holds the
# dot-product lanes of rows 3h .. 3h + 2 (one per unit) with column j, so one ``vfmad`` is the three FMAs
# of one cycle (three A vectors times one B vector, as in the paper's pipeline).
NR_NT = 8                   # columns of C per NT call (the paper's n)
NT_UNIT_LANES = 16          # FP64 lanes of one hardware vector: the reduction's two modulo-4 stages
R_ASTR, R_ONE = 4, 5        # the gather's stride (A's row pitch) and the bits of 1.0
# scalars: C's values, loaded while the main loop runs (47 registers: all but the arguments, the driver's
# and the link register; the last value reuses the first's), and the reduced sums (rotating over the
# registers the main loop is done with)
NT_C_REGS = tuple(range(8, 40)) + tuple(range(48, 63))
NT_X_REGS = (R_A, R_B, R_ASTR, R_ONE, 6)
NT_SCRATCH_BYTES = (MR * NR_NT * NT_UNIT_LANES + MR * NR_NT * 4) * F64   # the reduction's AM scratch
ONE_BITS = int(np.array([1.0]).view(np.int64)[0])


def _nt_units(platform: Platform) -> int:
    lanes = _need_fp64(platform, "FP64 NT micro-kernel")
    units = platform.fma_units
    if lanes != units * NT_UNIT_LANES or lanes != MR * NR_NT:
        raise PlatformError(f"FP64 NT micro-kernel: needs {NT_UNIT_LANES} FP64 lanes per FMA unit and FMA units "
                            f"x units = {MR * NR_NT}; platform {platform.name!r} has {lanes} lanes over {units} units")
    return units


@functools.lru_cache(maxsize=32)
def nt_microkernel(ka: int, a_stride: int, b_stride: int, c_stride: int, scratch: int, platform: Platform
                   ) -> tuple[tuple[Instr, ...], ...]:
    """Bundles of C[6, 8] += A[6, ka] B^T[8, ka]^T ending in ``ret``: A at AM ``s1`` (row pitch ``a_stride``
    bytes), B^T at AM ``s2`` (row pitch ``b_stride``), C at SM ``s3`` (row pitch ``c_stride``); AM
    ``scratch`` holds NT_SCRATCH_BYTES for the reduction. Main loop: per 16 k, two gathers of A (rows
    3h .. 3h + 2), eight B vectors repeated over the units, sixteen ``vfmad``. Reduction (the paper's
    five steps): the 16 accumulators to AM, four modulo-4 loads per 192 lanes and three adds (x 1.0) give
    sums of four; once more give each hardware vector's sum in one lane; each lane through the
    scalar-vector register (``smvd``), added to C's value (``sfaddd``) and stored (``sstd``)."""
    units = _nt_units(platform)
    (ka,) = positive_ints("FP64 NT micro-kernel K_A", MtemuError, ka=ka)
    if platform.scalar_registers < NT_C_REGS[-1] + 2:
        raise MtemuError(f"FP64 NT micro-kernel: needs {NT_C_REGS[-1] + 2} scalar registers, the platform has "
                         f"{platform.scalar_registers}")
    if ka % NT_UNIT_LANES:
        raise MtemuError(f"FP64 NT micro-kernel: K_A = {ka} is not a multiple of {NT_UNIT_LANES}")
    groups = MR // units                        # accumulators per column (2)
    n_acc = groups * NR_NT
    acc = list(range(n_acc))
    rot = 2
    va0 = n_acc
    vb0 = va0 + rot * groups
    top = vb0 + rot * NR_NT
    if top > platform.vector_registers:
        raise MtemuError(f"FP64 NT micro-kernel: needs {top} vector registers, the platform has "
                         f"{platform.vector_registers}")
    lanes = platform.fp64_lanes
    ops: list[Op] = [Op("smovi", (R_ASTR, a_stride), (), (("s", R_ASTR),)),
                     Op("smovi", (R_ONE, ONE_BITS), (), (("s", R_ONE),))]
    ops += [Op("svbcastd", (v, 0), (), (("v", v),)) for v in acc]          # +0.0
    cells = []                      # (lane of the reduced register, row, column of C) per C value
    for p in range(MR * NR_NT):
        q, u = divmod(p, units)     # lane p: hardware vector p = unit u of accumulator q = j groups + h
        j, h = divmod(q, groups)
        cells.append((p, units * h + u, j))
    c_at = [(R_C, row * c_stride + col * F64) for _p, row, col in cells]
    c_reg = [NT_C_REGS[n % len(NT_C_REGS)] for n in range(len(cells))]
    early = min(len(cells), len(NT_C_REGS))

    def load_c(n: int) -> Op:
        return Op("sldd", (c_reg[n], c_at[n]), (("s", R_C),), (("s", c_reg[n]),))

    ops += [load_c(n) for n in range(early)]
    for kk in range(ka // NT_UNIT_LANES):
        rs = kk % rot
        off = kk * NT_UNIT_LANES * F64
        for h in range(groups):
            v = va0 + rs * groups + h
            ops.append(Op("vlddg", (v, (R_A, units * h * a_stride + off), R_ASTR), (("s", R_A), ("s", R_ASTR)),
                          (("v", v),)))
        for j in range(NR_NT):
            v = vb0 + rs * NR_NT + j
            ops.append(Op("vlddg", (v, (R_B, j * b_stride + off), 0), (("s", R_B),), (("v", v),)))
        for j in range(NR_NT):
            for h in range(groups):
                a, b, c = va0 + rs * groups + h, vb0 + rs * NR_NT + j, acc[j * groups + h]
                ops.append(Op("vfmad", (c, a, b), (("v", a), ("v", b), ("v", c)), (("v", c),)))
    # reduction, step 1: the accumulators to AM (accumulator q's lanes at scratch + q lanes x 8)
    # (AM blocks as pseudo-registers ("m", n): the scheduler orders a load after the stores it reads)
    ops += [Op("vstd", ((0, scratch + q * lanes * F64), acc[q]), (("v", acc[q]),), (("m", q),)) for q in range(n_acc)]
    ones = vb0
    ops.append(Op("svbcastd", (ones, R_ONE), (("s", R_ONE),), (("v", ones),)))

    def sums_of_four(src: int, count: int, dst: int, free: list[int], block: int) -> list[int]:
        """``count`` registers of sums of four consecutive FP64 values from AM ``src`` (stored as
        pseudo-blocks ``block`` ..., one register each); stored at ``dst`` (as blocks 100 + n) if not
        negative; returns the registers."""
        out = []
        for bt in range(count):
            regs = free[4 * bt:4 * bt + 4]
            stored = tuple(("m", block + 4 * bt + i) for i in range(4))
            for jm, r in enumerate(regs):
                ops.append(Op("vlddm4", (r, (0, src + (4 * bt * lanes + jm) * F64)), stored, (("v", r),)))
            for r in regs[1:]:
                ops.append(Op("vfmad", (regs[0], r, ones), (("v", r), ("v", ones), ("v", regs[0])),
                              (("v", regs[0]),)))
            if dst >= 0:
                ops.append(Op("vstd", ((0, dst + bt * lanes * F64), regs[0]), (("v", regs[0]),), (("m", 100 + bt),)))
            out.append(regs[0])
        return out

    stage1 = n_acc * lanes // (4 * lanes)       # registers of sums of four (4)
    partial = scratch + n_acc * lanes * F64
    free = [v for v in range(platform.vector_registers) if v != ones][:4 * stage1]
    sums_of_four(scratch, stage1, partial, free, 0)
    (total,) = sums_of_four(partial, stage1 * lanes // (4 * lanes), -1, free[4 * stage1 - 4:], 100)
    # step 5: each lane through the scalar-vector register, added to C's value and stored
    for n, (p, _row, _col) in enumerate(cells):
        x, cv = NT_X_REGS[n % len(NT_X_REGS)], c_reg[n]
        ops.append(Op("smvd", (x, total, p), (("v", total),), (("s", x),)))
        ops.append(Op("sfaddd", (cv, cv, x), (("s", cv), ("s", x)), (("s", cv),)))
        ops.append(Op("sstd", (c_at[n], cv), (("s", R_C), ("s", cv))))
        if n + early < len(cells):  # the value that reuses this register, listed once it is free
            ops.append(load_c(n + early))
    bundles = schedule(ops, platform)
    bundles.append([ins("ret")])
    return tuple(tuple(b) for b in bundles)


def nt_micro_reference(a: np.ndarray, bt: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The NT micro-kernel's arithmetic in NumPy: C + A B^T with each of the 16 lanes' dot products
    accumulated in k order (products rounded, then added, from +0.0), then each 16-lane vector summed
    as ((q0 + q1) + q2) + q3 over its quarters, q = ((e0 + e1) + e2) + e3, and added to C."""
    m, k = a.shape
    w = NT_UNIT_LANES
    acc = np.zeros((m, bt.shape[0], w))
    for kk in range(k // w):
        acc = acc + a[:, None, kk * w:(kk + 1) * w] * bt[None, :, kk * w:(kk + 1) * w]

    def four(x: np.ndarray) -> np.ndarray:
        return ((x[..., 0] + x[..., 1]) + x[..., 2]) + x[..., 3]

    return np.asarray(c, np.float64) + four(four(acc.reshape(m, bt.shape[0], 4, 4)))


def nt_micro_timing(ka: int, platform: Platform) -> Fp64Result:
    """One call of the 6 x ka x 8 NT micro-kernel on one DSP (A, B^T in AM, C in SM), from the call's
    argument bundle to the halt after its return."""
    (ka,) = positive_ints("FP64 micro-kernel K_A", MtemuError, ka=ka)
    one = platform.with_overrides(dsps=1)
    _nt_units(one)
    _fits("AM", (MR + NR_NT) * ka * F64 + NT_SCRATCH_BYTES, one.am_bytes,
          f"the NT micro-kernel's A and B^T (({MR} + {NR_NT}) x {ka} x 8) and its reduction scratch")
    b = ProgramBuilder(one)
    b.bundle(*_call(0, MR * ka * F64, 0, "mk"))
    b.bundle(ins("halt"))
    b.label("mk")
    b.extend(nt_microkernel(ka, ka * F64, ka * F64, NR_NT * F64, (MR + NR_NT) * ka * F64, one))
    stats = Cluster(one, functional=False).run([b.assemble()])
    return _result("nt-micro", (MR, ka, NR_NT), MR * ka * NR_NT, stats, one)


@dataclass
class Fp64Result:
    """One timing run: the shape, the cycles of the busiest DSP, FP64 MACs and efficiency."""

    kernel: str
    shape: tuple[int, ...]
    dsps: int
    cycles: int
    macs: int
    efficiency: float           # useful flops / (cycles x peak flops of the DSPs used)
    stalls: dict[str, int]

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "shape": list(self.shape), "dsps": self.dsps, "cycles": self.cycles,
                "macs": self.macs, "efficiency": self.efficiency, "stalls": self.stalls}


def _result(kernel: str, shape: tuple[int, ...], macs: int, stats: RunStats, platform: Platform) -> Fp64Result:
    cycles = int(stats.cycles)
    eff = macs / (cycles * platform.fp64_lanes * platform.dsps)
    return Fp64Result(kernel, shape, platform.dsps, cycles, macs, eff, stats.stall_cycles())


def nn_micro_timing(ka: int, platform: Platform) -> Fp64Result:
    """One call of the 6 x ka x lanes NN micro-kernel on one DSP (A, B, C resident), from the call's
    argument bundle to the halt after its return."""
    (ka,) = positive_ints("FP64 micro-kernel K_A", MtemuError, ka=ka)
    lanes = _need_fp64(platform, "FP64 NN micro-kernel")
    one = platform.with_overrides(dsps=1)
    sm_need, am_need = MR * ka * F64, (ka + MR) * lanes * F64
    _fits("SM", sm_need, one.sm_bytes, f"the micro-kernel's A (6 x {ka} x 8)")
    _fits("AM", am_need, one.am_bytes, f"the micro-kernel's B and C (({ka} + 6) x {lanes} x 8)")
    b = ProgramBuilder(one)
    b.bundle(*_call(0, 0, ka * lanes * F64, "mk"))
    b.bundle(ins("halt"))
    b.label("mk")
    b.extend(nn_microkernel(ka, ka * F64, lanes * F64, one))
    stats = Cluster(one, functional=False).run([b.assemble()])
    return _result("nn-micro", (MR, ka, lanes), MR * ka * lanes, stats, one)


# ------------------------------------------------------------------------------------------
# single-core NN GEMM
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NNBlocking:
    """The paper's blockings: K_A (= K_G), N_A, M_S, M_A, M_G; and how many C tiles AM holds (3: the
    paper's triple buffering, load / compute / store; 2: the double-buffered baseline, whose next load
    waits for the previous store)."""

    ka: int
    na: int
    ms: int
    ma: int
    mg: int
    c_buffers: int = 3


# Section V-B's blockings for K_A = 128, 256, 512 (NN) and 512, 1024, 2048 (NT, V-B2)
PAPER_NN_BLOCKINGS = {128: NNBlocking(128, 192, 24, 72, 6048), 256: NNBlocking(256, 96, 12, 144, 3024),
                      512: NNBlocking(512, 48, 6, 252, 1512)}
PAPER_NT_BLOCKINGS = {512: NNBlocking(512, 64, 12, 36, 1440), 1024: NNBlocking(1024, 32, 12, 72, 720),
                      2048: NNBlocking(2048, 16, 6, 144, 288)}


def _fits(memory: str, need: int, have: int, what: str) -> None:
    if need > have:
        raise CapacityError(f"{memory}: {what} needs {need} bytes, {need - have} more than the platform's {have}")


@dataclass(frozen=True)
class NNPlan:
    """Where a GEMM's operands sit. NN: A tiles in SM (``sm_slots``), B and C tiles in AM; NT (``nt``): A
    and B^T tiles in AM (``sm_slots`` then name AM addresses), C tiles in SM, the reduction's scratch at AM
    ``scratch``."""

    m: int
    k: int
    n: int
    blk: NNBlocking
    a_addr: int
    b_addr: int
    c_addr: int
    ddr_bytes: int
    sm_slots: tuple[int, int]
    b_slots: tuple[int, int]
    c_slots: tuple[int, ...]
    nt: bool = False
    scratch: int = 0


def plan_nn(m: int, k: int, n: int, blk: NNBlocking, platform: Platform, nt: bool = False) -> NNPlan:
    """Check the shape and blocking against the platform (one line naming the memory and bytes missing);
    ``nt``: C = A B^T + C, B^T given as N x K row-major."""
    mode = "NT" if nt else "NN"
    m, k, n = positive_ints("FP64 GEMM dimension", MtemuError, m=m, k=k, n=n)
    positive_ints("FP64 GEMM blocking", MtemuError, **asdict(blk))
    if blk.c_buffers not in (2, 3):
        raise MtemuError(f"FP64 {mode} GEMM: c_buffers must be 2 or 3, got {blk.c_buffers}")
    lanes = _need_fp64(platform, f"FP64 {mode} GEMM")
    if nt:
        _nt_units(platform)
    cols, cols_name = (NR_NT, f"the micro-kernel's {NR_NT} columns") if nt else (lanes, f"the {lanes} FP64 lanes")
    checks = (("M", m, "M_G", blk.mg), ("M_G", blk.mg, "M_A", blk.ma), ("M_A", blk.ma, "M_S", blk.ms),
              ("M_S", blk.ms, "the micro-kernel's 6 rows", MR), ("K", k, "K_A", blk.ka), ("N", n, "N_A", blk.na),
              ("N_A", blk.na, cols_name, cols))
    if nt:
        checks += (("K_A", blk.ka, "the NT micro-kernel's 16-lane vectors", NT_UNIT_LANES),)
    for big_name, big, small_name, small in checks:
        if big % small:
            raise MtemuError(f"FP64 {mode} GEMM: {big_name} = {big} is not a multiple of {small_name} = {small}")
    a_tile = blk.ms * blk.ka * F64
    b_tile = blk.ka * blk.na * F64
    c_tile = blk.ma * blk.na * F64
    nb = blk.c_buffers
    a_what = f"2 A tiles of M_S x K_A = {blk.ms} x {blk.ka}"
    b_what = f"2 B{'^T' if nt else ''} tiles of {'N_A x K_A' if nt else 'K_A x N_A'} = " + \
        (f"{blk.na} x {blk.ka}" if nt else f"{blk.ka} x {blk.na}")
    c_what = f"{nb} C tiles of M_A x N_A = {blk.ma} x {blk.na} FP64"
    if nt:
        _fits("SM", nb * c_tile, platform.sm_bytes, c_what)
        _fits("AM", 2 * a_tile + 2 * b_tile + NT_SCRATCH_BYTES, platform.am_bytes,
              f"{a_what}, {b_what} FP64 and {NT_SCRATCH_BYTES} bytes of reduction scratch")
        a_slots, b_slots = (0, a_tile), (2 * a_tile, 2 * a_tile + b_tile)
        c_slots = tuple(i * c_tile for i in range(nb))
        scratch = 2 * a_tile + 2 * b_tile
    else:
        _fits("SM", 2 * a_tile, platform.sm_bytes, f"{a_what} FP64")
        _fits("AM", 2 * b_tile + nb * c_tile, platform.am_bytes, f"{b_what} and {c_what}")
        a_slots, b_slots = (0, a_tile), (0, b_tile)
        c_slots = tuple(2 * b_tile + i * c_tile for i in range(nb))
        scratch = 0
    _fits("GSM", blk.mg * blk.ka * F64, platform.gsm_bytes, f"the A block of M_G x K_A = {blk.mg} x {blk.ka} FP64")
    a_addr, b_addr = 0, m * k * F64
    c_addr = b_addr + k * n * F64
    ddr = c_addr + m * n * F64
    _fits("DDR", ddr, platform.ddr_bytes, f"A, B and C ({m} x {k}, {k} x {n}, {m} x {n} FP64)")
    return NNPlan(m, k, n, blk, a_addr, b_addr, c_addr, ddr, a_slots, b_slots, c_slots, nt, scratch)


def _assemble_nn(plan: NNPlan, platform: Platform) -> tuple[Program, dict, dict]:
    blk, n, k, nt = plan.blk, plan.n, plan.k, plan.nt
    nb = blk.c_buffers
    lanes = platform.fp64_lanes
    ng = n // platform.dsps                       # each DSP's columns
    # NT: B^T's tile is N_A rows of K_A; a DSP's columns are rows of B^T, a K_A-block its next K_A
    cols = NR_NT if nt else lanes                 # columns of C per micro-kernel call
    b_col_bytes = k * F64 if nt else F64          # DDR bytes from one column of B to the next
    b_call_bytes = cols * blk.ka * F64 if nt else cols * F64
    a_space, bc_space = ("AM", "SM") if nt else ("SM", "AM")
    r_boff = R_DOFFB if nt else R_DOFF
    b = ProgramBuilder(platform)
    d_ag = b.descriptor("DDR", "GSM", blk.mg, blk.ka * F64, k * F64, blk.ka * F64, name="a_block")
    if nt:
        d_b = b.descriptor("DDR", "AM", blk.na, blk.ka * F64, k * F64, blk.ka * F64, name="b_tile")
    else:
        d_b = b.descriptor("DDR", "AM", blk.ka, blk.na * F64, n * F64, blk.na * F64, name="b_tile")
    d_cl = b.descriptor("DDR", bc_space, blk.ma, blk.na * F64, n * F64, blk.na * F64, name="c_load")
    d_cs = b.descriptor(bc_space, "DDR", blk.ma, blk.na * F64, blk.na * F64, n * F64, name="c_store")
    d_as = b.descriptor("GSM", a_space, 1, blk.ms * blk.ka * F64, 0, 0, name="a_tile")
    m_tiles, n_tiles, ms_tiles = blk.mg // blk.ma, ng // blk.na, blk.ma // blk.ms
    n_c = m_tiles * n_tiles                       # C tiles per block, ni outer, mi inner
    n_a = n_c * ms_tiles                          # A tiles per block

    def c_off(s: int) -> int:
        ni, mi = divmod(s, m_tiles)
        return mi * blk.ma * n * F64 + ni * blk.na * F64

    def a_tile(j: int) -> Instr:
        mi, ms = (j // ms_tiles) % m_tiles, j % ms_tiles
        return ins("dma", CH_AS, d_as, (0, (mi * blk.ma + ms * blk.ms) * blk.ka * F64), (0, plan.sm_slots[j % 2]))

    b.bundle(ins("saddi", R_BROW, r_boff, plan.b_addr), ins("smovi", R_ABLK, plan.a_addr),
             ins("smovi", R_KO, k // blk.ka))
    b.label("ko")
    b.bundle(ins("saddi", R_CROW, R_DOFF, plan.c_addr), ins("smovi", R_MO, plan.m // blk.mg))
    b.label("mo")
    # the A block: one copy in GSM for all DSPs, loaded by the leader once every DSP is done with the last
    b.bundle(ins("barrier"))
    b.bundle(ins("bnz", R_FOLLOWER, "mo_loaded"))
    b.bundle(ins("dma", CH_AG, d_ag, (R_ABLK, 0), (0, 0)))
    b.bundle(ins("dmawait", CH_AG))
    b.label("mo_loaded")
    b.bundle(ins("barrier"))
    b.bundle(ins("dma", CH_B, d_b, (R_BROW, 0), (0, plan.b_slots[0])))
    b.bundle(ins("dma", CH_CL, d_cl, (R_CROW, c_off(0)), (0, plan.c_slots[0])))
    b.bundle(a_tile(0))
    for s in range(n_c):
        ni, mi = divmod(s, m_tiles)
        if mi == 0:
            b.bundle(ins("dmawait", CH_B))
            if ni + 1 < n_tiles:
                b.bundle(ins("dma", CH_B, d_b, (R_BROW, (ni + 1) * blk.na * b_col_bytes),
                             (0, plan.b_slots[(ni + 1) % 2])))
        b.bundle(ins("dmawait", CH_CL))
        if s + 1 < n_c:
            b.bundle(ins("dmawait", CH_CS0 + (s + 1) % nb))        # that buffer's last store has left
            b.bundle(ins("dma", CH_CL, d_cl, (R_CROW, c_off(s + 1)), (0, plan.c_slots[(s + 1) % nb])))
        for ms in range(ms_tiles):
            j = s * ms_tiles + ms
            b.bundle(ins("dmawait", CH_AS))
            if j + 1 < n_a:
                b.bundle(a_tile(j + 1))
            for r6 in range(blk.ms // MR):
                for cc in range(blk.na // cols):
                    b.bundle(*_call(plan.sm_slots[j % 2] + r6 * MR * blk.ka * F64,
                                    plan.b_slots[ni % 2] + cc * b_call_bytes,
                                    plan.c_slots[s % nb] + ((ms * blk.ms + r6 * MR) * blk.na + cc * cols) * F64,
                                    "drv"))
        b.bundle(ins("dma", CH_CS0 + s % nb, d_cs, (0, plan.c_slots[s % nb]), (R_CROW, c_off(s))))
    for ch in range(nb):
        b.bundle(ins("dmawait", CH_CS0 + ch))
    b.bundle(ins("saddi", R_ABLK, R_ABLK, blk.mg * k * F64), ins("saddi", R_CROW, R_CROW, blk.mg * n * F64))
    b.bundle(ins("bdec", R_MO, "mo"))
    b.bundle(ins("saddi", R_ABLK, R_ABLK, blk.ka * F64 - plan.m * k * F64),
             ins("saddi", R_BROW, R_BROW, blk.ka * (F64 if nt else n * F64)))
    b.bundle(ins("bdec", R_KO, "ko"))
    b.bundle(ins("halt"))
    _driver_stub(b, "drv", "mk", platform)
    b.label("mk")
    if nt:
        b.extend(nt_microkernel(blk.ka, blk.ka * F64, blk.ka * F64, blk.na * F64, plan.scratch, platform))
        init = {d: {R_DOFF: d * ng * F64, R_DOFFB: d * ng * k * F64, R_FOLLOWER: int(d > 0)}
                for d in range(platform.dsps)}
    else:
        b.extend(nn_microkernel(blk.ka, blk.ka * F64, blk.na * F64, platform))
        init = {d: {R_DOFF: d * ng * F64, R_FOLLOWER: int(d > 0)} for d in range(platform.dsps)}
    return b.assemble(), {}, init


def _driver_stub(b: ProgramBuilder, label: str, target: str, platform: Platform) -> None:
    """``label``: DRIVER_CYCLES_PER_CALL cycles of the driver's scalar work, the branch included, then on
    to ``target`` (whose ``ret`` returns to the caller of ``label``)."""
    pad = DRIVER_CYCLES_PER_CALL - 1 - platform.latencies.branch_delay
    if pad < 0:
        raise PlatformError(f"FP64 GEMM driver: branch_delay {platform.latencies.branch_delay} exceeds the "
                            f"driver's {DRIVER_CYCLES_PER_CALL} cycles per call")
    b.label(label)
    for _ in range(pad):
        b.bundle(ins("saddi", R_SPIN, R_SPIN, 1))
    b.bundle(ins("br", target))


def build_nn(m: int, k: int, n: int, blk: NNBlocking, platform: Platform, nt: bool = False
             ) -> tuple[NNPlan, Program, dict[int, dict[int, int]]]:
    """The NN (or NT) GEMM over all of ``platform``'s DSPs: DSP d computes columns [d N_G, (d + 1) N_G)
    of C, N_G = N / DSPs (the paper's multi-core split; one DSP is the single-core GEMM)."""
    plan = plan_nn(m, k, n, blk, platform, nt)
    if n % platform.dsps or (n // platform.dsps) % blk.na:
        raise MtemuError(f"FP64 {'NT' if nt else 'NN'} GEMM: N = {n} does not split into {platform.dsps} DSPs' "
                         f"column blocks of whole N_A = {blk.na} tiles")
    program, _d, init = cached_program("gemm_fp64_nt" if nt else "gemm_fp64", (m, k, n), blk, platform,
                                       lambda: _assemble_nn(plan, platform))
    return plan, program, init


def _cores(platform: Platform, cores: int) -> Platform:
    (cores,) = positive_ints("FP64 GEMM cores", MtemuError, cores=cores)
    if cores > platform.dsps:
        raise MtemuError(f"FP64 GEMM: {cores} cores asked, platform {platform.name!r} has {platform.dsps} DSPs")
    return platform.with_overrides(dsps=cores)


def nn_gemm_timing(m: int, k: int, n: int, blk: NNBlocking, platform: Platform, cores: int = 1,
                   nt: bool = False) -> Fp64Result:
    """The NN (``nt``: NT) GEMM's timing run on the first ``cores`` DSPs (sharing the cluster's DDR and GSM)."""
    plat = _cores(platform, cores)
    plan, program, init = build_nn(m, k, n, blk, plat, nt)
    stats = Cluster(plat, ddr_bytes=plan.ddr_bytes, functional=False).run([program], init_sregs=init)
    return _result("nt-gemm" if nt else "nn-gemm", (m, k, n), m * k * n, stats, plat)


def nt_gemm_timing(m: int, k: int, n: int, blk: NNBlocking, platform: Platform, cores: int = 1) -> Fp64Result:
    """The NT GEMM's timing run (C = A B^T + C) on the first ``cores`` DSPs."""
    return nn_gemm_timing(m, k, n, blk, platform, cores, nt=True)


def run_nn(a: np.ndarray, b: np.ndarray, c: np.ndarray, blk: NNBlocking, platform: Platform,
           cores: int = 1, nt: bool = False) -> np.ndarray:
    """Functional run: C + A B in FP64 (each k-step's product rounded, then its sum); ``nt``: ``b`` is
    B^T (N x K) and the result C + A B^T with the NT micro-kernel's order (:func:`nt_reference`)."""
    plat = _cores(platform, cores)
    m, k = a.shape
    n = b.shape[0] if nt else b.shape[1]
    plan, program, init = build_nn(m, k, n, blk, plat, nt)
    cl = Cluster(plat, ddr_bytes=plan.ddr_bytes)
    for addr, x in ((plan.a_addr, a), (plan.b_addr, b), (plan.c_addr, c)):
        cl.write_ddr_u16(addr, np.ascontiguousarray(x, np.float64).view(np.uint16))
    cl.run([program], init_sregs=init)
    return cl.read_ddr_u16(plan.c_addr, m * n * 4).view(np.float64).reshape(m, n)


def nt_reference(a: np.ndarray, bt: np.ndarray, c: np.ndarray, ka: int) -> np.ndarray:
    """The NT GEMM's arithmetic in NumPy: per K_A-block of k in order, C += that block's micro-kernel sums
    (:func:`nt_micro_reference`)."""
    out = np.array(c, np.float64)
    for k0 in range(0, a.shape[1], ka):
        out = nt_micro_reference(a[:, k0:k0 + ka], bt[:, k0:k0 + ka], out)
    return out


def nn_reference(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The emulated kernel's arithmetic in NumPy: k in order, each product rounded, then added."""
    out = np.array(c, np.float64)
    for kk in range(a.shape[1]):
        out = out + a[:, kk:kk + 1] * b[kk:kk + 1, :]
    return out


# ------------------------------------------------------------------------------------------
# the registry of the family's FP64 kernels
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fp64Kernel:
    name: str
    description: str
    timing: Callable[..., Fp64Result]


FP64_KERNELS: dict[str, Fp64Kernel] = {
    "nn-micro": Fp64Kernel("nn-micro", "NN micro-kernel 6 x K_A x lanes (A broadcast from SM; B, C in AM)",
                           nn_micro_timing),
    "nn-gemm": Fp64Kernel("nn-gemm", "NN GEMM on 1..DSPs cores: the three-level pipeline with triple-buffered C, "
                          "N split over the cores, one A block in GSM", nn_gemm_timing),
    "nt-micro": Fp64Kernel("nt-micro", "NT micro-kernel 6 x K_A x 8 (A, B^T in AM; C in SM; vector reduction tail)",
                           nt_micro_timing),
    "nt-gemm": Fp64Kernel("nt-gemm", "NT GEMM (C = A B^T + C) on 1..DSPs cores: the NN loop nest with A and B^T "
                          "tiles in AM, C tiles in SM", nt_gemm_timing),
}

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


# Section V-B's blockings for K_A = 128, 256, 512
PAPER_NN_BLOCKINGS = {128: NNBlocking(128, 192, 24, 72, 6048), 256: NNBlocking(256, 96, 12, 144, 3024),
                      512: NNBlocking(512, 48, 6, 252, 1512)}


def _fits(memory: str, need: int, have: int, what: str) -> None:
    if need > have:
        raise CapacityError(f"{memory}: {what} needs {need} bytes, {need - have} more than the platform's {have}")


@dataclass(frozen=True)
class NNPlan:
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


def plan_nn(m: int, k: int, n: int, blk: NNBlocking, platform: Platform) -> NNPlan:
    """Check the shape and blocking against the platform (one line naming the memory and bytes missing)."""
    m, k, n = positive_ints("FP64 GEMM dimension", MtemuError, m=m, k=k, n=n)
    positive_ints("FP64 GEMM blocking", MtemuError, **asdict(blk))
    if blk.c_buffers not in (2, 3):
        raise MtemuError(f"FP64 NN GEMM: c_buffers must be 2 or 3, got {blk.c_buffers}")
    lanes = _need_fp64(platform, "FP64 NN GEMM")
    checks = (("M", m, "M_G", blk.mg), ("M_G", blk.mg, "M_A", blk.ma), ("M_A", blk.ma, "M_S", blk.ms),
              ("M_S", blk.ms, "the micro-kernel's 6 rows", MR), ("K", k, "K_A", blk.ka), ("N", n, "N_A", blk.na),
              ("N_A", blk.na, f"the {lanes} FP64 lanes", lanes))
    for big_name, big, small_name, small in checks:
        if big % small:
            raise MtemuError(f"FP64 NN GEMM: {big_name} = {big} is not a multiple of {small_name} = {small}")
    sm_tile = blk.ms * blk.ka * F64
    b_tile = blk.ka * blk.na * F64
    c_tile = blk.ma * blk.na * F64
    _fits("SM", 2 * sm_tile, platform.sm_bytes, f"2 A tiles of M_S x K_A = {blk.ms} x {blk.ka} FP64")
    nb = blk.c_buffers
    _fits("AM", 2 * b_tile + nb * c_tile, platform.am_bytes,
          f"2 B tiles of K_A x N_A = {blk.ka} x {blk.na} and {nb} C tiles of M_A x N_A = {blk.ma} x {blk.na} FP64")
    _fits("GSM", blk.mg * blk.ka * F64, platform.gsm_bytes, f"the A block of M_G x K_A = {blk.mg} x {blk.ka} FP64")
    a_addr, b_addr = 0, m * k * F64
    c_addr = b_addr + k * n * F64
    ddr = c_addr + m * n * F64
    _fits("DDR", ddr, platform.ddr_bytes, f"A, B and C ({m} x {k}, {k} x {n}, {m} x {n} FP64)")
    return NNPlan(m, k, n, blk, a_addr, b_addr, c_addr, ddr, (0, sm_tile), (0, b_tile),
                  tuple(2 * b_tile + i * c_tile for i in range(nb)))


def _assemble_nn(plan: NNPlan, platform: Platform) -> tuple[Program, dict, dict]:
    blk, n, k = plan.blk, plan.n, plan.k
    nb = blk.c_buffers
    lanes = platform.fp64_lanes
    ng = n // platform.dsps                       # each DSP's columns
    b = ProgramBuilder(platform)
    d_ag = b.descriptor("DDR", "GSM", blk.mg, blk.ka * F64, k * F64, blk.ka * F64, name="a_block")
    d_b = b.descriptor("DDR", "AM", blk.ka, blk.na * F64, n * F64, blk.na * F64, name="b_tile")
    d_cl = b.descriptor("DDR", "AM", blk.ma, blk.na * F64, n * F64, blk.na * F64, name="c_load")
    d_cs = b.descriptor("AM", "DDR", blk.ma, blk.na * F64, blk.na * F64, n * F64, name="c_store")
    d_as = b.descriptor("GSM", "SM", 1, blk.ms * blk.ka * F64, 0, 0, name="a_tile")
    m_tiles, n_tiles, ms_tiles = blk.mg // blk.ma, ng // blk.na, blk.ma // blk.ms
    n_c = m_tiles * n_tiles                       # C tiles per block, ni outer, mi inner
    n_a = n_c * ms_tiles                          # A tiles per block

    def c_off(s: int) -> int:
        ni, mi = divmod(s, m_tiles)
        return mi * blk.ma * n * F64 + ni * blk.na * F64

    def a_tile(j: int) -> Instr:
        mi, ms = (j // ms_tiles) % m_tiles, j % ms_tiles
        return ins("dma", CH_AS, d_as, (0, (mi * blk.ma + ms * blk.ms) * blk.ka * F64), (0, plan.sm_slots[j % 2]))

    b.bundle(ins("saddi", R_BROW, R_DOFF, plan.b_addr), ins("smovi", R_ABLK, plan.a_addr),
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
                b.bundle(ins("dma", CH_B, d_b, (R_BROW, (ni + 1) * blk.na * F64), (0, plan.b_slots[(ni + 1) % 2])))
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
                for c48 in range(blk.na // lanes):
                    b.bundle(*_call(plan.sm_slots[j % 2] + r6 * MR * blk.ka * F64,
                                    plan.b_slots[ni % 2] + c48 * lanes * F64,
                                    plan.c_slots[s % nb] + ((ms * blk.ms + r6 * MR) * blk.na + c48 * lanes) * F64,
                                    "drv"))
        b.bundle(ins("dma", CH_CS0 + s % nb, d_cs, (0, plan.c_slots[s % nb]), (R_CROW, c_off(s))))
    for ch in range(nb):
        b.bundle(ins("dmawait", CH_CS0 + ch))
    b.bundle(ins("saddi", R_ABLK, R_ABLK, blk.mg * k * F64), ins("saddi", R_CROW, R_CROW, blk.mg * n * F64))
    b.bundle(ins("bdec", R_MO, "mo"))
    b.bundle(ins("saddi", R_ABLK, R_ABLK, blk.ka * F64 - plan.m * k * F64),
             ins("saddi", R_BROW, R_BROW, blk.ka * n * F64))
    b.bundle(ins("bdec", R_KO, "ko"))
    b.bundle(ins("halt"))
    _driver_stub(b, "drv", "mk", platform)
    b.label("mk")
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


def build_nn(m: int, k: int, n: int, blk: NNBlocking, platform: Platform
             ) -> tuple[NNPlan, Program, dict[int, dict[int, int]]]:
    """The NN GEMM over all of ``platform``'s DSPs: DSP d computes columns [d N_G, (d + 1) N_G) of C,
    N_G = N / DSPs (the paper's multi-core split; one DSP is the single-core GEMM)."""
    plan = plan_nn(m, k, n, blk, platform)
    if n % platform.dsps or (n // platform.dsps) % blk.na:
        raise MtemuError(f"FP64 NN GEMM: N = {n} does not split into {platform.dsps} DSPs' column blocks of "
                         f"whole N_A = {blk.na} tiles")
    program, _d, init = cached_program("gemm_fp64", (m, k, n), blk, platform, lambda: _assemble_nn(plan, platform))
    return plan, program, init


def _cores(platform: Platform, cores: int) -> Platform:
    (cores,) = positive_ints("FP64 GEMM cores", MtemuError, cores=cores)
    if cores > platform.dsps:
        raise MtemuError(f"FP64 NN GEMM: {cores} cores asked, platform {platform.name!r} has {platform.dsps} DSPs")
    return platform.with_overrides(dsps=cores)


def nn_gemm_timing(m: int, k: int, n: int, blk: NNBlocking, platform: Platform, cores: int = 1) -> Fp64Result:
    """The NN GEMM's timing run on the first ``cores`` DSPs (sharing the cluster's DDR and GSM)."""
    plat = _cores(platform, cores)
    plan, program, init = build_nn(m, k, n, blk, plat)
    stats = Cluster(plat, ddr_bytes=plan.ddr_bytes, functional=False).run([program], init_sregs=init)
    return _result("nn-gemm", (m, k, n), m * k * n, stats, plat)


def run_nn(a: np.ndarray, b: np.ndarray, c: np.ndarray, blk: NNBlocking, platform: Platform,
           cores: int = 1) -> np.ndarray:
    """Functional run: C + A B in FP64 (each k-step's product rounded, then its sum)."""
    plat = _cores(platform, cores)
    m, k = a.shape
    n = b.shape[1]
    plan, program, init = build_nn(m, k, n, blk, plat)
    cl = Cluster(plat, ddr_bytes=plan.ddr_bytes)
    for addr, x in ((plan.a_addr, a), (plan.b_addr, b), (plan.c_addr, c)):
        cl.write_ddr_u16(addr, np.ascontiguousarray(x, np.float64).view(np.uint16))
    cl.run([program], init_sregs=init)
    return cl.read_ddr_u16(plan.c_addr, m * n * 4).view(np.float64).reshape(m, n)


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
}

"""What every opcode does, stated once in plain Python over plain state.

This is the functional meaning of the instruction set (:mod:`mtemu.isa`): one function per opcode
(:data:`EXECUTE`), over a :class:`ClusterState` of NumPy arrays. Timing (cycles, stalls, DMA
bandwidth, which DSP runs when) is the machine's (:mod:`mtemu.machine`), not stated here. The
jitted machine and its speed paths (:mod:`mtemu.fast.runs`, :mod:`mtemu.fast.queues`,
:mod:`mtemu.fast.fused`, :mod:`mtemu.dma`) compute the same bits;
``tests/test_semantics.py`` runs random programs on both.

The rules every opcode follows:

* A bundle's slots execute in unit order (``isa.UNITS``), each writing its result at issue; a slot
  reads what the units before it in the same bundle wrote. (The assembler refuses programs that read
  a register before its latency has elapsed, so for accepted programs this equals the exposed
  pipeline.) The next bundle is ``pc + 1`` unless a control op names another.
* Scalar registers are int64 and wrap on overflow. ``s0`` reads 0 because nothing writes it: the
  assembler refuses every scalar destination ``s0`` and the machine refuses raw code whose named
  destination (``OpSpec.names_scalar_dest``) is ``s0``; ``init_sregs`` cannot set it.
* Vector registers hold ``lanes`` FP32 values. FP16 data are uint16 bit patterns; widening is exact
  and narrowing rounds to nearest, ties to even (:mod:`mtemu.fp16`). The FP64 ops (``OpSpec.fp64``)
  work on a separate FP64 register file of the same register count, ``fp64_lanes`` lanes each
  (``DspState.vregs64``); scalar registers carry FP64 values as their 64 bits.
* Addresses are ``s[r] + imm`` (int64, wrapping) in bytes. An access outside its memory, or not
  aligned to its element (2 bytes for FP16 and SM, 4 for FP32, 8 for FP64), is a :class:`MachineError`.
* SM and AM are private to each DSP, GSM and DDR shared. DMA moves its data at issue (``dmawait``
  only waits, which is timing); there is no call stack (``call`` writes the link register).
"""
from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np

from . import isa
from .errors import MachineError
from .fp16 import f16_to_f32_array, f32_to_f16_array

_WRAP = 1 << 64


def wrap64(x: int) -> int:
    """``x`` as an int64 register holds it (two's complement wrap-around)."""
    return (x + (1 << 63)) % _WRAP - (1 << 63)


# ------------------------------------------------------------------------------------------
# state
# ------------------------------------------------------------------------------------------
@dataclass
class DspState:
    """One DSP: registers, its private memories, where it is. Arrays may be views into a machine's."""

    sregs: np.ndarray              # int64 (scalar_registers,)
    vregs: np.ndarray              # float32 (vector_registers, lanes)
    sm: np.ndarray                 # uint8 (sm_bytes,)
    am: np.ndarray                 # uint8 (am_bytes,)
    pc: int = 0                    # program-relative bundle index
    halted: bool = False
    at_barrier: bool = False       # waiting at the barrier of bundle ``pc``
    vregs64: np.ndarray | None = None   # float64 (vector_registers, fp64_lanes): the FP64 ops' registers


class Transfer(NamedTuple):
    """A DMA as issued (its data moved then): DSP, channel, descriptor row, source and destination address."""

    dsp: int
    channel: int
    descriptor: tuple[int, ...]
    src: int
    dst: int


@dataclass
class ClusterState:
    """The DSPs, the shared memories and each DSP's DMA descriptor table (rows of ``isa.DESC_FIELDS``)."""

    dsps: list[DspState]
    gsm: np.ndarray                # uint8
    ddr: np.ndarray                # uint8
    descriptors: list[np.ndarray] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)    # the DMA queue, in issue order
    fma_units: int = 1             # the platform's FMA units (the units of vlddg's gather)

    @classmethod
    def new(cls, platform, ddr_bytes: int = 0) -> ClusterState:
        """Zeroed state for ``platform`` (a :class:`~mtemu.platform.Platform`) with ``ddr_bytes`` of DDR
        (rounded up to 64 bytes, as the machine sizes it)."""
        p = platform
        dsps = [DspState(np.zeros(p.scalar_registers, np.int64),
                         np.zeros((p.vector_registers, p.vector_lanes), np.float32),
                         np.zeros(p.sm_bytes, np.uint8), np.zeros(p.am_bytes, np.uint8),
                         vregs64=np.zeros((p.vector_registers, p.fp64_lanes), np.float64)) for _ in range(p.dsps)]
        return cls(dsps, np.zeros(p.gsm_bytes, np.uint8), np.zeros((ddr_bytes + 63) // 64 * 64, np.uint8),
                   fma_units=p.fma_units)

    @property
    def lanes(self) -> int:
        return int(self.dsps[0].vregs.shape[1])

    def memory(self, space: int, dsp: int) -> np.ndarray:
        """The bytes of memory space ``space`` (``isa.SP_*``) as DSP ``dsp`` sees them."""
        if space == isa.SP_SM:
            return self.dsps[dsp].sm
        if space == isa.SP_AM:
            return self.dsps[dsp].am
        return self.gsm if space == isa.SP_GSM else self.ddr


class Instr(NamedTuple):
    """One encoded slot: ``isa.FIELDS`` as Python ints."""

    op: int
    r0: int
    r1: int
    r2: int
    r3: int
    imm0: int
    imm1: int


# ------------------------------------------------------------------------------------------
# memory access
# ------------------------------------------------------------------------------------------
def _checked(mem: np.ndarray, space: int, a: int, size: int, align: int) -> np.ndarray:
    """The ``size`` bytes at ``a``, after the machine's checks (range first, then alignment)."""
    if a < 0 or a > mem.size - size:
        raise MachineError(f"access of {size} bytes at {isa.SPACES[space]} address {a} is outside the memory")
    if a % align:
        raise MachineError(f"unaligned {isa.SPACES[space]} address {a} (needs {align}-byte alignment)")
    return mem[a:a + size]


def _operand(c: ClusterState, d: int, spec: isa.OpSpec, i: Instr) -> np.ndarray:
    """The bytes an SM/AM load or store addresses: ``s[r1] + imm0``, one element per lane for vector data."""
    s = c.dsps[d]
    lanes = c.dsps[d].vregs64.shape[1] if spec.fp64 else c.lanes
    size = spec.access_bytes * (lanes if spec.vector else 1)
    mem = s.sm if spec.space == isa.SP_SM else s.am
    return _checked(mem, spec.space, wrap64(int(s.sregs[i.r1]) + i.imm0), size, spec.access_bytes)


def _widen(bits) -> np.ndarray:
    return f16_to_f32_array(np.ascontiguousarray(bits, dtype=np.uint16))


# The machine calls the C library's expf/logf lane by lane (Numba lowers np.exp on float32 to it);
# NumPy's own float32 exp and log round differently.
_LIBM = ctypes.CDLL(ctypes.util.find_library("m") or None)
for _name in ("expf", "logf"):
    getattr(_LIBM, _name).restype = ctypes.c_float
    getattr(_LIBM, _name).argtypes = [ctypes.c_float]


def _libm(name: str, x: np.ndarray) -> np.ndarray:
    f = getattr(_LIBM, name)
    return np.array([f(float(v)) for v in x], np.float32)


# ------------------------------------------------------------------------------------------
# the opcodes (each: state, DSP, instruction -> the next PC if it transfers control, else None)
# ------------------------------------------------------------------------------------------
def vfma(c: ClusterState, d: int, i: Instr) -> None:
    """``vd += va * vb`` per lane in FP32: the product rounds, then the sum (no fused multiply-add;
    products of FP16 values are exact in FP32, so for them the two agree)."""
    v = c.dsps[d].vregs
    with np.errstate(all="ignore"):
        v[i.r0] = v[i.r0] + v[i.r1] * v[i.r2]


def svbcast(c: ClusterState, d: int, i: Instr) -> None:
    """Every lane of ``vd`` = the FP16 value whose bits are the low 16 bits of ``sa``, widened exactly."""
    s = c.dsps[d]
    s.vregs[i.r0] = _widen([int(s.sregs[i.r1]) & 0xFFFF])[0]


def svbcastw(c: ClusterState, d: int, i: Instr) -> None:
    """Every lane of ``vd`` = the FP32 value whose bits are the low 32 bits of ``sa``."""
    s = c.dsps[d]
    s.vregs[i.r0] = np.array([int(s.sregs[i.r1]) & 0xFFFFFFFF], np.uint32).view(np.float32)[0]


def saddi(c: ClusterState, d: int, i: Instr) -> None:
    """``sd = sa + imm`` (int64, wrapping)."""
    s = c.dsps[d].sregs
    s[i.r0] = wrap64(int(s[i.r1]) + i.imm0)


def sadd(c: ClusterState, d: int, i: Instr) -> None:
    """``sd = sa + sb`` (int64, wrapping)."""
    s = c.dsps[d].sregs
    s[i.r0] = wrap64(int(s[i.r1]) + int(s[i.r2]))


def smovi(c: ClusterState, d: int, i: Instr) -> None:
    """``sd = imm``."""
    c.dsps[d].sregs[i.r0] = i.imm0


def sldh(c: ClusterState, d: int, i: Instr) -> None:
    """``sd`` = the half-word at SM ``sa + imm``, zero-extended (FP16 bits stay bits)."""
    c.dsps[d].sregs[i.r0] = int(_operand(c, d, isa.OP_BY_CODE[i.op], i).view(np.uint16)[0])


def ssth(c: ClusterState, d: int, i: Instr) -> None:
    """The half-word at SM ``sa + imm`` = the low 16 bits of ``sv``."""
    _operand(c, d, isa.OP_BY_CODE[i.op], i).view(np.uint16)[0] = int(c.dsps[d].sregs[i.r2]) & 0xFFFF


def vldh(c: ClusterState, d: int, i: Instr) -> None:
    """Lane k of ``vd`` = the FP16 value at AM ``sa + imm + 2k``, widened exactly."""
    c.dsps[d].vregs[i.r0] = _widen(_operand(c, d, isa.OP_BY_CODE[i.op], i).view(np.uint16))


def vldw(c: ClusterState, d: int, i: Instr) -> None:
    """Lane k of ``vd`` = the FP32 value at AM ``sa + imm + 4k`` (bits copied)."""
    c.dsps[d].vregs[i.r0] = _operand(c, d, isa.OP_BY_CODE[i.op], i).view(np.float32)


def vstw(c: ClusterState, d: int, i: Instr) -> None:
    """The FP32 value at AM ``sa + imm + 4k`` = lane k of ``vs`` (bits copied)."""
    _operand(c, d, isa.OP_BY_CODE[i.op], i).view(np.float32)[:] = c.dsps[d].vregs[i.r2]


def vsth(c: ClusterState, d: int, i: Instr) -> None:
    """The FP16 value at AM ``sa + imm + 2k`` = lane k of ``vs`` rounded to FP16 (nearest, ties to even)."""
    _operand(c, d, isa.OP_BY_CODE[i.op], i).view(np.uint16)[:] = f32_to_f16_array(c.dsps[d].vregs[i.r2].copy())


def vexp(c: ClusterState, d: int, i: Instr) -> None:
    """``vd = exp(va)`` per lane, as the host C library's ``expf`` rounds it."""
    v = c.dsps[d].vregs
    v[i.r0] = _libm("expf", v[i.r1])


def vlog(c: ClusterState, d: int, i: Instr) -> None:
    """``vd = log(va)`` per lane, as the host C library's ``logf`` rounds it (log 0 = -inf, log x<0 NaN)."""
    v = c.dsps[d].vregs
    v[i.r0] = _libm("logf", v[i.r1])


def vmax(c: ClusterState, d: int, i: Instr) -> None:
    """``vd = max(va, vb)`` per lane: ``va`` if ``va > vb`` or ``va`` is NaN, else ``vb`` (so a NaN in
    either is NaN, and max(+0, -0) is ``vb``)."""
    v = c.dsps[d].vregs
    a, b = v[i.r1].copy(), v[i.r2].copy()
    v[i.r0] = np.where((a > b) | (a != a), a, b)


def sldd(c: ClusterState, d: int, i: Instr) -> None:
    """``sd`` = the 64-bit word at SM ``sa + imm`` (an FP64 value's bits)."""
    c.dsps[d].sregs[i.r0] = _operand(c, d, isa.OP_BY_CODE[i.op], i).view(np.int64)[0]


def svbcastd(c: ClusterState, d: int, i: Instr) -> None:
    """Every FP64 lane of ``vd`` = the FP64 value whose bits are ``sa``."""
    s = c.dsps[d]
    s.vregs64[i.r0] = np.array([int(s.sregs[i.r1])], np.int64).view(np.float64)[0]


def vldd(c: ClusterState, d: int, i: Instr) -> None:
    """FP64 lane k of ``vd`` = the FP64 value at AM ``sa + imm + 8k`` (bits copied)."""
    c.dsps[d].vregs64[i.r0] = _operand(c, d, isa.OP_BY_CODE[i.op], i).view(np.float64)


def vstd(c: ClusterState, d: int, i: Instr) -> None:
    """The FP64 value at AM ``sa + imm + 8k`` = FP64 lane k of ``vs`` (bits copied)."""
    _operand(c, d, isa.OP_BY_CODE[i.op], i).view(np.float64)[:] = c.dsps[d].vregs64[i.r2]


def vfmad(c: ClusterState, d: int, i: Instr) -> None:
    """``vd += va * vb`` per FP64 lane: the product rounds to FP64, then the sum (as :func:`vfma`)."""
    v = c.dsps[d].vregs64
    with np.errstate(all="ignore"):
        v[i.r0] = v[i.r0] + v[i.r1] * v[i.r2]


def vlddg(c: ClusterState, d: int, i: Instr) -> None:
    """Gather: with fma_units units of ``w`` = fp64_lanes // fma_units lanes, FP64 lane ``u w + k`` of ``vd``
    = the FP64 value at AM ``sa + imm + u sb + 8k`` (``sb`` = 0: one vector for every unit); lanes past
    fma_units x ``w`` keep their value."""
    s = c.dsps[d]
    units = c.fma_units
    w = s.vregs64.shape[1] // units
    a, stride = wrap64(int(s.sregs[i.r1]) + i.imm0), int(s.sregs[i.r2])
    for u in range(units):
        unit = _checked(s.am, isa.SP_AM, wrap64(a + u * stride), 8 * w, 8)
        s.vregs64[i.r0, u * w:(u + 1) * w] = unit.view(np.float64)


def vlddm4(c: ClusterState, d: int, i: Instr) -> None:
    """Modulo-4 load: FP64 lane k of ``vd`` = the FP64 value at AM ``sa + imm + 32k`` (every fourth)."""
    s = c.dsps[d]
    lanes = s.vregs64.shape[1]
    span = _checked(s.am, isa.SP_AM, wrap64(int(s.sregs[i.r1]) + i.imm0), 32 * (lanes - 1) + 8, 8)
    s.vregs64[i.r0] = span.view(np.float64)[::4]


def smvd(c: ClusterState, d: int, i: Instr) -> None:
    """``sd`` = the bits of FP64 lane ``imm`` of ``va`` (through the scalar-vector register)."""
    s = c.dsps[d]
    if not 0 <= i.imm0 < s.vregs64.shape[1]:
        raise MachineError(f"smvd lane {i.imm0} outside the {s.vregs64.shape[1]} FP64 lanes")
    s.sregs[i.r0] = s.vregs64[i.r1, i.imm0:i.imm0 + 1].view(np.int64)[0]


def sfaddd(c: ClusterState, d: int, i: Instr) -> None:
    """``sd`` = ``sa + sb`` as FP64 values (their bits in scalar registers), rounded to nearest."""
    s = c.dsps[d]
    x = np.array([int(s.sregs[i.r1]), int(s.sregs[i.r2])], np.int64).view(np.float64)
    with np.errstate(all="ignore"):
        s.sregs[i.r0] = np.array([x[0] + x[1]], np.float64).view(np.int64)[0]


def sstd(c: ClusterState, d: int, i: Instr) -> None:
    """The 64-bit word at SM ``sa + imm`` = ``sv``."""
    _operand(c, d, isa.OP_BY_CODE[i.op], i).view(np.int64)[0] = int(c.dsps[d].sregs[i.r2])


def _move(src: np.ndarray, dst: np.ndarray, mode: int, sa: int, da: int, rows: int, row_bytes: int,
          src_stride: int, dst_stride: int) -> None:
    """Row r of ``row_bytes`` from ``src[sa + r * src_stride]`` to ``dst[da + r * dst_stride]``, rows in
    order and elements in order (which decides the result where source and destination overlap): copied
    as half-words, or for ``DMA_REDUCE_ADD`` added as FP32 words (dst += src)."""
    width, dtype = (4, np.float32) if mode == isa.DMA_REDUCE_ADD else (2, np.uint16)
    for r in range(rows):
        s = src[sa + r * src_stride:sa + r * src_stride + row_bytes].view(dtype)
        t = dst[da + r * dst_stride:da + r * dst_stride + row_bytes].view(dtype)
        with np.errstate(all="ignore"):
            if not np.may_share_memory(s, t):
                t[:] = t + s if mode == isa.DMA_REDUCE_ADD else s
                continue
            for k in range(row_bytes // width):
                t[k] = t[k] + s[k] if mode == isa.DMA_REDUCE_ADD else s[k]


def dma(c: ClusterState, d: int, i: Instr) -> None:
    """Transfer descriptor ``desc`` (rows, row bytes, strides, spaces, mode) from ``ss + imm0`` to
    ``sd + imm1`` on channel ``ch``. copy: the rows; broadcast: the rows into the same address of every
    DSP's SM or AM, DSP by DSP; reduce_add: FP32 words added into the destination. Both ends are checked
    over their whole extent ((rows - 1) * stride + row bytes; 4-byte alignment for reduce_add, else 2,
    of addresses and strides); an empty transfer (0 rows) checks and touches nothing."""
    s = c.dsps[d]
    desc = tuple(int(x) for x in c.descriptors[d][i.r1])
    src_sp, dst_sp, rows, row_bytes, sstr, dstr, mode = desc
    sa = wrap64(int(s.sregs[i.r2]) + i.imm0)
    da = wrap64(int(s.sregs[i.r3]) + i.imm1)
    if rows == 0:
        sa = da = 0
    sext = (rows - 1) * sstr + row_bytes if rows > 0 else 0
    dext = (rows - 1) * dstr + row_bytes if rows > 0 else 0
    align = 4 if mode == isa.DMA_REDUCE_ADD else 2
    src = c.memory(src_sp, d)
    _checked(src, src_sp, sa, sext, 1)
    _checked(c.memory(dst_sp, d), dst_sp, da, dext, 1)
    if sa % align or da % align or sstr % align or dstr % align:
        raise MachineError(f"unaligned {isa.SPACES[src_sp]} address {sa} (needs {align}-byte alignment)")
    c.transfers.append(Transfer(d, i.r0, desc, sa, da))
    if rows > 0:
        for target in (range(len(c.dsps)) if mode == isa.DMA_BROADCAST else (d,)):
            _move(src, c.memory(dst_sp, target), mode, sa, da, rows, row_bytes, sstr, dstr)


def dmawait(c: ClusterState, d: int, i: Instr) -> None:
    """Wait until channel ``ch`` is idle: timing only (every transfer's data moved when it issued)."""


def barrier(c: ClusterState, d: int, i: Instr) -> None:
    """Wait until every DSP reaches a barrier, then all continue after theirs (a DSP that halts while
    others wait is a deadlock)."""
    c.dsps[d].at_barrier = True


def br(c: ClusterState, d: int, i: Instr) -> int:
    """Jump to ``label`` (``imm0``, a program-relative PC)."""
    return i.imm0


def bnz(c: ClusterState, d: int, i: Instr) -> int | None:
    """Jump to ``label`` if ``sa != 0``."""
    return i.imm0 if int(c.dsps[d].sregs[i.r1]) != 0 else None


def bdec(c: ClusterState, d: int, i: Instr) -> int | None:
    """``sa -= 1`` (wrapping); then jump to ``label`` if ``sa != 0``."""
    s = c.dsps[d].sregs
    s[i.r1] = wrap64(int(s[i.r1]) - 1)
    return i.imm0 if int(s[i.r1]) != 0 else None


def call(c: ClusterState, d: int, i: Instr) -> int:
    """Link register (``r0``, the last scalar register) = the PC after this bundle; jump to ``label``."""
    c.dsps[d].sregs[i.r0] = c.dsps[d].pc + 1
    return i.imm0


def ret(c: ClusterState, d: int, i: Instr) -> int:
    """Jump to the PC in the link register (``r1``)."""
    return int(c.dsps[d].sregs[i.r1])


def halt(c: ClusterState, d: int, i: Instr) -> None:
    """The DSP stops."""
    c.dsps[d].halted = True


def nop(c: ClusterState, d: int, i: Instr) -> None:
    """Nothing (padding; ``imm0`` names the stall it counts as)."""


# opcode -> its statement; tests/test_semantics.py checks that every opcode of isa.OPS has one
EXECUTE: dict[int, Callable[[ClusterState, int, Instr], int | None]] = {
    op.code: globals()[op.name] for op in isa.OPS}


# ------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------
def execute(c: ClusterState, d: int, row) -> int | None:
    """Slot ``row`` (an encoded instruction) on DSP ``d``; the PC it transfers control to, if any."""
    i = Instr(*(int(x) for x in row))
    return None if i.op == 0 else EXECUTE[i.op](c, d, i)


def step(c: ClusterState, d: int, bundle: np.ndarray) -> None:
    """Bundle ``bundle`` (units x fields) on DSP ``d`` at its PC: every slot in unit order, then the PC
    moves on (a barrier leaves it on the barrier until :func:`run_reference` releases it)."""
    s = c.dsps[d]
    nxt = s.pc + 1
    for u in range(bundle.shape[0]):
        try:
            target = execute(c, d, bundle[u])
        except MachineError as exc:
            raise MachineError(f"DSP {d}, PC {s.pc}, unit {isa.UNITS[u]}: {exc}") from None
        if target is not None:
            nxt = target
    if not s.at_barrier:
        s.pc = nxt


def run_reference(c: ClusterState, programs: Sequence, dsp_program: Sequence[int] | None = None,
                  init_sregs: dict[int, dict[int, int]] | None = None,
                  dsp_descriptors: dict[int, np.ndarray] | None = None, max_bundles: int = 10 ** 6) -> int:
    """Run ``programs[dsp_program[d]]`` (assembled programs: ``code`` and ``descriptors``) on DSP d of
    ``c`` until every DSP halts, as :meth:`mtemu.machine.Cluster.run` does functionally; returns the
    bundles executed. Scalar registers start at 0 (then ``init_sregs``), vector registers and memories
    as ``c`` holds them. DSPs run in index order, each until it halts or reaches a barrier: so a program
    whose data depend on the order in which DSPs touch shared memory between barriers (a race) may end
    differently on the machine, whose order is its timing's."""
    n = len(c.dsps)
    dsp_program = list(dsp_program) if dsp_program is not None else [0] * n
    c.descriptors = [np.asarray((dsp_descriptors or {}).get(d, programs[k].descriptors), np.int64)
                     for d, k in enumerate(dsp_program)]
    for d, s in enumerate(c.dsps):
        s.sregs[:] = 0
        for r, v in (init_sregs or {}).get(d, {}).items():
            s.sregs[r] = v
        s.pc, s.halted, s.at_barrier = 0, False, False
    bundles = 0
    while True:
        for d, s in enumerate(c.dsps):
            code = programs[dsp_program[d]].code
            while not (s.halted or s.at_barrier):
                if not 0 <= s.pc < code.shape[0]:
                    raise MachineError(f"DSP {d}, PC {s.pc}: PC left the program")
                if bundles >= max_bundles:
                    raise MachineError(f"DSP {d}, PC {s.pc}: more than {max_bundles} bundles (infinite loop?)")
                step(c, d, code[s.pc])
                bundles += 1
        waiting = [d for d, s in enumerate(c.dsps) if s.at_barrier]
        if not waiting:
            return bundles
        if len(waiting) < n:
            raise MachineError(f"deadlock: DSP(s) {waiting} wait at a barrier that halted DSPs will never reach")
        for s in c.dsps:
            s.at_barrier = False
            s.pc += 1


"""Instruction set of the emulated DSP: eight functional units issuing in one VLIW bundle.

The units are those of the paper's Table 1. A program is an int64 array of shape
(bundles, UNITS, FIELDS); slot u of a bundle holds the instruction for unit u, or opcode 0
(empty). Fields are ``[op, r0, r1, r2, r3, imm0, imm1]``; what each means is given by the
opcode's operand fields and syntax below.

Memory spaces: SM and AM are private to each DSP, GSM is shared by the cluster, DDR is
off-chip. Scalar loads/stores address SM, vector loads/stores address AM; DMA moves data
between any two spaces. Exposed pipeline: a result becomes readable ``latency`` cycles after
issue and the assembler rejects programs that read it earlier; the machine therefore writes
results at issue, which is equivalent for every accepted program.

This module is the one opcode table (:data:`OPS`): every other module derives its op sets from the
flags of :class:`OpSpec` (:func:`ops_where`, :func:`op_table`) and the ``OP_*`` numbers from the
table. What each opcode does is stated once in plain Python in :mod:`mtemu.semantics`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# --- units -------------------------------------------------------------------------------
UNITS = ("VMAC", "SMAC1", "SMAC2", "SLDST", "VLDST1", "VLDST2", "SIEU", "SBR")
VMAC, SMAC1, SMAC2, SLDST, VLDST1, VLDST2, SIEU, SBR = range(8)
N_UNITS = len(UNITS)

# --- fields -------------------------------------------------------------------------------
FIELDS = ("op", "r0", "r1", "r2", "r3", "imm0", "imm1")
F_OP, F_R0, F_R1, F_R2, F_R3, F_IMM0, F_IMM1 = range(7)
N_FIELDS = len(FIELDS)

# --- memory spaces ------------------------------------------------------------------------
SPACES = ("SM", "AM", "GSM", "DDR")
SP_SM, SP_AM, SP_GSM, SP_DDR = range(4)

# --- DMA descriptor table columns (static part of a transfer; addresses come from registers)
DESC_FIELDS = ("src_space", "dst_space", "rows", "row_bytes", "src_stride", "dst_stride", "mode")
D_SRC, D_DST, D_ROWS, D_ROWB, D_SSTR, D_DSTR, D_MODE = range(7)
N_DESC = len(DESC_FIELDS)
DMA_COPY, DMA_BROADCAST, DMA_REDUCE_ADD = range(3)
# Bounds that keep the machine's address arithmetic inside int64 whatever a register holds:
# a descriptor spans at most MAX_DESC_EXTENT bytes ((rows - 1) * stride + row_bytes) in at most
# MAX_DESC_ROWS rows, and an address operand's offset is at most MAX_ADDRESS_IMM in size.
MAX_DESC_ROWS = 1 << 31
MAX_DESC_EXTENT = 1 << 46
MAX_ADDRESS_IMM = 1 << 48
DMA_MODES = ("copy", "broadcast", "reduce_add")

# --- stall reasons (NOP padding and machine waits) ------------------------------------------
STALLS = ("latency", "branch", "dma_wait", "barrier")
ST_LATENCY, ST_BRANCH, ST_DMA, ST_BARRIER = range(4)

# Operand tokens of fields r0..r3 (OpSpec.fields): a kind, then how the op uses it
#   kind   s scalar register   v vector register   l the link register (a scalar register the
#          assembler fills in: the platform's last)   c DMA channel   d DMA descriptor (checked
#          against the descriptor table)   '' unused (must be 0)
#   use    no suffix: read   '=' written   '+' read and written (vfma's accumulator, bdec's counter)
_KINDS = {"s": "s", "v": "v", "l": "s", "c": "c", "d": "d"}


@dataclass(frozen=True)
class OpSpec:
    """One opcode: its encoding, operands, timing class and the properties the rest of mtemu derives
    its op sets from (:func:`ops_where`). ``tests/test_isa.py`` checks the flags against the operands."""

    code: int
    name: str
    units: tuple[int, ...]          # units that may execute it
    fields: tuple[str, str, str, str]   # operand token of r0..r3 (above)
    syntax: str                     # text form operand list, e.g. "vd, va, vb"
    latency: str | None             # Latencies field name for the written register
    space: int | None = None        # memory space an address operand must refer to
    access_bytes: int = 0           # bytes per element of its SM/AM access (vector ops: per lane)
    control: bool = False           # changes the PC or blocks (ends hazard tracking)
    has_target: bool = False        # imm0 is a branch target (a label: a program-relative PC)
    addresses_memory: bool = False  # reads a register + immediate address (the machine bounds the offset)
    touches_am: bool = False        # reads or writes vector registers or AM, or stores to SM: what the
    #                                 functional queue of deferred runs and DMAs holds (mtemu.fast.queues)
    is_plain: bool = False          # data-only: may be part of a straight-line run (mtemu.fast.runs); the
    #                                 op then has a case in blocks.run_plain
    libm: bool = False              # rounds as the host's C maths library (not in functional runs)
    is_mac: bool = False            # counted as a vector multiply-accumulate (RunStats.vfma)
    busy: bool = True               # occupies its unit (False: padding, counted as a stall)
    fp64: bool = False              # works on FP64 data (vector ops: the platform's fp64_lanes lanes of the
    #                                 FP64 register file); needs a platform with FP64 lanes

    @property
    def field_kinds(self) -> tuple[str, str, str, str]:
        """Register kind of r0..r3: s, v, c, d or '' (the link register is a scalar register)."""
        return tuple(_KINDS.get(f[:1], "") for f in self.fields)

    @property
    def writes(self) -> str:
        """Kinds of the registers written, in field order."""
        return "".join(_KINDS[f[0]] for f in self.fields if f[1:] in ("=", "+"))

    @property
    def reads(self) -> str:
        """Kinds of the registers read, in field order."""
        return "".join(_KINDS[f[0]] for f in self.fields if f and f[0] in "svl" and f[1:] != "=")

    @property
    def names_scalar_dest(self) -> bool:
        """r0 is a scalar register the program names as the destination (never s0)."""
        return self.fields[0] == "s="

    @property
    def vector(self) -> bool:
        """Uses a vector register."""
        return any(f[:1] == "v" for f in self.fields)

    def register_effects(self, row) -> tuple[list[tuple[str, int]], list[tuple[str, int]], str | None]:
        """(reads, writes, latency field) of encoded instruction ``row``: registers as (kind, number);
        reads in field order, read-and-written registers last."""
        regs = [(_KINDS.get(f[:1], ""), int(row[F_R0 + i]), f[1:]) for i, f in enumerate(self.fields)]
        reads = [(k, r) for k, r, use in regs if k in ("s", "v") and use == ""]
        reads += [(k, r) for k, r, use in regs if use == "+"]
        writes = [(k, r) for k, r, use in regs if use in ("=", "+")]
        return reads, writes, self.latency


# What each opcode does is stated in plain Python in mtemu.semantics (one function per opcode); the
# jitted machine (mtemu.machine._run) has a case per opcode that does the same.
OPS: tuple[OpSpec, ...] = (
    OpSpec(1, "vfma", (VMAC,), ("v+", "v", "v", ""), "vd, va, vb", "vmac",
           touches_am=True, is_plain=True, is_mac=True),
    OpSpec(2, "svbcast", (SMAC1, SMAC2), ("v=", "s", "", ""), "vd, sa", "broadcast", touches_am=True, is_plain=True),
    OpSpec(3, "saddi", (SMAC1, SMAC2, SIEU), ("s=", "s", "", ""), "sd, sa, imm", "scalar_alu"),
    OpSpec(4, "sadd", (SMAC1, SMAC2, SIEU), ("s=", "s", "s", ""), "sd, sa, sb", "scalar_alu"),
    OpSpec(5, "smovi", (SMAC1, SMAC2, SIEU), ("s=", "", "", ""), "sd, imm", "scalar_alu"),
    OpSpec(6, "sldh", (SLDST,), ("s=", "s", "", ""), "sd, [sa+imm]", "scalar_load", space=SP_SM, access_bytes=2,
           addresses_memory=True, is_plain=True),
    OpSpec(7, "ssth", (SLDST,), ("", "s", "s", ""), "[sa+imm], sv", None, space=SP_SM, access_bytes=2,
           addresses_memory=True, touches_am=True, is_plain=True),
    OpSpec(8, "vldh", (VLDST1, VLDST2), ("v=", "s", "", ""), "vd, [sa+imm]", "vector_load", space=SP_AM,
           access_bytes=2, addresses_memory=True, touches_am=True, is_plain=True),
    OpSpec(9, "vldw", (VLDST1, VLDST2), ("v=", "s", "", ""), "vd, [sa+imm]", "vector_load", space=SP_AM,
           access_bytes=4, addresses_memory=True, touches_am=True, is_plain=True),
    OpSpec(10, "vstw", (VLDST1, VLDST2), ("", "s", "v", ""), "[sa+imm], vs", None, space=SP_AM, access_bytes=4,
           addresses_memory=True, touches_am=True, is_plain=True),
    OpSpec(11, "vsth", (VLDST1, VLDST2), ("", "s", "v", ""), "[sa+imm], vs", None, space=SP_AM, access_bytes=2,
           addresses_memory=True, touches_am=True, is_plain=True),
    OpSpec(12, "dma", (SIEU,), ("c", "d", "s", "s"), "ch, desc, [ss+imm], [sd+imm]", None, addresses_memory=True),
    OpSpec(13, "dmawait", (SBR,), ("c", "", "", ""), "ch", None, control=True),
    OpSpec(14, "barrier", (SBR,), ("", "", "", ""), "", None, control=True),
    OpSpec(15, "br", (SBR,), ("", "", "", ""), "label", None, control=True, has_target=True),
    OpSpec(16, "bnz", (SBR,), ("", "s", "", ""), "sa, label", None, control=True, has_target=True),
    OpSpec(17, "bdec", (SBR,), ("", "s+", "", ""), "sa, label", "scalar_alu", control=True, has_target=True),
    OpSpec(18, "call", (SBR,), ("l=", "", "", ""), "label", "scalar_alu", control=True, has_target=True),
    OpSpec(19, "ret", (SBR,), ("", "l", "", ""), "", None, control=True),
    OpSpec(20, "halt", (SBR,), ("", "", "", ""), "", None, control=True),
    OpSpec(21, "nop", tuple(range(N_UNITS)), ("", "", "", ""), "reason", None, is_plain=True, busy=False),
    # FP32 scalar constants (softmax scale 1/sqrt(d)) for the attention kernels; same pipe as svbcast
    OpSpec(22, "svbcastw", (SMAC1, SMAC2), ("v=", "s", "", ""), "vd, sa", "broadcast", touches_am=True,
           is_plain=True),
    # softmax forward: one VMAC issue each, FMA latency (a stand-in for the vendor's vector math
    # routines; docs/CHOICES.md "mtemu attention kernels")
    OpSpec(23, "vexp", (VMAC,), ("v=", "v", "", ""), "vd, va", "vmac", touches_am=True, is_plain=True, libm=True),
    OpSpec(24, "vlog", (VMAC,), ("v=", "v", "", ""), "vd, va", "vmac", touches_am=True, is_plain=True, libm=True),
    OpSpec(25, "vmax", (VMAC,), ("v=", "v", "v", ""), "vd, va, vb", "vmac", touches_am=True, is_plain=True),
    # FP64 (the DSP family's double-precision GEMM, docs/DSP-FAMILY.md): a 64-bit scalar load, its
    # broadcast, vector load/store and multiply-accumulate over the FP64 lanes (functional mode runs
    # them bundle by bundle: mtemu.fast.runs leaves them out of functional runs)
    OpSpec(26, "sldd", (SLDST,), ("s=", "s", "", ""), "sd, [sa+imm]", "scalar_load", space=SP_SM, access_bytes=8,
           addresses_memory=True, is_plain=True, fp64=True),
    OpSpec(27, "svbcastd", (SMAC1, SMAC2), ("v=", "s", "", ""), "vd, sa", "broadcast", touches_am=True,
           is_plain=True, fp64=True),
    OpSpec(28, "vldd", (VLDST1, VLDST2), ("v=", "s", "", ""), "vd, [sa+imm]", "vector_load", space=SP_AM,
           access_bytes=8, addresses_memory=True, touches_am=True, is_plain=True, fp64=True),
    OpSpec(29, "vstd", (VLDST1, VLDST2), ("", "s", "v", ""), "[sa+imm], vs", None, space=SP_AM, access_bytes=8,
           addresses_memory=True, touches_am=True, is_plain=True, fp64=True),
    OpSpec(30, "vfmad", (VMAC,), ("v+", "v", "v", ""), "vd, va, vb", "vmac",
           touches_am=True, is_plain=True, is_mac=True, fp64=True),
    # FP64 for the NT micro-kernel (dot products reduced across lanes): a gather load of one hardware
    # vector per FMA unit (``sb`` bytes apart; sb = s0 repeats one vector for every unit), the modulo-4
    # load of the paper's VLDDWM4, the scalar-vector register's lane read (one port: SMAC1 only), a
    # scalar FP64 add (SMAC2 first, leaving SMAC1 to the lane reads) and a 64-bit scalar store (the loads
    # and the store join timing runs, which check an FP64 access's first element as for vldd)
    OpSpec(31, "vlddg", (VLDST1, VLDST2), ("v=", "s", "s", ""), "vd, [sa+imm], sb", "vector_load", space=SP_AM,
           access_bytes=8, addresses_memory=True, touches_am=True, is_plain=True, fp64=True),
    OpSpec(32, "vlddm4", (VLDST1, VLDST2), ("v=", "s", "", ""), "vd, [sa+imm]", "vector_load", space=SP_AM,
           access_bytes=8, addresses_memory=True, touches_am=True, is_plain=True, fp64=True),
    OpSpec(33, "smvd", (SMAC1,), ("s=", "v", "", ""), "sd, va, imm", "broadcast", touches_am=True, fp64=True),
    OpSpec(34, "sfaddd", (SMAC2, SMAC1), ("s=", "s", "s", ""), "sd, sa, sb", "vmac", fp64=True),
    OpSpec(35, "sstd", (SLDST,), ("", "s", "s", ""), "[sa+imm], sv", None, space=SP_SM, access_bytes=8,
           addresses_memory=True, touches_am=True, is_plain=True, fp64=True),
)

OP_BY_NAME = {op.name: op for op in OPS}
OP_BY_CODE = {op.code: op for op in OPS}
N_OPCODES = max(op.code for op in OPS) + 1
# Register kind of fields r0..r3 per opcode (OpSpec.field_kinds), by name.
FIELD_KINDS = {op.name: op.field_kinds for op in OPS}

# Opcode numbers as plain ints for the jitted machine: OP_VFMA, OP_SVBCAST, ... (OP_ + name in upper case)
globals().update({f"OP_{op.name.upper()}": op.code for op in OPS})


def _matching(predicates, flags) -> list[OpSpec]:
    for key in flags:
        if not hasattr(OPS[0], key):
            raise AttributeError(f"OpSpec has no field or property {key!r}")
    return [op for op in OPS if all(getattr(op, k) == v for k, v in flags.items()) and all(p(op) for p in predicates)]


def ops_where(*predicates, **flags) -> np.ndarray:
    """Codes (int64, ascending) of the opcodes whose fields or properties equal ``flags`` and that pass
    every predicate (a function of an OpSpec), e.g. ``ops_where(touches_am=True)``."""
    return np.array(sorted(op.code for op in _matching(predicates, flags)), dtype=np.int64)


def op_table(*predicates, **flags) -> np.ndarray:
    """Membership table over opcodes (N_OPCODES booleans; opcode 0, the empty slot, False) of
    :func:`ops_where`'s set: indexing it with a code array is a fast ``np.isin``."""
    table = np.zeros(N_OPCODES, np.bool_)
    table[ops_where(*predicates, **flags)] = True
    return table


ZERO_REG = 0      # scalar register 0 always reads 0 and may not be written
LINK_REG = -1     # CALL writes the last scalar register (index resolved per platform)

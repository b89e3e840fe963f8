"""Instruction set of the emulated DSP: eight functional units issuing in one VLIW bundle.

The units are those of the paper's Table 1. A program is an int64 array of shape
(bundles, UNITS, FIELDS); slot u of a bundle holds the instruction for unit u, or opcode 0
(empty). Fields are ``[op, r0, r1, r2, r3, imm0, imm1]``; what each means is given by the
operand signature of the opcode below.

Memory spaces: SM and AM are private to each DSP, GSM is shared by the cluster, DDR is
off-chip. Scalar loads/stores address SM, vector loads/stores address AM; DMA moves data
between any two spaces. Exposed pipeline: a result becomes readable ``latency`` cycles after
issue and the assembler rejects programs that read it earlier; the machine therefore writes
results at issue, which is equivalent for every accepted program.
"""
from __future__ import annotations

from dataclasses import dataclass

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

# Operand kinds used in signatures:
#   s  scalar register      v  vector register     i  immediate        l  label (pc)
#   c  DMA channel          d  DMA descriptor      r  stall reason
#   [s+i]  address = scalar register + immediate (signature token 'a', uses r1/imm0)


@dataclass(frozen=True)
class OpSpec:
    code: int
    name: str
    units: tuple[int, ...]          # units that may execute it
    writes: str                     # operand kinds written, in field order (r0 ...)
    reads: str                      # operand kinds read
    syntax: str                     # text form operand list, e.g. "vd, va, vb"
    latency: str | None             # Latencies field name for the written register
    space: int | None = None        # memory space an address operand must refer to
    control: bool = False           # changes the PC or blocks (ends hazard tracking)


# Field usage per opcode (documented in syntax strings):
#   VFMA   vd(r0) += va(r1) * vb(r2)                      FP32, products of FP16-exact values
#   SVBCAST vd(r0) = broadcast(fp16 bits in sreg r1)      converts exactly to FP32
#   SVBCASTW vd(r0) = broadcast(fp32 bits in sreg r1)     low 32 bits read as an FP32 value
#   VEXP   vd(r0) = exp(va(r1))   VLOG vd(r0) = log(va(r1))   FP32, per lane (softmax forward)
#   VMAX   vd(r0) = max(va(r1), vb(r2))                  FP32, per lane (NaN if either is NaN)
#   SADDI  sd(r0) = sa(r1) + imm0
#   SADD   sd(r0) = sa(r1) + sb(r2)
#   SMOVI  sd(r0) = imm0
#   SLDH   sd(r0) = SM16[sa(r1) + imm0]                    half-word load (FP16 bits)
#   SSTH   SM16[sa(r1) + imm0] = sv(r2) & 0xffff
#   VLDH   vd(r0)[i] = fp32(AM16[sa(r1) + imm0 + 2i])      i < lanes
#   VLDW   vd(r0)[i] = AM32[sa(r1) + imm0 + 4i]
#   VSTW   AM32[sa(r1) + imm0 + 4i] = vs(r2)[i]
#   VSTH   AM16[sa(r1) + imm0 + 2i] = fp16_rne(vs(r2)[i])
#   DMA    channel r0, descriptor r1, src = sreg r2 + imm0, dst = sreg r3 + imm1
#   DMAWAIT channel r0                                     blocks until the channel is idle
#   BARRIER                                                 blocks until every DSP arrives
#   BR label(imm0)  BNZ sa(r1), label   BDEC sa(r1), label (sa -= 1; branch if sa != 0)
#   CALL label (s[link] = pc + 1)   RET (pc = s[link])   HALT
#   NOP reason(imm0)                                        padding; counted as a stall
OPS: tuple[OpSpec, ...] = (
    OpSpec(1, "vfma", (VMAC,), "v", "vvv", "vd, va, vb", "vmac"),
    OpSpec(2, "svbcast", (SMAC1, SMAC2), "v", "s", "vd, sa", "broadcast"),
    OpSpec(3, "saddi", (SMAC1, SMAC2, SIEU), "s", "s", "sd, sa, imm", "scalar_alu"),
    OpSpec(4, "sadd", (SMAC1, SMAC2, SIEU), "s", "ss", "sd, sa, sb", "scalar_alu"),
    OpSpec(5, "smovi", (SMAC1, SMAC2, SIEU), "s", "", "sd, imm", "scalar_alu"),
    OpSpec(6, "sldh", (SLDST,), "s", "s", "sd, [sa+imm]", "scalar_load", space=SP_SM),
    OpSpec(7, "ssth", (SLDST,), "", "ss", "[sa+imm], sv", None, space=SP_SM),
    OpSpec(8, "vldh", (VLDST1, VLDST2), "v", "s", "vd, [sa+imm]", "vector_load", space=SP_AM),
    OpSpec(9, "vldw", (VLDST1, VLDST2), "v", "s", "vd, [sa+imm]", "vector_load", space=SP_AM),
    OpSpec(10, "vstw", (VLDST1, VLDST2), "", "sv", "[sa+imm], vs", None, space=SP_AM),
    OpSpec(11, "vsth", (VLDST1, VLDST2), "", "sv", "[sa+imm], vs", None, space=SP_AM),
    OpSpec(12, "dma", (SIEU,), "", "ss", "ch, desc, [ss+imm], [sd+imm]", None),
    OpSpec(13, "dmawait", (SBR,), "", "", "ch", None, control=True),
    OpSpec(14, "barrier", (SBR,), "", "", "", None, control=True),
    OpSpec(15, "br", (SBR,), "", "", "label", None, control=True),
    OpSpec(16, "bnz", (SBR,), "", "s", "sa, label", None, control=True),
    OpSpec(17, "bdec", (SBR,), "s", "s", "sa, label", "scalar_alu", control=True),
    OpSpec(18, "call", (SBR,), "s", "", "label", "scalar_alu", control=True),
    OpSpec(19, "ret", (SBR,), "", "s", "", None, control=True),
    OpSpec(20, "halt", (SBR,), "", "", "", None, control=True),
    OpSpec(21, "nop", tuple(range(N_UNITS)), "", "", "reason", None),
    # FP32 scalar constants (softmax scale 1/sqrt(d)) for the attention kernels; same pipe as svbcast
    OpSpec(22, "svbcastw", (SMAC1, SMAC2), "v", "s", "vd, sa", "broadcast"),
    # softmax forward: one VMAC issue each, FMA latency (a stand-in for the vendor's vector math
    # routines; docs/CHOICES.md "mtemu attention kernels")
    OpSpec(23, "vexp", (VMAC,), "v", "v", "vd, va", "vmac"),
    OpSpec(24, "vlog", (VMAC,), "v", "v", "vd, va", "vmac"),
    OpSpec(25, "vmax", (VMAC,), "v", "vv", "vd, va, vb", "vmac"),
)

# Register kind of fields r0..r3 per opcode: s scalar, v vector, c DMA channel, d descriptor
# (checked against the descriptor table), '' unused (must be 0).
FIELD_KINDS = {
    "vfma": ("v", "v", "v", ""), "svbcast": ("v", "s", "", ""), "saddi": ("s", "s", "", ""),
    "sadd": ("s", "s", "s", ""), "smovi": ("s", "", "", ""), "sldh": ("s", "s", "", ""),
    "ssth": ("", "s", "s", ""), "vldh": ("v", "s", "", ""), "vldw": ("v", "s", "", ""),
    "vstw": ("", "s", "v", ""), "vsth": ("", "s", "v", ""), "dma": ("c", "d", "s", "s"),
    "dmawait": ("c", "", "", ""), "barrier": ("", "", "", ""), "br": ("", "", "", ""),
    "bnz": ("", "s", "", ""), "bdec": ("", "s", "", ""), "call": ("s", "", "", ""),
    "ret": ("", "s", "", ""), "halt": ("", "", "", ""), "nop": ("", "", "", ""),
    "svbcastw": ("v", "s", "", ""), "vexp": ("v", "v", "", ""), "vlog": ("v", "v", "", ""),
    "vmax": ("v", "v", "v", ""),
}

OP_BY_NAME = {op.name: op for op in OPS}
OP_BY_CODE = {op.code: op for op in OPS}
N_OPCODES = max(op.code for op in OPS) + 1

# Opcode numbers as plain ints for the jitted machine.
OP_VFMA, OP_SVBCAST, OP_SADDI, OP_SADD, OP_SMOVI, OP_SLDH, OP_SSTH = 1, 2, 3, 4, 5, 6, 7
OP_VLDH, OP_VLDW, OP_VSTW, OP_VSTH, OP_DMA, OP_DMAWAIT, OP_BARRIER = 8, 9, 10, 11, 12, 13, 14
OP_BR, OP_BNZ, OP_BDEC, OP_CALL, OP_RET, OP_HALT, OP_NOP = 15, 16, 17, 18, 19, 20, 21
OP_SVBCASTW, OP_VEXP, OP_VLOG, OP_VMAX = 22, 23, 24, 25

ZERO_REG = 0      # scalar register 0 always reads 0 and may not be written
LINK_REG = -1     # CALL writes the last scalar register (index resolved per platform)

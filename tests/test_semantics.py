"""mtemu.semantics states what every opcode does; the jitted machine must compute the same bits.

Opcode by opcode: hand-derived cases, each also run on the machine (functional mode) and compared
with the plain interpreter (:func:`mtemu.semantics.run_reference`) register by register and byte
by byte. Then random hazard-free programs (built through the assembler, which checks them) with
loops, calls, branches, DMA and barriers, on one DSP and on two, with and without the machine's
fast paths. Data are kept away from NaNs with distinct payloads meeting in one addition, whose
result bits the host's compiler may choose either way: FP16 data and FP32 data live in separate
regions, and scalars that may hold any integer are never broadcast.
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtemu import isa
from mtemu.assembler import ProgramBuilder, ins, parse
from mtemu.errors import MachineError
from mtemu.machine import Cluster
from mtemu.platform import DEFAULT
from mtemu.semantics import ClusterState, execute, run_reference, wrap64

LANES = 16
PLAT = DEFAULT.with_overrides(dsps=2, sm_bytes=1024, am_bytes=4096, gsm_bytes=4096, vector_lanes=LANES,
                              scalar_registers=16, vector_registers=8)
DDR = 4096
LINK = PLAT.scalar_registers - 1


def _f16(x) -> np.ndarray:
    return np.asarray(x, np.float16).view(np.uint16)


def _fill(c: Cluster, ref: ClusterState, space: str, addr: int, data: np.ndarray, dsp: int = 0) -> None:
    raw = np.ascontiguousarray(data).view(np.uint8).ravel()
    c.region(space, addr, raw.size, dsp)[:] = raw
    sp = isa.SPACES.index(space)
    ref.memory(sp, dsp)[addr:addr + raw.size] = raw


def _new():
    return Cluster(PLAT, ddr_bytes=DDR), ClusterState.new(PLAT, DDR)


def _compare(c: Cluster, ref: ClusterState) -> None:
    for d, s in enumerate(ref.dsps):
        assert np.array_equal(c.sregs[d], s.sregs), f"DSP {d} scalar registers"
        assert np.array_equal(c.vregs[d].view(np.uint32), s.vregs.view(np.uint32)), f"DSP {d} vector registers"
        assert np.array_equal(c.region("SM", 0, PLAT.sm_bytes, d), s.sm), f"DSP {d} SM"
        assert np.array_equal(c.region("AM", 0, PLAT.am_bytes, d), s.am), f"DSP {d} AM"
    assert np.array_equal(c.region("GSM", 0, PLAT.gsm_bytes), ref.gsm), "GSM"
    assert np.array_equal(c.region("DDR", 0, DDR), ref.ddr), "DDR"


IDLE = parse("{ halt }", PLAT)


def _both(programs, c=None, ref=None, fast_forward=None, **kw) -> ClusterState:
    """Run on the machine and on the reference from the same state; they must agree. One program runs
    on DSP 0 alone (DSP 1 halts at once) unless ``dsp_program`` says otherwise."""
    if c is None:
        c, ref = _new()
    if len(programs) == 1 and "dsp_program" not in kw:
        programs, kw["dsp_program"] = [programs[0], IDLE], [0, 1]
    c.run(programs, fast_forward=fast_forward, **kw)
    run_reference(ref, programs, **kw)
    _compare(c, ref)
    return ref


def _text(text, c=None, ref=None, **kw) -> ClusterState:
    return _both([parse(text, PLAT)], c, ref, **kw)


def _one(line: str, sregs: dict | None = None, c=None, ref=None) -> ClusterState:
    """One bundle, padded so that every write lands, then halt."""
    return _text(f"{line}\n" + "{ nop }\n" * 9 + "{ halt }", c, ref, init_sregs={0: sregs or {}})


# ------------------------------------------------------------------------------------------
# scalar
# ------------------------------------------------------------------------------------------
def test_scalar_arithmetic_wraps_as_int64():
    top = (1 << 63) - 1
    s = _one("{ saddi s2, s1, 1 | sadd s3, s1, s1 | smovi@SIEU s4, -7 }", {1: top}).dsps[0].sregs
    assert s[2] == -(1 << 63) and s[3] == -2 and s[4] == -7
    assert wrap64(1 << 63) == -(1 << 63) and wrap64(-(1 << 63) - 1) == top


def test_s0_reads_zero_and_the_units_of_a_bundle_run_in_order():
    ref = _one("{ saddi s2, s0, 5 }").dsps[0].sregs
    assert ref[0] == 0 and ref[2] == 5
    # a slot reads what the units before it in the same bundle wrote (the machine writes at issue);
    # the assembler refuses such a bundle, so it is built by hand
    code = np.zeros((2, isa.N_UNITS, isa.N_FIELDS), np.int64)
    code[0, isa.SMAC1] = [isa.OP_SMOVI, 3, 0, 0, 0, 40, 0]
    code[0, isa.SIEU] = [isa.OP_SADDI, 4, 3, 0, 0, 2, 0]
    code[1, isa.SBR] = [isa.OP_HALT, 0, 0, 0, 0, 0, 0]
    prog = parse("{ halt }", PLAT)
    prog.code = code
    assert _both([prog]).dsps[0].sregs[4] == 42


def test_half_word_load_zero_extends_and_store_keeps_the_low_bits():
    c, ref = _new()
    _fill(c, ref, "SM", 100, np.array([0xFFFF, 0x1234], np.uint16))
    s = _one("{ sldh s2, [s1+-100] }\n{ ssth [s1+4], s3 }", {1: 200, 3: -2}, c, ref)
    assert s.dsps[0].sregs[2] == 0xFFFF
    assert s.dsps[0].sm[204:206].view(np.uint16)[0] == 0xFFFE


# ------------------------------------------------------------------------------------------
# vector
# ------------------------------------------------------------------------------------------
def test_broadcasts_widen_fp16_exactly_or_take_fp32_bits():
    v = _one("{ svbcast v1, s1 | svbcastw v2, s2 }", {1: 0x5_3C01, 2: 0x7_3F800000}).dsps[0].vregs
    assert (v[1] == np.float32(1 + 2 ** -10)).all()            # high bits ignored: FP16 0x3C01
    assert (v[2] == 1.0).all()                                  # FP32 0x3F800000
    v = _one("{ svbcast v1, s1 }", {1: 0x0001}).dsps[0].vregs
    assert (v[1] == np.float32(2 ** -24)).all()                 # the smallest FP16 subnormal


def test_vector_loads_and_stores_round_to_nearest_even():
    c, ref = _new()
    half = np.zeros(LANES, np.uint16)
    half[:4] = [0x3C00, 0xC000, 0x0001, 0x7C00]                 # 1, -2, 2**-24, inf
    _fill(c, ref, "AM", 64, half)
    word = np.zeros(LANES, np.float32)
    word[:4] = [1 + 2 ** -11, 1 + 3 * 2 ** -11, 65520.0, -2 ** -25]   # ties, overflow, underflow
    _fill(c, ref, "AM", 256, word)
    s = _one("{ vldh v1, [s1+64] | vldw v2, [s1+256] }\n" + "{ nop }\n" * 9 +
             "{ vsth [s1+512], v2 | vstw [s1+1024], v1 }", {1: 0}, c, ref).dsps[0]
    assert s.vregs[1][:4].tolist() == [1.0, -2.0, 2 ** -24, math.inf]
    assert s.am[512:520].view(np.uint16).tolist() == [0x3C00, 0x3C02, 0x7C00, 0x8000]
    assert s.am[1024:1088].view(np.float32).tolist() == s.vregs[1].tolist()


def test_vfma_rounds_the_product_then_the_sum():
    c, ref = _new()
    x = np.full(LANES, 1 + 2 ** -12, np.float32)
    _fill(c, ref, "AM", 0, np.concatenate([x, np.full(LANES, -1, np.float32)]))
    s = _one("{ vldw v1, [s0+0] | vldw v2, [s0+64] }\n" + "{ nop }\n" * 9 + "{ vfma v2, v1, v1 }", None, c, ref)
    # (1 + 2**-12)**2 = 1 + 2**-11 + 2**-24 rounds (a tie, to even) to 1 + 2**-11; a fused
    # multiply-add would give 2**-11 + 2**-24
    assert (s.dsps[0].vregs[2] == 2 ** -11).all()


def test_vexp_vlog_vmax_edge_cases():
    c, ref = _new()
    a = np.zeros(LANES, np.float32)
    b = np.zeros(LANES, np.float32)
    a[:6] = [0.0, -np.inf, np.nan, 1.0, 0.0, -0.0]
    b[:6] = [1.0, 1.0, 1.0, np.nan, -0.0, 0.0]
    _fill(c, ref, "AM", 0, np.concatenate([a, b]))
    s = _one("{ vldw v1, [s0+0] | vldw v2, [s0+64] }\n" + "{ nop }\n" * 9 + "{ vmax v3, v1, v2 }\n{ vexp v4, v1 }\n"
             "{ vlog v5, v1 }", None, c, ref).dsps[0]
    mx = s.vregs[3][:6]
    assert mx[0] == 1 and mx[1] == 1 and np.isnan(mx[2]) and np.isnan(mx[3])
    assert mx[4] == 0 and np.signbit(mx[4]) and mx[5] == 0 and not np.signbit(mx[5])    # vb on equal zeros
    assert s.vregs[4][:2].tolist() == [1.0, 0.0] and np.isnan(s.vregs[4][2]) and math.isclose(s.vregs[4][3], math.e,
                                                                                              rel_tol=1e-7)
    assert s.vregs[5][0] == -np.inf and s.vregs[5][3] == 0.0 and np.isnan(s.vregs[5][1])


# ------------------------------------------------------------------------------------------
# DMA
# ------------------------------------------------------------------------------------------
DESCS = """.desc cp src=DDR dst=SM rows=2 row_bytes=8 src_stride=16 dst_stride=8 mode=copy
.desc bc src=DDR dst=AM rows=1 row_bytes=8 src_stride=8 dst_stride=8 mode=broadcast
.desc add src=SM dst=GSM rows=1 row_bytes=8 src_stride=8 dst_stride=8 mode=reduce_add
.desc none src=SM dst=AM rows=0 row_bytes=8 src_stride=8 dst_stride=8 mode=copy
.desc smear src=SM dst=SM rows=1 row_bytes=8 src_stride=8 dst_stride=8 mode=copy
"""


def test_dma_copy_broadcast_reduce_add_and_an_empty_transfer():
    c, ref = _new()
    _fill(c, ref, "DDR", 0, np.arange(1, 17, dtype=np.uint16))
    _fill(c, ref, "GSM", 0, np.array([1.5, -1], np.float32))
    prog = parse(DESCS + "{ smovi s1, 4 }\n{ dma 0, cp, [s0+0], [s1+0] }\n{ dma 1, bc, [s0+0], [s0+8] }\n"
                 "{ dma 2, add, [s1+0], [s0+0] }\n{ dma 3, none, [s1+-999], [s1+99999] }\n{ dmawait 0 }\n"
                 "{ dmawait 1 }\n{ halt }", PLAT)
    s = _both([prog], c, ref)
    assert s.dsps[0].sm[4:12].view(np.uint16).tolist() == [1, 2, 3, 4]          # row 0
    assert s.dsps[0].sm[12:20].view(np.uint16).tolist() == [9, 10, 11, 12]      # row 1: src rows 16 bytes apart
    for d in range(PLAT.dsps):                                                  # every DSP's AM
        assert s.dsps[d].am[8:16].view(np.uint16).tolist() == [1, 2, 3, 4]
    added = np.array([1.5, -1], np.float32) + s.dsps[0].sm[4:12].view(np.float32)
    assert s.gsm[:8].view(np.float32).tolist() == added.tolist()
    assert [t.channel for t in s.transfers] == [0, 1, 2, 3]


def test_overlapping_copy_moves_element_by_element_in_order():
    c, ref = _new()
    _fill(c, ref, "SM", 0, np.array([7, 1, 2, 3, 4], np.uint16))
    s = _both([parse(DESCS + "{ dma 0, smear, [s0+0], [s0+2] }\n{ halt }", PLAT)], c, ref)
    assert s.dsps[0].sm[:10].view(np.uint16).tolist() == [7, 7, 7, 7, 7]        # each element copies the last


@pytest.mark.parametrize("text, message", [
    ("{ sldh s2, [s0+1024] }", "outside the memory"), ("{ vldh v1, [s0+1] }", "unaligned"),
    ("{ vstw [s0+4094], v1 }", "outside the memory"), ("{ dma 0, cp, [s0+4090], [s0+0] }", "outside the memory"),
    ("{ dma 0, add, [s0+2], [s0+0] }", "unaligned")])
def test_bad_addresses_fault_in_both(text, message):
    prog = parse(DESCS + text + "\n" + "{ nop }\n" * 9 + "{ halt }", PLAT)
    c, ref = _new()
    with pytest.raises(MachineError, match=message):
        c.run([prog])
    with pytest.raises(MachineError, match=f"DSP 0, PC 0, unit .*{message}"):
        run_reference(ref, [prog])


# ------------------------------------------------------------------------------------------
# control
# ------------------------------------------------------------------------------------------
def test_bdec_loops_bnz_skips_br_jumps_call_links_and_ret_returns():
    text = ("{ smovi s1, 3 }\nloop:\n{ saddi s2, s2, 10 }\n{ bdec s1, loop }\n{ bnz s1, skip }\n"
            "{ smovi s3, 1 }\nskip:\n{ bnz s2, over }\n{ smovi s4, 1 }\nover:\n{ call sub }\n{ saddi s5, s5, 1 }\n"
            "{ br end }\nsub:\n{ smovi s6, 9 }\n{ ret }\nend:\n{ halt }")
    s = _text(text).dsps[0]
    assert s.sregs[1] == 0 and s.sregs[2] == 30           # three trips, the counter ends at 0
    assert s.sregs[3] == 1 and s.sregs[4] == 0            # bnz falls through on 0, jumps otherwise
    assert s.sregs[5] == 1 and s.sregs[6] == 9 and s.sregs[LINK] == 8      # the PC after the call
    assert s.halted and s.pc == 13


def test_bdec_from_zero_wraps_and_branches():
    s = _text("{ bdec s1, end }\nend:\n{ halt }").dsps[0]
    assert s.sregs[1] == -1


def test_barrier_waits_for_every_dsp_and_halt_stops():
    prog = parse("{ saddi s1, s1, 1 }\n{ barrier }\n{ saddi s1, s1, 1 }\n{ halt }\n{ smovi s2, 5 }", PLAT)
    s = _both([prog], dsp_program=[0, 0])
    assert all(d.sregs[1] == 2 and d.sregs[2] == 0 and d.pc == 4 for d in s.dsps)
    lone = parse("{ barrier }\n{ halt }", PLAT)
    quick = parse("{ halt }", PLAT)
    with pytest.raises(MachineError, match="deadlock"):
        run_reference(ClusterState.new(PLAT, DDR), [lone, quick], dsp_program=[0, 1])


def test_nop_and_dmawait_change_no_data():
    ref = ClusterState.new(PLAT, DDR)
    before = [x.copy() for x in (ref.dsps[0].sregs, ref.dsps[0].vregs, ref.dsps[0].sm)]
    for op in (isa.OP_NOP, isa.OP_DMAWAIT):
        assert execute(ref, 0, [op, 0, 0, 0, 0, 0, 0]) is None
    assert all(np.array_equal(a, b) for a, b in zip(before, (ref.dsps[0].sregs, ref.dsps[0].vregs, ref.dsps[0].sm),
                                                    strict=True))


# ------------------------------------------------------------------------------------------
# random programs
# ------------------------------------------------------------------------------------------
# register roles: s1 SM base, s2 AM base (FP16 region), s3 GSM base (this DSP's), s13 DDR base (this
# DSP's FP32 region), s14 AM FP32 base; s4..s7 FP16 bits (loaded); s8 loop counter; s9, s10 FP32 bits;
# s11, s12 any integer (never broadcast); s15 the link register
AM32 = 2048
LATENCY = {spec.name: getattr(PLAT.latencies, spec.latency) if spec.latency else 0 for spec in isa.OPS}
RANDOM_DESCS = (   # name, src, dst, rows, row_bytes, src stride, dst stride, mode, (src reg, imm range), (dst ...)
    ("sm_am", "SM", "AM", 2, 32, 64, 64, "copy", (1, 512), (2, 1024)),
    ("am_gsm", "AM", "GSM", 2, 64, 128, 128, "copy", (2, 1024), (3, 1024)),
    ("gsm_am", "GSM", "AM", 1, 128, 128, 128, "copy", (3, 1024), (2, 1024)),
    ("am_ddr_add", "AM", "DDR", 2, 64, 64, 128, "reduce_add", (14, 1024), (13, 512)),
    ("ddr_sm", "DDR", "SM", 4, 16, 16, 32, "copy", (0, 1024), (1, 512)),
    ("sm_sm", "SM", "SM", 1, 64, 64, 64, "copy", (1, 512), (1, 512)),
    ("empty", "SM", "AM", 0, 32, 32, 32, "copy", (1, 512), (2, 1024)),
    ("ddr_bcast", "DDR", "AM", 2, 32, 32, 64, "broadcast", (0, 1024), (2, 1024)),
)


# the opcodes _Gen draws at random, and those it places where a program's structure needs them
DATA_OPS = ("vfma", "vmax", "vexp", "vlog", "svbcast", "svbcastw", "sldh", "ssth", "vldh", "vsth", "vldw", "vstw",
            "smovi", "saddi", "sadd")
STRUCTURE_OPS = ("nop", "bdec", "bnz", "br", "call", "ret", "dma", "dmawait", "barrier", "halt")


def test_random_programs_cover_every_opcode():
    """A new opcode fails here until the random programs use it (the FP64 ops': tests/test_fp64.py)."""
    assert sorted(DATA_OPS + STRUCTURE_OPS) == sorted(s.name for s in isa.OPS if not s.fp64)


class _Gen:
    """Bundles of random instructions whose reads all wait for the latency of the write before."""

    def __init__(self, rng, b: ProgramBuilder, broadcast: bool):
        self.rng, self.b, self.broadcast = rng, b, broadcast
        self.cycle = 0
        self.ready: dict[tuple[str, int], int] = {}
        self.descs = {d[0]: b.descriptor(*d[1:8]) for d in RANDOM_DESCS}
        self.labels = 0

    def _even(self, hi: int, step: int = 2) -> int:
        return int(self.rng.integers(0, hi // step + 1)) * step

    def _candidate(self):
        """(instruction, registers read, registers written)."""
        rng, v = self.rng, lambda: int(self.rng.integers(0, PLAT.vector_registers))
        kind = str(rng.choice(["vfma"] * 4 + list(DATA_OPS)))
        if kind in ("vfma", "vmax"):
            d, a, b = v(), v(), v()
            return ins(kind, f"v{d}", f"v{a}", f"v{b}"), [("v", a), ("v", b)] + [("v", d)] * (kind == "vfma"), \
                [("v", d)]
        if kind in ("vexp", "vlog"):
            d, a = v(), v()
            return ins(kind, f"v{d}", f"v{a}"), [("v", a)], [("v", d)]
        if kind in ("svbcast", "svbcastw"):
            s = int(rng.integers(0, 8)) if kind == "svbcast" else int(rng.integers(9, 11))
            d = v()
            return ins(kind, f"v{d}", f"s{s}"), [("s", s)], [("v", d)]
        if kind == "sldh":
            d = int(rng.integers(4, 8))
            return ins(kind, f"s{d}", ("s1", self._even(700))), [("s", 1)], [("s", d)]
        if kind == "ssth":
            s = int(rng.integers(4, 8))
            return ins(kind, ("s1", self._even(700)), f"s{s}"), [("s", 1), ("s", s)], []
        if kind in ("vldh", "vldw"):
            d = v()
            addr = ("s2", self._even(1504)) if kind == "vldh" else ("s14", self._even(AM32 - 64, 4))
            return ins(kind, f"v{d}", addr), [("s", int(addr[0][1:]))], [("v", d)]
        if kind in ("vsth", "vstw"):
            s = v()
            addr = ("s2", self._even(1504)) if kind == "vsth" else ("s14", self._even(AM32 - 64, 4))
            return ins(kind, addr, f"v{s}"), [("s", int(addr[0][1:])), ("v", s)], []
        d = int(rng.choice([9, 10, 11, 12])) if kind == "smovi" else int(rng.integers(11, 13))
        if kind == "smovi":
            value = int(np.float32(rng.standard_normal() * 100).view(np.uint32)) if d < 11 \
                else int(rng.integers(-1000, 1000))
            return ins(kind, f"s{d}", value), [], [("s", d)]
        a = int(rng.integers(0, 13))
        if kind == "saddi":
            return ins(kind, f"s{d}", f"s{a}", int(rng.integers(-50, 50))), [("s", a)], [("s", d)]
        b2 = int(rng.integers(0, 13))
        return ins(kind, f"s{d}", f"s{a}", f"s{b2}"), [("s", a), ("s", b2)], [("s", d)]

    def bundle(self) -> None:
        used_units, chosen, read, written = set(), [], set(), set()
        for _ in range(int(self.rng.integers(1, 7))):        # tries; most bundles take one to three
            instr, reads, writes = self._candidate()
            spec = isa.OP_BY_NAME[instr.op]
            free = [u for u in spec.units if u not in used_units]
            regs = [r for r in reads if r[0] != "s" or r[1] != 0]
            if not free or any(self.ready.get(r, 0) > self.cycle or r in written for r in regs) \
                    or any(self.ready.get(w, 0) > self.cycle or w in written or w in read for w in writes):
                continue
            used_units.add(free[0])
            chosen.append((ins(instr.op, *instr.args, unit=isa.UNITS[free[0]]), writes, LATENCY[instr.op]))
            read.update(regs)
            written.update(writes)
        for _instr, writes, lat in chosen:
            for w in writes:
                self.ready[w] = self.cycle + lat           # readable from this cycle on
        self.emit(*[c[0] for c in chosen] or [ins("nop")])

    def emit(self, *instrs) -> None:
        self.b.bundle(*instrs)
        self.cycle += 1

    def land(self) -> None:
        """Pad until every write has landed (before a control transfer or a label)."""
        while any(t > self.cycle for t in self.ready.values()):
            self.emit(ins("nop"))

    def label(self) -> str:
        self.land()
        name = f"L{self.labels}"
        self.labels += 1
        self.b.label(name)
        return name

    def straight(self, n: int) -> None:
        for _ in range(n):
            self.bundle()

    def dma(self) -> None:
        rng = self.rng
        names = [d[0] for d in RANDOM_DESCS if self.broadcast or d[7] != "broadcast"]
        name = str(rng.choice(names))
        row = next(d for d in RANDOM_DESCS if d[0] == name)
        align = 4 if row[7] == "reduce_add" else 2
        (sr, shi), (dr, dhi) = row[8], row[9]
        src = (f"s{sr}", self._even(shi, align))
        dst = (f"s{dr}", max(src[1] + int(rng.choice([-2, 2, 6, 0])), 0) if name == "sm_sm" else self._even(dhi, align))
        ch = int(rng.integers(0, PLAT.dma_channels))
        self.emit(ins("dma", ch, self.descs[name], src, dst))
        if rng.random() < 0.5:
            self.land()
            self.emit(ins("dmawait", ch))


def _random_program(seed: int, dsps: int) -> tuple:
    rng = np.random.default_rng(seed)
    b = ProgramBuilder(PLAT)
    g = _Gen(rng, b, broadcast=dsps == 1)
    subs = []
    for _ in range(int(rng.integers(3, 11))):
        what = rng.choice(["straight", "straight", "loop", "call", "skip", "dma"] + ["barrier"] * (dsps > 1))
        if what == "straight":
            g.straight(int(rng.integers(2, 12)))
        elif what == "loop":
            g.emit(ins("smovi", "s8", int(rng.integers(1, 4))))
            top = g.label()
            g.straight(int(rng.integers(1, 8)))
            g.land()
            g.emit(ins("bdec", "s8", top))
            g.ready = {}
        elif what == "call":
            subs.append(f"sub{len(subs)}")
            g.land()
            g.emit(ins("call", subs[-1]))
            g.ready = {}
        elif what == "skip":
            g.land()
            g.emit(ins("bnz", "s11", f"skip{g.labels}") if rng.random() < 0.7 else ins("br", f"skip{g.labels}"))
            name = f"skip{g.labels}"
            g.labels += 1
            g.straight(int(rng.integers(1, 4)))
            g.land()
            b.label(name)
        elif what == "dma":
            g.dma()
        else:
            g.land()
            g.emit(ins("barrier"))
    g.land()
    g.emit(ins("halt"))
    for name in subs:
        g.ready = {}
        b.label(name)
        g.straight(int(rng.integers(1, 6)))
        g.land()
        g.emit(ins("ret"))
    return b.assemble(), rng


def _random_state(rng, c: Cluster, ref: ClusterState) -> None:
    def f16(n):
        bits = rng.integers(0, 0x7C00, n).astype(np.uint16)
        bits[rng.random(n) < 0.1] &= 0x03FF                     # subnormals and zeros
        return bits | (rng.integers(0, 2, n).astype(np.uint16) << 15)

    def f32(n):
        return (rng.standard_normal(n) * 4).astype(np.float32)

    for d in range(PLAT.dsps):
        _fill(c, ref, "SM", 0, f16(PLAT.sm_bytes // 2), d)
        _fill(c, ref, "AM", 0, f16(AM32 // 2), d)
        _fill(c, ref, "AM", AM32, f32((PLAT.am_bytes - AM32) // 4), d)
        regs = np.where(rng.random((PLAT.vector_registers, LANES)) < 0.5, f16(PLAT.vector_registers * LANES)
                        .view(np.float16).astype(np.float32).reshape(-1, LANES), f32(PLAT.vector_registers * LANES)
                        .reshape(-1, LANES)).astype(np.float32)
        c.vregs[d] = regs
        ref.dsps[d].vregs[:] = regs
    _fill(c, ref, "GSM", 0, f16(PLAT.gsm_bytes // 2))
    _fill(c, ref, "DDR", 0, f16(AM32 // 2))
    _fill(c, ref, "DDR", AM32, f32((DDR - AM32) // 4))


def _bases(rng, dsps: int) -> dict:
    return {d: {1: int(rng.choice([0, 64, 128, 256])), 2: int(rng.choice([0, 256, 512])), 3: 2048 * d,
                13: AM32 + 1024 * d, 14: AM32, 11: int(rng.integers(0, 2))} for d in range(dsps)}


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2 ** 32 - 1), st.booleans())
def test_random_programs_on_one_dsp_match_the_reference(seed, fast_forward):
    prog, rng = _random_program(seed, 1)
    idle = parse("{ halt }", PLAT)
    c, ref = _new()
    _random_state(rng, c, ref)
    init = _bases(rng, 1)
    _both([prog, idle], c, ref, fast_forward=fast_forward, dsp_program=[0, 1], init_sregs=init)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2 ** 32 - 1))
def test_random_programs_on_two_dsps_match_the_reference(seed):
    prog, rng = _random_program(seed, 2)
    c, ref = _new()
    _random_state(rng, c, ref)
    _both([prog], c, ref, dsp_program=[0, 0], init_sregs=_bases(rng, 2))


# 2,000 programs in four shards of 500, each its own test, so that test workers (``-n 2``) share them; a
# shard's seeds are offset by an odd constant, so the shards draw different programs
MANY_SHARDS = 4


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(MANY_SHARDS))
@settings(max_examples=2000 // MANY_SHARDS, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 2))
def test_many_random_programs_match_the_reference(shard, seed, dsps):
    prog, rng = _random_program((seed + shard * 0x9E3779B9) % 2 ** 32, dsps)
    c, ref = _new()
    _random_state(rng, c, ref)
    programs = [prog] if dsps == 2 else [prog, parse("{ halt }", PLAT)]
    _both(programs, c, ref, dsp_program=[0, 0] if dsps == 2 else [0, 1], init_sregs=_bases(rng, dsps))

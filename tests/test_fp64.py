"""The FP64 ops (sldd, svbcastd, vldd, vstd, vfmad; the NT kernel's vlddg, vlddm4, smvd, sfaddd, sstd):
the jitted machine computes the bits
mtemu.semantics states and NumPy's float64 gives; platforms without FP64 lanes refuse them.

Hand cases first, then random hazard-free FP64 programs (mixed with FP32 ops, whose register file is
separate) on the machine with and without its fast paths against the reference interpreter.
"""
import numpy as np
import pytest

from mtemu import isa
from mtemu.assembler import ProgramBuilder, ins, parse
from mtemu.errors import MachineError, PlatformError
from mtemu.machine import Cluster
from mtemu.platform import DEFAULT, load_platform
from mtemu.semantics import ClusterState, run_reference

LANES64 = 16
PLAT = DEFAULT.with_overrides(dsps=2, sm_bytes=1024, am_bytes=8192, gsm_bytes=4096, vector_lanes=16,
                              scalar_registers=16, vector_registers=8, fp64_lanes=LANES64)
DDR = 4096
IDLE = parse("{ halt }", PLAT)
FP64_NAMES = {s.name for s in isa.OPS if s.fp64}


def _new():
    return Cluster(PLAT, ddr_bytes=DDR), ClusterState.new(PLAT, DDR)


def _fill(c, ref, space: str, addr: int, data: np.ndarray, dsp: int = 0) -> None:
    raw = np.ascontiguousarray(data).view(np.uint8).ravel()
    c.region(space, addr, raw.size, dsp)[:] = raw
    ref.memory(isa.SPACES.index(space), dsp)[addr:addr + raw.size] = raw


def _compare(c, ref) -> None:
    for d, s in enumerate(ref.dsps):
        assert np.array_equal(c.sregs[d], s.sregs), f"DSP {d} scalar registers"
        assert np.array_equal(c.vregs[d].view(np.uint32), s.vregs.view(np.uint32)), f"DSP {d} FP32 registers"
        assert np.array_equal(c.vregs64[d].view(np.uint64), s.vregs64.view(np.uint64)), f"DSP {d} FP64 registers"
        assert np.array_equal(c.region("SM", 0, PLAT.sm_bytes, d), s.sm), f"DSP {d} SM"
        assert np.array_equal(c.region("AM", 0, PLAT.am_bytes, d), s.am), f"DSP {d} AM"


def _both(prog, c, ref, fast_forward=None, **kw):
    c.run([prog, IDLE], dsp_program=[0, 1], fast_forward=fast_forward, **kw)
    run_reference(ref, [prog, IDLE], dsp_program=[0, 1], **kw)
    _compare(c, ref)


def test_fp64_ops_are_in_the_table_with_their_units():
    assert FP64_NAMES == {"sldd", "svbcastd", "vldd", "vstd", "vfmad", "vlddg", "vlddm4", "smvd", "sfaddd", "sstd"}
    assert isa.OP_BY_NAME["smvd"].units == (isa.SMAC1,)           # one read port of the scalar-vector register
    assert isa.OP_BY_NAME["vfmad"].units == (isa.VMAC,) and isa.OP_BY_NAME["vfmad"].is_mac
    assert {isa.OP_BY_NAME[n].access_bytes for n in ("sldd", "vldd", "vstd")} == {8}


def test_multiply_accumulate_matches_numpy_float64():
    """vd += va * vb lane by lane: NumPy's float64 product, then its sum (no fused rounding)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal(3)
    b = rng.standard_normal(LANES64)
    acc = rng.standard_normal(LANES64)
    c, ref = _new()
    _fill(c, ref, "SM", 64, a)
    _fill(c, ref, "AM", 0, b)
    _fill(c, ref, "AM", 1024, acc)
    prog = parse("\n".join([
        "{ sldd s2, [s0+64] | vldd v1, [s0+0] | vldd v2, [s0+1024] }",
        *["{ nop }"] * 8,
        "{ svbcastd v0, s2 }", *["{ nop }"] * 3,
        "{ vfmad v2, v0, v1 }", *["{ nop }"] * 5,
        "{ vstd [s0+2048], v2 }", "{ nop }", "{ halt }"]), PLAT)
    _both(prog, c, ref)
    got = c.region("AM", 2048, LANES64 * 8).view(np.float64)
    assert np.array_equal(got.view(np.uint64), (acc + a[0] * b).view(np.uint64))


def test_gather_modulo_load_and_the_scalar_path_match_numpy():
    """vlddg: unit u (fma_units = 3 units of 16 // 3 = 5 lanes here; lane 15 keeps its value) from
    s3 bytes further per unit, or one vector repeated (s0); vlddm4: every fourth value; smvd reads a lane
    into a scalar, sfaddd adds two FP64 scalars, sstd stores one to SM."""
    rng = np.random.default_rng(2)
    mem = rng.standard_normal(512)
    c, ref = _new()
    _fill(c, ref, "AM", 0, mem)
    _fill(c, ref, "SM", 0, np.array([0.25]))
    prog = parse("\n".join([
        "{ svbcastd v1, s0 | svbcastd v2, s0 }", *["{ nop }"] * 3,
        "{ vlddg v1, [s2+64], s3 | vlddg v2, [s2+8], s0 }", "{ vlddm4 v3, [s2+16] | sldd s5, [s0+0] }",
        *["{ nop }"] * 8,
        "{ smvd s4, v3, 7 }", *["{ nop }"] * 3,
        "{ sfaddd s6, s4, s5 }", *["{ nop }"] * 5,
        "{ sstd [s0+8], s6 }", "{ halt }"]), PLAT)
    _both(prog, c, ref, init_sregs={0: {3: 256}})
    w = LANES64 // PLAT.fma_units
    g = c.vregs64[0, 1].copy()
    want = np.concatenate([mem[8 + 32 * u:8 + 32 * u + w] for u in range(PLAT.fma_units)] + [[0.0]])
    assert np.array_equal(g, want)
    assert np.array_equal(c.vregs64[0, 2], np.concatenate([np.tile(mem[1:1 + w], PLAT.fma_units), [0.0]]))
    assert np.array_equal(c.vregs64[0, 3], mem[2:2 + 4 * LANES64:4])
    assert c.region("SM", 8, 8).view(np.float64)[0] == mem[2 + 4 * 7] + 0.25


def test_fp64_and_fp32_register_files_are_separate():
    c, ref = _new()
    _fill(c, ref, "AM", 0, np.arange(LANES64, dtype=np.float64))
    prog = parse("{ vldd v3, [s0+0] }\n" + "{ nop }\n" * 9 + "{ halt }", PLAT)
    _both(prog, c, ref)
    assert not c.vregs[0, 3].any() and np.array_equal(c.vregs64[0, 3], np.arange(LANES64))


def test_misaligned_fp64_access_is_an_error():
    c, _ref = _new()
    prog = parse("{ vldd v1, [s1+0] }\n" + "{ nop }\n" * 9 + "{ halt }", PLAT)
    with pytest.raises(MachineError, match="alignment"):
        c.run([prog, IDLE], dsp_program=[0, 1], init_sregs={0: {1: 4}})


def test_fp64_program_on_a_platform_without_fp64_lanes_is_refused():
    plat = PLAT.with_overrides(fp64_lanes=0)
    prog = parse("{ vfmad v1, v2, v3 }\n" + "{ nop }\n" * 6 + "{ halt }", plat)
    with pytest.raises(MachineError, match="vfmad is an FP64 op .* no FP64 lanes"):
        Cluster(plat, ddr_bytes=0, functional=False).run([prog, parse("{ halt }", plat)], dsp_program=[0, 1])


def test_fp64_lanes_must_divide_the_vector_width():
    with pytest.raises(PlatformError, match="'fp64_lanes' = 40 does not divide the vector width"):
        DEFAULT.with_overrides(fp64_lanes=40)
    with pytest.raises(PlatformError, match="vector_bits"):
        DEFAULT.with_overrides(vector_bits=1000)


def test_family_fields_leave_the_default_digests_alone():
    """The MT-3000 default hashes as before the family fields existed (its caches stay valid)."""
    assert DEFAULT.digest() == "5d843da7f8355a62" and DEFAULT.timing_digest() == "e1393f762cf0b9f0"
    assert DEFAULT.with_overrides(fp64_lanes=48).digest() != DEFAULT.digest()


def test_ft_m7032_platform_file():
    p = load_platform("platforms/ft-m7032.toml")
    assert (p.dsps, p.fp64_lanes, p.clock_hz) == (8, 48, 1.8e9)
    assert p.peak_fp64_flops_per_s == pytest.approx(172.8e9)


# ------------------------------------------------------------------------------------------
# random FP64 programs
# ------------------------------------------------------------------------------------------
LAT = {s.name: getattr(PLAT.latencies, s.latency) if s.latency else 0 for s in isa.OPS}


def _random_program(rng) -> ProgramBuilder:
    """s1 SM base (FP64 scalars at 0..255, sstd at 256..511), s2 AM base (FP64 vectors at 0..4095; s3 the
    gather's stride); FP32 at AM 4096..."""
    b = ProgramBuilder(PLAT)
    ready: dict[tuple[str, int], int] = {}
    cycle = 0
    for _ in range(int(rng.integers(20, 60))):
        kind = str(rng.choice(["vfmad", "vfmad", "svbcastd", "sldd", "vldd", "vstd", "vldw", "vfma", "vlddg",
                               "vlddm4", "smvd", "sfaddd", "sstd"]))
        v = lambda: int(rng.integers(0, PLAT.vector_registers))   # noqa: E731
        if kind in ("vfmad", "vfma"):
            d, a, c = v(), v(), v()
            instr, reads, writes = ins(kind, f"v{d}", f"v{a}", f"v{c}"), [("v", a), ("v", c), ("v", d)], [("v", d)]
        elif kind == "svbcastd":
            s, d = int(rng.integers(4, 8)), v()
            instr, reads, writes = ins(kind, f"v{d}", f"s{s}"), [("s", s)], [("v", d)]
        elif kind == "sldd":
            d = int(rng.integers(4, 8))
            instr, reads, writes = ins(kind, f"s{d}", ("s1", 8 * int(rng.integers(0, 32)))), [("s", 1)], [("s", d)]
        elif kind == "vldd":
            d = v()
            instr, reads, writes = ins(kind, f"v{d}", ("s2", 8 * int(rng.integers(0, 496)))), [("s", 2)], [("v", d)]
        elif kind == "vlddg":                  # s3: the units' stride (128 bytes), or s0: one vector
            d, st = v(), int(rng.choice([0, 3]))
            instr = ins(kind, f"v{d}", ("s2", 8 * int(rng.integers(0, 450))), f"s{st}")
            reads, writes = [("s", 2), ("s", st)], [("v", d)]
        elif kind == "vlddm4":
            d = v()
            instr, reads, writes = ins(kind, f"v{d}", ("s2", 8 * int(rng.integers(0, 450)))), [("s", 2)], [("v", d)]
        elif kind == "smvd":
            d, a = int(rng.integers(4, 8)), v()
            instr, reads, writes = ins(kind, f"s{d}", f"v{a}", int(rng.integers(0, LANES64))), [("v", a)], [("s", d)]
        elif kind == "sfaddd":
            d, a, b2 = (int(x) for x in rng.integers(4, 8, 3))
            instr, reads, writes = ins(kind, f"s{d}", f"s{a}", f"s{b2}"), [("s", a), ("s", b2)], [("s", d)]
        elif kind == "sstd":
            a = int(rng.integers(4, 8))
            instr, reads, writes = ins(kind, ("s1", 256 + 8 * int(rng.integers(0, 32))), f"s{a}"), \
                [("s", 1), ("s", a)], []
        elif kind == "vstd":
            s = v()
            instr, reads, writes = ins(kind, ("s2", 8 * int(rng.integers(0, 496))), f"v{s}"), [("s", 2), ("v", s)], []
        else:
            d = v()
            instr, reads, writes = ins(kind, f"v{d}", ("s2", 4096 + 4 * int(rng.integers(0, 900)))), [("s", 2)], \
                [("v", d)]
        start = max([cycle] + [ready.get(r, 0) for r in reads + writes])
        while cycle < start:
            b.bundle(ins("nop"))
            cycle += 1
        b.bundle(instr)
        for w in writes:
            ready[w] = cycle + LAT[kind]
        cycle += 1
    b.nops(10)
    b.bundle(ins("halt"))
    return b


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fast_forward", [True, False])
def test_random_fp64_programs_match_the_reference(seed, fast_forward):
    rng = np.random.default_rng(seed)
    c, ref = _new()
    _fill(c, ref, "SM", 0, rng.standard_normal(32))
    _fill(c, ref, "AM", 0, rng.standard_normal(512))
    _fill(c, ref, "AM", 4096, rng.standard_normal(1024).astype(np.float32))
    prog = _random_program(rng).assemble()
    _both(prog, c, ref, fast_forward=fast_forward, init_sregs={0: {1: 0, 2: 0, 3: 128}})


def test_timing_runs_count_fp64_macs_as_the_bundle_by_bundle_run():
    rng = np.random.default_rng(7)
    prog = _random_program(rng).assemble()
    fast = Cluster(PLAT, functional=False).run([prog, IDLE], dsp_program=[0, 1], fast_forward=True)
    slow = Cluster(PLAT, functional=False).run([prog, IDLE], dsp_program=[0, 1], fast_forward=False)
    assert np.array_equal(fast.per_dsp, slow.per_dsp)
    assert fast.vfma == sum(1 for row in prog.code[:, isa.VMAC, isa.F_OP] if row in (isa.OP_VFMA, isa.OP_VFMAD))

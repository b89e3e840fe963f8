"""Straight-line blocks (mtemu.fast.runs): tables against their reference, and every counter of a
fast-forwarded timing run against the bundle-by-bundle run (kernels on many shapes, random
programs, errors)."""
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtemu import isa, machine
from mtemu.assembler import ProgramBuilder, ins, parse
from mtemu.errors import MachineError
from mtemu.fast import queues
from mtemu.fast.runs import MAX_CLASSES, MIN_BUNDLES, build_blocks, build_blocks_reference
from mtemu.kernels.attention import (
    attention_backward_timing,
    attention_forward_timing,
    run_attention,
    run_attention_backward,
)
from mtemu.kernels.attention.backward import _build_cached as build_backward
from mtemu.kernels.attention.forward import _build_forward_cached as build_forward
from mtemu.kernels.capacity import AttentionTiles
from mtemu.kernels.gemm import GemmTiles, build_gemm, reference_gemm
from mtemu.kernels.gemm_a_resident import AResidentGemmTiles, build_a_resident, reference_gemm_a_resident
from mtemu.machine import Cluster
from mtemu.platform import DEFAULT, load_platform
from mtemu.validate import TABLE5, TABLE5_M

SMALL = DEFAULT.with_overrides(dsps=4, vector_lanes=32)
TINY = DEFAULT.with_overrides(dsps=2)


def counters(stats):
    return (stats.cycles, stats.per_dsp.tolist(), stats.server_bytes, stats.server_busy, stats.stall_cycles())


def both(platform, ddr_bytes, programs, **kw):
    """(fast-forwarded, bundle by bundle): counters, or the error message."""
    out = []
    for ff in (True, False):
        try:
            stats = Cluster(platform, ddr_bytes=ddr_bytes, functional=False).run(programs, fast_forward=ff, **kw)
        except MachineError as exc:
            out.append(("error", str(exc)))
        else:
            out.append(counters(stats))
    return out


def assert_same_gemm(gp, platform):
    fast, full = both(platform, gp.plan.ddr_bytes, [gp.program], init_sregs=gp.init_sregs,
                      dsp_descriptors=gp.dsp_descriptors)
    assert fast == full


# ------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------
def _seg_end(*programs):
    sizes = [p.bundles for p in programs]
    return np.repeat(np.cumsum(sizes), sizes)


def _assert_tables_match(code, seg_end, lanes):
    fast = build_blocks(code, seg_end, lanes)
    ref = build_blocks_reference(code, seg_end, lanes)
    for name, a, b in zip(("end", "deltas", "creg", "cmem", "calign", "lo", "hi", "mis"), fast, ref, strict=True):
        assert np.array_equal(a, b), name
    return fast


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("lanes", [1, 32])
def test_tables_of_kernels_match_the_reference(lanes):
    gp = build_gemm(96, 256, 96, GemmTiles(mg=48, k2=64, n2=64), SMALL)
    ar = build_a_resident(96, 256, 96, AResidentGemmTiles(mg=48, kg=128, k2=64, n2=64), SMALL)
    bw = build_backward(2, 1, 64, 16, True, AttentionTiles(br=32, bc=32, d=16, br_prime=8, bc_prime=16),
                        "resident", SMALL)
    for progs in ([gp.program], [ar.program], bw.programs[:2]):
        code = np.concatenate([p.code for p in progs])
        end = _assert_tables_match(code, _seg_end(*progs), lanes)[0]
        assert (end > np.arange(code.shape[0])).any()


def test_runs_stop_at_control_scalar_writes_program_ends_and_too_many_classes():
    body = "".join(f"{{ vldh v{16 + i}, [s{i + 1}+0] }}\n" for i in range(MAX_CLASSES + 2))
    p1 = parse("{ nop }\n{ nop branch }\n{ smovi s1, 0 }\n" + body + "{ nop }\n" * 9 + "{ halt }", TINY)
    p2 = parse("{ vfma v1, v2, v3 }\n" + "{ nop }\n" * 6 + "{ halt }", TINY)
    code = np.concatenate([p1.code, p2.code])
    end, deltas, creg, *_ = _assert_tables_match(code, _seg_end(p1, p2), 1)
    n1 = p1.bundles
    assert end[0] == 2 and deltas[0, 2:4].tolist() == [1, 1]       # one latency, one branch nop
    assert end[2] == 2                                               # smovi writes a register
    assert end[3] == 3 + MAX_CLASSES and end[3 + MAX_CLASSES] == n1 - 1   # cut at the ninth class
    assert end[n1 - 1] == n1 - 1 and end[n1] == n1 + 7               # halt; next program's own run
    assert sorted(creg[3].tolist()) == list(range(1, MAX_CLASSES + 1))


# ------------------------------------------------------------------------------------------
# kernels: identical counters on many shapes
# ------------------------------------------------------------------------------------------
GEMM_SHAPES = [(96, 256, 96), (100, 200, 300), (48, 64, 33), (192, 512, 128), (7, 96, 500), (240, 320, 224)]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("shape", GEMM_SHAPES)
def test_gemm_counters_equal_the_bundle_by_bundle_run(shape):
    for tiles in (GemmTiles(mg=48, k2=64, n2=64), GemmTiles(mg=96, k2=32, n2=96, mr=4, nv=2),
                  GemmTiles(mg=48, k2=64, n2=64, pipelined=False)):
        assert_same_gemm(build_gemm(*shape, tiles, SMALL), SMALL)
    for tiles in (AResidentGemmTiles(mg=48, kg=128, k2=64, n2=64), AResidentGemmTiles(mg=96, kg=64, k2=32, n2=96,
                                                                                      b_slots=2)):
        assert_same_gemm(build_a_resident(*shape, tiles, SMALL), SMALL)


def test_default_platform_gemms_equal_the_bundle_by_bundle_run():
    assert_same_gemm(build_gemm(256, 512, 768, GemmTiles(), DEFAULT), DEFAULT)
    assert_same_gemm(build_a_resident(256, 1536, 768, AResidentGemmTiles(), DEFAULT), DEFAULT)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("causal", [True, False])
def test_attention_counters_equal_the_bundle_by_bundle_run(causal):
    tiles = AttentionTiles(br=32, bc=32, d=16, br_prime=8, bc_prime=16)
    for schedule in ("gsm", "broadcast", "own"):
        for ap in (build_backward(2, 1, 96, 16, causal, tiles, "resident", SMALL, schedule),
                   build_forward(2, 1, 96, 16, causal, tiles, SMALL, schedule)):
            fast, full = both(SMALL, ap.plan.ddr_bytes, ap.programs, dsp_program=list(range(SMALL.dsps)))
            assert fast == full
    staged = build_backward(2, 2, 64, 16, causal, tiles, "ddr-staged", SMALL, "auto")
    fast, full = both(SMALL, staged.plan.ddr_bytes, staged.programs, dsp_program=list(range(SMALL.dsps)))
    assert fast == full


def test_attention_runners_use_it_by_default():
    # the runners' numbers equal a bundle-by-bundle run of the same programs
    tiles = AttentionTiles(br=32, bc=32, d=16, br_prime=8, bc_prime=16)
    r = attention_backward_timing(2, 1, 96, 16, tiles=tiles, platform=SMALL)
    f = attention_forward_timing(2, 1, 96, 16, tiles=tiles, platform=SMALL)
    for res, ap in ((r, build_backward(2, 1, 96, 16, True, tiles, "resident", SMALL, "auto")),
                    (f, build_forward(2, 1, 96, 16, True, tiles, SMALL, "auto"))):
        full = Cluster(SMALL, ddr_bytes=ap.plan.ddr_bytes, functional=False).run(
            ap.programs, dsp_program=list(range(SMALL.dsps)), fast_forward=False)
        assert (res.cycles, res.stalls) == (full.cycles, full.stall_cycles())


RAW_DDR = Path(__file__).resolve().parent.parent / "platforms" / "mt3000-raw-ddr.toml"
# The Table 5 set (m = TABLE5_M), grouped by what the fast-forward sees. With the default tiles of both loop
# orders (c-stationary: k2 = 128, n2 = 768; a-resident: kg = 768, k2 = 256, n2 = 384) the shapes of a group
# leave the same tails (k and n modulo the tiles), so their programs are made of the same straight-line runs
# and the same tiles, and differ only in how many full tiles the loops walk. Each bundle-by-bundle run
# costs tens of CPU-seconds, so it runs on the smallest shape of each group; the test below it checks that
# every other shape's programs hold exactly the runs of that shape's.
TABLE5_GROUPS = {(4096, 4096): [(4096, 11008), (11008, 4096)], (6656, 6656): [(8192, 8192)]}


def _table5_programs(k, n):
    plat = load_platform(str(RAW_DDR))
    return plat, (build_a_resident(TABLE5_M, k, n, AResidentGemmTiles(), plat),
                  build_gemm(TABLE5_M, k, n, GemmTiles(), plat))


def _runs(gp, lanes):
    """The distinct straight-line runs of ``gp``'s program (their bundles' bytes)."""
    code = gp.program.code
    end = build_blocks(code, np.full(code.shape[0], code.shape[0]), lanes)[0]
    starts = [pc for pc in range(code.shape[0]) if end[pc] > pc and (pc == 0 or end[pc - 1] != end[pc])]
    return {code[pc:end[pc]].tobytes() for pc in starts}


@pytest.mark.slow
@pytest.mark.parametrize("k, n", list(TABLE5_GROUPS))
def test_table5_gemms_equal_the_bundle_by_bundle_run(k, n):
    """The Table 5 set on the raw-DDR platform, both loop orders: identical cycles, stalls, counters
    (one shape per group of TABLE5_GROUPS; test_table5_shapes_share_the_runs_of_the_checked_one ties the
    others to it)."""
    plat, programs = _table5_programs(k, n)
    for gp in programs:
        assert_same_gemm(gp, plat)


def test_table5_groups_are_the_table5_set():
    shapes = [s for kept, covered in TABLE5_GROUPS.items() for s in (kept, *covered)]
    assert sorted(shapes) == sorted((k, n) for k, n, *_ in TABLE5)


@pytest.mark.slow     # builds the big programs (kept between runs, and in CI taken from the main job's)
@pytest.mark.parametrize("kept, covered", list(TABLE5_GROUPS.items()))
def test_table5_shapes_share_the_runs_of_the_checked_one(kept, covered):
    plat, programs = _table5_programs(*kept)
    runs = [_runs(gp, plat.vector_lanes) for gp in programs]
    assert all(runs)
    for k, n in covered:
        assert [_runs(gp, plat.vector_lanes) for gp in _table5_programs(k, n)[1]] == runs, (k, n)


# ------------------------------------------------------------------------------------------
# errors and limits: the same message, at the same DSP, PC, unit and address
# ------------------------------------------------------------------------------------------
def _plain_block(n, reg=1, imm=0, op="vldh"):
    return "".join(f"{{ {op} v{16 + i % 12}, [s{reg}+{imm + 64 * i}] }}\n" for i in range(n))


@pytest.mark.parametrize("base, fails", [(0, False), (2, False), (1, True), (-64, True),
                                         (TINY.am_bytes - 64 * 19 - 2, False), (TINY.am_bytes - 64 * 19, True)])
def test_out_of_range_or_misaligned_addresses_fail_alike(base, fails):
    prog = parse(f"{{ smovi s1, {base} }}\n" + _plain_block(20) + "{ nop }\n" * 9 + "{ halt }", TINY)
    fast, full = both(TINY, 0, [prog])
    assert fast == full and (fast[0] == "error") == fails


def test_word_accesses_check_four_byte_alignment():
    for base in (0, 2, 4):
        prog = parse(f"{{ smovi s1, {base} }}\n" + _plain_block(20, op="vldw") + "{ nop }\n" * 9 + "{ halt }", TINY)
        fast, full = both(TINY, 0, [prog])
        assert fast == full
        assert (fast[0] == "error") == (base == 2)


@pytest.mark.parametrize("limit", [5, 15, 21, 22, 40])
def test_cycle_limit_inside_a_block_fails_alike(limit):
    prog = parse("{ smovi s1, 0 }\n" + _plain_block(20) + "{ nop }\n" * 10 + "{ halt }", TINY)
    fast, full = both(TINY, 0, [prog], max_cycles=limit)
    assert fast == full


def test_loops_and_entries_in_the_middle_of_a_run():
    # the loop jumps back into the middle of the plain run that starts after the smovi
    text = ("{ smovi s1, 3 }\n{ smovi s2, 0 }\n" + _plain_block(5, reg=2) + "top:\n" + _plain_block(12, reg=2)
            + "{ nop }\n" * 9 + "{ bdec s1, top }\n{ halt }")
    prog = parse(text, TINY)
    fast, full = both(TINY, 0, [prog])
    assert fast == full and fast[0] > 3 * 12


# --- random straight-line programs with loops and bad bases -----------------------------------
_PLAIN = ["vfma", "svbcast", "sldh", "ssth", "vldh", "vldw", "vstw", "vsth", "nop", "nopb"]


@st.composite
def random_program(draw):
    """Plain bundles in a loop, on bases that may be out of range or misaligned; every written
    register rotates so no write is in flight when it is read or rewritten."""
    b = ProgramBuilder(TINY)
    for r in range(1, 5):
        b.bundle(ins("smovi", r, draw(st.sampled_from([0, 2, 4, 64, -4, TINY.sm_bytes - 8, TINY.am_bytes - 1024,
                                                        TINY.am_bytes]))))
    b.bundle(ins("smovi", 5, draw(st.integers(1, 4))))
    b.label("top")
    for i in range(draw(st.integers(1, 40))):
        op = draw(st.sampled_from(_PLAIN))
        reg, imm = draw(st.integers(0, 4)), draw(st.integers(-8, 600)) * 2
        if op == "vfma":
            b.bundle(ins(op, i % 8, 60, 61))
        elif op == "svbcast":
            b.bundle(ins(op, 48 + i % 8, 0))
        elif op == "sldh":
            b.bundle(ins(op, 20 + i % 30, (reg, imm)))
        elif op == "ssth":
            b.bundle(ins(op, (reg, imm), 0))
        elif op in ("vldh", "vldw"):
            b.bundle(ins(op, 16 + i % 32, (reg, imm)))
        elif op in ("vstw", "vsth"):
            b.bundle(ins(op, (reg, imm), 62))
        else:
            b.bundle(ins("nop", "branch") if op == "nopb" else ins("nop"))
    b.nops(10)
    b.bundle(ins("bdec", 5, "top"))
    b.bundle(ins("halt"))
    return b.assemble()


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_program(), st.integers(30, 3000))
def test_random_programs_fail_or_count_alike(prog, limit):
    fast, full = both(TINY, 1024, [prog], max_cycles=limit)
    assert fast == full


def test_blocks_are_long_enough_to_matter():
    assert 1 < MIN_BUNDLES <= 16 and isa.N_UNITS == 8


# ------------------------------------------------------------------------------------------
# functional mode: the same data and counters, with the runs' data executed late (and on threads)
# ------------------------------------------------------------------------------------------
def functional_gemm(gp, platform, a, b, fast_forward, in_thread=False):
    out = {}

    def go():
        c = Cluster(platform, ddr_bytes=gp.plan.ddr_bytes, functional=True)
        c.write_ddr_u16(gp.plan.a_addr, a.view(np.uint16))
        c.write_ddr_u16(gp.plan.b_addr, b.view(np.uint16))
        stats = c.run([gp.program], init_sregs=gp.init_sregs, dsp_descriptors=gp.dsp_descriptors,
                      fast_forward=fast_forward)
        out["r"] = (counters(stats), c.read_ddr_u16(gp.plan.c_addr, a.shape[0] * b.shape[1]), c.sregs.copy(),
                    c.vregs.copy())

    if in_thread:           # not the main thread: waiting runs execute on this thread alone
        th = threading.Thread(target=go)
        th.start()
        th.join()
    else:
        go()
    return out["r"]


def _same_run(x, y):
    assert x[0] == y[0]
    for u, v in zip(x[1:], y[1:], strict=True):
        assert np.array_equal(u.view(np.uint8), v.view(np.uint8))


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("shape", [(96, 256, 96), (100, 200, 300), (7, 96, 500)])
def test_functional_gemms_equal_the_bundle_by_bundle_run(shape):
    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal(shape[:2]).astype(np.float16)
    b = rng.standard_normal(shape[1:]).astype(np.float16)
    gp = build_gemm(*shape, GemmTiles(mg=48, k2=64, n2=64), SMALL)
    full = functional_gemm(gp, SMALL, a, b, False)
    _same_run(functional_gemm(gp, SMALL, a, b, True), full)
    _same_run(functional_gemm(gp, SMALL, a, b, True, in_thread=True), full)
    assert np.array_equal(full[1].view(np.float16).reshape(shape[0], shape[2]), reference_gemm(a, b))
    ar = build_a_resident(*shape, AResidentGemmTiles(mg=48, kg=128, k2=64, n2=64), SMALL)
    full = functional_gemm(ar, SMALL, a, b, False)
    _same_run(functional_gemm(ar, SMALL, a, b, True), full)
    assert np.array_equal(full[1].view(np.float16).reshape(shape[0], shape[2]), reference_gemm_a_resident(a, b, 128))


def test_tiny_queues_and_sm_copy_buffers_change_no_bit(monkeypatch):
    """Queues of two entries and an SM copy buffer of one SM per DSP: the waiting work runs far more
    often (queue full, buffer full), and the product is the same."""
    monkeypatch.setattr(queues, "QUEUE", 2)
    monkeypatch.setattr(queues, "SM_COPY_BYTES", 0)
    shape = (100, 200, 300)
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shape[:2]).astype(np.float16)
    b = rng.standard_normal(shape[1:]).astype(np.float16)
    for gp, want in ((build_gemm(*shape, GemmTiles(mg=48, k2=64, n2=64), SMALL), reference_gemm(a, b)),
                     (build_a_resident(*shape, AResidentGemmTiles(mg=48, kg=128, k2=64, n2=64), SMALL),
                      reference_gemm_a_resident(a, b, 128))):
        _same_run(functional_gemm(gp, SMALL, a, b, True), functional_gemm(gp, SMALL, a, b, False))
        got = functional_gemm(gp, SMALL, a, b, True)[1]
        assert np.array_equal(got.view(np.float16).reshape(shape[0], shape[2]), want)


def test_functional_attention_equals_the_bundle_by_bundle_run(monkeypatch):
    rng = np.random.default_rng(5)
    tiles = AttentionTiles(br=32, bc=32, d=16, br_prime=8, bc_prime=16)
    q, k, v = (rng.standard_normal((h, 96, 16)).astype(np.float16) for h in (2, 1, 1))
    do = rng.standard_normal(q.shape).astype(np.float16)
    results = {}
    for ff in ("1", "0"):
        monkeypatch.setenv("MTEMU_FAST_FORWARD", ff)
        fwd = run_attention(q, k, v, tiles=tiles, platform=SMALL)
        bwd = run_attention_backward(q, k, v, fwd.o, do, fwd.saved, tiles=tiles, platform=SMALL)
        results[ff] = [fwd.cycles, fwd.stalls, bwd.cycles, bwd.stalls] + [
            x.view(np.uint8) for x in (fwd.o, fwd.saved.p, fwd.saved.lse, bwd.dq, bwd.dk, bwd.dv)]
    for x, y in zip(results["1"], results["0"], strict=True):
        assert np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y


@st.composite
def random_functional_program(draw):
    """Plain bundles around a loop with scalar loads feeding broadcasts, scalar stores, base changes,
    local DMAs and exp (not plain in functional mode): every reason the waiting runs execute."""
    b = ProgramBuilder(TINY)
    descs = [b.descriptor("SM", "AM", 2, 64, 128, 256, "copy"), b.descriptor("AM", "SM", 1, 128, 128, 128, "copy")]
    for r in range(1, 5):
        b.bundle(ins("smovi", r, draw(st.sampled_from([0, 64, 512, 2048, TINY.sm_bytes - 2048]))))
    b.bundle(ins("smovi", 5, draw(st.integers(1, 3))))
    b.label("top")
    for i in range(draw(st.integers(1, 30))):
        op = draw(st.sampled_from(_PLAIN + ["smovi", "dma", "vexp"]))
        reg, imm = draw(st.integers(1, 4)), draw(st.integers(0, 300)) * 4
        if op == "vfma":
            b.bundle(ins(op, i % 8, 16 + i % 24, 48 + i % 8))
        elif op == "svbcast":
            b.bundle(ins(op, 48 + i % 8, 20 + draw(st.integers(0, 29))))
        elif op == "sldh":
            b.bundle(ins(op, 20 + i % 30, (reg, imm)))
        elif op == "ssth":
            b.bundle(ins(op, (reg, imm), 20 + draw(st.integers(0, 29))))
        elif op in ("vldh", "vldw"):
            b.bundle(ins(op, 16 + i % 24, (reg, imm)))
        elif op in ("vstw", "vsth"):
            b.bundle(ins(op, (reg, imm), i % 8))
        elif op == "smovi":
            b.bundle(ins("smovi", reg, draw(st.sampled_from([0, 128, 1024]))))
        elif op == "dma":
            b.bundle(ins("dma", 0, draw(st.sampled_from(descs)), (0, 256), (0, 512)))
            b.bundle(ins("dmawait", 0))
        elif op == "vexp":
            b.bundle(ins("vexp", 56 + i % 4, 16 + i % 24))
        else:
            b.bundle(ins("nop", "branch") if op == "nopb" else ins("nop"))
        if op in ("vfma", "vexp", "vldh", "vldw", "svbcast", "sldh"):
            b.nops(9)       # its result lands before anything may read or rewrite it
    b.nops(10)
    b.bundle(ins("bdec", 5, "top"))
    b.bundle(ins("halt"))
    return b.assemble()


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_functional_program(), st.integers(0, 2**32 - 1))
def test_random_functional_programs_compute_alike(prog, seed):
    rng = np.random.default_rng(seed)
    fill = rng.standard_normal(TINY.dsps * (TINY.sm_bytes + 4096) // 2).astype(np.float16).view(np.uint8)

    def load(c):
        n_sm = TINY.sm_bytes
        for d in range(TINY.dsps):
            c.region("SM", 0, n_sm, d)[:] = fill[d * n_sm:(d + 1) * n_sm]
            c.region("AM", 0, 4096, d)[:] = fill[TINY.dsps * n_sm + d * 4096:][:4096]
    _assert_fast_equals_full(TINY, 0, prog, load)


def _assert_fast_equals_full(platform, ddr_bytes, prog, load) -> None:
    """Run ``prog`` fast-forwarded and bundle by bundle on clusters ``load`` filled alike: the same
    counters (or error) and, bit for bit, the same memory and registers."""
    out = []
    for ff in (True, False):
        c = Cluster(platform, ddr_bytes=ddr_bytes, functional=True)
        load(c)
        try:
            stats = c.run([prog], fast_forward=ff)
        except MachineError as exc:
            out.append(("error", str(exc)))
        else:
            out.append((counters(stats), c.mem.copy(), c.sregs.copy(), c.vregs.copy()))
    fast, full = out
    assert fast[0] == full[0]
    if fast[0] != "error":
        for x, y in zip(fast[1:], full[1:], strict=True):
            assert np.array_equal(x.view(np.uint8), y.view(np.uint8))


@st.composite
def random_dma_program(draw):
    """Runs of vector work between DMAs of every kind the queue treats differently: into AM (they wait
    with the runs: a copy, a broadcast out of DDR or GSM), into SM, GSM or DDR (they do not, and out
    of AM, a copy or a reduce-add, they make the DSP's runs execute first), over address ranges that
    overlap the runs' loads and stores, issued by every DSP of a three-DSP cluster sharing DDR and GSM."""
    b = ProgramBuilder(THREE)
    descs = [b.descriptor("DDR", "AM", 2, 256, 512, 256, "broadcast"),
             b.descriptor("GSM", "AM", 1, 512, 512, 512, "broadcast"),
             b.descriptor("DDR", "AM", 2, 256, 256, 256, "copy"),
             b.descriptor("AM", "DDR", 1, 256, 256, 256, "reduce_add"),
             b.descriptor("AM", "DDR", 2, 256, 256, 256, "copy"), b.descriptor("AM", "GSM", 1, 512, 512, 512, "copy"),
             b.descriptor("DDR", "SM", 1, 256, 256, 256, "copy"), b.descriptor("SM", "AM", 1, 256, 256, 256, "copy"),
             b.descriptor("GSM", "DDR", 1, 512, 512, 512, "copy")]
    for r in range(1, 4):
        b.bundle(ins("smovi", r, draw(st.sampled_from([0, 256, 512, 1024]))))
    b.bundle(ins("smovi", 5, draw(st.integers(1, 3))))
    b.label("top")
    for _ in range(draw(st.integers(1, 24))):
        kind = draw(st.sampled_from(["run", "run", "dma"]))
        if kind == "dma":
            src, dst = draw(st.sampled_from([0, 256, 512, 1024])), draw(st.sampled_from([0, 256, 512, 1024]))
            b.bundle(ins("dma", 0, draw(st.sampled_from(descs)), (0, src), (0, dst)))
            b.bundle(ins("dmawait", 0))
            continue
        for k in range(MIN_BUNDLES + draw(st.integers(0, 8))):      # long enough to be a run
            op = draw(st.sampled_from(["vfma", "svbcast", "sldh", "vldh", "vldw", "vstw"]))
            reg, imm = draw(st.integers(1, 3)), draw(st.integers(0, 160)) * 4
            if op == "vfma":
                b.bundle(ins(op, k % 8, 16 + k % 8, 48 + k % 8))
            elif op == "svbcast":
                b.bundle(ins(op, 48 + k % 8, 20 + k % 8))
            elif op == "sldh":
                b.bundle(ins(op, 20 + k % 8, (reg, imm)))
            elif op in ("vldh", "vldw"):
                b.bundle(ins(op, 16 + k % 8, (reg, imm)))
            else:
                b.bundle(ins(op, (reg, imm), k % 8))
            b.nops(9)
    b.nops(10)
    b.bundle(ins("bdec", 5, "top"))
    b.bundle(ins("halt"))
    return b.assemble()


THREE = DEFAULT.with_overrides(dsps=3, vector_lanes=32)
THREE_MEM = Cluster(THREE, ddr_bytes=8192, functional=True).mem.size      # every memory of it, in halves


@pytest.mark.slow     # > 5 s: the full suite runs it, the quick layer does not
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dma_program(), st.integers(0, 2**32 - 1))
def test_random_programs_with_every_kind_of_dma_compute_alike(prog, seed):
    # only as many values as the memory holds (the same leading values of the seed's stream as a longer
    # draw): drawing the 8 M normals the memory never held was most of an example's time
    fill = np.random.default_rng(seed).standard_normal(THREE_MEM).astype(np.float16).view(np.uint16)

    def load(c):
        c.mem[:] = fill
    _assert_fast_equals_full(THREE, 8192, prog, load)


@pytest.mark.parametrize("n", [1, 5, 24, 48, 64])
def test_the_flush_order_spreads_any_run_of_dsps_over_the_threads(n):
    """A parallel flush splits its loop into equal contiguous parts, one a thread: over
    :func:`queues.spread_order`, each of 2, 4 or 8 parts then holds DSPs from all over the range, and any
    contiguous group of DSPs (the only ones with work in some flushes) is shared within one DSP."""
    order = queues.spread_order(n).tolist()
    assert sorted(order) == list(range(n))
    for parts in (2, 4, 8):
        if n % parts:
            continue
        size = n // parts
        part_of = {d: i // size for i, d in enumerate(order)}
        for lo in range(n):
            for hi in range(lo + 1, n + 1):
                counts = np.bincount([part_of[d] for d in range(lo, hi)], minlength=parts)
                assert counts.max() - counts.min() <= 1, (parts, lo, hi)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dma_program(), st.integers(0, 2**32 - 1))
def test_the_loop_skips_must_flush_only_where_it_could_ask_nothing(prog, seed):
    """:func:`queues.may_flush` (the machine loop's test before it calls :func:`queues.must_flush`) is
    False only at bundles where must_flush asks for no flush even with every DSP's queue full of work
    over every memory, whatever the registers hold; and True at every bundle that touches waiting state
    or issues a DMA."""
    code, descs, _lo, _hi, desc_off, _blocks, tables = machine._prepare([prog], [0] * THREE.dsps, THREE, True, True)
    touches = tables[0]
    dsps = THREE.dsps
    qn = np.full(dsps, queues.QUEUE, np.int64)
    qrange = np.zeros((dsps, queues.QUEUE, MAX_CLASSES, 3), np.int64)
    for space in range(4):
        qrange[:, :, space] = (space, -(1 << 60), 1 << 60)
    rng = np.random.default_rng(seed)
    sregs = rng.integers(0, 1 << 16, size=(dsps, THREE.scalar_registers)).astype(np.int64)
    for p in range(code.shape[0]):
        may = queues.may_flush(p, code, touches)
        assert may == (bool(touches[p]) or bool((code[p, :, 0] == isa.OP_DMA).any())), p
        for d in range(dsps):
            need = queues.must_flush(d, p, code, descs, desc_off, touches, sregs, qn, qrange)
            assert may or need == 0, (p, d, need)
            assert need > 0 or not touches[p], (p, d)          # with everything waiting, a touch asks

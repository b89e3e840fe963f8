"""A memory-safe, bounded machine: extreme registers, absurd descriptors, slow DMA, runaway loops
and chunked runs give a right result or a MachineError naming DSP and PC, never a crash."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mtemu.machine as machine
from mtemu import isa
from mtemu.assembler import parse
from mtemu.errors import AssemblyError, MachineError, PlatformError
from mtemu.kernels.gemm import GemmTiles, build_gemm, gemm_timing
from mtemu.machine import Cluster
from mtemu.platform import DEFAULT, Platform

ONE = DEFAULT.with_overrides(dsps=1)
TWO = DEFAULT.with_overrides(dsps=2)
PAD = "{ nop }\n" * 9
INT64_MAX = 2 ** 63 - 1
INT64_MIN = -(2 ** 63)


def _run(text, platform=ONE, ddr=4096, functional=True, **kw):
    prog = parse(text, platform)
    return Cluster(platform, ddr_bytes=ddr, functional=functional).run([prog], **kw)


# --- address arithmetic cannot overflow -----------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["vldh v1, [s1+{o}]", "vldw v1, [s1+{o}]", "vsth [s1+{o}], v1", "sldh s2, [s1+{o}]",
                        "ssth [s1+{o}], s2"]),
       st.one_of(st.integers(INT64_MIN, INT64_MAX), st.sampled_from([INT64_MAX - 1, INT64_MAX - 3, INT64_MIN,
                                                                     INT64_MIN + 2, 2 ** 62, -2])),
       st.integers(-2 ** 20, 2 ** 20).map(lambda x: x * 4), st.booleans())
def test_extreme_register_addresses_are_refused_not_wrapped(op, reg, offset, functional):
    # a register near 2**63 plus a small size used to wrap negative, pass the bounds check and
    # index far outside the machine's memory (a segfault)
    text = "{ " + op.format(o=offset) + " }\n" + PAD + "{ halt }"
    try:
        stats = _run(text, functional=functional, init_sregs={0: {1: reg}})
    except MachineError as exc:
        assert "DSP 0, PC 0" in str(exc)
    else:
        addr = reg + offset
        assert 0 <= addr < max(ONE.am_bytes, ONE.sm_bytes) and stats.cycles == 11


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2 ** 62), st.integers(2, 2 ** 62).map(lambda x: x // 2 * 2), st.integers(0, 2 ** 62),
       st.integers(0, 2 ** 62), st.sampled_from(["SM", "AM", "GSM", "DDR"]),
       st.integers(INT64_MIN, INT64_MAX).map(lambda x: x // 4 * 4))
def test_absurd_descriptors_are_named_errors(rows, row_bytes, sstride, dstride, space, reg):
    prog = parse(".desc d src=DDR dst=AM rows=1 row_bytes=64 src_stride=64 dst_stride=64\n"
                 "{ dma 0, d, [s1+0], [s0+0] }\n{ dmawait 0 }\n{ halt }", TWO)
    table = prog.descriptors.copy()
    table[0, isa.D_DST] = isa.SPACES.index(space)
    table[0, isa.D_ROWS], table[0, isa.D_ROWB] = rows, row_bytes
    table[0, isa.D_SSTR], table[0, isa.D_DSTR] = sstride, dstride
    cluster = Cluster(TWO, ddr_bytes=1 << 16)
    try:
        cluster.run([prog], dsp_descriptors={1: table}, init_sregs={1: {1: reg}})
    except MachineError as exc:
        msg = str(exc)
        assert "DSP 1" in msg and ("PC" in msg or "descriptor 0" in msg), msg
    else:    # only an empty transfer, or one that fits the memories, can run
        assert rows == 0 or (0 <= reg and reg + (rows - 1) * sstride + row_bytes <= 1 << 16)


def test_a_huge_descriptor_names_dsp_pc_and_descriptor():
    prog = parse(".desc d src=DDR dst=AM rows=1 row_bytes=64 src_stride=64 dst_stride=64\n"
                 "{ smovi s1, 0 }\n{ dma 0, d, [s1+0], [s0+0] }\n{ dmawait 0 }\n{ halt }", TWO)
    table = prog.descriptors.copy()
    table[0, isa.D_ROWS], table[0, isa.D_SSTR] = 2 ** 40, 2 ** 40
    with pytest.raises(MachineError, match=r"DSP 1, PC 1: DMA descriptor 0 spans more than any memory"):
        Cluster(TWO, ddr_bytes=4096).run([prog], dsp_descriptors={1: table})


def test_far_address_offsets_are_refused_by_assembler_and_machine():
    with pytest.raises(AssemblyError, match="beyond any memory"):
        parse("{ vldh v1, [s1+" + str(2 ** 50) + "] }\n" + PAD + "{ halt }", ONE)
    prog = parse("{ vldh v1, [s1+0] }\n" + PAD + "{ halt }", ONE)
    prog.code[0, isa.VLDST1, isa.F_IMM0] = INT64_MIN
    with pytest.raises(MachineError, match="beyond any memory"):
        Cluster(ONE, ddr_bytes=0).run([prog])


# --- time cannot overflow; limits tell a loop from a slow DMA --------------------------------
def test_a_dma_that_would_end_past_the_limit_is_too_slow_not_a_loop():
    slow = DEFAULT.with_overrides(dsps=1, ddr_bandwidth=1e6, dma_latency_cycles=10 ** 9)
    text = (".desc d src=DDR dst=AM rows=1 row_bytes=65536 src_stride=65536 dst_stride=65536\n"
            "{ dma 0, d, [s0+0], [s0+0] }\n{ dmawait 0 }\n{ halt }")
    with pytest.raises(MachineError, match=r"DSP 0, PC 0.*DMA of 65536 bytes on the DDR server would end at "
                                           r"cycle \d+, past the cycle limit 1000000000: this one transfer takes "
                                           r"\d+ cycles from issue, too slow, not a loop"):
        _run(text, slow, ddr=1 << 17, max_cycles=10 ** 9)


def test_cycle_limit_says_loop_or_waiting_for_dma():
    with pytest.raises(MachineError, match=r"cycle limit 5000 exceeded \(DSP 0 issued \d+ bundles without "
                                           r"halting: a loop that never ends\?"):
        _run("top:\n{ br top }\n{ halt }", max_cycles=5000)
    # many transfers, each within the limit, that together outlast it: waiting, not looping
    text = (".desc d src=DDR dst=AM rows=1 row_bytes=4096 src_stride=4096 dst_stride=4096\n"
            "{ smovi s1, 1000 }\ntop:\n{ dma 0, d, [s0+0], [s0+0] }\n{ dmawait 0 }\n{ bdec s1, top }\n{ halt }")
    with pytest.raises(MachineError, match=r"waiting for DMA: transfers too slow for the limit, not a loop"):
        _run(text, ddr=8192, max_cycles=200_000)


@pytest.mark.parametrize("bad", [0, -5, 2 ** 61, 1.5, "10", True, float("nan")])
def test_limits_are_checked(bad):
    with pytest.raises(MachineError, match="max_cycles"):
        _run("{ halt }", max_cycles=bad)


def test_wall_clock_guard_stops_a_runaway_program(monkeypatch):
    monkeypatch.setattr(machine, "CHUNK_BUNDLES", 1 << 16)
    with pytest.raises(MachineError, match=r"wall-clock limit of 0.2 s reached at emulated cycle \d+ .*loop"):
        _run("top:\n{ br top }\n{ halt }", max_cycles=2 ** 59, max_seconds=0.2)


def test_chunked_runs_are_identical(monkeypatch):
    whole = gemm_timing(300, 256, 400)
    monkeypatch.setattr(machine, "CHUNK_BUNDLES", 97)     # cut slices anywhere, many times
    cut = gemm_timing(300, 256, 400)
    assert (cut.cycles, cut.stalls, cut.ddr_bytes) == (whole.cycles, whole.stalls, whole.ddr_bytes)


# --- the platform a cluster runs on is checked --------------------------------------------
@pytest.mark.parametrize("field, value", [("clock_hz", float("nan")), ("ddr_bandwidth", 1e-30),
                                          ("ddr_bandwidth", float("inf")), ("dma_latency_cycles", 10 ** 18),
                                          ("dsps", 0), ("vector_lanes", 3)])
def test_a_cluster_refuses_a_bad_platform_built_directly(field, value):
    from dataclasses import replace
    with pytest.raises(PlatformError, match=field):
        Cluster(replace(DEFAULT, **{field: value}), ddr_bytes=0)


def test_a_cluster_refuses_what_is_not_a_platform():
    with pytest.raises(PlatformError, match="expected an mtemu Platform, got dict"):
        Cluster({"dsps": 2}, ddr_bytes=0)


def test_a_functional_cluster_larger_than_the_host_says_how_much(monkeypatch):
    import rtcommon.hostmem as hostmem
    monkeypatch.setattr(hostmem, "available_bytes", lambda: 1 << 20)
    with pytest.raises(MachineError, match=r"needs \d+\.\d\d MiB of host memory; 1\.00 MiB is available"):
        Cluster(DEFAULT, ddr_bytes=1 << 20, functional=True)
    Cluster(DEFAULT, ddr_bytes=1 << 30, functional=False)   # timing mode holds no data


def test_initial_registers_are_checked():
    prog = parse("{ halt }", ONE)
    with pytest.raises(MachineError, match="64-bit integer"):
        Cluster(ONE, ddr_bytes=0).run([prog], init_sregs={0: {1: 2 ** 64}})
    with pytest.raises(MachineError, match="DSP 5"):
        Cluster(ONE, ddr_bytes=0).run([prog], init_sregs={5: {1: 0}})
    assert isinstance(Platform(), Platform) and np.int64(0) == 0



_GEMM = build_gemm(48, 64, 64, GemmTiles(mg=48, k2=64, n2=64), DEFAULT).program     # every kind of op
_VALID = type(_GEMM)(_GEMM.code.copy(), _GEMM.descriptors, dict(_GEMM.labels), list(_GEMM.descriptor_names))
_VALID.code[0, isa.SBR] = [isa.OP_NOP, 0, 0, 0, 0, isa.ST_BRANCH, 0]                 # and a nop
_VALUES = (-1, 0, 1, 2, 3, 7, 63, 64, 65, 200, isa.N_OPCODES, isa.OP_HALT, isa.OP_NOP, isa.OP_DMA, isa.OP_SLDH,
           isa.OP_BR, _VALID.bundles, 1 << 20, -(1 << 20))


def _named_checks_pass(prog) -> bool:
    original = machine._raw_ok
    machine._raw_ok = lambda *args: False          # the named checks alone
    try:
        machine._validate_raw(prog, DEFAULT)
        return True
    except MachineError:
        return False
    finally:
        machine._raw_ok = original


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_the_one_pass_check_refuses_exactly_what_the_named_checks_refuse():
    """The machine first checks raw code in one jitted pass and names a problem with the vectorised
    checks only when that pass fails: both must refuse the same programs. Every field of one slot of
    each opcode in a GEMM's program (and of an empty slot) is set to each of a set of edge values."""
    allowed, limits = machine._operand_rules(DEFAULT)
    ops = _VALID.code[:, :, isa.F_OP]
    slots = [tuple(np.argwhere(ops == op)[0]) for op in np.unique(ops)]
    refused = 0
    for b, u in slots:
        for f in range(isa.N_FIELDS):
            for value in _VALUES:
                code = _VALID.code.copy()
                code[b, u, f] = value
                prog = type(_VALID)(code, _VALID.descriptors, dict(_VALID.labels), list(_VALID.descriptor_names))
                fast = machine._raw_ok(code, prog.descriptors.shape[0], allowed, limits, machine._ADDRESSING_OPS,
                                       machine._TARGET_OPS, machine._SCALAR_WRITE_OPS)
                assert fast == _named_checks_pass(prog), (int(ops[b, u]), f, value)
                refused += not fast
    assert len(slots) > 10 and refused > 100          # the edge values do reach the checks


def test_host_gsm_reads_are_bounds_and_alignment_checked():
    c = Cluster(DEFAULT, ddr_bytes=1 << 20, functional=True)
    gsm = DEFAULT.gsm_bytes
    c.region("GSM", 0, 8)[:] = np.array([1.5, -2.0], dtype=np.float32).view(np.uint8)
    assert c.read_gsm_f32(0, 2).tolist() == [1.5, -2.0]
    assert c.read_gsm_f32(gsm - 4, 1).shape == (1,)
    with pytest.raises(MachineError, match="outside"):
        c.read_gsm_f32(gsm - 4, 2)                # would read on into DDR
    with pytest.raises(MachineError, match="outside"):
        c.read_gsm_f32(-4, 1)                     # would read AM
    with pytest.raises(MachineError, match="unaligned"):
        c.read_gsm_f32(2, 1)

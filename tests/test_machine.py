import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtemu import isa, machine
from mtemu.assembler import ProgramBuilder, ins, parse
from mtemu.errors import MachineError, MtemuError
from mtemu.machine import Cluster
from mtemu.platform import DEFAULT

SMALL = DEFAULT.with_overrides(dsps=2)


def run_text(text, platform=SMALL, functional=True, ddr=4096, **kw):
    prog = parse(text, platform)
    c = Cluster(platform, ddr_bytes=ddr, functional=functional)
    return c.run([prog], **kw), c


def test_straight_line_bundles_take_one_cycle_each():
    for n in (1, 5, 40):
        stats, _ = run_text("{ smovi s1, 1 }\n" * n + "{ halt }")
        assert stats.cycles == n + 1
        assert stats.busy_cycles()["SMAC1"] == n * SMALL.dsps


def test_nop_bundles_count_as_latency_or_branch_stalls():
    stats, _ = run_text("{ nop }\n{ nop }\n{ nop branch }\n{ halt }")
    s = stats.stall_cycles()
    assert s["latency"] == 2 * SMALL.dsps and s["branch"] == SMALL.dsps
    assert stats.cycles == 4


def test_taken_branch_costs_the_branch_delay():
    # loop body of 1 bundle executed 4 times; 3 taken branches
    stats, c = run_text("{ smovi s1, 4 }\ntop:\n{ bdec s1, top }\n{ halt }")
    assert stats.cycles == 1 + 4 + 3 * SMALL.latencies.branch_delay + 1
    assert c.sregs[0, 1] == 0


@pytest.mark.parametrize("nbytes", [64, 4096, 30000])
def test_dma_takes_latency_plus_bytes_over_bandwidth(nbytes):
    plat = DEFAULT.with_overrides(dsps=1)
    text = (f".desc d src=DDR dst=AM rows=1 row_bytes={nbytes} src_stride={nbytes} dst_stride={nbytes} mode=copy\n"
            "{ dma 0, d, [s0+0], [s0+0] }\n{ dmawait 0 }\n{ halt }")
    stats, _ = run_text(text, plat, ddr=32768)
    bpc = plat.ddr_bandwidth / plat.clock_hz
    # issued at cycle 0; one row, so one row overhead
    done = math.ceil(plat.dma_latency_cycles + nbytes / bpc + plat.dma_row_overhead_cycles)
    # the wait bundle issues at cycle 1 and releases at completion; halt takes one more cycle
    assert stats.cycles == max(done, 2) + 1
    assert stats.stall_cycles()["dma_wait"] == done - 2


def test_ddr_bandwidth_is_shared_first_come_first_served():
    plat = DEFAULT.with_overrides(dsps=4)
    nbytes = 17070
    text = (f".desc d src=DDR dst=AM rows=1 row_bytes={nbytes} src_stride=0 dst_stride={nbytes} mode=copy\n"
            "{ dma 0, d, [s0+0], [s0+0] }\n{ dmawait 0 }\n{ halt }")
    stats, _ = run_text(text, plat, functional=False, ddr=32768)
    per = nbytes / (plat.ddr_bandwidth / plat.clock_hz) + plat.dma_row_overhead_cycles
    # four equal transfers issued together finish one after another on the DDR server
    assert stats.cycles == math.ceil(plat.dma_latency_cycles + 4 * per) + 1


def test_functional_and_timing_modes_count_identical_cycles():
    text = """
.desc d src=DDR dst=AM rows=2 row_bytes=384 src_stride=384 dst_stride=512 mode=broadcast
{ dma 0, d, [s0+0], [s0+0] | smovi s1, 3 }
{ dmawait 0 }
top:
{ vldh v1, [s0+0] | sldh s4, [s0+0] }
{ nop }
{ nop }
{ nop }
{ nop }
{ nop }
{ nop }
{ svbcast v2, s4 }
{ nop }
{ nop }
{ nop }
{ nop }
{ vfma v3, v1, v2 }
{ nop }
{ nop }
{ nop }
{ nop }
{ nop }
{ bdec s1, top }
{ vsth [s0+2048], v3 | barrier }
{ halt }
"""
    a, _ = run_text(text, functional=True)
    b, _ = run_text(text, functional=False)
    assert a.cycles == b.cycles
    assert np.array_equal(a.per_dsp, b.per_dsp)


def test_vector_load_mac_store_values():
    lanes = SMALL.vector_lanes
    x = (np.arange(lanes) % 17 - 8).astype(np.float16)
    text = f"""
.desc d src=DDR dst=AM rows=1 row_bytes={2 * lanes} src_stride=0 dst_stride=0 mode=copy
{{ dma 0, d, [s0+0], [s0+0] | smovi s4, 0x4200 }}
{{ dmawait 0 }}
{{ vldh v1, [s0+0] | svbcast v2, s4 }}
""" + "{ nop }\n" * 8 + "{ vfma v3, v1, v2 }\n" + "{ nop }\n" * 5 + "{ vfma v3, v1, v1 }\n" + "{ nop }\n" * 5 + \
        "{ vsth [s0+4096], v3 | vstw@VLDST2 [s0+8192], v3 }\n{ halt }"
    prog = parse(text, SMALL)
    c = Cluster(SMALL, ddr_bytes=4096)
    c.write_ddr_u16(0, x.view(np.uint16))
    c.run([prog])
    am = int(c.bases[1]) // 2
    half = c.mem[am + 2048: am + 2048 + lanes].view(np.float16)
    full = c.mem[am + 4096: am + 4096 + 2 * lanes].view(np.float32)
    expect = x.astype(np.float32) * np.float32(3.0) + x.astype(np.float32) ** 2   # 0x4200 is 3.0
    assert np.array_equal(full, expect)
    assert np.array_equal(half, expect.astype(np.float16))


def test_out_of_range_address_names_dsp_pc_unit_address():
    text = "{ smovi s5, 65536 }\n{ sldh s1, [s5+0] }\n" + "{ nop }\n" * 7 + "{ halt }"
    with pytest.raises(MachineError,
                       match=r"DSP 0, PC 1, unit SLDST: access of 2 bytes at SM address 65536 is outside the memory"):
        run_text(text)


def test_misaligned_vector_store():
    with pytest.raises(MachineError, match=r"unit VLDST1: unaligned AM address 6"):
        run_text("{ vstw [s0+6], v1 }\n{ halt }")


def test_dma_past_the_end_of_ddr():
    text = (".desc d src=DDR dst=AM rows=4 row_bytes=256 src_stride=2048 dst_stride=256 mode=copy\n"
            "{ dma 0, d, [s0+0], [s0+0] }\n{ dmawait 0 }\n{ halt }")
    with pytest.raises(MachineError, match=r"unit SIEU: access of 6400 bytes at DDR address 0 is outside the memory"):
        run_text(text, ddr=4096)


def test_deadlock_is_reported():
    # DSP 0 waits at a barrier, DSP 1 halts without reaching it
    text = "{ bnz s3, out }\n{ barrier }\nout:\n{ halt }"
    prog = parse(text, SMALL)
    c = Cluster(SMALL, ddr_bytes=0)
    with pytest.raises(MachineError, match=r"deadlock: DSP\(s\) 0 wait at a barrier \(PC 1\) that halted DSP\(s\) 1 "):
        c.run([prog], init_sregs={1: {3: 1}})


def test_barrier_aligns_clocks():
    text = ("{ bnz s3, slow }\n{ barrier }\n{ halt }\nslow:\n" + "{ nop }\n" * 20
            + "{ br back }\nback:\n{ barrier }\n{ halt }")
    prog = parse(text, SMALL)
    stats = Cluster(SMALL, ddr_bytes=0).run([prog], init_sregs={1: {3: 1}})
    assert stats.stall_cycles()["barrier"] > 20


def test_cycle_limit_catches_infinite_loop():
    with pytest.raises(MachineError, match="cycle limit 1000 exceeded"):
        run_text("top:\n{ br top }\n{ halt }", max_cycles=1000)


def test_raw_program_with_bad_register_is_refused_before_running():
    prog = parse("{ vfma v1, v2, v3 }\n{ nop }\n{ nop }\n{ nop }\n{ nop }\n{ nop }\n{ halt }", SMALL)
    prog.code[0, isa.VMAC, isa.F_R1] = 99
    with pytest.raises(MachineError, match="vfma operand r1 = 99 out of range"):
        Cluster(SMALL, ddr_bytes=0).run([prog])
    prog.code[0, isa.VMAC, isa.F_OP] = 77
    with pytest.raises(MachineError, match="unknown opcode 77"):
        Cluster(SMALL, ddr_bytes=0).run([prog])


def test_frozen_programs_are_prepared_once_and_edited_ones_are_not_stale():
    text = "{ smovi s1, 7 }\n{ ssth [s0+16], s1 }\n{ halt }"
    prog = parse(text, SMALL)
    c = Cluster(SMALL, ddr_bytes=0)
    c.run([prog])
    assert int(c.region("SM", 16, 2)[0:2].view(np.uint16)[0]) == 7
    prog.code[0, isa.SMAC1, isa.F_IMM0] = 9          # a program that is not frozen may change
    c.run([prog])
    assert int(c.region("SM", 16, 2)[0:2].view(np.uint16)[0]) == 9
    assert not any(prog is p for entry in machine._PREPARED.values() for p in entry[0])
    frozen = parse(text, SMALL).freeze()
    assert frozen.frozen and not frozen.code.flags.writeable
    with pytest.raises(ValueError):
        frozen.code[0, isa.SMAC1, isa.F_IMM0] = 9
    for _ in range(2):
        c.run([frozen])
        assert int(c.region("SM", 16, 2)[0:2].view(np.uint16)[0]) == 7
    assert sum(frozen is p for entry in machine._PREPARED.values() for p in entry[0]) == 1


# --- never a crash: random programs and random addresses ----------------------------------
_OPS = ["vfma", "svbcast", "saddi", "sadd", "smovi", "sldh", "ssth", "vldh", "vldw", "vstw", "vsth", "nop"]


@st.composite
def random_program(draw):
    n = draw(st.integers(1, 12))
    bundles = []
    for _ in range(n):
        op = draw(st.sampled_from(_OPS))
        r = lambda hi=8: draw(st.integers(0, hi))  # noqa: E731
        addr = (r(8), draw(st.integers(-70000, 800000)))
        if op == "vfma":
            bundles.append([ins(op, r(), r(), r())])
        elif op == "svbcast":
            bundles.append([ins(op, r(), r())])
        elif op == "saddi":
            bundles.append([ins(op, r() + 1, r(), draw(st.integers(-10**6, 10**6)))])
        elif op == "sadd":
            bundles.append([ins(op, r() + 1, r(), r())])
        elif op == "smovi":
            bundles.append([ins(op, r() + 1, draw(st.integers(-10**6, 10**6)))])
        elif op in ("sldh", "vldh", "vldw"):
            bundles.append([ins(op, r() + 1 if op == "sldh" else r(), addr)])
        elif op in ("ssth",):
            bundles.append([ins(op, addr, r())])
        elif op in ("vstw", "vsth"):
            bundles.append([ins(op, addr, r())])
        else:
            bundles.append([ins("nop")])
        bundles.extend([[ins("nop")]] * 9)      # respect every latency
    bundles.append([ins("halt")])
    return bundles


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_program(), st.booleans())
def test_random_programs_give_a_result_or_a_named_error(bundles, functional):
    b = ProgramBuilder(SMALL)
    for bundle in bundles:
        b.bundle(*bundle)
    prog = b.assemble()
    c = Cluster(SMALL, ddr_bytes=1024, functional=functional)
    try:
        stats = c.run([prog])
    except MachineError as exc:
        assert "DSP" in str(exc) and "PC" in str(exc)
    else:
        assert stats.cycles == len(bundles)


@settings(max_examples=40, deadline=None)
@given(st.integers(-10**7, 10**8), st.integers(1, 64), st.integers(0, 5000), st.sampled_from(["SM", "AM", "GSM",
                                                                                              "DDR"]))
def test_random_dma_addresses_never_crash(addr, rows, stride, space):
    text = (f".desc d src=DDR dst={space} rows={rows} row_bytes=64 src_stride={stride // 2 * 2} "
            f"dst_stride={max(64, stride // 2 * 2)} mode=copy\n"
            "{ smovi s5, " + str(addr // 2 * 2) + " }\n{ dma 0, d, [s0+0], [s5+0] }\n{ dmawait 0 }\n{ halt }")
    try:
        run_text(text, ddr=65536)
    except MtemuError as exc:
        assert "DSP 0" in str(exc) or "DSP 1" in str(exc)


def test_programs_back_to_back_in_one_array_are_linked_without_a_copy():
    """Programs whose code lies back to back in one array (as the attention kernels build theirs) run
    from that memory, read-only, with the statistics of the same programs in arrays of their own; out
    of order, or apart, they are copied as before."""
    from mtemu.assembler import Program
    plat = DEFAULT.with_overrides(dsps=3)
    built = []
    for k in range(3):
        b = ProgramBuilder(plat)
        d = b.descriptor("DDR", "AM", 1, 64 * (k + 1), 0, 0)
        b.bundle(ins("dma", 0, d, (0, 128 * k), (0, 0)))
        b.bundle(ins("dmawait", 0))
        b.nops(5 * k)
        b.bundle(ins("halt"))
        built.append(b.assemble())
    whole = np.concatenate([p.code for p in built])
    ends = np.cumsum([p.bundles for p in built])
    views = [Program(whole[e - p.bundles:e], p.descriptors) for p, e in zip(built, ends, strict=True)]
    linked = machine._back_to_back(views, int(ends[-1]))
    assert linked is not None and np.shares_memory(linked, whole) and not linked.flags.writeable
    assert np.array_equal(linked, whole)
    assert machine._back_to_back(views[::-1], int(ends[-1])) is None
    assert machine._back_to_back(built, int(ends[-1])) is None
    runs = [Cluster(plat, ddr_bytes=1 << 20, functional=False).run(ps, dsp_program=[0, 1, 2])
            for ps in (views, built)]
    assert runs[0].cycles == runs[1].cycles and runs[0].stall_cycles() == runs[1].stall_cycles()
    assert whole.flags.writeable           # the builder's array is left as it was

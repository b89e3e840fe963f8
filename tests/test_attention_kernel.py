"""Emulated attention backward (Algorithm 1) and the svbcastw instruction it needs."""
import json
import math
import struct

import numpy as np
import pytest

import mtemu.validate as mtemu_validate
from mtemu.assembler import ProgramBuilder, ins, parse
from mtemu.cli import main as cli_main
from mtemu.errors import AssemblyError, CapacityError, MtemuError
from mtemu.kernels.attention import (
    attention_backward_timing,
    default_tiles,
    plan_attention,
    run_attention,
    run_attention_backward,
)
from mtemu.kernels.attention.backward import _phases
from mtemu.kernels.attention_ref import attention_backward_ref, attention_backward_tiled, attention_forward_ref
from mtemu.kernels.capacity import AttentionTiles
from mtemu.machine import Cluster
from mtemu.platform import DEFAULT
from mtemu.validate import validate_attention

# a small cluster so functional runs take well under a second
SMALL = DEFAULT.with_overrides(dsps=4, vector_lanes=32)
ONE = DEFAULT.with_overrides(dsps=1, vector_lanes=32)


def _inputs(heads, kv_heads, seq, d, seed, causal):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, seq, d)).astype(np.float16)
    k = rng.standard_normal((kv_heads, seq, d)).astype(np.float16)
    v = rng.standard_normal((kv_heads, seq, d)).astype(np.float16)
    do = rng.standard_normal((heads, seq, d)).astype(np.float16)
    o, saved = attention_forward_ref(q, k, v, causal)
    return q, k, v, o, do, saved


def _bits(x):
    return np.asarray(x, np.float16).view(np.uint16)


# ------------------------------------------------------------------------------------------
# svbcastw
# ------------------------------------------------------------------------------------------
def _f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def test_svbcastw_broadcasts_an_fp32_value():
    lanes = SMALL.vector_lanes
    scale = np.float32(1 / math.sqrt(128))          # not representable in FP16
    text = f"""
{{ smovi s4, {_f32_bits(float(scale))} | smovi s5, 0x3c00 }}
{{ svbcastw v1, s4 | svbcast v2, s5 }}
{{ nop }}
{{ nop }}
{{ nop }}
{{ vfma v3, v1, v2 }}
""" + "{ nop }\n" * 5 + "{ vstw [s0+0], v3 | vstw [s0+1024], v1 }\n{ halt }"
    prog = parse(text, SMALL)
    c = Cluster(SMALL, ddr_bytes=64)
    c.run([prog])
    am = int(c.bases[1]) // 2
    got = c.mem[am: am + 2 * lanes].view(np.float32)
    raw = c.mem[am + 512: am + 512 + 2 * lanes].view(np.float32)
    assert np.all(got == scale) and np.all(raw == scale)      # 0 + scale * 1.0, exact
    # disassembly round-trips
    assert np.array_equal(parse(prog.disassemble(), SMALL).code, prog.code)


def test_svbcastw_latency_hazard_and_operands():
    lat = SMALL.latencies.broadcast
    early = [[ins("smovi", 4, 1)], [ins("svbcastw", 1, 4)]] + [[ins("nop")]] * (lat - 2) + \
        [[ins("vfma", 2, 1, 1)]] + [[ins("nop")]] * 6 + [[ins("halt")]]
    b = ProgramBuilder(SMALL)
    b.extend(early)
    with pytest.raises(AssemblyError, match=r"vfma: reads v1 1 cycle\(s\) before the write"):
        b.assemble()
    ok = [[ins("smovi", 4, 1)], [ins("svbcastw", 1, 4)]] + [[ins("nop")]] * (lat - 1) + \
        [[ins("vfma", 2, 1, 1)]] + [[ins("nop")]] * 6 + [[ins("halt")]]
    b = ProgramBuilder(SMALL)
    b.extend(ok)
    b.assemble()
    b = ProgramBuilder(SMALL)
    b.bundle(ins("svbcastw", 1, 4, unit="VMAC"))
    with pytest.raises(AssemblyError, match="svbcastw cannot run on VMAC"):
        b.assemble()


def test_vexp_vlog_vmax_values_and_latency():
    lanes = SMALL.vector_lanes
    x = (np.arange(lanes) / 4 - 3).astype(np.float32)        # -3 .. 4.75, exact in FP16
    y = (3 - np.arange(lanes) / 8).astype(np.float32)
    c = Cluster(SMALL, ddr_bytes=4 * lanes)
    c.write_ddr_u16(0, np.concatenate([x.astype(np.float16), y.astype(np.float16)]).view(np.uint16))
    lat = SMALL.latencies.vmac
    text = f"""
.desc d src=DDR dst=AM rows=1 row_bytes={4 * lanes} src_stride=0 dst_stride=0 mode=copy
{{ dma 0, d, [s0+0], [s0+0] }}
{{ dmawait 0 }}
{{ vldh v1, [s0+0] | vldh v2, [s0+{2 * lanes}] }}
""" + "{ nop }\n" * 8 + "{ vexp v3, v1 }\n{ vmax v5, v1, v2 }\n" + "{ nop }\n" * (lat - 1) + \
        "{ vlog v4, v3 }\n" + "{ nop }\n" * (lat - 1) + \
        "{ vstw [s0+4096], v3 | vstw [s0+8192], v4 }\n{ vstw [s0+12288], v5 }\n{ halt }"
    prog = parse(text, SMALL)
    c.run([prog])
    am = int(c.bases[1]) // 2

    def f32(off):
        return c.mem[am + off // 2: am + off // 2 + 2 * lanes].view(np.float32)

    assert np.allclose(f32(4096), np.exp(x), rtol=2 ** -22)
    assert np.allclose(f32(8192), x, rtol=2 ** -20, atol=2 ** -20)      # log(exp(x)) = x
    assert np.array_equal(f32(12288), np.maximum(x, y))
    assert np.array_equal(parse(prog.disassemble(), SMALL).code, prog.code)
    # reading a result one cycle before the FMA latency has elapsed is refused
    for op, args in (("vexp", (3, 1)), ("vlog", (3, 1)), ("vmax", (3, 1, 2))):
        for gap, ok in ((lat - 1, False), (lat, True)):
            b = ProgramBuilder(SMALL)
            b.extend([[ins(op, *args)]] + [[ins("nop")]] * (gap - 1) + [[ins("vfma", 4, 3, 3)]]
                     + [[ins("nop")]] * lat + [[ins("halt")]])
            if ok:
                b.assemble()
            else:
                with pytest.raises(AssemblyError, match=r"vfma: reads v3 1 cycle\(s\) before the write"):
                    b.assemble()
    b = ProgramBuilder(SMALL)
    b.bundle(ins("vmax", 1, 2, 3, unit="VLDST1"))
    with pytest.raises(AssemblyError, match="vmax cannot run on VLDST1"):
        b.assemble()


# ------------------------------------------------------------------------------------------
# functional correctness
# ------------------------------------------------------------------------------------------
CASES = [  # heads, kv_heads, seq, d, causal, tiles (br, bc, bc')
    (2, 2, 70, 16, True, (32, 24, 16)),      # MHA, ragged query/key tiles and sub-tiles
    (2, 2, 70, 16, False, (32, 24, 16)),
    (4, 1, 64, 24, True, (32, 32, 8)),       # GQA: four query heads share one KV head
    (6, 2, 45, 40, False, (16, 32, 12)),     # GQA, d > lanes (two vectors per row)
]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("heads,kv_heads,seq,d,causal,tl", CASES)
def test_matches_float64_reference_and_tiled_order(heads, kv_heads, seq, d, causal, tl):
    q, k, v, o, do, saved = _inputs(heads, kv_heads, seq, d, seed=seq + d, causal=causal)
    tiles = AttentionTiles(br=tl[0], bc=tl[1], d=d, br_prime=8, bc_prime=tl[2])
    r = run_attention_backward(q, k, v, o, do, saved, causal=causal, tiles=tiles, platform=SMALL)
    for x, shape in ((r.dq, q.shape), (r.dk, k.shape), (r.dv, v.shape)):
        assert x.dtype == np.float16 and x.shape == shape
    # exact gradient at the FP16 inputs: FP16 tolerance (saved P and O are FP16-rounded)
    exact = attention_backward_ref(q, k, v, o, do, saved, causal=causal)
    for got, ref in zip((r.dq, r.dk, r.dv), exact, strict=True):
        err = np.abs(got.astype(np.float64) - ref)
        assert err.max() <= 2e-2 * np.abs(ref).max(), err.max() / np.abs(ref).max()
    # the same inputs the kernel sees (saved P, given O): only FP32/FP16 rounding remains
    same = attention_backward_ref(q, k, v, o, do, saved, causal=causal, use_saved=True)
    for got, ref in zip((r.dq, r.dk, r.dv), same, strict=True):
        assert np.all(np.abs(got.astype(np.float64) - ref) <= 2.0 ** -9 * np.abs(ref) + 2e-3 * np.abs(ref).max())
    # Algorithm 1's FP32 operation order: dq bit for bit
    tq, tk, tv = attention_backward_tiled(q, k, v, o, do, saved, tl[0], tl[1], causal=causal)
    assert np.array_equal(_bits(r.dq), _bits(tq.astype(np.float16)))
    assert np.allclose(r.dk.astype(np.float32), tk, rtol=2e-3, atol=2e-3 * np.abs(tk).max())
    assert np.allclose(r.dv.astype(np.float32), tv, rtol=2e-3, atol=2e-3 * np.abs(tv).max())


@pytest.mark.parametrize("variant", ["resident", "ddr-staged"])
def test_single_dsp_is_bit_exact_for_all_gradients(variant):
    q, k, v, o, do, saved = _inputs(2, 1, 50, 16, seed=3, causal=True)
    tiles = AttentionTiles(br=32, bc=16, d=16, br_prime=8, bc_prime=8)
    r = run_attention_backward(q, k, v, o, do, saved, tiles=tiles, platform=ONE, variant=variant)
    tq, tk, tv = attention_backward_tiled(q, k, v, o, do, saved, 32, 16)
    for got, ref in zip((r.dq, r.dk, r.dv), (tq, tk, tv), strict=True):
        assert np.array_equal(_bits(got), _bits(ref.astype(np.float16)))


@pytest.mark.parametrize("variant,schedule,mode,phases", [
    ("resident", "auto", "gsm", [[0], [1], [2]]),      # accumulators + K/V of one head fill GSM
    ("ddr-staged", "auto", "gsm", [[0, 1, 2]]),        # staged accumulators live in DDR
    ("resident", "own", "own", [[0], [1], [2]]),
    ("resident", "broadcast", "broadcast", [[0], [1], [2]]),
])
def test_schedules_and_gsm_phases(variant, schedule, mode, phases):
    # three MHA heads of two query tiles each (fewer items per KV head than DSPs); GSM holds one
    # head's FP32 accumulators and FP16 K/V, forcing one phase per head (and GSM zeroing)
    seq, d = 40, 16
    plat = SMALL.with_overrides(gsm_bytes=2 * seq * d * 4 + 2 * seq * d * 2)
    tiles = AttentionTiles(32, 16, d, 8, 8)
    plan = plan_attention(3, 3, seq, d, tiles=tiles, variant=variant, platform=plat, schedule=schedule)
    assert _phases(plan, plat) == (mode, phases)
    q, k, v, o, do, saved = _inputs(3, 3, seq, d, seed=11, causal=True)
    r = run_attention_backward(q, k, v, o, do, saved, tiles=tiles, platform=plat, variant=variant, schedule=schedule)
    assert r.schedule == mode
    tq, tk, tv = attention_backward_tiled(q, k, v, o, do, saved, 32, 16)
    assert np.array_equal(_bits(r.dq), _bits(tq.astype(np.float16)))
    assert np.allclose(r.dk.astype(np.float32), tk, rtol=2e-3, atol=2e-3 * np.abs(tk).max())
    assert np.allclose(r.dv.astype(np.float32), tv, rtol=2e-3, atol=2e-3 * np.abs(tv).max())


def test_gsm_schedule_refused_when_k_v_do_not_fit():
    with pytest.raises(CapacityError, match=r"^GSM: schedule 'gsm' keeps one KV head's K and V"):
        plan_attention(1, 1, 6144, 128, schedule="gsm")
    assert plan_attention(1, 1, 6144, 128).schedule == "auto"
    with pytest.raises(MtemuError, match="schedule must be one of"):
        plan_attention(1, 1, 64, 16, schedule="fast")


@pytest.mark.slow     # > 5 s: the full suite runs it, the quick layer does not
def test_mha_uses_every_dsp_on_the_default_platform():
    # 16 MHA heads x 3 query tiles: broadcasting one KV head at a time keeps 21 of 24 DSPs idle
    # (4.3 % utilization); K/V in GSM without lock step reach about 18 %
    r = attention_backward_timing(16, 16, 512, 128)
    b = attention_backward_timing(16, 16, 512, 128, schedule="broadcast")
    assert r.schedule == "gsm" and b.schedule == "broadcast"
    assert r.utilization > 0.1 and r.utilization > 3 * b.utilization


def test_staged_variant_same_math_more_ddr_traffic_and_cycles():
    q, k, v, o, do, saved = _inputs(4, 2, 64, 16, seed=5, causal=True)
    tiles = AttentionTiles(br=32, bc=32, d=16, br_prime=8, bc_prime=16)
    a = run_attention_backward(q, k, v, o, do, saved, tiles=tiles, platform=SMALL, variant="resident")
    b = run_attention_backward(q, k, v, o, do, saved, tiles=tiles, platform=SMALL, variant="ddr-staged")
    assert np.array_equal(_bits(a.dq), _bits(b.dq))
    assert np.allclose(a.dk.astype(np.float32), b.dk.astype(np.float32), rtol=2e-3, atol=1e-3)
    assert np.allclose(a.dv.astype(np.float32), b.dv.astype(np.float32), rtol=2e-3, atol=1e-3)
    assert b.ddr_bytes > 2 * a.ddr_bytes and b.cycles > a.cycles
    assert a.gsm_bytes > b.gsm_bytes                    # resident reduces in GSM, staged in DDR


def test_timing_mode_counts_the_functional_cycles():
    q, k, v, o, do, saved = _inputs(2, 1, 40, 16, seed=7, causal=False)
    tiles = AttentionTiles(br=32, bc=16, d=16, br_prime=8, bc_prime=8)
    f = run_attention_backward(q, k, v, o, do, saved, causal=False, tiles=tiles, platform=SMALL)
    t = run_attention_backward(q, k, v, o, do, saved, causal=False, tiles=tiles, platform=SMALL, mode="timing")
    assert (f.cycles, f.stalls, f.ddr_bytes) == (t.cycles, t.stalls, t.ddr_bytes) and t.dq is None
    # useful MACs: four GEMMs per tile pair, every pair visited without causality
    assert t.useful_macs == 4 * 2 * 40 * 40 * 16
    assert t.utilization == pytest.approx(t.useful_macs / (SMALL.peak_macs_per_cycle * t.cycles))
    assert t.latency_ms == pytest.approx(t.cycles / SMALL.clock_hz * 1e3)


def test_causal_skips_masked_key_tiles():
    tiles = AttentionTiles(br=32, bc=32, d=16, br_prime=8, bc_prime=16)
    c = attention_backward_timing(2, 2, 128, 16, causal=True, tiles=tiles, platform=SMALL)
    n = attention_backward_timing(2, 2, 128, 16, causal=False, tiles=tiles, platform=SMALL)
    assert (c.tile_pairs, n.tile_pairs) == (2 * (1 + 2 + 3 + 4), 2 * 16)
    assert c.cycles < n.cycles


# ------------------------------------------------------------------------------------------
# capacity and input checks
# ------------------------------------------------------------------------------------------
def test_eq1_violation_is_refused_with_the_checker_message():
    big = AttentionTiles(br=192, bc=2048, d=128, br_prime=32, bc_prime=32)
    with pytest.raises(CapacityError, match=r"do not fit Eq. 1: inequality AM: .* by \d+ bytes"):
        plan_attention(1, 1, 4096, 128, tiles=big)


def test_kernel_buffers_checked_beyond_eq1():
    # fits Eq. 1 but not this kernel's AM layout (double K/V/P^T slots, FP32 sub-tiles)
    t = AttentionTiles(br=192, bc=512, d=128, br_prime=32, bc_prime=32)
    with pytest.raises(CapacityError, match=r"^AM: attention kernel buffers .* more than the 786432-byte AM"):
        plan_attention(1, 1, 1024, 128, tiles=t)
    with pytest.raises(CapacityError, match=r"exceeds one vector \(192 lanes\)"):
        plan_attention(1, 1, 1024, 64, tiles=AttentionTiles(br=256, bc=64, d=64, br_prime=8, bc_prime=8))
    with pytest.raises(CapacityError, match=r"^GSM: FP32 dK and dV accumulators"):
        plan_attention(1, 1, 8192, 128)
    assert plan_attention(1, 1, 8192, 128, variant="ddr-staged").gsm_used == 0


def test_bad_arguments():
    q, k, v, o, do, saved = _inputs(2, 1, 8, 16, seed=1, causal=True)
    with pytest.raises(MtemuError, match="variant must be one of"):
        run_attention_backward(q, k, v, o, do, saved, variant="fast", platform=SMALL)
    with pytest.raises(MtemuError, match="mode must be"):
        run_attention_backward(q, k, v, o, do, saved, mode="fast", platform=SMALL)
    with pytest.raises(MtemuError, match="argument 'q' must have dtype float16"):
        run_attention_backward(q.astype(np.float32), k, v, o, do, saved, platform=SMALL)
    with pytest.raises(MtemuError, match=r"tile 'd' \(32\) must equal head_dim \(16\)"):
        run_attention_backward(q, k, v, o, do, saved, platform=SMALL, tiles=default_tiles(32, SMALL))


# ------------------------------------------------------------------------------------------
# timing on the default platform and the CLI
# ------------------------------------------------------------------------------------------
@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_resident_beats_ddr_staged_on_the_default_platform():
    rows = validate_attention(seqs=(512,))
    (row,) = rows
    assert row["seq"] == 512 and row["heads"] == 16 and row["speedup"] > 1.2
    assert row["staged_ddr_bytes"] > 2 * row["resident_ddr_bytes"]
    assert 0.05 < row["resident_utilization"] < 1


def test_cli_attention_bwd_json(capsys):
    assert cli_main(["attention-bwd", "--seq", "64", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
                     "--mode", "functional", "--dsps", "4", "--vector-lanes", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "functional" and out["variant"] == "resident" and out["cycles"] > 0
    assert max(out["max_rel_error_vs_float64"].values()) < 2e-2
    assert cli_main(["attention-bwd", "--seq", "64", "--heads", "3", "--kv-heads", "2", "--head-dim", "16"]) == 2
    assert "kv_heads=2 must divide heads=3" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# forward kernel
# ------------------------------------------------------------------------------------------
@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("heads,kv_heads,seq,d,causal,schedule", [
    (4, 2, 70, 16, True, "auto"), (2, 1, 45, 24, False, "auto"), (4, 2, 70, 16, True, "broadcast"),
    (3, 3, 40, 16, True, "own")])
def test_forward_matches_reference_and_feeds_the_backward(heads, kv_heads, seq, d, causal, schedule):
    rng = np.random.default_rng(seq)
    q = rng.standard_normal((heads, seq, d)).astype(np.float16)
    k = rng.standard_normal((kv_heads, seq, d)).astype(np.float16)
    v = rng.standard_normal((kv_heads, seq, d)).astype(np.float16)
    tiles = AttentionTiles(br=32, bc=24, d=d, br_prime=8, bc_prime=16)
    r = run_attention(q, k, v, causal=causal, tiles=tiles, platform=SMALL, schedule=schedule)
    assert r.schedule == ("gsm" if schedule == "auto" else schedule)
    o, saved = attention_forward_ref(q, k, v, causal)
    assert r.o.dtype == np.float16 and r.saved.p.dtype == np.float16 and r.saved.lse.dtype == np.float32
    # FP32 math with one FP16 rounding: within an FP16 ulp or two of the float64-rounded result
    assert np.all(np.abs(r.o.astype(np.float64) - o) <= 2 ** -9 * np.abs(o.astype(np.float64)) + 2 ** -14)
    assert np.all(np.abs(r.saved.p.astype(np.float64) - saved.p) <= 2 ** -10 * saved.p.astype(np.float64) + 2 ** -24)
    assert np.allclose(r.saved.lse, saved.lse, rtol=1e-6, atol=1e-5)
    if causal:   # masked probabilities are exactly zero
        iu = np.triu_indices(seq, 1)
        assert np.all(r.saved.p[:, iu[0], iu[1]] == 0)
    # the emulated forward's state drives the emulated backward
    do = rng.standard_normal(q.shape).astype(np.float16)
    b = run_attention_backward(q, k, v, r.o, do, r.saved, causal=causal, tiles=tiles, platform=SMALL)
    exact = attention_backward_ref(q, k, v, o, do, saved, causal=causal)
    for got, ref in zip((b.dq, b.dk, b.dv), exact, strict=True):
        assert np.abs(got.astype(np.float64) - ref).max() <= 2e-2 * np.abs(ref).max()
    t = run_attention(q, k, v, causal=causal, tiles=tiles, platform=SMALL, mode="timing", schedule=schedule)
    assert t.cycles == r.cycles and t.o is None
    assert t.useful_macs == 2 * d * sum(min(32, seq - i0) * min(24, seq - j0)
                                        for i0 in range(0, seq, 32) for j0 in range(0, seq, 24)
                                        if not causal or j0 <= min(i0 + 32, seq) - 1) * heads


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_cli_validate_attention_json(capsys, monkeypatch):
    monkeypatch.setattr(mtemu_validate, "validate_attention",     # what the handler imports when it runs
                        lambda plat, progress: validate_attention(plat, seqs=(512,), progress=progress))
    assert cli_main(["validate", "attention"]) == 0
    err = capsys.readouterr().err.splitlines()        # a line before each emulation, on stderr
    assert [line.split("] ", 1)[1] for line in err] == ["attention 1/1: seq 512, 16 heads, resident backward ...",
                                                       "attention 1/1: seq 512, 16 heads, DDR-staged backward ..."]
    assert cli_main(["validate", "attention", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    out = json.loads(captured.out)
    (row,) = out["rows"]
    assert row["seq"] == 512 and row["speedup"] == pytest.approx(row["staged_ms"] / row["resident_ms"])
    assert cli_main(["attention-fwd", "--seq", "32", "--heads", "2", "--head-dim", "16", "--mode", "functional",
                     "--dsps", "2", "--vector-lanes", "16", "--json"]) == 0
    fwd = json.loads(capsys.readouterr().out)
    assert fwd["max_rel_error_o_vs_float64"] < 2e-3 and fwd["cycles"] > 0


def _program_bits(programs):
    return [(p.code.tobytes(), p.descriptors.tobytes(), sorted(p.labels.items()), p.descriptor_names)
            for p in programs]


@pytest.mark.parametrize("direction,variant,schedule,causal", [
    ("bwd", "resident", "auto", True), ("bwd", "ddr-staged", "auto", True), ("bwd", "resident", "own", False),
    ("bwd", "resident", "broadcast", True), ("fwd", None, "gsm", True), ("fwd", None, "own", False),
    ("fwd", None, "broadcast", True),
])
def test_drivers_from_templates_are_the_programs_built_bundle_by_bundle(direction, variant, schedule, causal):
    """The drivers' fast path (bundles as encoded templates, DMAs filled in by array operations) gives
    every DSP the program the assembler builds bundle by bundle (ReferenceDriver), bit for bit."""
    from mtemu.kernels.attention import backward, forward
    plat = SMALL.with_overrides(dsps=6)
    tiles = AttentionTiles(32, 16, 32, 8, 8)
    if direction == "bwd":
        plan = plan_attention(4, 2, 96, 32, causal=causal, tiles=tiles, variant=variant, platform=plat,
                              schedule=schedule)
        built = [backward.build_attention_backward(plan, plat, reference=r) for r in (False, True)]
    else:
        plan = forward.plan_attention_forward(4, 2, 96, 32, causal=causal, tiles=tiles, platform=plat,
                                              schedule=schedule)
        built = [forward.build_attention_forward(plan, plat, reference=r) for r in (False, True)]
    assert built[0].schedule == built[1].schedule == (schedule if schedule != "auto" else built[0].schedule)
    assert _program_bits(built[0].programs) == _program_bits(built[1].programs)
    assert sum(p.bundles for p in built[0].programs) > 1000


def test_driver_refuses_what_the_assembler_refuses():
    """A DMA address beyond any memory, an unknown channel, a bad descriptor and a latency hazard are
    refused by both paths with the assembler's message, the same bundle and operand named."""
    from mtemu.isa import MAX_ADDRESS_IMM
    from mtemu.kernels.attention.driver import Library, link

    def message(fill, platform, reference):
        lib = Library(platform, {}, reference=reference)
        drv = lib.driver()
        drv.barrier()
        drv.wait(1)
        with pytest.raises(AssemblyError) as err:
            fill(drv)
            link([drv], lib)
        return str(err.value)

    slow = DEFAULT.with_overrides(latencies={"scalar_alu": 3})
    far = MAX_ADDRESS_IMM + 2
    cases = [
        (lambda d: d.dma(0, "DDR", "AM", 1, 64, 0, 0, 0, far), DEFAULT,
         "bundle 2, unit SIEU, dma, operand 4 (destination): address offset"),
        (lambda d: d.dma(0, "DDR", "AM", 1, 64, 0, 0, -far, 0), DEFAULT, "bundle 2, unit SIEU, dma, operand 3"),
        (lambda d: d.dma(0, "DDR", "AM", 1, 64, 0, 0, 64.0, 0), DEFAULT,
         "bundle 2, unit SIEU, dma, operand 3 (source): expected an integer immediate"),
        (lambda d: (d.barrier(), d.wait(99)), DEFAULT, "bundle 3, unit SBR, dmawait, operand 1: DMA channel 99"),
        (lambda d: d.dma(0, "DDR", "AM", 1, 63, 0, 0, 0, 0), DEFAULT, "DMA descriptor 'd0': row_bytes must be even"),
        (lambda d: d.call(("round", 1, 1, 0, 64, 32), {1: 64, 2: 128}), slow,
         "bundle 2, unit SBR: control transfer while s1"),
    ]
    for fill, platform, expected in cases:
        fast, ref = (message(fill, platform, r) for r in (False, True))
        assert fast == ref and fast.startswith(expected), (fast, ref)

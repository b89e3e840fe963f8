"""The functional fast path of straight-line runs (mtemu.fast.queues.run_plain) against its plain statement.

``run_plain`` decodes instructions into one list, defers broadcasts (a ``vfma`` multiplies by the
broadcast scalar) and widens FP16 with the CPU's conversion instruction where there is one;
``run_plain_reference`` runs the same bundles unit by unit in NumPy. Random programs reuse a few
registers on purpose (a broadcast register as accumulator, as both sources, stored, fed to
``vmax``, reloaded) and start anywhere in the run. Data are finite FP16 values including
subnormals and signed zeros; sums may overflow to infinities and inf - inf gives the CPU's default
NaN in both, so every NaN carries the same bits and the comparison stays bit for bit. Special input
patterns (NaN payloads) are checked on conversions alone.
"""
import numpy as np
import pytest

import mtemu
from mtemu import isa
from mtemu.fast.queues import _scalar_exit as scalar_exit
from mtemu.fast.queues import decode_ops, exit_loads, run_plain, run_plain_reference
from mtemu.machine import F16_TABLE
from mtemu.tune import map_jobs

LANES = 16
SM_BYTES, AM_BYTES = 1024, 4096
NV, NS = 8, 16
BASES = np.array([0, SM_BYTES, 0, 0], np.int64)        # one DSP: SM, then AM
CAPS = np.array([SM_BYTES, AM_BYTES, 0, 0], np.int64)
VECTOR_OPS = ("vfma", "vfma", "vfma", "svbcast", "svbcastw", "vmax", "sldh", "ssth", "vldh", "vldw", "vstw", "vsth")


def _instr(rng, name: str) -> list[int]:
    """[op, r0, r1, r2, r3, imm0, imm1]: vector registers from a few, bases s1..s3, loaded s4..s7."""
    v = lambda: int(rng.integers(0, NV))                          # noqa: E731
    base = int(rng.integers(1, 4))
    op = getattr(isa, "OP_" + name.upper())
    if name in ("vfma", "vmax"):
        return [op, v(), v(), v(), 0, 0, 0]
    if name in ("svbcast", "svbcastw"):
        return [op, v(), int(rng.integers(1, 8)), 0, 0, 0, 0]
    if name == "sldh":
        return [op, int(rng.integers(4, 8)), base, 0, 0, int(rng.integers(0, 64)) * 2, 0]
    if name == "ssth":
        return [op, 0, base, int(rng.integers(1, 8)), 0, int(rng.integers(0, 64)) * 2, 0]
    imm = int(rng.integers(0, 16)) * 4 * LANES // 2               # whole-vector steps, FP16 or FP32
    if name in ("vldh", "vldw"):
        return [op, v(), base, 0, 0, imm, 0]
    return [op, 0, base, v(), 0, imm, 0]                          # vstw, vsth


def _program(rng, bundles: int) -> np.ndarray:
    code = np.zeros((bundles, isa.N_UNITS, isa.N_FIELDS), np.int64)
    for q in range(bundles):
        for u in rng.choice(isa.N_UNITS, size=int(rng.integers(1, 4)), replace=False):
            code[q, u] = _instr(rng, str(rng.choice(VECTOR_OPS))) if rng.random() > 0.1 else [isa.OP_NOP] + [0] * 6
    return code


def _finite_f16(rng, n: int) -> np.ndarray:
    """Finite FP16 patterns: normals over the whole range, subnormals, signed zeros."""
    bits = rng.integers(0, 0x7C00, n).astype(np.uint16)
    bits[rng.random(n) < 0.1] &= 0x03FF                           # subnormals and zero
    return bits | (rng.integers(0, 2, n).astype(np.uint16) << 15)


def _state(rng):
    mem = _finite_f16(rng, (SM_BYTES + AM_BYTES) // 2)
    sregs = np.zeros(NS, np.int64)
    sregs[1:4] = rng.integers(0, 8, 3) * 128                      # bases: SM and AM accesses stay inside
    sregs[4:8] = mem[rng.integers(0, mem.size, 4)]
    vregs = np.zeros((1, NV, LANES), np.float32)
    vregs[0] = mem[SM_BYTES // 2:SM_BYTES // 2 + NV * LANES].reshape(NV, LANES).view(np.float16)
    return mem, sregs, vregs


def _fast(code, p, e, mem, sregs, vregs):
    ops, off, fused, _sld, _sld_off = decode_ops(code)
    on, val = np.zeros((1, NV), np.bool_), np.zeros((1, NV), np.float32)
    run_plain(0, p, e, ops, off, fused, sregs, vregs, mem, mem.view(np.float32), F16_TABLE, BASES, CAPS, LANES, on, val,
              mem, 0)
    assert not on.any()                           # every deferred broadcast was written out


@pytest.mark.parametrize("seed", range(40))
def test_random_runs_equal_the_reference(seed):
    rng = np.random.default_rng(seed)
    code = _program(rng, 60)
    p = int(rng.integers(0, 20))
    e = int(rng.integers(p + 1, 61))
    mem, sregs, vregs = _state(rng)
    want = [x.copy() for x in (mem, sregs, vregs)]
    run_plain_reference(0, p, e, code, want[1], want[2], want[0], F16_TABLE, BASES, CAPS, LANES)
    _fast(code, p, e, mem, sregs, vregs)
    for got, ref in zip((mem, sregs, vregs), want, strict=True):
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))


def _bundles(*instrs: list[int]) -> np.ndarray:
    code = np.zeros((len(instrs), isa.N_UNITS, isa.N_FIELDS), np.int64)
    for q, ins in enumerate(instrs):
        code[q, 0] = ins
    return code


def test_deferred_broadcasts_hand_computed():
    """s4 = 1.5, s5 = -2 (FP16 bits): v0 = bcast(1.5); v1 = bcast(-2); v2 = [0, 1, ...];
    v2 += v0 * v1 (both broadcasts); v0 += v0 * v2 (accumulator is a broadcast); v3 = max(v1, v2)."""
    s4, s5 = int(np.float16(1.5).view(np.uint16)), int(np.float16(-2).view(np.uint16))
    code = _bundles([isa.OP_SVBCAST, 0, 4, 0, 0, 0, 0], [isa.OP_SVBCAST, 1, 5, 0, 0, 0, 0],
                    [isa.OP_VFMA, 2, 0, 1, 0, 0, 0], [isa.OP_VFMA, 0, 0, 2, 0, 0, 0],
                    [isa.OP_VMAX, 3, 1, 2, 0, 0, 0], [isa.OP_VSTW, 0, 0, 1, 0, 0, 0])
    mem = np.zeros((SM_BYTES + AM_BYTES) // 2, np.uint16)
    sregs = np.zeros(NS, np.int64)
    sregs[4], sregs[5] = s4, s5
    vregs = np.zeros((1, NV, LANES), np.float32)
    vregs[0, 2] = np.arange(LANES)
    _fast(code, 0, len(code), mem, sregs, vregs)
    v2 = np.arange(LANES, dtype=np.float32) - 3                   # 0..15 + 1.5 * -2
    assert np.array_equal(vregs[0, 2], v2)
    assert np.array_equal(vregs[0, 0], 1.5 + 1.5 * v2)
    assert np.array_equal(vregs[0, 1], np.full(LANES, -2, np.float32))   # broadcast written out at the end
    assert np.array_equal(vregs[0, 3], np.maximum(v2, -2))
    stored = mem[SM_BYTES // 2:SM_BYTES // 2 + 2 * LANES].view(np.float32)
    assert np.array_equal(stored, np.full(LANES, -2, np.float32))         # a stored broadcast has its lanes


def test_vector_loads_widen_every_fp16_pattern_like_the_table():
    """vldh of all 65536 patterns (NaNs, infinities, subnormals) gives the table's bits exactly."""
    lanes = 1024
    caps = np.array([SM_BYTES, 1 << 17, 0, 0], np.int64)
    mem = np.zeros((SM_BYTES + (1 << 17)) // 2, np.uint16)
    mem[SM_BYTES // 2:] = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    code = _bundles(*[[isa.OP_VLDH, r, 1, 0, 0, r * 2 * lanes, 0] for r in range(64)])
    ops, off, fused, _s, _so = decode_ops(code)
    vregs = np.zeros((1, 64, lanes), np.float32)
    run_plain(0, 0, 64, ops, off, fused, np.zeros(NS, np.int64), vregs, mem, mem.view(np.float32), F16_TABLE,
              BASES, caps, lanes, np.zeros((1, 64), np.bool_), np.zeros((1, 64), np.float32), mem, 0)
    assert np.array_equal(vregs.reshape(-1).view(np.uint32), F16_TABLE.view(np.uint32))


def test_decoded_ops_keep_bundle_and_unit_order():
    code = np.zeros((3, isa.N_UNITS, isa.N_FIELDS), np.int64)
    code[0, 5] = [isa.OP_VLDH, 1, 2, 0, 0, 8, 0]
    code[0, 0] = [isa.OP_VFMA, 3, 4, 5, 0, 0, 0]
    code[1, 0] = [isa.OP_NOP, 0, 0, 0, 0, 1, 0]
    code[2, 3] = [isa.OP_SLDH, 6, 1, 0, 0, 4, 0]
    ops, off, _fused, sld, sld_off = decode_ops(code)
    assert ops[:, :5].tolist() == [[isa.OP_VFMA, 3, 4, 5, 0], [isa.OP_VLDH, 1, 2, 0, 8], [isa.OP_SLDH, 6, 1, 0, 4]]
    assert not ops[:, 5:].any()                   # too short to fuse
    assert off.tolist() == [0, 2, 2, 3]
    assert sld.tolist() == [[6, 1, 4]] and sld_off.tolist() == [0, 0, 0, 1]


@pytest.mark.parametrize("seed", range(6))
def test_a_run_leaves_each_register_its_last_load(seed):
    """The scalar side of a queued run (exit_loads' table, read from any start PC inside a run) leaves
    every register what its last ``sldh`` in [p, end) read, and the others as they were: against a
    plain walk over the loads."""
    rng = np.random.default_rng(seed)
    n = 60
    code = np.zeros((n, isa.N_UNITS, isa.N_FIELDS), np.int64)
    for q in range(n):
        for u in range(int(rng.integers(0, 3))):
            code[q, u] = [isa.OP_SLDH, int(rng.integers(8, 16)), int(rng.integers(1, 3)), 0, 0,
                          2 * int(rng.integers(0, 64)), 0]
    cuts = np.sort(rng.choice(np.arange(1, n), 4, replace=False))
    end = np.zeros(n, np.int64)
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, n], strict=True):
        end[a:b] = b
    end[cuts[1]] = cuts[1]                    # a bundle that is not plain: no run starts there
    _ops, _off, _fused, sld, sld_off = decode_ops(code)
    exits, exit_off = exit_loads(end, sld, sld_off, NS)
    mem = rng.integers(0, 1 << 16, SM_BYTES // 2).astype(np.uint16)
    for p in range(n):
        e = int(end[p])
        if e <= p:
            continue
        sr = rng.integers(0, 1 << 20, NS).astype(np.int64)
        sr[1:3] = rng.integers(0, 8, 2) * 2
        want = sr.copy()
        for j in range(sld_off[p], sld_off[e]):           # every base is read before any load lands
            want[sld[j, 0]] = mem[(sr[sld[j, 1]] + sld[j, 2]) >> 1]
        scalar_exit(0, p, e, exits, exit_off, sr, mem, BASES, np.array([SM_BYTES, 0, 0, 0], np.int64))
        assert sr.tolist() == want.tolist(), (p, e)


def _functional_product(n: int) -> bytes:
    """A functional GEMM (its waiting work runs over threads): what a tuner worker may be asked to do."""
    a = np.ones((n, n), np.float16)
    return mtemu.run_gemm(a, a).c.tobytes()


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_workers_started_after_a_functional_run_can_run_one_too():
    """A functional run launches the threading layer's threads (GNU OpenMP where present, which a
    forked child could not launch again): the tuner's local workers still run functional work."""
    want = _functional_product(384)                 # its waiting work ran over threads: launched
    got = dict(map_jobs([384, 384], 2, None, lambda note: None, fn=_functional_product))
    assert got == {0: want, 1: want}

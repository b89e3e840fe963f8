"""Fused stretches (mtemu.fast.fused) against the instruction-by-instruction reference, bit for bit.

A stretch is the multiply-accumulate core of a run: scalar loads, broadcasts, vector loads and
``vfma`` adding (broadcast) x (loaded vector) into accumulators nothing else in it touches.
:func:`mtemu.fast.fused.run_fused` compiles it once and runs it blocked (rows widened once, terms added
eight at a time per accumulator, accumulators in rounds, one fused multiply-add per term). These
tests build random stretches in the shapes a micro-kernel takes (and ones that break the rules in
the middle), run them through ``run_plain`` (which fuses them) and through ``run_plain_reference``,
and compare memory, scalar and vector registers bit for bit. Data are finite FP16 values including
subnormals and signed zeros, with exponents wide enough that sums overflow to infinities (inf - inf
gives the CPU's default NaN in both).
"""
import numpy as np
import pytest
from numba import njit

from mtemu import isa
from mtemu.fast.fused import (
    FUSE_DEPTH,
    G_AUX,
    G_N,
    G_REGS,
    G_TERMS,
    GROUP_MAX,
    H_ACCS,
    H_BCASTS,
    H_FINALS,
    H_LOADS,
    H_SCALARS,
    H_SLOTS,
    H_STEPS,
    H_TERMS,
    MIN_FUSED_TERMS,
    N_AFFINE,
    N_HEADER,
    N_STEP,
    O_FUSE_AT,
    O_FUSE_END,
    STEP_GROUP,
    STEP_INIT,
    STEP_ONE8,
    STEP_PAIR8,
    STEP_QUAD8,
    STEP_TAIL,
    STEP_WIDEN,
    group_lanes,
    group_x16,
)
from mtemu.fast.queues import decode_ops, run_plain, run_plain_reference
from mtemu.fast.simd import VECTOR_FP16
from mtemu.fp16 import add_fp16_product
from mtemu.machine import F16_TABLE

LANES = 16
SM_BYTES, AM_BYTES = 2048, 32768
NV, NS = 32, 24
BASES = np.array([0, SM_BYTES, 0, 0], np.int64)
CAPS = np.array([SM_BYTES, AM_BYTES, 0, 0], np.int64)


def _op(name: str, r0=0, r1=0, r2=0, imm=0) -> list[int]:
    return [getattr(isa, "OP_" + name.upper()), r0, r1, r2, 0, imm, 0]


def _finite_f16(rng, n: int) -> np.ndarray:
    bits = rng.integers(0, 0x7C00, n).astype(np.uint16)
    bits[rng.random(n) < 0.1] &= 0x03FF
    return bits | (rng.integers(0, 2, n).astype(np.uint16) << 15)


def _stretch_program(rng, mr: int, nv: int, ks: int, scalar_second: bool, extra: bool,
                     starts: bool = False, lanes: int = LANES) -> list[list[int]]:
    """A micro-kernel's body: per k, mr scalar loads (s8..) and broadcasts (v mr*nv ..), nv vector loads,
    mr x nv vfma into accumulators v0..; optionally interleaved with the odd extra (a broadcast read
    straight from an entry register, a reloaded broadcast register, a scalar load nobody reads). With
    ``starts``, each accumulator may first be set inside the body: broadcast from s0 (zeroing C, as the
    pipelined GEMM does) or from an entry register, or loaded from AM, or left at its entry value."""
    ops = []
    acc0, va0, vb0 = 0, mr * nv, mr * nv + mr
    if starts:
        for r in range(mr * nv):
            how = int(rng.integers(0, 4))
            if how == 1:
                ops.append(_op("svbcast", acc0 + r, 0))
            elif how == 2:
                ops.append(_op("svbcast", acc0 + r, 4 + r % 4))
            elif how == 3:
                ops.append(_op("vldh", acc0 + r, 2, imm=2 * lanes * int(rng.integers(0, 32))))
        rng.shuffle(ops)
    for kk in range(ks):
        for r in range(mr):
            ops.append(_op("sldh", 8 + r, 1, imm=2 * (r * ks + kk)))
        for r in range(mr):
            src = 4 + r % 4 if extra and rng.random() < 0.2 else 8 + r    # s4..s7: entry registers
            ops.append(_op("svbcast", va0 + r, src))
        for c in range(nv):
            ops.append(_op("vldh", vb0 + c, 2, imm=2 * lanes * (kk * nv + c)))
        if extra and rng.random() < 0.3:
            ops.append(_op("sldh", 20, 3, imm=2 * int(rng.integers(0, 64))))
        for r in range(mr):
            for c in range(nv):
                a, b = va0 + r, vb0 + c
                ops.append(_op("vfma", acc0 + r * nv + c, *((b, a) if scalar_second else (a, b))))
    return ops


def _bundled(ops: list[list[int]], rng, per_bundle: int) -> np.ndarray:
    """Instructions in order, up to ``per_bundle`` per bundle (units in slot order)."""
    groups = []
    i = 0
    while i < len(ops):
        k = int(rng.integers(1, per_bundle + 1))
        groups.append(ops[i:i + k])
        i += k
    code = np.zeros((len(groups), isa.N_UNITS, isa.N_FIELDS), np.int64)
    for q, group in enumerate(groups):
        for u, ins in enumerate(group):
            code[q, u] = ins
    return code


def _state(rng, lanes=LANES):
    mem = _finite_f16(rng, (SM_BYTES + AM_BYTES) // 2)
    sregs = np.zeros(NS, np.int64)
    sregs[1] = 0                                         # SM base of the scalar loads
    sregs[2] = int(rng.integers(0, 4)) * 2 * lanes       # AM base of the vector loads
    sregs[3] = 256
    sregs[4:8] = mem[rng.integers(0, mem.size, 4)]
    vregs = mem[SM_BYTES // 2:SM_BYTES // 2 + NV * lanes].view(np.float16).astype(np.float32).reshape(1, NV, lanes)
    return mem, sregs, vregs.copy()


def _compare(code, p, e, rng, loads=False, lanes=LANES):
    mem, sregs, vregs = _state(rng, lanes)
    want = [x.copy() for x in (mem, sregs, vregs)]
    run_plain_reference(0, p, e, code, want[1], want[2], want[0], F16_TABLE, BASES, CAPS, lanes)
    ops, off, fused, _sld, _sld_off = decode_ops(code, NS, NV)
    on, val = np.zeros((1, NV), np.bool_), np.zeros((1, NV), np.float32)
    smem, sbase = mem, int(BASES[0])
    if loads:
        # the run reads a copy of the SM it saw when it was queued (here placed 128 bytes into a
        # buffer); SM then changes (a DMA), which must not matter
        smem, sbase = np.concatenate([_finite_f16(rng, 64), mem[:SM_BYTES // 2]]), 128
        mem[:SM_BYTES // 2] = _finite_f16(rng, SM_BYTES // 2)
        want[0][:SM_BYTES // 2] = mem[:SM_BYTES // 2]
    run_plain(0, p, e, ops, off, fused, sregs, vregs, mem, mem.view(np.float32), F16_TABLE, BASES, CAPS, lanes,
              on, val, smem, sbase)
    for got, ref in zip((mem, sregs, vregs), want, strict=True):
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))
    return ops


@pytest.mark.parametrize("seed", range(24))
def test_random_micro_kernels_fuse_and_compute_alike(seed):
    rng = np.random.default_rng(seed)
    mr = int(rng.integers(1, 8))                    # up to 7 accumulators a column: quads, pairs, ones
    nv = min(int(rng.integers(1, 4)), (NV - mr) // (mr + 1))
    ks = int(rng.integers(2, 12))
    body = _stretch_program(rng, mr, nv, ks, bool(rng.integers(0, 2)), bool(rng.integers(0, 2)))
    # a prologue and epilogue the stretch may not take in: accumulators loaded and stored
    pro = [_op("vldw", r, 3, imm=4 * LANES * r) for r in range(mr * nv)]
    epi = [_op("vstw", 0, 3, r, imm=4 * LANES * r) for r in range(mr * nv)]
    code = _bundled(pro + body + epi, rng, 3)
    ops = _compare(code, 0, len(code), rng, loads=bool(seed % 2))
    if mr * nv * ks >= MIN_FUSED_TERMS:
        assert ops[:, O_FUSE_END].any()              # the path under test was taken


@pytest.mark.parametrize("seed", range(16))
def test_accumulators_that_start_inside_the_stretch(seed):
    """Accumulators broadcast (zeroed from s0) or loaded by the stretch before their first term start
    from that value; the stretch takes them in."""
    rng = np.random.default_rng(200 + seed)
    mr, nv, ks = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(4, 12))
    body = _stretch_program(rng, mr, nv, ks, bool(seed % 2), bool(seed % 3 == 0), starts=True)
    epi = [_op("vstw", 0, 3, r, imm=4 * LANES * r) for r in range(mr * nv)]
    code = _bundled(body + epi, rng, 3)
    ops = _compare(code, 0, len(code), rng, loads=bool(seed % 2))
    if mr * nv * ks >= MIN_FUSED_TERMS:
        first = np.flatnonzero(ops[:, O_FUSE_END])
        assert first.size and first[0] == 0         # one stretch from the first op


@pytest.mark.parametrize("seed", range(12))
def test_entering_or_leaving_in_the_middle_of_a_stretch(seed):
    """A run that starts or ends inside a stretch runs that part instruction by instruction."""
    rng = np.random.default_rng(100 + seed)
    code = _bundled(_stretch_program(rng, 3, 2, 8, bool(seed % 2), True), rng, 2)
    p = int(rng.integers(0, len(code) // 2))
    e = int(rng.integers(p + 1, len(code) + 1))
    _compare(code, p, e, rng, loads=bool(seed % 3 == 0))


def _reuse_program(rng, nacc: int, nrows: int, ks: int) -> list[list[int]]:
    """A stretch whose rows live across rounds: ``nrows`` vector registers loaded up front, each term
    adding a fresh broadcast times a randomly chosen one of them, and now and then a row register
    reloaded from elsewhere in AM (its old row is then dead, the new one live to its last use or the
    end). The schedule must keep each row in its slot until its last term reads it."""
    acc0, vb0, vr0 = 0, nacc, nacc + 1
    ops = [_op("vldh", vr0 + c, 2, imm=2 * LANES * c) for c in range(nrows)]
    for kk in range(ks):
        ops.append(_op("sldh", 8, 1, imm=2 * kk))
        ops.append(_op("svbcast", vb0, 8))
        for r in range(nacc):
            ops.append(_op("vfma", acc0 + r, vb0, vr0 + int(rng.integers(0, nrows))))
        if rng.random() < 0.4:
            ops.append(_op("vldh", vr0 + int(rng.integers(0, nrows)), 2, imm=2 * LANES * int(rng.integers(0, 48))))
    return ops


@pytest.mark.parametrize("seed", range(16))
def test_rows_live_across_rounds_keep_their_slots(seed):
    rng = np.random.default_rng(300 + seed)
    nacc, nrows, ks = int(rng.integers(1, 6)), int(rng.integers(1, 7)), int(rng.integers(MIN_FUSED_TERMS, 40))
    body = _reuse_program(rng, nacc, nrows, ks)
    epi = [_op("vstw", 0, 3, r, imm=4 * LANES * r) for r in range(nacc + 1 + nrows)]
    code = _bundled(body + epi, rng, 3)
    ops = _compare(code, 0, len(code), rng, loads=bool(seed % 2))
    assert ops[:, O_FUSE_END].any()


def _first_stretch_steps(code):
    """(record start, loads, steps as rows of N_STEP) of the first stretch of ``code``."""
    ops, _off, fused, _s, _so = decode_ops(code, NS, NV)
    at = int(ops[np.flatnonzero(ops[:, O_FUSE_END])[0], O_FUSE_AT])
    nl, steps = int(fused[at + H_LOADS]), int(fused[at + H_STEPS])
    ps = at + N_HEADER + 2 * nl + 4 * int(fused[at + H_BCASTS]) + 4 * int(fused[at + H_SCALARS]) \
        + 4 * int(fused[at + H_ACCS]) + 2 * int(fused[at + H_TERMS]) + 3 * int(fused[at + H_FINALS])
    return fused, at, nl, fused[ps:ps + N_STEP * steps].reshape(steps, N_STEP)


def test_a_gemm_stretch_reads_its_rows_in_register_groups():
    """6 x 2 accumulators over 64 k: each column's six accumulators read the same 64 rows, so each
    column is one group step that reads its rows straight from AM; the only rows widened into slots
    are the two the row registers hold at the end."""
    rng = np.random.default_rng(7)
    code = _bundled(_stretch_program(rng, 6, 2, 64, False, False), rng, 3)
    fused, at, nl, kinds = _first_stretch_steps(code)
    groups = kinds[kinds[:, 0] == STEP_GROUP]
    assert nl == 128 and groups.shape[0] == 2
    assert groups[:, G_N].tolist() == [6, 6] and groups[:, G_TERMS].tolist() == [64, 64]
    assert sorted(groups[:, G_REGS:G_REGS + 6].ravel().tolist()) == list(range(12))
    assert sorted(kinds[kinds[:, 0] == STEP_WIDEN, 1].tolist()) == [nl - 2, nl - 1]
    assert fused[at + H_SLOTS] == 2
    assert not np.isin(kinds[:, 0], [STEP_QUAD8, STEP_PAIR8]).any()
    _compare(code, 0, len(code), rng)


@pytest.mark.parametrize("mr, sizes", [(4, [4]), (5, [4]), (6, [6]), (7, [6]), (8, [4, 4]), (10, [6, 4]),
                                       (12, [6, 6])])
@pytest.mark.parametrize("lanes", [16, 80, 192])
@pytest.mark.parametrize("affine", [True, False])
def test_gemm_shaped_stretches_add_in_register_groups_alike(mr, sizes, lanes, affine):
    """mr rows of C over one column: groups of six (four where eight are left) take the accumulators
    that share rows, the rest go in rounds, and the sums are the instruction-by-instruction ones at
    lane counts with and without a remainder past the host's blocks of 32 (six) or 48 (four) lanes.
    Rows and broadcasts at evenly spaced addresses (values of A packed or every other one) are
    addressed by the group step itself; rows in shuffled order and some broadcasts from entry
    registers go through the per-term tables."""
    rng = np.random.default_rng(1000 + 7 * mr + lanes + affine)
    ops = _stretch_program(rng, mr, 1, 24, bool(mr % 2), not affine, lanes=lanes)
    spacing = 2 + 2 * (mr % 2)                  # bytes between a row of A's values: packed, or every other
    for o in ops:
        if o[0] == isa.OP_SLDH:
            o[5] = o[5] // 2 * spacing
    if not affine:
        rows = rng.permutation(24)
        for o in ops:
            if o[0] == isa.OP_VLDH:
                o[5] = 2 * lanes * int(rows[o[5] // (2 * lanes)])
    code = _bundled(ops, rng, 3)
    fused, at, _nl, kinds = _first_stretch_steps(code)
    groups = kinds[kinds[:, 0] == STEP_GROUP]
    assert groups[:, G_N].tolist() == sizes and (groups[:, G_TERMS] == 24).all()
    left = mr - sum(sizes)
    assert np.isin(kinds[:, 0], [STEP_QUAD8, STEP_PAIR8, STEP_ONE8]).any() == (left > 0)
    rows = [fused[at + g[G_AUX]] for g in groups]
    bcasts = [fused[at + g[G_AUX] + N_AFFINE * (1 + f)] for g in groups for f in range(g[G_N])]
    assert all(rows) and all(bcasts) if affine else not any(rows) and not all(bcasts)
    strides = {fused[at + g[G_AUX] + N_AFFINE * (1 + f) + 3] for g in groups for f in range(g[G_N])}
    assert strides == {spacing} if affine else spacing in strides
    _compare(code, 0, len(code), rng, loads=bool(mr % 2), lanes=lanes)


def test_a_group_stops_where_its_shortest_member_does():
    """Two of six accumulators lose their last three terms (a software-pipelined loop's peeled
    iteration): the group takes the terms all six have, the others' last terms go in tails."""
    rng = np.random.default_rng(11)
    ops = _stretch_program(rng, 6, 1, 20, False, False, lanes=64)
    fmas = [i for i, o in enumerate(ops) if o[0] == isa.OP_VFMA]
    drop = {i for i in fmas[-6 * 3:] if ops[i][1] in (1, 4)}
    code = _bundled([o for i, o in enumerate(ops) if i not in drop], rng, 3)
    _fused, _at, _nl, kinds = _first_stretch_steps(code)
    groups = kinds[kinds[:, 0] == STEP_GROUP]
    assert groups[:, G_N].tolist() == [6] and groups[:, G_TERMS].tolist() == [17]
    assert (kinds[:, 0] == STEP_TAIL).sum() == 4
    _compare(code, 0, len(code), rng, lanes=64)


@pytest.mark.skipif(not VECTOR_FP16, reason="the host has no vector FP16 conversion and FMA")
@pytest.mark.parametrize("n", [4, 6])
def test_register_groups_add_as_lane_by_lane(n):
    """The register-blocked kernels against group_lanes on 192 lanes: random FP16 rows (subnormals,
    signed zeros) and broadcasts, a few of them infinities and NaNs, so sums become infinities and
    NaNs; bit for bit where not NaN."""
    rng = np.random.default_rng(n)
    lanes, terms = 192, 40
    mem16 = _finite_f16(rng, lanes * terms + 64)
    addr = (rng.permutation(terms) * lanes + rng.integers(0, 64)).astype(np.uint64)
    x = F16_TABLE[_finite_f16(rng, terms * GROUP_MAX)].reshape(GROUP_MAX, terms)
    x[[0, 0, 1, 2], [5, 9, 3, 7]] = np.inf, -np.inf, np.nan, np.inf
    v = F16_TABLE[_finite_f16(rng, 8 * lanes)].reshape(8, lanes)
    regs = np.array([7, 2, 5, 0, 3, 6], np.int64)
    want = v.copy()
    group_lanes(want, regs, n, mem16, addr, x, terms, 0, lanes)
    got = v.copy()
    group_x16(got, regs, n, mem16, addr, x, terms, lanes)
    nan = np.isnan(want)
    assert nan.any() and np.isinf(want).any()
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.array_equal(got[[1, 4]], v[[1, 4]])       # rows outside the group untouched


@pytest.mark.parametrize("seed", range(4))
def test_four_accumulators_a_column_read_their_rows_straight_from_am(seed):
    """4 x 3 accumulators: every column is a group of four, which reads AM itself, so the only rows
    widened into slots are the three the row registers hold at the end, and the sums are still the
    instruction-by-instruction ones."""
    rng = np.random.default_rng(400 + seed)
    ks = 8 * int(rng.integers(2, 6))
    code = _bundled(_stretch_program(rng, 4, 3, ks, bool(seed % 2), False), rng, 3)
    fused, at, nl, kinds = _first_stretch_steps(code)
    assert set(kinds[:, 0].tolist()) == {STEP_INIT, STEP_GROUP, STEP_WIDEN}
    assert (kinds[:, 0] == STEP_GROUP).sum() == 3 and (kinds[kinds[:, 0] == STEP_GROUP, G_TERMS] == ks).all()
    assert sorted(kinds[kinds[:, 0] == STEP_WIDEN, 1].tolist()) == [nl - 3, nl - 2, nl - 1]
    _compare(code, 0, len(code), rng, loads=bool(seed % 2))


def _end_of_first_stretch(ops_list):
    code = _bundled(ops_list, np.random.default_rng(0), 1)
    ops = decode_ops(code, NS, NV)[0]
    starts = np.flatnonzero(ops[:, O_FUSE_END])
    return (int(starts[0]), int(ops[starts[0], O_FUSE_END])) if starts.size else None


def _fmas(n, acc=0, a=10, b=11):
    return [_op("svbcast", a, 4), _op("vldh", b, 2)] + [_op("vfma", acc + i % 4, a, b) for i in range(n)]


def test_stretches_stop_where_the_rules_break():
    n = MIN_FUSED_TERMS
    assert _end_of_first_stretch(_fmas(n)) == (0, n + 2)
    # an accumulator read as a source ends it (the vfma is not taken in)
    assert _end_of_first_stretch(_fmas(n) + [_op("vfma", 5, 0, 11)] + _fmas(2)) == (0, n + 2)
    # a broadcast into an accumulator ends it
    assert _end_of_first_stretch(_fmas(n) + [_op("svbcast", 1, 4)]) == (0, n + 2)
    # ... but an accumulator may start as a broadcast or a load the stretch made
    starts = [_op("svbcast", 0, 0), _op("vldh", 1, 2, imm=64), _op("svbcast", 2, 5)]
    assert _end_of_first_stretch(starts + _fmas(n)) == (0, n + 5)
    # a load based on a register the stretch loaded ends it
    assert _end_of_first_stretch(_fmas(n) + [_op("sldh", 2, 1), _op("vldh", 11, 2)]) == (0, n + 3)
    # anything else ends it; too few terms: no stretch
    assert _end_of_first_stretch(_fmas(n) + [_op("vstw", 0, 3, 0)]) == (0, n + 2)
    assert _end_of_first_stretch(_fmas(n - 1)) is None


@njit
def _fused_form(acc, x, y):
    return add_fp16_product(acc, x, y)


@njit
def _rounded_form(acc, x, y):
    return acc + x * y


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_one_rounding_equals_two_for_products_of_fp16_values():
    """acc + x*y with x, y FP16 values: the fused form equals product-then-sum, bit for bit, on every
    FP16 pattern for x (NaNs, infinities, subnormals) against random y and FP32 accumulators."""
    rng = np.random.default_rng(7)
    xs = F16_TABLE                                       # all 65536 patterns, widened
    for _ in range(8):
        ys = F16_TABLE[rng.integers(0, 1 << 16, xs.size)]
        accs = rng.integers(0, 1 << 32, xs.size, dtype=np.uint64).astype(np.uint32).view(np.float32)
        accs[::3] = (xs[::3] * ys[::3]) * -1             # exact cancellations
        got = np.array([_fused_form(a, x, y) for a, x, y in zip(accs, xs, ys, strict=True)], np.float32)
        want = np.array([_rounded_form(a, x, y) for a, x, y in zip(accs, xs, ys, strict=True)], np.float32)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_depth_and_minimum_are_what_the_docs_say():
    assert FUSE_DEPTH == 8 and MIN_FUSED_TERMS == 16

"""The DSP family's FP64 GEMM kernels: bit-exact against NumPy's float64 in functional mode, the
micro-kernel's cycles in closed form, and one-line refusals of blockings that do not fit."""
import numpy as np
import pytest

from mtemu.errors import CapacityError, MtemuError, PlatformError
from mtemu.kernels.gemm_fp64 import (
    FP64_KERNELS,
    NT_SCRATCH_BYTES,
    PAPER_NN_BLOCKINGS,
    PAPER_NT_BLOCKINGS,
    NNBlocking,
    nn_micro_timing,
    nn_reference,
    nt_micro_reference,
    nt_micro_timing,
    nt_reference,
    plan_nn,
    run_nn,
)
from mtemu.platform import DEFAULT, load_platform

FT = load_platform("platforms/ft-m7032.toml")


@pytest.mark.parametrize("m, k, n, blk, cores", [
    (24, 32, 96, NNBlocking(16, 96, 12, 12, 24), 1),      # one M block, two K blocks, two C tiles
    (48, 16, 144, NNBlocking(16, 48, 6, 12, 24), 1),      # two M blocks (the mo loop), three column blocks
    (48, 16, 144, NNBlocking(16, 48, 6, 12, 24, c_buffers=2), 1),
    (24, 32, 192, NNBlocking(16, 48, 6, 12, 24), 2),      # two cores: one A block in GSM, N split
])
def test_nn_gemm_is_bit_exact_with_numpy(m, k, n, blk, cores):
    rng = np.random.default_rng(m + n)
    a, b, c = rng.standard_normal((m, k)), rng.standard_normal((k, n)), rng.standard_normal((m, n))
    got = run_nn(a, b, c, blk, FT, cores)
    want = nn_reference(a, b, c)
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))
    assert np.allclose(got, c + a @ b)


@pytest.mark.parametrize("ka", [64, 512])
def test_micro_kernel_cycles_in_closed_form(ka):
    """call bundle + branch (1 + 6), then the body: C's six loads take the two vector units three
    cycles, so B's first row loads at cycle 3 and lands at 12; 6 ka FMAs; the last accumulator lands 6
    cycles after its FMA and is stored; ret (1 + 6 branch), halt (1): 6 ka + 33."""
    r = nn_micro_timing(ka, FT)
    assert r.cycles == 6 * ka + 33
    assert r.efficiency == pytest.approx(6 * ka / (6 * ka + 33))


def test_paper_blockings_fit_and_one_more_row_does_not():
    for blk in PAPER_NN_BLOCKINGS.values():
        plan_nn(6048, 2048, 1536, blk, FT)
    with pytest.raises(CapacityError, match=r"^AM: .* needs 807936 bytes, 21504 more than the platform's 786432$"):
        plan_nn(90, 2048, 1536, NNBlocking(128, 192, 6, 90, 90), FT)
    with pytest.raises(CapacityError, match=r"^GSM: the A block .* more than the platform's 6291456$"):
        plan_nn(6150, 2048, 1536, NNBlocking(128, 192, 6, 6, 6150), FT)
    with pytest.raises(CapacityError, match=r"^SM: "):
        plan_nn(6048, 2048, 1536, NNBlocking(1024, 48, 6, 252, 1512), FT)


@pytest.mark.parametrize("m, k, n, blk, cores", [
    (24, 64, 32, NNBlocking(32, 16, 12, 12, 24), 1),      # two K blocks, two M tiles, two column blocks
    (48, 32, 48, NNBlocking(32, 24, 6, 12, 24, c_buffers=2), 1),   # two M blocks, three calls per tile
    (24, 64, 64, NNBlocking(32, 16, 6, 12, 24), 2),       # two cores: B^T's rows split
])
def test_nt_gemm_is_bit_exact_with_numpy(m, k, n, blk, cores):
    rng = np.random.default_rng(m + k + n)
    a, bt, c = rng.standard_normal((m, k)), rng.standard_normal((n, k)), rng.standard_normal((m, n))
    got = run_nn(a, bt, c, blk, FT, cores, nt=True)
    want = nt_reference(a, bt, c, blk.ka)
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))
    assert np.allclose(got, c + a @ bt.T)


def test_nt_micro_reference_is_the_paper_reduction():
    """Per lane l, the k = l (mod 16) products in order; then the 16 lanes as four sums of four."""
    rng = np.random.default_rng(3)
    a, bt, c = rng.standard_normal((6, 32)), rng.standard_normal((8, 32)), rng.standard_normal((6, 8))
    lane = a[2, :16] * bt[5, :16] + a[2, 16:] * bt[5, 16:]
    q = [((lane[4 * g] + lane[4 * g + 1]) + lane[4 * g + 2]) + lane[4 * g + 3] for g in range(4)]
    assert nt_micro_reference(a, bt, c)[2, 5] == c[2, 5] + (((q[0] + q[1]) + q[2]) + q[3])


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("ka", [64, 2048])
def test_nt_micro_kernel_cycles(ka):
    """ka cycles of vfmad (three 16-lane FMAs each) and 145 more: the call and return (15), the first
    loads (10), the five-step reduction and the 48 lane reads of the scalar-vector register."""
    r = nt_micro_timing(ka, FT)
    assert r.cycles == ka + 145
    assert r.efficiency == pytest.approx(ka / (ka + 145))


def test_nt_blockings_fit_and_refusals_name_the_memory():
    for blk in PAPER_NT_BLOCKINGS.values():
        plan_nn(2880, 2048, 2048, blk, FT, nt=True)
    over = 2 * 6 * 2048 * 8 + 2 * 2048 * 24 * 8 + NT_SCRATCH_BYTES - FT.am_bytes
    with pytest.raises(CapacityError, match=rf"^AM: 2 A tiles .* and {NT_SCRATCH_BYTES} bytes of reduction scratch "
                                            rf"needs \d+ bytes, {over} more than the platform's 786432$"):
        plan_nn(2880, 2048, 2880, NNBlocking(2048, 24, 6, 72, 288), FT, nt=True)
    with pytest.raises(CapacityError, match=r"^SM: 3 C tiles of M_A x N_A = 288 x 16 FP64 needs 110592 bytes"):
        plan_nn(2880, 2048, 2048, NNBlocking(2048, 16, 6, 288, 288), FT, nt=True)
    with pytest.raises(MtemuError, match="N_A = 20 is not a multiple of the micro-kernel's 8 columns"):
        plan_nn(2880, 2048, 2040, NNBlocking(2048, 20, 6, 144, 288), FT, nt=True)
    with pytest.raises(PlatformError, match="16 FP64 lanes per FMA unit"):
        nt_micro_timing(64, FT.with_overrides(fp64_lanes=24))
    with pytest.raises(PlatformError, match="no FP64 lanes"):
        nt_micro_timing(64, DEFAULT)


def test_bad_shapes_and_platforms_are_refused_in_one_line():
    with pytest.raises(MtemuError, match="N = 100 is not a multiple of N_A = 48"):
        plan_nn(1512, 512, 100, PAPER_NN_BLOCKINGS[512], FT)
    with pytest.raises(PlatformError, match="no FP64 lanes"):
        nn_micro_timing(64, DEFAULT)
    assert set(FP64_KERNELS) >= {"nn-micro", "nn-gemm", "nt-micro", "nt-gemm"}


@pytest.mark.parametrize("flags, match", [
    (["--fp64-lanes", "40"], "'fp64_lanes' = 40 does not divide the vector width"),
    (["--fp64-lanes", "0"], "has no FP64 lanes"),
    (["--am-bytes", "262144"], "AM: the micro-kernel's B and C ((1024 + 6) x 48 x 8) needs 395520 bytes, 133376 more"),
])
def test_validate_dsp_family_refuses_bad_platforms_in_one_line(capsys, flags, match):
    from mtemu.cli import main
    rc = main(["validate", "dsp-family", "--json", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and match in err[0], err


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_validate_rows_are_marked_and_the_micro_kernel_calibration_holds():
    from mtemu.validate.dsp_family import TARGETS, TOLERANCE_PP, Row, emulate, family_platform
    plat = family_platform()
    fit = [t for t in TARGETS if t.fit]
    assert {t.shape[0] for t in fit if t.kernel == "nn-micro"} == {64, 512, 1024}
    assert {t.shape[3] for t in fit if t.kernel == "nn-gemm"} == {128, 256, 512}
    assert all(t.cores == 1 and t.c_buffers == 3 for t in fit)        # multi-core and variants held out
    assert all(not t.fit for t in TARGETS if t.kernel.startswith("nt"))    # the NT results are held out
    for t in fit[:3]:
        row = Row(t, emulate(t, plat).efficiency, 0)
        assert abs(row.error_pp) <= TOLERANCE_PP, row.to_json()
    bound = next(t for t in TARGETS if t.upper_bound)
    assert Row(bound, bound.measured - 0.01, 0).error_pp == 0.0     # below an upper bound is no error

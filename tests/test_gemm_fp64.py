"""The DSP family's FP64 GEMM kernels: bit-exact against NumPy's float64 in functional mode, the
micro-kernel's cycles in closed form, and one-line refusals of blockings that do not fit."""
import numpy as np
import pytest

from mtemu.errors import CapacityError, MtemuError, PlatformError
from mtemu.kernels.gemm_fp64 import (
    FP64_KERNELS,
    PAPER_NN_BLOCKINGS,
    NNBlocking,
    nn_micro_timing,
    nn_reference,
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


def test_bad_shapes_and_platforms_are_refused_in_one_line():
    with pytest.raises(MtemuError, match="N = 100 is not a multiple of N_A = 48"):
        plan_nn(1512, 512, 100, PAPER_NN_BLOCKINGS[512], FT)
    with pytest.raises(PlatformError, match="no FP64 lanes"):
        nn_micro_timing(64, DEFAULT)
    assert set(FP64_KERNELS) >= {"nn-micro", "nn-gemm"}


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


def test_validate_rows_are_marked_and_the_micro_kernel_calibration_holds():
    from mtemu.validate.dsp_family import TARGETS, TOLERANCE_PP, Row, emulate, family_platform
    plat = family_platform()
    fit = [t for t in TARGETS if t.fit]
    assert {t.shape[0] for t in fit if t.kernel == "nn-micro"} == {64, 512, 1024}
    assert {t.shape[3] for t in fit if t.kernel == "nn-gemm"} == {128, 256, 512}
    assert all(t.cores == 1 and t.c_buffers == 3 for t in fit)        # multi-core and variants held out
    for t in fit[:3]:
        row = Row(t, emulate(t, plat).efficiency, 0)
        assert abs(row.error_pp) <= TOLERANCE_PP, row.to_json()
    bound = next(t for t in TARGETS if t.upper_bound)
    assert Row(bound, bound.measured - 0.01, 0).error_pp == 0.0     # below an upper bound is no error

"""Fig. 4's literal loop order: A_g resident in GSM, C through DDR between k-blocks."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mtemu.errors import CapacityError, MtemuError
from mtemu.kernels.gemm import reference_gemm
from mtemu.kernels.gemm_a_resident import (
    AResidentGemmTiles,
    a_resident_timing,
    plan_a_resident,
    reference_gemm_a_resident,
    run_a_resident,
)
from mtemu.kernels.gemm_bound import a_resident_bound
from mtemu.platform import DEFAULT

CASES = [
    # (m, k, n, tiles): several k-blocks and panels; one panel (a partial's DDR read right after
    # its write); short last blocks on every axis; a short last m-block with its own partition
    (48, 256, 192, AResidentGemmTiles(mg=48, kg=128, k2=64, n2=192)),
    (64, 192, 150, AResidentGemmTiles(mg=64, kg=64, k2=32, n2=192)),
    (96, 300, 500, AResidentGemmTiles(mg=48, kg=128, k2=64, n2=192, mr=2, nv=1)),
    (100, 257, 200, AResidentGemmTiles(mg=64, kg=100, k2=48, n2=384)),
]


def _operands(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("m,k,n,tiles", CASES)
def test_bit_exact_with_the_blocked_reference_and_timing_mode_agrees(m, k, n, tiles):
    a, b = _operands(m, k, n)
    r = run_a_resident(a, b, tiles=tiles)
    ref = reference_gemm_a_resident(a, b, min(tiles.kg, k))
    assert np.array_equal(r.c.view(np.uint16), ref.view(np.uint16))
    assert a_resident_timing(m, k, n, tiles=tiles).cycles == r.cycles
    # within FP16 tolerance of the float64 product despite the FP16 partial sums
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.max(np.abs(r.c.astype(np.float64) - exact)) <= 2e-3 * np.sqrt(k) * np.max(np.abs(exact)) + 0.05


def test_one_k_block_is_the_single_pass_gemm():
    a, b = _operands(64, 96, 192, seed=3)
    r = run_a_resident(a, b, tiles=AResidentGemmTiles(mg=64, kg=128, k2=32, n2=192))
    assert np.array_equal(r.c.view(np.uint16), reference_gemm(a, b).view(np.uint16))


@pytest.mark.parametrize("m,k,n,tiles", CASES)
def test_ddr_bytes_are_the_closed_form(m, k, n, tiles):
    t = plan_a_resident(m, k, n, tiles).tiles
    nk = -(-k // t.kg)
    mblocks = -(-m // t.mg)
    expected = m * k * 2 + mblocks * k * n * 2 + m * n * (2 * (nk - 1) * 2 + 2)
    assert a_resident_timing(m, k, n, tiles=tiles).ddr_bytes == expected
    # and the closed-form bound, with the same tiles, is an upper bound on the emulated utilization
    r = a_resident_timing(m, k, n, tiles=tiles)
    assert r.utilization <= a_resident_bound(m, k, n, t.mg, t.kg, t.n2)


def test_capacities_and_inputs_are_checked():
    with pytest.raises(CapacityError, match="^GSM: two A_g tiles"):
        plan_a_resident(2048, 4096, 4096, AResidentGemmTiles(mg=2048, kg=1024, k2=64))
    with pytest.raises(CapacityError, match="^AM: two B tiles"):
        plan_a_resident(2048, 4096, 4096, AResidentGemmTiles(mg=512, kg=1024, k2=512, n2=768))
    with pytest.raises(CapacityError, match="^SM: two A_2 tiles"):
        plan_a_resident(2048, 4096, 4096, AResidentGemmTiles(mg=2048, kg=768, k2=384), replace(DEFAULT,
                                                                                               gsm_bytes=1 << 24))
    with pytest.raises(CapacityError, match="tile 'kg'"):
        plan_a_resident(64, 64, 64, AResidentGemmTiles(kg=0))
    with pytest.raises(MtemuError, match="dimension k"):
        plan_a_resident(64, 0, 64)
    a, b = _operands(8, 8, 8)
    with pytest.raises(MtemuError, match="float16"):
        run_a_resident(a.astype(np.float32), b)
    with pytest.raises(MtemuError, match="inner dimensions"):
        run_a_resident(a, b[:4])


def test_cli_loop_order(run_cli):
    import json

    from mtemu.cli import main
    code, out, err = run_cli(main, ["gemm", "--m", "64", "--k", "200", "--n", "100", "--loop-order", "a-resident",
                                    "--kg", "64", "--json"])
    assert code == 0, err
    d = json.loads(out)
    assert d["tiles"]["kg"] == 64 and d["utilization"] <= d["bound"]["utilization"]
    code, _, err = run_cli(main, ["gemm", "--m", "64", "--k", "64", "--n", "64", "--loop-order", "c-stationary",
                                  "--kg", "32"])
    assert code == 2 and "--kg applies to --loop-order a-resident only" in err

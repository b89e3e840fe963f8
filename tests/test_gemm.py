import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mtemu
from mtemu.errors import CapacityError, MtemuError
from mtemu.kernels.gemm import GemmTiles, build_gemm, gemm_timing, plan_gemm, reference_gemm, run_gemm
from mtemu.platform import DEFAULT

SMALL_TILES = GemmTiles(mg=48, k2=32, n2=384, mr=2, nv=2)


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float16)


@pytest.mark.parametrize("m,k,n", [(48, 64, 192), (50, 70, 200), (7, 5, 3), (100, 300, 500), (24, 32, 384)])
def test_bit_exact_against_reference(m, k, n):
    a, b = _rand((m, k), 1), _rand((k, n), 2)
    r = run_gemm(a, b, tiles=SMALL_TILES)
    assert r.c.dtype == np.float16 and r.c.shape == (m, n)
    assert np.array_equal(r.c.view(np.uint16), reference_gemm(a, b).view(np.uint16))


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 60), st.integers(1, 90), st.integers(1, 420), st.integers(0, 2**31))
def test_bit_exact_random_shapes(m, k, n, seed):
    a, b = _rand((m, k), seed), _rand((k, n), seed + 1)
    tiles = GemmTiles(mg=min(48, m), k2=16, n2=192, mr=3, nv=1)
    r = run_gemm(a, b, tiles=tiles)
    assert np.array_equal(r.c.view(np.uint16), reference_gemm(a, b).view(np.uint16))


def test_default_tiles_functional_and_close_to_float64():
    a, b = _rand((96, 256), 3), _rand((256, 600), 4)
    r = run_gemm(a, b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    # FP16 output rounding dominates: relative error within a few FP16 ulps of the magnitude
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    assert np.all(np.abs(r.c.astype(np.float64) - exact) <= 2e-3 * scale + 1e-3)
    assert np.array_equal(r.c.view(np.uint16), reference_gemm(a, b).view(np.uint16))


def test_timing_and_functional_modes_give_identical_cycles():
    a, b = _rand((48, 64), 5), _rand((64, 400), 6)
    f = run_gemm(a, b, tiles=SMALL_TILES, mode="functional")
    t = run_gemm(a, b, tiles=SMALL_TILES, mode="timing")
    assert f.cycles == t.cycles and f.stalls == t.stalls and f.busy == t.busy
    assert t.c is None


def test_ideal_dma_meets_the_analytic_compute_bound():
    ideal = DEFAULT.with_overrides(ddr_bandwidth=1e15, gsm_bandwidth=1e15, dma_latency_cycles=0,
                                   dma_row_overhead_cycles=0)
    m, k, n = 2048, 512, 768
    tiles = GemmTiles(mg=1024, k2=128, n2=768, mr=6, nv=4)
    plan = plan_gemm(m, k, n, tiles, ideal)
    r = gemm_timing(m, k, n, tiles=tiles, platform=ideal)
    vectors = math.ceil(min(plan.tiles.n2, n) / ideal.vector_lanes)
    # VMAC issues per DSP, closed form: padded rows x vectors x k for every (m-block, panel)
    per_dsp = plan.rows_max * vectors * k * (m // plan.tiles.mg) * math.ceil(n / plan.tiles.n2)
    assert r.busy["VMAC"] == per_dsp * ideal.dsps
    assert r.cycles >= per_dsp
    # with free data movement only the micro-kernel fill/drain and calls remain
    assert r.cycles <= 1.06 * per_dsp
    assert r.utilization > 0.9


def test_capacity_errors_name_the_memory_and_the_excess():
    with pytest.raises(CapacityError, match=r"AM: .* more than the 786432-byte AM"):
        plan_gemm(2048, 4096, 4096, GemmTiles(mg=2048, k2=128, n2=1536, mr=4, nv=4))
    with pytest.raises(CapacityError, match=r"SM: two A_2 tiles .* more than the 65536-byte SM"):
        plan_gemm(2048, 4096, 4096, GemmTiles(mg=2048, k2=1024, n2=192, mr=4, nv=1))
    with pytest.raises(CapacityError, match=r"GSM: three A_g tiles"):
        plan_gemm(2048, 4096, 4096, GemmTiles(mg=2048, k2=128), DEFAULT.with_overrides(gsm_bytes=1 << 20))
    with pytest.raises(MtemuError, match="vector registers"):
        plan_gemm(2048, 512, 768, GemmTiles(mr=12, nv=4))
    with pytest.raises(CapacityError, match="tile 'k2' must be a positive integer"):
        plan_gemm(64, 64, 64, GemmTiles(k2=0))


def test_bad_inputs_are_refused():
    a = _rand((8, 8), 0)
    with pytest.raises(MtemuError, match="must be float16"):
        run_gemm(a.astype(np.float32), a)
    with pytest.raises(MtemuError, match="inner dimensions differ"):
        run_gemm(a, _rand((9, 8), 0))
    with pytest.raises(MtemuError, match="mode must be"):
        run_gemm(a, a, mode="fast")


def test_software_pipeline_and_tiles_matter():
    shape = (2048, 1024, 1536)
    base = gemm_timing(*shape)
    flat = gemm_timing(*shape, tiles=GemmTiles(pipelined=False))
    naive = gemm_timing(*shape, tiles=GemmTiles(mg=2048, k2=32, n2=192, mr=1, nv=1))
    assert base.utilization > flat.utilization + 0.15
    assert base.utilization > naive.utilization + 0.15
    # the stall breakdown explains the gap: DMA waits grow without the pipeline
    assert flat.stalls["dma_wait"] > 3 * base.stalls["dma_wait"]


def test_library_api_is_exported():
    assert mtemu.run_gemm is run_gemm
    gp = build_gemm(48, 64, 192, SMALL_TILES)
    assert gp.program.bundles > 0 and len(gp.dsp_descriptors) == DEFAULT.dsps


def test_library_entry_points_refuse_wrong_argument_types():
    import mtemu
    from mtemu.errors import MtemuError
    from mtemu.kernels.gemm_a_resident import a_resident_timing
    with pytest.raises(MtemuError, match="expected an mtemu Platform, got dict"):
        mtemu.gemm_timing(64, 64, 64, platform={})
    with pytest.raises(MtemuError, match="tiles must be a GemmTiles"):
        mtemu.gemm_timing(64, 64, 64, tiles="big")
    with pytest.raises(MtemuError, match="tiles must be a AResidentGemmTiles"):
        a_resident_timing(64, 64, 64, tiles=mtemu.GemmTiles())


def _program_bytes(program, dsp_desc, init):
    return (program.code.tobytes(), program.descriptors.tobytes(), sorted(program.labels.items()),
            {d: t.tobytes() for d, t in dsp_desc.items()}, init)


@pytest.mark.parametrize("kind", ["gemm", "a_resident"])
@pytest.mark.parametrize("shape,tiles", [((100, 300, 500), None), ((48, 64, 192), "small"), ((600, 1000, 700), None)])
def test_call_sites_built_once_give_the_program_built_site_by_site(monkeypatch, kind, shape, tiles):
    """_call_tiles appends a program's repeated call sites as the same bundle objects; without its memo
    (every bundle built anew, the reference) the program is the same, bit for bit."""
    from mtemu.kernels import gemm, gemm_a_resident
    from mtemu.kernels.gemm_tiles import AResidentGemmTiles
    mod = gemm if kind == "gemm" else gemm_a_resident
    if kind == "gemm":
        t = SMALL_TILES if tiles else GemmTiles()
        plan = gemm.plan_gemm(*shape, t, DEFAULT)
    else:
        t = AResidentGemmTiles(mg=48, kg=64, k2=32, n2=384, mr=2, nv=2) if tiles else AResidentGemmTiles()
        plan = gemm_a_resident.plan_a_resident(*shape, t, DEFAULT)
    memoised = _program_bytes(*mod._assemble(plan, DEFAULT))
    call_tiles = gemm._call_tiles
    monkeypatch.setattr(mod, "_call_tiles", lambda *args: call_tiles(*args[:-1]))   # sites=None
    assert _program_bytes(*mod._assemble(plan, DEFAULT)) == memoised

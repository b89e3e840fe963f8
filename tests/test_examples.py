"""The shipped examples: outputs against NumPy, cycles against the numbers derived by hand in each file."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from mtemu.cli import main as mtemu_main
from mtemu.explain import explain
from mtemu.platform import load_platform
from mtemu.program_runner import load_kernel, run_kernel

# The cycle counts in the examples' comments are derived by hand on the default platform (what
# `mtemu run` uses); each file also gives its count on the 30 GB/s platform with the 2.1-cycle
# row overhead (platforms/mt3000-30gbps.toml), checked here too.
DEFAULT = load_platform(None)
SLOW_DDR = load_platform(Path(__file__).resolve().parent.parent / "platforms" / "mt3000-30gbps.toml")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def module(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bits(a):
    return np.ascontiguousarray(a).view(np.uint16 if a.dtype == np.float16 else np.uint32)


@pytest.mark.parametrize("platform, cycles, dma_wait", [
    (DEFAULT, 1382, (653 - 3) + (706 - 654) + (1381 - 730)),
    (SLOW_DDR, 1501, (693 - 3) + (785 - 694) + (1500 - 809))])
def test_vector_add_is_fp16_addition_in_the_derived_cycles(platform, cycles, dma_wait):
    kernel, plat = load_kernel(EXAMPLES / "vector_add.s", platform)
    assert plat.dsps == 1
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(768) * 300).astype(np.float16)
    y = rng.standard_normal(768).astype(np.float16)
    x[:4] = [65504, -65504, 0.0, 6e-8]          # overflow to inf, subnormals
    y[:4] = [65504, -1, -0.0, 6e-8]
    r = run_kernel(kernel, plat, inputs={"x": x, "y": y})
    # bit-exact: the FP32 sum of two FP16 values rounded once to FP16 is FP16 addition
    with np.errstate(over="ignore"):
        assert (bits(r.outputs["z"]) == bits(x + y)).all()
    assert r.report.cycles == cycles              # derived in the file's header
    assert r.report.stalls["dma_wait"] == dma_wait
    assert explain(r.stats).binding == "DMA latency"


@pytest.mark.parametrize("platform, dsps, cycles", [(DEFAULT, 4, 7093), (DEFAULT, 1, None), (DEFAULT, 3, None),
                                                    (SLOW_DDR, 4, 7426), (SLOW_DDR, 3, None)])
def test_dot_product_through_gsm(platform, dsps, cycles):
    dot = module("dot_gsm")
    kernel, plat = load_kernel(EXAMPLES / "dot_gsm.py", platform, dsps=dsps)
    n = dsps * dot.VECTORS * plat.vector_lanes
    rng = np.random.default_rng(dsps)
    x = rng.standard_normal(n).astype(np.float16)
    y = rng.standard_normal(n).astype(np.float16)
    r = run_kernel(kernel, plat, inputs={"x": x, "y": y})
    got = r.outputs["dot"][0]
    # bit-exact with the kernel's FP32 summation order; close to the exact dot product
    assert bits(np.array([got])) == bits(np.array([dot.reference(x, y, dsps, plat.vector_lanes)]))
    exact = float(x.astype(np.float64) @ y.astype(np.float64))
    assert abs(got - exact) <= 1e-5 * float(np.abs(x.astype(np.float64) * y).sum())
    # the hand derivation: 7093 for 4 DSPs (7426 at 30 GB/s), and its formula for any count
    assert r.report.cycles == dot.expected_cycles(dsps, plat)
    assert cycles is None or r.report.cycles == cycles
    assert dsps == 1 or r.report.stalls["barrier"] > 0


@pytest.mark.parametrize("platform, pipelined, cycles", [(DEFAULT, True, 1883), (DEFAULT, False, 2048),
                                                        (SLOW_DDR, True, 2264), (SLOW_DDR, False, 2429)])
def test_pipelined_gemm_micro_kernel(platform, pipelined, cycles):
    gemm = module("gemm_pipelined")
    plat = platform.with_overrides(dsps=gemm.DSPS)
    kernel = gemm.build(plat, pipelined=pipelined)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((gemm.ROWS, gemm.K)).astype(np.float16)
    b = rng.standard_normal((gemm.K, gemm.VECS * plat.vector_lanes)).astype(np.float16)
    r = run_kernel(kernel, plat, inputs={"a": a, "b": b})
    # bit-exact: exact FP16 products, FP32 sums over k in order, one rounding
    assert (bits(r.outputs["c"]) == bits(gemm.reference(a, b))).all()
    ref64 = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(r.outputs["c"] - ref64).max() <= 2e-3 * np.abs(ref64).max()
    assert r.report.cycles == cycles              # derived in the file's header
    busy = r.report.busy
    assert busy["VMAC"] == gemm.ROWS * gemm.VECS * gemm.K and busy["SLDST"] == gemm.ROWS * gemm.K


def test_the_pipelined_schedule_is_vmac_bound():
    gemm = module("gemm_pipelined")
    plat = DEFAULT.with_overrides(dsps=1)
    at = gemm._schedule(plat, True)
    vmac_cycles = sorted(c for c, instrs in at.items() for i in instrs if i.op == "vfma")
    # one FMA every cycle from T0 on: the VMAC slot never idles inside the k loop
    assert vmac_cycles == list(range(gemm.T0, gemm.T0 + gemm.ROWS * gemm.VECS * gemm.K))


@pytest.mark.parametrize("name, cycles", [("vector_add.s", 1382), ("dot_gsm.py", 7093), ("gemm_pipelined.py", 1883)])
def test_the_readme_command_gives_the_derived_cycles(name, cycles, capsys, tmp_path):
    # `mtemu run examples/NAME --mode timing --json`, as the README shows it, on the default platform
    assert mtemu_main(["run", str(EXAMPLES / name), "--mode", "timing", "--out-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cycles"] == cycles

"""`mtemu run` and `mtemu explain` command handlers, called through a parser built with their register()."""
import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from mtemu.cli import attention_bwd as cli_attention_bwd
from mtemu.cli import attention_fwd as cli_attention_fwd
from mtemu.cli import explain as cli_explain
from mtemu.cli import gemm as cli_gemm
from mtemu.cli import run as cli_run
from mtemu.errors import MtemuError
from mtemu.kernels.names import DEFAULT_GEMM

# the examples' hand-derived cycle counts are for the 30 GB/s platform (see tests/test_examples.py)
PLAT30 = Path(__file__).resolve().parent.parent / "platforms" / "mt3000-30gbps.toml"

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def call(*argv):
    parser = argparse.ArgumentParser(prog="mtemu")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (cli_run, cli_explain, cli_gemm, cli_attention_bwd, cli_attention_fwd):
        module.register(sub)
    args = parser.parse_args([str(a) for a in argv])
    return args.handler(args)


@pytest.fixture
def xy(tmp_path):
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(768).astype(np.float16) for _ in range(2))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    return x, y, [f"x={tmp_path / 'x.npy'}", f"y={tmp_path / 'y.npy'}"]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_run_writes_outputs_trace_and_explanation(tmp_path, xy):
    x, y, specs = xy
    out, trace, roof = tmp_path / "out", tmp_path / "t.json", tmp_path / "r.png"
    payload, text = call("run", EXAMPLES / "vector_add.s", "--input", specs[0], "--input", specs[1],
                         "--out-dir", out, "--trace", trace, "--explain", "--roofline", roof, "--platform", PLAT30)
    json.dumps(payload, allow_nan=False)
    assert payload["cycles"] == 1501 and payload["bundles"] == 29 and payload["dma_bytes"]["ddr"] == 3 * 1536
    assert (np.load(out / "z.npy").view(np.uint16) == (x + y).view(np.uint16)).all()
    assert payload["outputs"] == {"z": str(out / "z.npy")}
    assert payload["explanation"]["binding"] == "DMA latency" and roof.exists()
    events = json.loads(trace.read_text())["traceEvents"]
    assert payload["trace"]["spans"] == sum(e["ph"] == "X" for e in events)
    assert "1501 (" in text and "full detail" in text and "bound by DMA latency" in text


def test_run_refuses_bad_flags_before_running(tmp_path, xy):
    _x, _y, specs = xy
    out = tmp_path / "out"
    with pytest.raises(MtemuError, match="--trace-window needs --trace"):
        call("run", EXAMPLES / "vector_add.s", "--input", specs[0], "--input", specs[1], "--out-dir", out,
             "--trace-window", "0:100")
    with pytest.raises(MtemuError, match="lies outside DDR"):
        call("run", EXAMPLES / "vector_add.s", "--input", specs[0], "--input", specs[1], "--out-dir", out,
             "--output", "w=DDR:21474836000:768:float16")
    assert not out.exists()


def test_run_a_python_program_on_more_dsps(tmp_path):
    n = 3 * 4 * 192
    rng = np.random.default_rng(3)
    for name in ("x", "y"):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(n).astype(np.float16))
    payload, _ = call("run", EXAMPLES / "dot_gsm.py", "--dsps", 3, "--input", f"x={tmp_path / 'x.npy'}",
                      "--input", f"y={tmp_path / 'y.npy'}", "--out-dir", tmp_path, "--json")
    assert payload["dsps"] == 3 and np.load(tmp_path / "dot.npy").shape == (1,)


def test_explain_commands():
    payload, text = call("explain", "gemm", "--m", 256, "--k", 512, "--n", 768, "--mg", 256, "--n2", 384,
                         "--loop-order", "c-stationary", "--platform", PLAT30)
    ex = payload["explanation"]
    assert ex["binding"] == "DDR" and ex["gemm"]["tiles"]["n2"] == 384 and "n2 384 -> 768" in text
    assert payload["loop_order"] == "c-stationary" and text.startswith("GEMM 256x512x768, tiles c-stationary mg=256")
    payload, text = call("explain", "program", EXAMPLES / "gemm_pipelined.py", "--mode", "timing",
                         "--platform", PLAT30)
    assert payload["run"]["cycles"] == 2264 and payload["explanation"]["binding"] == "DMA latency"
    with pytest.raises(MtemuError, match="--m must be positive"):
        call("explain", "gemm", "--m", 0, "--k", 512, "--n", 768)


SMALL_PLATFORM = ["--dsps", 4, "--vector-lanes", 32]


def test_explain_and_gemm_show_the_same_default_kernel_and_tiles():
    """Without --loop-order both run the default loop order and print the tiles that ran the same way
    (the default nv=4 clipped to nv=2 by n2=384)."""
    shape = ("--m", 256, "--k", 512, "--n", 768, "--platform", PLAT30)
    explained, etext = call("explain", "gemm", *shape, "--json")
    ran, gtext = call("gemm", *shape, "--json")
    assert explained["loop_order"] == DEFAULT_GEMM == "a-resident" and explained["explanation"]["gemm"] is None
    assert explained["explanation"]["cycles"] == ran["cycles"]
    _, etext = call("explain", "gemm", *shape)
    _, gtext = call("gemm", *shape)
    tiles = "tiles a-resident mg=256 kg=512 k2=256 n2=384 mr=6 nv=2"
    assert etext.splitlines()[0] == f"GEMM 256x512x768, {tiles}"
    assert gtext.splitlines()[0] == f"GEMM 256x512x768 (timing), {tiles}"
    assert "closed-form bound of this loop order" in etext


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("loop_order", ["c-stationary", "a-resident"])
@pytest.mark.parametrize("mode", ["timing", "functional"])
def test_gemm_command_traces_and_explains_either_loop_order(tmp_path, loop_order, mode):
    shape = ["--m", 96, "--k", 256, "--n", 96, "--mg", 48, "--k2", 64, "--n2", 64, "--mode", mode,
             "--loop-order", loop_order, *(["--kg", 128] if loop_order == "a-resident" else []), *SMALL_PLATFORM]
    plain, _ = call("gemm", *shape, "--json")
    trace, roof = tmp_path / "g.json", tmp_path / "g.png"
    payload, text = call("gemm", *shape, "--trace", trace, "--trace-window", "0:500", "--explain",
                         "--roofline", roof, "--json")
    json.dumps(payload, allow_nan=False)
    # tracing changes no counter; the trace and the explanation describe the same run
    assert payload["cycles"] == plain["cycles"] and payload["stalls"] == plain["stalls"]
    assert "trace" not in plain and "explanation" not in plain
    ex = payload["explanation"]
    assert ex["cycles"] == plain["cycles"] and ex["macs"] == 96 * 256 * 96 and roof.exists()
    assert (ex["gemm"] is not None) == (loop_order == "c-stationary")
    events = json.loads(trace.read_text())["traceEvents"]
    assert payload["trace"]["spans"] == sum(e["ph"] == "X" for e in events) > 0
    assert "bound by" in text and "trace: " in text and "roofline: " in text


def test_attention_commands_trace_and_explain(tmp_path):
    shape = ["--seq", 64, "--heads", 2, "--kv-heads", 1, "--head-dim", 16, *SMALL_PLATFORM]
    for command, mode in (("attention-bwd", "timing"), ("attention-bwd", "functional"),
                          ("attention-fwd", "timing"), ("attention-fwd", "functional")):
        plain, _ = call(command, *shape, "--mode", mode, "--json")
        trace = tmp_path / f"{command}-{mode}.json"
        payload, text = call(command, *shape, "--mode", mode, "--trace", trace, "--explain", "--json")
        json.dumps(payload, allow_nan=False)
        assert payload["cycles"] == plain["cycles"] and payload["stalls"] == plain["stalls"]
        assert payload["explanation"]["macs"] == plain["useful_macs"] and trace.exists()
        assert "bound by" in text and "trace: " in text


def test_kernel_commands_check_trace_flags_first():
    with pytest.raises(MtemuError, match="--trace-window needs --trace"):
        call("gemm", "--m", 96, "--k", 64, "--n", 96, "--trace-window", "0:10", *SMALL_PLATFORM)
    with pytest.raises(MtemuError, match="--trace-max-events must be positive"):
        call("attention-fwd", "--seq", 64, "--heads", 2, "--head-dim", 16, "--trace", "x.json",
             "--trace-max-events", 0)

"""`mtemu run` and `mtemu explain` command handlers, called through a parser built with their register()."""
import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from mtemu.cli import explain as cli_explain
from mtemu.cli import run as cli_run
from mtemu.errors import MtemuError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def call(*argv):
    parser = argparse.ArgumentParser(prog="mtemu")
    sub = parser.add_subparsers(dest="command", required=True)
    cli_run.register(sub)
    cli_explain.register(sub)
    args = parser.parse_args([str(a) for a in argv])
    return args.handler(args)


@pytest.fixture
def xy(tmp_path):
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(768).astype(np.float16) for _ in range(2))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    return x, y, [f"x={tmp_path / 'x.npy'}", f"y={tmp_path / 'y.npy'}"]


def test_run_writes_outputs_trace_and_explanation(tmp_path, xy):
    x, y, specs = xy
    out, trace, roof = tmp_path / "out", tmp_path / "t.json", tmp_path / "r.png"
    payload, text = call("run", EXAMPLES / "vector_add.s", "--input", specs[0], "--input", specs[1],
                         "--out-dir", out, "--trace", trace, "--explain", "--roofline", roof)
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
    payload, text = call("explain", "gemm", "--m", 256, "--k", 512, "--n", 768, "--mg", 256, "--n2", 384)
    ex = payload["explanation"]
    assert ex["binding"] == "DDR" and ex["gemm"]["tiles"]["n2"] == 384 and "n2 384 -> 768" in text
    payload, text = call("explain", "program", EXAMPLES / "gemm_pipelined.py", "--mode", "timing")
    assert payload["run"]["cycles"] == 2264 and payload["explanation"]["binding"] == "DMA latency"
    with pytest.raises(MtemuError, match="--m must be positive"):
        call("explain", "gemm", "--m", 0, "--k", 512, "--n", 768)

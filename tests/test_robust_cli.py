"""One line and exit 2 for every expected failure, 130 for Ctrl-C, strict JSON on success: random
arguments on both CLIs, OS errors on outputs, interrupted runs, and the argument policy."""
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtemu.cli import main as mtemu_main
from ratrain.cli import main as ratrain_main
from rtcommon.cli import run_main
from rtcommon.jsonio import NONFINITE_KEY, dumps_strict

ROOT = Path(__file__).resolve().parents[1]


def _strict_loads(text: str):
    def refuse(token):
        raise AssertionError(f"non-strict JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def _check(rc: int, captured, argv: list[str], prog: str) -> None:
    """A right result (exit 0; strict JSON with --json) or a named error on one line (exit 2)."""
    assert rc in (0, 2), (argv, rc, captured.err)
    if rc == 2:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{prog} ") and ": error: " in lines[0], (argv, captured.err)
    elif "--json" in argv:
        _strict_loads(captured.out)


ARG = st.one_of(st.integers(-10 ** 40, 10 ** 40).map(str), st.floats().map(repr),
                st.sampled_from(["nan", "inf", "-inf", "0", "-1", "1e-30", "30", "1e400", "", "x", "1,2", "0x10"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["--dsps", "--clock-hz", "--ddr-bandwidth", "--am-bytes", "--sm-bytes",
                                           "--dma-latency-cycles", "--dma-row-overhead-cycles", "--vector-lanes",
                                           "--dma-channels", "--gsm-bytes"]), ARG), max_size=3), st.booleans())
def test_random_platform_flags(capsys, flags, as_json):
    argv = ["platform"] + [x for pair in flags for x in pair] + (["--json"] if as_json else [])
    rc = mtemu_main(argv)
    _check(rc, capsys.readouterr(), argv, "mtemu")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["--step-s", "--mtbf-hours", "--checkpoint-s", "--restart-s", "--compute-cv"]), ARG,
       st.sampled_from(["--steps", "--clusters"]), ARG)
def test_random_time_to_train_arguments(capsys, fflag, fval, iflag, ival):
    base = {"--step-s": "1", "--steps": "100", "--clusters": "8", "--mtbf-hours": "50", "--checkpoint-s": "10"}
    base[fflag], base[iflag] = fval, ival
    argv = ["time-to-train"] + [x for kv in base.items() for x in kv] + ["--json"]
    rc = ratrain_main(argv)
    _check(rc, capsys.readouterr(), argv, "ratrain")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["--clusters", "--global-batch", "--seq", "--top"]), ARG,
       st.sampled_from(["--zero-stages", "--tp-degrees", "--micro-batches"]),
       st.sampled_from(["5", "3", "16", "0", "1,2", "2,4", "9", "-1", "x", "99999999999999999999"]))
def test_random_plan_arguments(capsys, iflag, ival, lflag, lval):
    base = {"--clusters": "8", "--global-batch": "8", "--seq": "2048", "--top": "3"}
    base[iflag] = ival
    argv = (["plan", "--model", "llama2-7b", "--profile", "roofline", "--json", lflag, lval]
            + [x for kv in base.items() for x in kv])
    rc = ratrain_main(argv)
    _check(rc, capsys.readouterr(), argv, "ratrain")


@pytest.mark.parametrize("argv, match", [
    (["--zero-stages", "5"], "--zero-stages 5: ZeRO stages are 0, 1, 2, 3"),
    (["--tp-degrees", "3"], "--tp-degrees 3 does not divide --clusters 8"),
    (["--tp-degrees", "16"], "searches T up to 8"),
    (["--micro-batches", "3"], "none divides --global-batch 8"),
    (["--method", "zero3-heavy", "--zero-stages", "0,1"], "searches Z=3 only"),
])
def test_plan_refuses_what_it_cannot_enumerate(capsys, argv, match):
    rc = ratrain_main(["plan", "--model", "llama2-7b", "--clusters", "8", "--global-batch", "8",
                       "--profile", "roofline"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and match in err and "OOM" not in err


def test_plan_refuses_a_tp_degree_the_model_cannot_split(capsys, tmp_path):
    cfg = json.loads((ROOT / "tests/fixtures/hf/llama2-7b.json").read_text())
    cfg["num_attention_heads"] = cfg["num_key_value_heads"] = 8
    cfg["head_dim"] = 512
    cfg["intermediate_size"] = 11007
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc = ratrain_main(["plan", "--hf-config", str(tmp_path / "config.json"), "--clusters", "8",
                       "--global-batch", "8", "--profile", "roofline", "--tp-degrees", "2"])
    assert rc == 2 and "--tp-degrees 2: model" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["ratrain", "simulate", "--uniform", "--stages", "2", "--microbatches", "2", "--t-forward", "1",
     "--t-backward", "2", "--trace", "{file}/x.json"],
    ["ratrain", "simulate", "--uniform", "--stages", "2", "--microbatches", "2", "--t-forward", "1",
     "--t-backward", "2", "--plot", "{dir}"],
    ["ratrain", "correctness", "--steps", "1", "--out", "{file}/sub"],
    ["ratrain", "reproduce", "--out", "{file}"],
    ["mtemu", "tune", "gemm", "--m", "64", "--k", "64", "--n", "64", "--out", "{file}/x"],
    ["mtemu", "run", "examples/vector_add.s", "--trace", "{dir}"],
])
def test_outputs_are_checked_before_any_work(capsys, tmp_path, argv):
    (tmp_path / "f").write_text("in the way")
    argv = [a.format(file=tmp_path / "f", dir=tmp_path) for a in argv]
    t0 = time.perf_counter()
    rc = (ratrain_main if argv[0] == "ratrain" else mtemu_main)(argv[1:])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "argument --" in err, err
    assert time.perf_counter() - t0 < 5


def _parser_with(handler):
    import argparse

    from rtcommon.cli import apply_policy, new_parser
    parser = new_parser("tool", "test")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("go")
    p.add_argument("--json", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--x", type=float, default=1.0)
    p.set_defaults(handler=handler)
    assert isinstance(p, argparse.ArgumentParser)
    return apply_policy(parser)


@pytest.mark.parametrize("exc, match", [
    (OSError(errno.ENOSPC, "No space left on device", "/out/x.json"), "/out/x.json: No space left on device"),
    (PermissionError(errno.EROFS, "Read-only file system", "/ro/x"), "/ro/x: Read-only file system"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/f/x"), "/f/x: Not a directory"),
    (MemoryError(), "out of host memory"),
])
def test_os_and_memory_errors_are_one_line(capsys, exc, match):
    def handler(args):
        raise exc
    assert run_main("tool", _parser_with(handler), ["go"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tool go: error: ") and match in err


def test_interrupt_is_130(capsys):
    def handler(args):
        raise KeyboardInterrupt
    assert run_main("tool", _parser_with(handler), ["go"]) == 130
    assert capsys.readouterr().err == "tool go: interrupted\n"


def test_policy_refuses_negative_seeds_and_non_finite_floats(capsys):
    parser = _parser_with(lambda a: ({}, ""))
    for argv in (["go", "--seed", "-1"], ["go", "--x", "nan"], ["go", "--x", "-inf"], ["go", "--seed", "9" * 40]):
        assert run_main("tool", parser, argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "argument --" in err, err


def test_json_output_is_strict_and_says_what_became_null(capsys):
    payload = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf")}, "e": 2}
    assert run_main("tool", _parser_with(lambda a: (payload, "text")), ["go", "--json"]) == 0
    out = _strict_loads(capsys.readouterr().out)
    assert out["a"] is None and out["b"] == [1.0, None] and out["c"]["d"] is None and out["e"] == 2
    assert out[NONFINITE_KEY] == ["$.a (nan)", "$.b[1] (inf)", "$.c.d (-inf)"]
    assert NONFINITE_KEY not in _strict_loads(dumps_strict({"x": 1.5}))


def _wait_for_cpu_seconds(pid: int, seconds: float, timeout: float = 120.0) -> None:
    """Block until process ``pid`` has used ``seconds`` of CPU (wall time is no measure on a busy machine)."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        time.sleep(seconds)
        return
    tick = os.sysconf("SC_CLK_TCK")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        if (int(fields[11]) + int(fields[12])) / tick >= seconds:     # utime + stime
            return
        time.sleep(0.1)


@pytest.mark.slow     # > 5 s: the full suite runs it, the quick layer does not
def test_ctrl_c_stops_a_long_emulation_quickly(tmp_path):
    loop = tmp_path / "loop.s"
    loop.write_text("# @dsps 1\ntop:\n{ br top }\n{ halt }\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # the same run with a small cycle limit first: if this process's machine is not in Numba's disk
    # cache yet (another process may have rewritten its index), it is compiled here, not under the
    # interrupt below (LLVM does not return to Python for many seconds while it compiles)
    subprocess.run([sys.executable, "-m", "mtemu.cli", "run", str(loop), "--mode", "timing", "--max-cycles", "1000"],
                   capture_output=True, env=env, cwd=ROOT, timeout=900)
    # the child starts with Ctrl-C's default action even if this process ignores it (a process that
    # inherits an ignored SIGINT never turns it into KeyboardInterrupt)
    parent_sigint = signal.getsignal(signal.SIGINT)
    p = subprocess.Popen([sys.executable, "-m", "mtemu.cli", "run", str(loop), "--mode", "timing",
                          "--max-cycles", str(2 ** 59)], stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for_cpu_seconds(p.pid, 4.0)    # imports, then well into the jitted loop, however loaded the machine
        t0 = time.perf_counter()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)  # reading as it waits: a full pipe would block the child
        elapsed = time.perf_counter() - t0
    finally:
        p.kill()
    assert p.returncode == 130 and elapsed < 5, (parent_sigint, err[-2000:])
    assert err.strip().splitlines()[-1] == "mtemu run: interrupted"


def test_correctness_refuses_a_diverged_run(capsys, tmp_path):
    rc = ratrain_main(["correctness", "--lr", "1e30", "--steps", "3", "--no-reorder-reference",
                       "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert rc == 2 and "loss is nan" in err and "training diverged" in err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("text, match", [
    ('{"ddr_bandwidth": 30}', "ddr_bandwidth is in bytes/s; for 30 GB/s write 30e9"),
    ("memory_budget_bytes = 20\n", "memory_budget_bytes (the cluster's 'ddr_bytes') = 20 is outside the sane range"),
    ('{"link_latency_s": 1e9}', "link_latency_s=1000000000.0 is over 10 s: it is in seconds"),
    ("[" * 1000 + "]" * 1000, "nested deeper"),
])
def test_training_platform_files_are_checked(capsys, tmp_path, text, match):
    path = tmp_path / ("p.toml" if "=" in text else "p.json")
    path.write_text(text)
    for argv in (["memory", "--model", "llama2-7b"], ["plan", "--model", "llama2-7b", "--clusters", "8",
                                                     "--global-batch", "8", "--profile", "roofline"]):
        assert ratrain_main(argv + ["--platform", str(path)]) == 2
        err = capsys.readouterr().err
        assert match in err and err.count("\n") == 1, err

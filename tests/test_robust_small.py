"""Small contract holes: closed stdout, free checkpoints, duplicate JSON keys, shapes that are not
integers at the library entry points."""
import subprocess
import sys

import pytest

from mtemu.errors import MtemuError
from ratrain.plan.time_to_train import Reliability, time_to_train
from rtcommon.checks import positive_ints
from rtcommon.errors import UserError
from rtcommon.jsonio import parse_json


def test_closed_stdout_is_one_line_exit_2():
    res = subprocess.run(f"{sys.executable} -m mtemu.cli platform --json >&-", shell=True, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip() == "mtemu platform: error: cannot write the output: standard output is closed"


def test_free_checkpoints_have_no_overhead():
    t = time_to_train(10.0, 100, 8, None, Reliability(mtbf_hours=100.0, checkpoint_s=0.0))
    assert t.optimal_interval_s == 0.0 and t.overhead.total == 0.0 and t.wall_s == pytest.approx(1000.0)


@pytest.mark.parametrize("text, key", [('{"a": 1, "b": 2, "a": 3}', "a"), ('{"x": [{"k": 1, "k": 1}]}', "k")])
def test_duplicate_json_keys_are_named(text, key):
    with pytest.raises(UserError, match=rf"f\.json: JSON object has the key '{key}' twice"):
        parse_json(text, "f.json")


@pytest.mark.parametrize("value", [64.0, "64", True, None, 0, -1])
def test_positive_ints_refuse_what_is_not_one(value):
    with pytest.raises(UserError, match="GEMM dimension m must be a positive integer"):
        positive_ints("GEMM dimension", UserError, m=value)


@pytest.mark.parametrize("dims", [(64.0, 64, 64), (True, 64, 64), ("64", 64, 64)])
def test_gemm_timing_refuses_a_shape_that_is_not_integers(dims):
    import mtemu

    with pytest.raises(MtemuError, match="GEMM dimension m must be a positive integer"):
        mtemu.gemm_timing(*dims)


@pytest.mark.parametrize("fn", ["attention_forward_timing", "attention_backward_timing"])
def test_attention_timing_refuses_a_float_shape(fn):
    import mtemu

    with pytest.raises(MtemuError, match="attention heads must be a positive integer, got 8.0"):
        getattr(mtemu, fn)(8.0, 8, 64, 64)

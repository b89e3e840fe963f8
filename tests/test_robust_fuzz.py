"""Fuzzing the contract over three input families (platform files, HF configs, `mtemu run`
arguments): each input gives a sane result, or one UserError line naming the field it is about;
never another exception, never a write outside the output folder. The quick layer runs a small,
fixed budget (derandomized); the slow layer a larger one."""
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtemu.assembler import ProgramBuilder, ins
from mtemu.platform import RANGES
from mtemu.program_runner import Kernel, parse_output_spec, run_kernel, run_program
from ratrain.spec.models import from_hf_config
from ratrain.spec.platforms import load_platform
from rtcommon.errors import UserError

QUICK = settings(max_examples=40, derandomize=True, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SLOW = settings(max_examples=400, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# JSON numbers of every awkward kind (as text: 1e400 and 401-digit integers survive only that way)
NUMBER_TEXT = st.one_of(
    st.integers(-2 ** 70, 2 ** 70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["0", "-1", "1e400", "-1e400", "1" + "0" * 400, "2.5", "true", "null", '"12"', "[]", "{}",
                     "1e-400", "64", "4096", "1.75e9"]))
PLATFORM_FIELDS = sorted(RANGES) + ["link_bandwidth", "link_latency_s", "latencies.vmac", "latencies.broadcast"]
HF_FIELDS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
             "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "sliding_window"]
LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
         "num_attention_heads": 4, "vocab_size": 1000}


def _one_line_naming(exc: UserError, names) -> None:
    text = str(exc)
    assert "\n" not in text.strip() and len(text) < 600, text
    assert any(n.split(".")[-1] in text for n in names), text


def _platform_case(tmp_path, values):
    body = {}
    for name, text in values.items():
        table, _, key = name.rpartition(".")
        (body.setdefault(table, {}) if table else body)[key] = text
    parts = [f'"{k}": {v}' if not isinstance(v, dict) else
             f'"{k}": {{' + ", ".join(f'"{a}": {b}' for a, b in v.items()) + "}" for k, v in body.items()]
    path = tmp_path / "p.json"
    path.write_text("{" + ", ".join(parts) + "}")
    try:
        plat = load_platform(path)
    except UserError as exc:
        _one_line_naming(exc, values)
        return
    cluster = plat.cluster
    assert 0 < cluster.peak_mac_per_s < math.inf and 0 < plat.link_bandwidth < math.inf


def _hf_case(tmp_path, values):
    text = json.dumps(LLAMA)[:-1] + "".join(f', "{k}": {v}' for k, v in values.items()) + "}"
    path = tmp_path / "config.json"
    path.write_text(text)
    try:
        spec = from_hf_config(path)
    except UserError as exc:
        _one_line_naming(exc, list(values) + ["config.json"])
        return
    assert all(isinstance(getattr(spec, f), int) and getattr(spec, f) > 0 for f in ("hidden", "layers", "vocab"))
    assert math.isfinite(spec.norm_eps) and (spec.rope_theta is None or math.isfinite(spec.rope_theta))


SPEC_PART = st.one_of(st.integers(-2 ** 40, 2 ** 70).map(str), st.sampled_from(
    ["DDR", "GSM", "SM.0", "AM.0", "AM.99", "ddr", "XX", "0x40", "8", "4x2", "4294967296x4294967296", "0x8",
     "float16", "float32", "int8", "", "..", "-3", "1.5"]))
OUT_NAME = st.sampled_from(["z", "../../escaped", "a/b", "..", ".hidden", "ok_1", "", "x" * 300])


def _run_case(tmp_path, name, parts):
    spec = f"{name}={':'.join(parts)}"
    out = tmp_path / "out"
    prog = tmp_path / "h.s"
    prog.write_text("# @dsps 1\n{ halt }\n")
    try:
        result = run_program(prog, load_platform(None).cluster, outputs=[spec], out_dir=out)
    except UserError as exc:
        assert "\n" not in str(exc).strip()
        assert not out.exists() or not any(out.iterdir())
    else:
        assert result.report.cycles >= 1
        (written,) = out.iterdir()
        assert written.name == f"{name}.npy"
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent != out and p != prog]
    assert not outside, outside


@QUICK
@given(values=st.dictionaries(st.sampled_from(PLATFORM_FIELDS), NUMBER_TEXT, min_size=1, max_size=3))
def test_platform_files_fuzz(tmp_path, values):
    _platform_case(tmp_path, values)


@QUICK
@given(values=st.dictionaries(st.sampled_from(HF_FIELDS), NUMBER_TEXT, min_size=1, max_size=3))
def test_hf_configs_fuzz(tmp_path, values):
    _hf_case(tmp_path, values)


@QUICK
@given(name=OUT_NAME, parts=st.lists(SPEC_PART, min_size=1, max_size=5))
def test_run_outputs_fuzz(tmp_path, name, parts):
    _run_case(tmp_path, name, parts)


@QUICK
@given(fields=st.fixed_dictionaries({}, optional={
    "ddr_bytes": st.one_of(st.integers(-5, 2 ** 70), st.floats(), st.text(max_size=3)),
    "useful_macs": st.one_of(st.none(), st.integers(-2 ** 40, 2 ** 70), st.floats()),
    "init_sregs": st.dictionaries(st.one_of(st.integers(-2, 30), st.text(max_size=1)),
                                  st.one_of(st.dictionaries(st.integers(-2, 70), st.one_of(
                                      st.integers(-2 ** 64, 2 ** 64), st.floats())), st.lists(st.integers())),
                                  max_size=2),
    "dsp_program": st.one_of(st.none(), st.lists(st.one_of(st.integers(-1, 2), st.floats()), max_size=3))}))
def test_python_kernel_fields_fuzz(fields):
    b = ProgramBuilder(load_platform(None).cluster.with_overrides(dsps=1))
    b.bundle(ins("halt"))
    kernel = Kernel([b.assemble()], **fields)
    try:
        result = run_kernel(kernel, load_platform(None).cluster.with_overrides(dsps=1))
    except UserError as exc:
        _one_line_naming(exc, ["Kernel", *fields])
    else:
        assert 0 <= result.report.utilization <= 1


def test_output_spec_sizes_are_python_ints():
    _name, region = parse_output_spec("w=DDR:0:4294967296x4294967296:float16")
    assert isinstance(region.nbytes, int) and region.nbytes == 2 ** 65
    assert np.dtype(np.float16).itemsize == 2


@pytest.mark.slow
@SLOW
@given(values=st.dictionaries(st.sampled_from(PLATFORM_FIELDS), NUMBER_TEXT, min_size=1, max_size=5))
def test_platform_files_fuzz_long(tmp_path, values):
    _platform_case(tmp_path, values)


@pytest.mark.slow
@SLOW
@given(values=st.dictionaries(st.sampled_from(HF_FIELDS), NUMBER_TEXT, min_size=1, max_size=5))
def test_hf_configs_fuzz_long(tmp_path, values):
    _hf_case(tmp_path, values)


@pytest.mark.slow
@SLOW
@given(name=OUT_NAME, parts=st.lists(SPEC_PART, min_size=1, max_size=5))
def test_run_outputs_fuzz_long(tmp_path, name, parts):
    _run_case(tmp_path, name, parts)

"""Per-stage memory (paper Eq. 5, 6, 9, 10): closed forms, invariants, paper rows, CLI."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ratrain import cli
from ratrain.errors import ConfigError
from ratrain.spec.memory import (
    DEFAULT_CONSTANTS,
    MemoryConstants,
    fits,
    layer_checkpoint_bytes,
    layer_full_bytes,
    layer_saved_tensors,
    max_peak,
    recovery_bytes,
    smallest_feasible,
    stage_memory,
)
from ratrain.spec.models import from_hf_config, get_model, layer_parameter_count
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import GIB, TrainingPlatform

HF = Path(__file__).parent / "fixtures" / "hf"


def peak_gib(model: str, **kw) -> float:
    return max_peak(stage_memory(get_model(model), ParallelConfig(**kw))) / GIB


# ---------------------------------------------------------------- closed forms

def test_full_save_layer_set_llama2_7b():
    m, h, f, heads, s = 2048, 4096, 11008, 32, 2048
    expected = m * (8 * h + 3 * f) * 2 + 2 * m * 4 + heads * s * s * 2
    assert layer_full_bytes(get_model("llama2-7b"), 1, 2048) == expected
    saved = layer_saved_tensors(get_model("llama2-7b"), 1, 2048)
    assert saved["attn_probs"] == 1 * heads * s * s * 2           # Algorithm 1 loads saved P
    assert layer_checkpoint_bytes(get_model("llama2-7b"), 1, 2048) == m * h * 2
    assert recovery_bytes(get_model("llama2-7b"), 1, 2048) == expected - m * h * 2


def test_gqa_saves_small_kv_and_tp_splits_heads():
    spec = get_model("llama2-70b")
    saved = layer_saved_tensors(spec, 1, 2048)
    assert saved["k"] == saved["v"] == 2048 * 8 * 128 * 2
    split = layer_saved_tensors(spec, 1, 2048, tp=4)
    assert split["attn_probs"] * 4 == saved["attn_probs"] and split["gate"] * 4 == saved["gate"]
    assert split["attn_norm_output"] == saved["attn_norm_output"]   # replicated (no seq. parallel)


def test_stage_state_closed_form_zero2():
    spec = get_model("llama2-7b")
    stages = stage_memory(spec, ParallelConfig(pp=2, dp=4, zero=2, accum=128))
    params0 = 16 * layer_parameter_count(spec) + spec.vocab * spec.hidden
    assert stages[0].state_bytes == 2 * params0 + 2 * math.ceil(params0 / 4) + 12 * math.ceil(params0 / 4)
    bd = stages[0].breakdown
    assert bd["weights"] == 2 * params0 and bd["optimizer"] == 12 * math.ceil(params0 / 4)


@pytest.mark.parametrize("zero, per_param", [(0, 16), (1, 4 + 12 / 8), (2, 2 + 14 / 8), (3, 16 / 8)])
def test_zero_stage_semantics(zero, per_param):
    spec = get_model("llama2-13b")
    st = stage_memory(spec, ParallelConfig(pp=40, dp=8, zero=zero, accum=8))[20]   # one plain layer
    assert st.state_bytes == pytest.approx(per_param * layer_parameter_count(spec), rel=1e-6)
    assert (st.breakdown["working_weights"] > 0) == (zero == 3)


def test_fsr_activation_is_eq6_and_full_is_eq5():
    spec = get_model("qwen2.5-32b")
    cfg = ParallelConfig(pp=8, dp=32, accum=128, activation="fsr")
    ck, rec = layer_checkpoint_bytes(spec, 1, 2048), recovery_bytes(spec, 1, 2048)
    full = layer_full_bytes(spec, 1, 2048)
    for st in stage_memory(spec, cfg):
        assert st.n_act == min(8 - st.stage, 128)
        tokens = st.n_act * 2048 * 4 * ((st.stage == 0) + (st.stage == 7))
        assert st.activation_bytes == st.n_act * len(st.layers) * ck + rec + tokens
    for st in stage_memory(spec, ParallelConfig(pp=8, dp=32, accum=128, activation="full")):
        tokens = st.n_act * 2048 * 4 * ((st.stage == 0) + (st.stage == 7))
        assert st.activation_bytes == st.n_act * len(st.layers) * full + tokens


def test_n_act_capped_by_accumulation():
    stages = stage_memory(get_model("llama2-70b"), ParallelConfig(pp=48, dp=2, accum=16))
    assert [st.n_act for st in stages] == [16] * 33 + list(range(15, 0, -1))


def test_peak_is_sum_of_tiers_and_breakdown():
    for st in stage_memory(get_model("baichuan2-13b"), ParallelConfig(pp=8, dp=2, accum=128)):
        assert st.peak_bytes == st.state_bytes + st.activation_bytes + st.buffer_bytes
        assert sum(st.breakdown.values()) == st.peak_bytes
        assert st.breakdown["runtime_reserve"] == DEFAULT_CONSTANTS.runtime_reserve_bytes


# ---------------------------------------------------------------- invariants

@pytest.mark.parametrize("model", ["llama2-7b", "baichuan2-13b", "qwen2.5-32b", "llama2-70b"])
def test_more_stages_less_state_per_stage(model):
    spec = get_model(model)
    states = [max(st.state_bytes for st in stage_memory(spec, ParallelConfig(pp=p, dp=4, accum=64)))
              for p in range(1, spec.layers + 1)]
    assert all(b <= a for a, b in zip(states, states[1:], strict=False))
    assert states[-1] < states[0] / 10


@pytest.mark.parametrize("model, pp", [("llama2-13b", 2), ("qwen2.5-32b", 8), ("llama2-70b", 48)])
def test_ckpt_and_fsr_below_full(model, pp):
    spec = get_model(model)
    by = {a: stage_memory(spec, ParallelConfig(pp=pp, dp=4, accum=32, activation=a))
          for a in ("full", "ckpt", "fsr")}
    for full, ckpt, fsr in zip(by["full"], by["ckpt"], by["fsr"], strict=False):
        assert ckpt.activation_bytes < fsr.activation_bytes <= full.activation_bytes
        if full.n_act * len(full.layers) > 1:
            # (one layer, one micro-batch in flight: FSR's checkpoint + recovery buffer is the
            # full-save set itself, so only then may they tie)
            assert fsr.activation_bytes < full.activation_bytes
            assert ckpt.peak_bytes < full.peak_bytes and fsr.peak_bytes < full.peak_bytes


@pytest.mark.parametrize("model, pp, dp", [("llama2-7b", 2, 4), ("qwen2.5-32b", 8, 32), ("llama2-70b", 80, 2)])
def test_higher_zero_never_increases_state(model, pp, dp):
    spec = get_model(model)
    runs = [stage_memory(spec, ParallelConfig(pp=pp, dp=dp, zero=z, accum=16)) for z in range(4)]
    for z in range(3):
        for lo, hi in zip(runs[z], runs[z + 1], strict=False):
            assert hi.state_bytes <= lo.state_bytes
            if z < 2:     # Z=3 adds gathered working weights to the buffer tier
                assert hi.peak_bytes <= lo.peak_bytes


def test_zero_without_data_parallelism_changes_nothing():
    spec = get_model("llama2-7b")
    peaks = {max_peak(stage_memory(spec, ParallelConfig(pp=8, dp=1, zero=z, accum=8))) for z in range(4)}
    assert len(peaks) == 1


def test_bulk_prefetch_costs_more_under_zero3():
    spec = get_model("llama2-13b")
    lw = stage_memory(spec, ParallelConfig(pp=2, dp=128, zero=3, prefetch="layerwise"))
    bulk = stage_memory(spec, ParallelConfig(pp=2, dp=128, zero=3, prefetch="bulk"))
    assert all(b.peak_bytes > layer.peak_bytes for layer, b in zip(lw, bulk, strict=False))
    z2 = [stage_memory(spec, ParallelConfig(pp=2, dp=128, zero=2, prefetch=p)) for p in ("layerwise", "bulk")]
    assert [s.peak_bytes for s in z2[0]] == [s.peak_bytes for s in z2[1]]   # gathered in place


def test_tensor_parallel_divides_state():
    spec = get_model("llama2-13b")
    t1 = stage_memory(spec, ParallelConfig(pp=2, dp=64, tp=1))
    t2 = stage_memory(spec, ParallelConfig(pp=2, dp=64, tp=2))
    for a, b in zip(t1, t2, strict=False):
        assert b.state_bytes == pytest.approx(a.state_bytes / 2, rel=0.01)


def test_fits_respects_budget():
    spec, cfg = get_model("llama2-7b"), ParallelConfig(pp=2, dp=4, accum=128)
    assert fits(spec, cfg)
    assert not fits(spec, cfg, TrainingPlatform().with_overrides(memory_budget_bytes=16 * GIB))
    assert not fits(spec, ParallelConfig(pp=2, dp=4, accum=128, activation="full"))


def test_hf_config_gives_same_memory_as_builtin():
    cfg = ParallelConfig(pp=16, dp=4, accum=128)
    a = stage_memory(from_hf_config(HF / "qwen2.5-32b.json"), cfg)
    b = stage_memory(get_model("qwen2.5-32b"), cfg)
    assert [s.peak_bytes for s in a] == [s.peak_bytes for s in b]


def test_bad_tp_is_a_config_error():
    with pytest.raises(ConfigError, match="not divisible by tp=3"):
        stage_memory(get_model("llama2-7b"), ParallelConfig(pp=2, tp=3))


# ---------------------------------------------------------------- paper targets

# (model, config, paper peak GB, tolerance GB).  GB = 2**30 bytes (docs/CHOICES.md).
# The runtime reserve was fitted on the rows marked "fit"; all others are held out.
_XFAIL_QWEN_T3 = pytest.mark.xfail(strict=True, reason=(
    "held out: our parameter-balanced partition gives 16.3 GB vs 18.14 (-1.8 GB); the uniform "
    "split would match this row (18.8) but makes Baichuan2-13B P=8,D=2 infeasible (22.8)"))
_XFAIL_TP = pytest.mark.xfail(strict=True, reason=(
    "TP divides layer weights in our model; the paper's TP-heavy peaks exceed its own T=1 rows"))
_XFAIL_Z3 = pytest.mark.xfail(strict=True, reason=(
    "ZeRO-3 over D=128 / D=32 shards the FP16 weights too; the paper's ZeRO-3 peaks are 7-10 GB higher"))

PAPER_ROWS = [
    # Table 3: T=1, Z=2, b=1, seq 2048, FSR, within 1.0 GB
    pytest.param("llama2-7b", dict(pp=2, dp=4, accum=128), 19.57, 1.0, id="T3-7b-fit"),
    pytest.param("baichuan2-13b", dict(pp=8, dp=2, accum=128), 19.06, 1.0, id="T3-baichuan-fit"),
    pytest.param("qwen2.5-32b", dict(pp=16, dp=4, accum=128), 18.14, 1.0, id="T3-qwen", marks=_XFAIL_QWEN_T3),
    pytest.param("llama2-70b", dict(pp=48, dp=2, accum=16), 19.46, 1.0, id="T3-70b-fit"),
    # Table 2: 256 clusters, within 1.5 GB (A: global batch 4096 / (D b))
    pytest.param("llama2-13b", dict(pp=2, dp=128, accum=32), 15.84, 1.5, id="T2-13b-ratrain"),
    pytest.param("llama2-13b", dict(pp=2, dp=64, tp=2, accum=64), 16.51, 1.5, id="T2-13b-tp", marks=_XFAIL_TP),
    pytest.param("llama2-13b", dict(pp=2, dp=128, zero=3, accum=32), 14.73, 1.5, id="T2-13b-z3", marks=_XFAIL_Z3),
    pytest.param("llama2-13b", dict(pp=2, dp=128, accum=32, activation="ckpt"), 15.73, 1.5, id="T2-13b-ckpt"),
    pytest.param("qwen2.5-32b", dict(pp=8, dp=32, accum=128), 14.71, 1.5, id="T2-qwen-ratrain"),
    pytest.param("qwen2.5-32b", dict(pp=8, dp=16, tp=2, accum=256), 19.45, 1.5, id="T2-qwen-tp", marks=_XFAIL_TP),
    pytest.param("qwen2.5-32b", dict(pp=8, dp=32, zero=3, accum=128), 16.54, 1.5, id="T2-qwen-z3", marks=_XFAIL_Z3),
    pytest.param("qwen2.5-32b", dict(pp=8, dp=32, accum=128, activation="ckpt"), 14.50, 1.5, id="T2-qwen-ckpt"),
]


@pytest.mark.parametrize("model, kw, paper, tol", PAPER_ROWS)
def test_paper_peak(model, kw, paper, tol):
    ours = peak_gib(model, **kw)
    assert abs(ours - paper) <= tol, f"ours {ours:.2f} GB vs paper {paper:.2f} GB"
    assert ours <= 20.0      # every paper row ran, so it must fit


@pytest.mark.parametrize("model, kw", [("llama2-13b", dict(pp=2, dp=128, accum=32)),
                                       ("qwen2.5-32b", dict(pp=8, dp=32, accum=128))])
def test_full_save_is_oom(model, kw):
    assert peak_gib(model, activation="full", **kw) > 20.0
    assert not fits(get_model(model), ParallelConfig(activation="full", **kw))


def test_smallest_feasible_is_minimal_llama2_7b():
    spec = get_model("llama2-7b")
    cfg, peak = smallest_feasible(spec, global_batch=512)
    assert peak <= 20 * GIB and fits(spec, cfg)
    # Our model finds a footprint no larger than the paper's 8 clusters (it finds P=7, D=1).
    assert cfg.clusters <= 8
    # Exhaustive check: nothing with fewer clusters fits.
    for d in (1, 2, 4):
        for p in range(1, (cfg.clusters - 1) // d + 1):
            small = ParallelConfig(pp=p, dp=d, accum=512 // d)
            assert not fits(spec, small), small.describe()


def test_runtime_reserve_is_additive():
    spec, cfg = get_model("llama2-7b"), ParallelConfig(pp=2, dp=4, accum=128)
    a = max_peak(stage_memory(spec, cfg, constants=MemoryConstants(0)))
    b = max_peak(stage_memory(spec, cfg, constants=MemoryConstants(GIB)))
    assert b - a == GIB


# ---------------------------------------------------------------- CLI

def test_cli_model_json(capsys):
    assert cli.main(["model", "--model", "llama2-7b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["name"] == "llama2-7b" and out["parameters"] == 6_738_415_616 and out["layers"] == 32
    gemm = {op["name"]: (op["m"], op["k"], op["n"]) for op in out["operators"] if op["kind"] == "gemm"}
    assert gemm["down_proj"] == (2048, 11008, 4096)


def test_cli_model_hf_config_text(capsys):
    assert cli.main(["model", "--hf-config", str(HF / "qwen3-8b.json")]) == 0
    assert "8,190,735,360 parameters" in capsys.readouterr().out


def test_cli_memory_json(capsys):
    argv = ["memory", "--model", "baichuan2-13b", "--pp", "8", "--dp", "2", "--zero", "2",
            "--micro-batch", "1", "--seq", "2048", "--accum", "128", "--activation", "fsr", "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["budget_bytes"] == 20 * GIB and out["fits"] is True and len(out["stages"]) == 8
    keys = {"stage", "state_bytes", "activation_bytes", "buffer_bytes", "peak_bytes"}
    assert all(keys <= set(st) for st in out["stages"])
    assert max(st["peak_bytes"] for st in out["stages"]) == out["max_peak_bytes"]


def test_cli_memory_platform_file(tmp_path, capsys):
    plat = tmp_path / "small.toml"
    plat.write_text("memory_budget_bytes = 1073741824\n")
    assert cli.main(["memory", "--model", "llama2-7b", "--pp", "2", "--platform", str(plat), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["budget_bytes"] == GIB and out["fits"] is False


@pytest.mark.parametrize("argv, word", [
    (["memory", "--model", "gpt-9"], "unknown model"),
    (["memory", "--model", "llama2-7b", "--pp", "0"], "pp must be"),
    (["memory", "--model", "llama2-7b", "--zero", "5"], "zero must be"),
    (["memory", "--model", "llama2-7b", "--pp", "33"], "exceeds the number of layers"),
    (["memory", "--hf-config", str(HF / "bad-wrong-type.json")], "hidden_size must be an integer"),
    (["model", "--hf-config", str(HF / "missing.json")], "cannot read"),
    (["memory", "--model", "llama2-7b", "--platform", "/nonexistent/p.toml"], "cannot read"),
])
def test_cli_bad_input_exits_2_with_one_line(argv, word, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and word in lines[0] and captured.out == ""

"""Model specs: exact parameter counts, HF config parsing, operator shapes, configs, platform."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratrain.errors import ConfigError
from ratrain.spec.models import (
    Operator,
    embedding_and_head_operators,
    from_hf_config,
    get_model,
    layer_operators,
    layer_parameter_count,
    layer_tp_parameter_count,
    list_models,
    parameter_count,
)
from ratrain.spec.parallel import ParallelConfig, in_flight_microbatches, partition_layers, partition_model
from ratrain.spec.platform import GIB, TrainingPlatform

HF = Path(__file__).parent / "fixtures" / "hf"


# ---------------------------------------------------------------- parameter counts

@pytest.mark.parametrize("name, expected", [
    ("llama2-7b", 6_738_415_616),
    ("llama2-13b", 13_015_864_320),
    ("llama2-70b", 68_976_648_192),
    ("qwen2.5-32b", 32_763_876_352),        # HF safetensors total
    ("baichuan2-13b", 13_896_668_160),
])
def test_exact_parameter_counts(name, expected):
    assert parameter_count(get_model(name)) == expected


def test_layer_count_by_hand_llama2_7b():
    # 4 h^2 attention + 3 h f MLP + 2 h norms
    h, f = 4096, 11008
    assert layer_parameter_count(get_model("llama2-7b")) == 4 * h * h + 3 * h * f + 2 * h


def test_tp_split_keeps_norms_replicated():
    spec = get_model("llama2-13b")
    full, half = layer_tp_parameter_count(spec, 1), layer_tp_parameter_count(spec, 2)
    assert full == layer_parameter_count(spec)
    assert half == (full - 2 * spec.hidden) // 2 + 2 * spec.hidden


def test_builtins_listed_and_unknown_rejected():
    assert set(list_models()) >= {"llama2-7b", "llama2-13b", "llama2-70b", "baichuan2-13b", "qwen2.5-32b"}
    with pytest.raises(ConfigError, match="unknown model 'gpt-9'"):
        get_model("gpt-9")


# ---------------------------------------------------------------- HF config.json

@pytest.mark.parametrize("fixture, builtin", [
    ("llama2-7b.json", "llama2-7b"),
    ("llama2-70b.json", "llama2-70b"),
    ("qwen2.5-32b.json", "qwen2.5-32b"),
    ("baichuan2-13b.json", "baichuan2-13b"),
])
def test_hf_config_matches_builtin(fixture, builtin):
    spec, ref = from_hf_config(HF / fixture), get_model(builtin)
    for field in ("hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "vocab", "qkv_bias",
                  "tied_embeddings", "position", "packed_qkv", "qk_norm"):
        assert getattr(spec, field) == getattr(ref, field), field
    assert parameter_count(spec) == parameter_count(ref)


def test_hf_mistral_gqa_and_window():
    spec = from_hf_config(HF / "mistral-7b.json")
    assert (spec.family, spec.kv_heads, spec.sliding_window) == ("mistral", 8, 4096)
    assert parameter_count(spec) == 7_241_732_096
    att = [op for op in layer_operators(spec, 1, 8192) if op.kind == "attention"][0]
    assert att.window == 4096


def test_hf_qwen3_head_dim_and_qk_norm():
    spec = from_hf_config(HF / "qwen3-8b.json")
    assert spec.family == "qwen3" and spec.qk_norm and not spec.qkv_bias and spec.head_dim == 128
    assert parameter_count(spec) == 8_190_735_360
    names = [op.name for op in layer_operators(spec, 1, 128)]
    assert "qk_norm" in names


def test_hf_qwen3_head_dim_need_not_divide_hidden(tmp_path):
    raw = json.loads((HF / "qwen3-8b.json").read_text())
    raw.update(hidden_size=1000, num_attention_heads=16, num_key_value_heads=8, head_dim=64)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    spec = from_hf_config(path)
    assert spec.q_dim == 1024 and spec.hidden == 1000 and spec.name == tmp_path.name
    q = [op for op in layer_operators(spec, 2, 16) if op.name == "q_proj"][0]
    assert (q.m, q.k, q.n) == (32, 1000, 1024)


def test_hf_baichuan_without_model_type_uses_architectures_and_alibi():
    raw = json.loads((HF / "baichuan2-13b.json").read_text())
    assert "model_type" not in raw
    spec = from_hf_config(HF / "baichuan2-13b.json")
    assert spec.family == "baichuan" and spec.position == "alibi" and spec.packed_qkv


def test_hf_baichuan_7b_uses_rope():
    spec = from_hf_config(HF / "baichuan2-7b.json")
    assert spec.position == "rope" and spec.packed_qkv
    assert parameter_count(spec) == 7_505_973_248


@pytest.mark.parametrize("fixture, pattern", [
    ("bad-missing-field.json", r"bad-missing-field\.json: missing field num_hidden_layers"),
    ("bad-wrong-type.json", r"bad-wrong-type\.json: field hidden_size must be an integer"),
    ("bad-nonpositive.json", r"bad-nonpositive\.json: field num_hidden_layers must be positive"),
    ("bad-indivisible.json", r"bad-indivisible\.json: field hidden_size=4000 is not divisible by "
                             r"num_attention_heads=48"),
    ("bad-unknown-type.json", r"bad-unknown-type\.json: field model_type='falcon' is not supported"),
    ("bad-not-json.json", r"bad-not-json\.json: not valid JSON"),
    ("no-such-file.json", r"no-such-file\.json: cannot read"),
])
def test_hf_malformed_configs_name_file_and_field(fixture, pattern):
    with pytest.raises(ConfigError, match=pattern):
        from_hf_config(HF / fixture)


def test_hf_kv_heads_must_divide_heads(tmp_path):
    raw = json.loads((HF / "llama2-7b.json").read_text())
    raw["num_key_value_heads"] = 5
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"odd\.json: field num_key_value_heads=5"):
        from_hf_config(path)


# ---------------------------------------------------------------- operators

def _gemms(ops: list[Operator]) -> dict[str, tuple[int, int, int]]:
    return {op.name: (op.m, op.k, op.n) for op in ops if op.kind == "gemm"}


def test_llama2_7b_layer_gemm_shapes():
    g = _gemms(layer_operators(get_model("llama2-7b"), micro_batch=1, seq=2048))
    assert g == {"q_proj": (2048, 4096, 4096), "k_proj": (2048, 4096, 4096), "v_proj": (2048, 4096, 4096),
                 "o_proj": (2048, 4096, 4096), "gate_proj": (2048, 4096, 11008),
                 "up_proj": (2048, 4096, 11008), "down_proj": (2048, 11008, 4096)}


def test_gemm_weight_macs_equal_layer_weights_times_tokens():
    # Every projection weight is used once per token in the forward pass.
    for name in list_models():
        spec = get_model(name)
        b, s = 2, 256
        macs = sum(op.macs for op in layer_operators(spec, b, s) if op.kind == "gemm")
        weights = layer_parameter_count(spec) - 2 * spec.hidden
        weights -= (spec.q_dim + 2 * spec.kv_dim) if spec.qkv_bias else 0
        assert macs == b * s * weights, name


def test_tensor_parallel_splits_n_or_k():
    spec = get_model("llama2-70b")
    g1 = _gemms(layer_operators(spec, 1, 2048, tp=1))
    g8 = _gemms(layer_operators(spec, 1, 2048, tp=8))
    for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
        assert g8[name] == (g1[name][0], g1[name][1], g1[name][2] // 8)      # column-parallel
    for name in ("o_proj", "down_proj"):
        assert g8[name] == (g1[name][0], g1[name][1] // 8, g1[name][2])      # row-parallel
    kinds = [op.kind for op in layer_operators(spec, 1, 2048, tp=8)]
    assert kinds.count("allreduce") == 2 and "allreduce" not in [op.kind for op in layer_operators(spec, 1, 2048)]
    with pytest.raises(ConfigError, match="not divisible by tp=3"):
        layer_operators(spec, 1, 2048, tp=3)


def test_packed_qkv_and_bias_and_attention_shapes():
    baichuan = layer_operators(get_model("baichuan2-13b"), 1, 2048)
    assert _gemms(baichuan)["qkv_proj"] == (2048, 5120, 3 * 5120)
    assert "rotary" not in [op.name for op in baichuan]               # ALiBi: no rotary op
    att = [op for op in baichuan if op.kind == "attention"][0]
    assert (att.batch, att.heads, att.kv_heads, att.seq, att.head_dim, att.causal, att.alibi) == \
        (1, 40, 40, 2048, 128, True, True)
    qwen = layer_operators(get_model("qwen2.5-32b"), 4, 1024, tp=2)
    assert [op.bias for op in qwen if op.name in ("q_proj", "k_proj", "v_proj")] == [True] * 3
    att = [op for op in qwen if op.kind == "attention"][0]
    assert (att.batch, att.heads, att.kv_heads) == (4, 20, 4)
    assert att.macs == 2 * 4 * 20 * 1024 * 1024 * 128


def test_elementwise_bytes():
    ops = {op.name: op for op in layer_operators(get_model("llama2-7b"), 1, 2048)}
    m, h, f = 2048, 4096, 11008
    assert ops["attn_residual"].bytes_moved == 3 * m * h * 2
    assert ops["swiglu"].bytes_moved == 3 * m * f * 2
    assert ops["attn_norm"].bytes_moved == 2 * m * h * 2 + h * 2 + m * 4
    assert ops["rotary"].bytes_moved == 2 * m * (32 + 32) * 128 * 2 + 2 * 2048 * 128 * 2


def test_embedding_and_head_operators():
    edge = embedding_and_head_operators(get_model("qwen2.5-32b"), 1, 2048, tp=2)
    head = [op for op in edge["last"] if op.name == "lm_head"][0]
    assert (head.m, head.k, head.n) == (2048, 5120, 152064 // 2)
    assert [op.kind for op in edge["first"]] == ["embedding", "allreduce"]
    assert [op.name for op in edge["last"]] == ["final_norm", "lm_head", "loss"]


def test_bad_operator_shape_inputs():
    with pytest.raises(ConfigError, match="micro_batch"):
        layer_operators(get_model("llama2-7b"), 0, 2048)
    with pytest.raises(ConfigError, match="seq"):
        layer_operators(get_model("llama2-7b"), 1, -5)


# ---------------------------------------------------------------- ParallelConfig and partition

def test_parallel_config_describe_and_validation():
    assert ParallelConfig(pp=8, dp=32, zero=2, activation="fsr").describe() == "P=8,D=32,Z=2,FSR"
    assert ParallelConfig(pp=2, dp=64, tp=2, activation="ckpt").describe() == "P=2,D=64,T=2,Z=2,Ckpt"
    cfg = ParallelConfig(pp=2, dp=4, accum=128, micro_batch=1)
    assert (cfg.clusters, cfg.global_batch) == (8, 512)
    for kw, word in [({"pp": 0}, "pp"), ({"zero": 4}, "zero"), ({"activation": "half"}, "activation"),
                     ({"prefetch": "eager"}, "prefetch"), ({"accum": 1.5}, "accum"),
                     ({"partition": "random"}, "partition")]:
        with pytest.raises(ConfigError, match=word):
            ParallelConfig(**kw)


def test_in_flight_rule():
    assert [in_flight_microbatches(p, 4, 8) for p in range(4)] == [4, 3, 2, 1]
    assert [in_flight_microbatches(p, 48, 16) for p in (0, 31, 32, 33, 47)] == [16, 16, 16, 15, 1]
    with pytest.raises(ConfigError):
        in_flight_microbatches(4, 4, 8)


def test_partition_layers_uniform():
    assert [len(r) for r in partition_layers(32, 2)] == [16, 16]
    assert [len(r) for r in partition_layers(80, 48)] == [1] * 16 + [2] * 32
    assert [len(r) for r in partition_layers(10, 3)] == [3, 3, 4]
    parts = partition_layers(40, 8)
    assert parts[0].start == 0 and parts[-1].stop == 40
    assert all(a.stop == b.start for a, b in zip(parts, parts[1:], strict=False))
    with pytest.raises(ConfigError, match="exceeds the number of layers"):
        partition_layers(4, 5)


def test_partition_with_edge_weights_balances_parameters():
    # Baichuan2-13B: the embedding and the LM head each weigh about 2 layers.
    counts = [len(r) for r in partition_model(get_model("baichuan2-13b"), 8)]
    assert sum(counts) == 40 and counts[0] == 3 and counts[-1] == 3 and max(counts) == 6
    # Leftover layers go to output-side stages (fewer in-flight micro-batches).
    assert counts == sorted(counts[:-1]) + [3]
    assert [len(r) for r in partition_model(get_model("llama2-7b"), 2)] == [16, 16]
    assert [len(r) for r in partition_model(get_model("qwen2.5-32b"), 8, "uniform")] == [8] * 8


def test_partition_property_every_split_is_contiguous_and_complete():
    for layers in (1, 2, 7, 40, 80):
        for pp in range(1, min(layers, 12) + 1):
            for first, last in ((0, 0), (0.5, 2.0), (3.2, 0.1)):
                parts = partition_layers(layers, pp, first, last)
                assert len(parts) == pp and all(len(r) >= 1 for r in parts)
                assert parts[0].start == 0 and parts[-1].stop == layers
                assert all(a.stop == b.start for a, b in zip(parts, parts[1:], strict=False))


# ---------------------------------------------------------------- platform

def test_platform_defaults_and_overrides():
    p = TrainingPlatform()
    assert p.memory_budget_bytes == 20 * GIB and p.ddr_bandwidth == 51e9 and p.link_bandwidth == 3.7e9
    assert p.peak_mac_per_s == 8.1e12 and 0 < p.link_latency_s < 1e-3
    q = p.with_overrides(memory_budget_bytes=16 * GIB)
    assert q.memory_budget_bytes == 16 * GIB and p.memory_budget_bytes == 20 * GIB
    with pytest.raises(ConfigError, match="unknown field 'hbm'"):
        p.with_overrides(hbm=1)
    with pytest.raises(ConfigError, match="ddr_bandwidth"):
        p.with_overrides(ddr_bandwidth=-1.0)


def test_platform_from_toml_and_json(tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_text('name = "half"\nmemory_budget_bytes = 10737418240\nlink_bandwidth = 1.0e9\n')
    p = TrainingPlatform.from_file(toml)
    assert (p.name, p.memory_budget_bytes, p.link_bandwidth) == ("half", 10 * GIB, 1e9)
    js = tmp_path / "p.json"
    js.write_text(json.dumps({"clock_hz": 0.5 * 1.7578125e9}))
    assert TrainingPlatform.from_file(js).peak_mac_per_s == pytest.approx(4.05e12)
    js.write_text(json.dumps({"peak_mac_per_s": 4e12}))             # derived: only its true value is accepted
    with pytest.raises(ConfigError, match=r"peak_mac_per_s=4000000000000.0 is derived"):
        TrainingPlatform.from_file(js)


@pytest.mark.parametrize("text, pattern", [
    ('{"ddr_bw": 1}', r"bad\.json: unknown field 'ddr_bw'"),
    ('{"link_bandwidth": 0}', r"bad\.json: field link_bandwidth must be a positive number"),
    ('{"memory_budget_bytes": "20GB"}', r"bad\.json: field memory_budget_bytes"),
    ('{"link_latency_s": -1}', r"bad\.json: field link_latency_s"),
    ('[1, 2]', r"bad\.json: top level"),
    ('{"a": ', r"bad\.json: not valid JSON"),
])
def test_platform_bad_files(tmp_path, text, pattern):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=pattern):
        TrainingPlatform.from_file(path)

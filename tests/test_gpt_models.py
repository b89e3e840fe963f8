"""GPT models as Megatron runs them: parameter counts, HF gpt2 configs, operators, padded vocab.

Hand-derived references: a GPT-2 layer holds 12 h^2 + 13 h parameters (q/k/v/proj weights 4 h^2
and biases 4 h, fc1/fc2 weights 8 h^2 and biases 5 h, two LayerNorms 4 h); the model adds the
token embedding (vocab x h), the learned positions (n_positions x h) and the final LayerNorm
(2 h); the head is tied. A layer's forward FLOPs are 24 b s h^2 + 4 b s^2 h (Narayanan et al.,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", 2021).
"""
from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest

from ratrain.errors import ConfigError
from ratrain.spec.memory import layer_saved_tensors, layer_workspace_bytes, stage_memory
from ratrain.spec.models import (
    ModelSpec,
    embedding_and_head_operators,
    embedding_parameter_count,
    from_hf_config,
    get_model,
    gpt_model,
    head_parameter_count,
    layer_operators,
    layer_parameter_count,
    layer_tp_parameter_count,
    list_models,
    megatron_padded_vocab,
    parameter_count,
    stage_edge_parameters,
)
from ratrain.spec.parallel import ParallelConfig

HF = Path(__file__).parent / "fixtures" / "hf"


def gpt_params(h: int, layers: int, vocab: int, positions: int) -> int:
    return layers * (12 * h * h + 13 * h) + vocab * h + positions * h + 2 * h


# ---------------------------------------------------------------- parameter counts

@pytest.mark.parametrize("fixture, expected, h, layers", [
    ("gpt2.json", 124_439_808, 768, 12),
    ("gpt2-medium.json", 354_823_168, 1024, 24),
])
def test_hf_gpt2_parameter_counts(fixture, expected, h, layers):
    spec = from_hf_config(HF / fixture)
    assert gpt_params(h, layers, 50257, 1024) == expected          # the hand derivation itself
    assert parameter_count(spec) == expected
    assert layer_parameter_count(spec) == 12 * h * h + 13 * h
    assert embedding_parameter_count(spec) == (50257 + 1024) * h
    assert head_parameter_count(spec) == 2 * h                      # final LayerNorm; head tied
    assert (spec.family, spec.norm, spec.mlp, spec.position, spec.max_positions) == \
        ("gpt", "layernorm", "gelu", "learned", 1024)
    assert (spec.ffn, spec.kv_heads, spec.head_dim, spec.tied_embeddings, spec.linear_bias, spec.dropout) == \
        (4 * h, spec.heads, h // spec.heads, True, True, 0.1)


@pytest.mark.parametrize("tp, padded", [(1, 50304), (2, 50432), (4, 50688), (8, 51200)])
def test_megatron_padded_vocab(tp, padded):
    assert megatron_padded_vocab(50257, tp) == padded
    assert padded % (128 * tp) == 0 and padded - 128 * tp < 50257 <= padded
    assert megatron_padded_vocab(padded, tp) == padded                  # already aligned: unchanged
    assert megatron_padded_vocab(50257, tp, divisible_by=1) == -(-50257 // tp) * tp


def test_megatron_padded_vocab_rejects_bad_input():
    with pytest.raises(ConfigError, match="tp must be a positive integer"):
        megatron_padded_vocab(50257, 0)
    with pytest.raises(ConfigError, match="divisible_by"):
        megatron_padded_vocab(50257, 1, divisible_by=True)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_gpt_model_counts_the_padded_vocabulary(tp):
    spec = gpt_model(1024, 16, 24, 1024, tp=tp)
    vocab = megatron_padded_vocab(50257, tp)
    assert spec.vocab == vocab
    assert parameter_count(spec) == gpt_params(1024, 24, vocab, 1024)
    # the measured runs' shape: GPT-2 medium's layers with Megatron's padded embedding
    assert parameter_count(spec) - parameter_count(from_hf_config(HF / "gpt2-medium.json")) == (vocab - 50257) * 1024


def test_gpt_model_names_round_trip():
    assert gpt_model(1024, 16, 24, 1024).name == "gpt-h1024-l24-a16"
    for spec in (gpt_model(1024, 16, 24, 1024), gpt_model(2048, 16, 12, 1024, tp=8),
                 gpt_model(512, 8, 2, 256, vocab=1000, tp=2)):
        assert get_model(spec.name) == spec
    assert gpt_model(2048, 16, 12, 2048, tp=4).name == "gpt-h2048-l12-a16-s2048-tp4"
    assert "gpt-h1024-l24-a16" not in list_models()         # made on demand, not in the built-in table
    with pytest.raises(ConfigError, match="not divisible by heads"):
        gpt_model(1000, 16, 2)


def test_gpt_tp_split_replicates_norms_and_row_parallel_biases():
    spec = gpt_model(1024, 16, 24, 1024)
    h = 1024
    split = 12 * h * h + 3 * h + 4 * h               # weights, qkv and fc1 biases (column-parallel)
    replicated = 4 * h + 2 * h                       # two LayerNorms, proj and fc2 biases
    assert layer_tp_parameter_count(spec, 1) == layer_parameter_count(spec) == split + replicated
    for tp in (2, 4, 8):
        assert layer_tp_parameter_count(spec, tp) == split // tp + replicated


def test_gpt_stage_edges_hold_positions_on_stage_0_and_a_tied_copy_on_the_last():
    spec = gpt_model(1024, 16, 24, 1024, tp=2)
    h, v = 1024, spec.vocab
    assert stage_edge_parameters(spec, 1, 2) == (v * h // 2 + 1024 * h, 2 * h)          # tied: no copy
    assert stage_edge_parameters(spec, 4, 2) == (v * h // 2 + 1024 * h, v * h // 2 + 2 * h)


# ---------------------------------------------------------------- HF config.json

def test_hf_gpt2_optional_fields(tmp_path):
    raw = json.loads((HF / "gpt2.json").read_text())
    raw.update(n_inner=None, tie_word_embeddings=False, activation_function="gelu", attn_pdrop=0.0,
               resid_pdrop=0.0, layer_norm_epsilon=1e-6)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    spec = from_hf_config(path)
    assert (spec.ffn, spec.tied_embeddings, spec.dropout, spec.norm_eps) == (4 * 768, False, 0.0, 1e-6)
    assert parameter_count(spec) == 124_439_808 + 50257 * 768          # untied head
    raw.update(n_inner=2048)
    path.write_text(json.dumps(raw))
    assert from_hf_config(path).ffn == 2048


@pytest.mark.parametrize("change, pattern", [
    ({"activation_function": "relu"}, r"field activation_function='relu' is not supported"),
    ({"attn_pdrop": 1.5}, r"field attn_pdrop must be a probability"),
    ({"attn_pdrop": 0.0}, r"field resid_pdrop=0.1 and attn_pdrop=0.0 must be both zero or both positive"),
    ({"n_inner": 0}, r"field n_inner must be positive"),
    ({"n_positions": "1024"}, r"field n_positions must be an integer"),
    ({"n_head": 10}, r"field n_embd=768 is not divisible by n_head=10"),
    ({"tie_word_embeddings": "yes"}, r"field tie_word_embeddings must be true or false"),
])
def test_hf_gpt2_bad_fields_name_file_and_field(tmp_path, change, pattern):
    raw = json.loads((HF / "gpt2.json").read_text())
    raw.update(change)
    path = tmp_path / "gpt2-bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"gpt2-bad\.json: " + pattern):
        from_hf_config(path)


def test_hf_gpt2_missing_field_fixture():
    with pytest.raises(ConfigError, match=r"bad-gpt2-missing-n-embd\.json: missing field n_embd$"):
        from_hf_config(HF / "bad-gpt2-missing-n-embd.json")


def test_hf_gpt2_by_architecture_only(tmp_path):
    raw = json.loads((HF / "gpt2.json").read_text())
    del raw["model_type"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert parameter_count(from_hf_config(path)) == 124_439_808


# ---------------------------------------------------------------- the spec itself

_LLAMA_JSON_KEYS = ["name", "hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "vocab", "qkv_bias",
                    "tied_embeddings", "position", "packed_qkv", "qk_norm", "norm_eps", "rope_theta",
                    "sliding_window", "family"]


def test_llama_spec_json_has_no_gpt_fields():
    # profile cache names hash spec.to_json(): a LLaMA-family spec's JSON must stay as it was
    for name in list_models():
        assert list(get_model(name).to_json()) == _LLAMA_JSON_KEYS
    gpt = gpt_model(1024, 16, 24, 1024).to_json()
    assert (gpt["norm"], gpt["mlp"], gpt["linear_bias"], gpt["max_positions"], gpt["dropout"]) == \
        ("layernorm", "gelu", True, 1024, 0.1)


@pytest.mark.parametrize("kw, pattern", [
    ({"norm": "batchnorm"}, "norm must be one of"),
    ({"mlp": "relu"}, "mlp must be one of"),
    ({"position": "learned"}, "learned positions need max_positions"),
    ({"max_positions": 1024}, "max_positions is for position 'learned' only"),
    ({"dropout": 1.0}, r"dropout must be a probability in \[0, 1\)"),
    ({"dropout": True}, "dropout must be a probability"),
    ({"linear_bias": 1}, "linear_bias must be true or false"),
])
def test_spec_rejects_bad_gpt_fields(kw, pattern):
    with pytest.raises(ConfigError, match=pattern):
        ModelSpec("m", hidden=64, ffn=256, layers=2, heads=4, kv_heads=4, head_dim=16, vocab=128, **kw)


# ---------------------------------------------------------------- operators

GPT_LAYER_OPS = ["attn_norm", "qkv_proj", "attention", "attn_probs_dropout", "o_proj", "attn_allreduce",
                 "attn_dropout", "attn_residual", "mlp_norm", "fc1", "gelu", "fc2", "mlp_allreduce",
                 "mlp_dropout", "mlp_residual"]


def test_gpt_layer_operator_order_and_allreduce_places():
    spec = gpt_model(1024, 16, 24, 1024, tp=2)
    assert [op.name for op in layer_operators(spec, 1, 1024, tp=2)] == GPT_LAYER_OPS
    assert [op.name for op in layer_operators(spec, 1, 1024)] == \
        [n for n in GPT_LAYER_OPS if not n.endswith("allreduce")]
    ops = {op.name: op for op in layer_operators(spec, 1, 1024, tp=2)}
    assert all(ops[n].bias for n in ("qkv_proj", "o_proj", "fc1", "fc2"))
    assert ops["attn_allreduce"].bytes_moved == ops["mlp_allreduce"].bytes_moved == 1024 * 1024 * 2


@pytest.mark.parametrize("h, layers, b, s, tp", [(1024, 24, 1, 1024, 1), (2048, 12, 4, 1024, 2),
                                                 (1024, 12, 2, 512, 8)])
def test_gpt_layer_forward_flops_narayanan(h, layers, b, s, tp):
    spec = gpt_model(h, 16, layers, 1024, tp=tp)
    ops = layer_operators(spec, b, s, tp)
    flops_per_rank = sum(2 * op.macs for op in ops)
    assert flops_per_rank * tp == 24 * b * s * h * h + 4 * b * s * s * h
    att = next(op for op in ops if op.kind == "attention")
    assert (att.batch, att.heads, att.kv_heads, att.seq, att.head_dim, att.causal, att.alibi) == \
        (b, 16 // tp, 16 // tp, s, h // 16, True, False)
    gemm = {op.name: (op.m, op.k, op.n) for op in ops if op.kind == "gemm"}
    m = b * s
    assert gemm == {"qkv_proj": (m, h, 3 * h // tp), "o_proj": (m, h // tp, h),
                    "fc1": (m, h, 4 * h // tp), "fc2": (m, 4 * h // tp, h)}


def test_gpt_gemm_macs_equal_weights_times_tokens():
    spec = from_hf_config(HF / "gpt2.json")
    h, b, s = 768, 2, 128
    macs = sum(op.macs for op in layer_operators(spec, b, s) if op.kind == "gemm")
    assert macs == b * s * 12 * h * h                         # weights only: biases and norms are not GEMM work


def test_gpt_elementwise_bytes():
    spec = gpt_model(1024, 16, 24, 1024, tp=2)
    b, s, h, tp = 2, 1024, 1024, 2
    m, f, heads = b * s, 4 * h // tp, 16 // tp
    ops = {op.name: op for op in layer_operators(spec, b, s, tp)}
    # LayerNorm: read x, weight and bias; write y, FP32 mean and rstd
    assert ops["attn_norm"].bytes_moved == ops["mlp_norm"].bytes_moved == 2 * m * h * 2 + 2 * h * 2 + 2 * m * 4
    # dropout: read FP16, write FP16 and the 1-byte mask
    assert ops["attn_probs_dropout"].bytes_moved == b * heads * s * s * 5
    assert ops["attn_dropout"].bytes_moved == ops["mlp_dropout"].bytes_moved == m * h * 5
    assert ops["gelu"].bytes_moved == 2 * m * f * 2
    assert ops["attn_residual"].bytes_moved == ops["mlp_residual"].bytes_moved == 3 * m * h * 2


def test_gpt_embedding_and_head_operators():
    spec = gpt_model(1024, 16, 24, 1024, tp=2)
    m, h = 2 * 1024, 1024
    edge = embedding_and_head_operators(spec, 2, 1024, tp=2)
    assert [op.name for op in edge["first"]] == ["embedding", "embedding_allreduce", "position_embedding",
                                                 "embedding_dropout"]
    first = {op.name: op for op in edge["first"]}
    assert first["position_embedding"].bytes_moved == 3 * m * h * 2 + m * 4
    assert first["embedding_dropout"].bytes_moved == m * h * 5
    last = {op.name: op for op in edge["last"]}
    assert (last["lm_head"].m, last["lm_head"].k, last["lm_head"].n) == (m, h, 50432 // 2)
    assert last["final_norm"].bytes_moved == 2 * m * h * 2 + 2 * h * 2 + 2 * m * 4
    assert [op.name for op in embedding_and_head_operators(spec, 1, 1024, 1)["first"]] == \
        ["embedding", "position_embedding", "embedding_dropout"]
    with pytest.raises(ConfigError, match="seq=2048 exceeds its 1024 learned positions"):
        embedding_and_head_operators(spec, 1, 2048, tp=2)


def test_gpt_without_dropout_has_no_dropout_operators():
    spec = from_hf_config(HF / "gpt2.json")
    spec = ModelSpec(**{**spec.__dict__, "dropout": 0.0})
    names = [op.name for op in layer_operators(spec, 1, 128)]
    names += [op.name for op in embedding_and_head_operators(spec, 1, 128)["first"]]
    assert not [n for n in names if "dropout" in n]


# ---------------------------------------------------------------- the LLaMA family stays bit-for-bit

def _llama_family_digest() -> str:
    """Every model-side number of the built-in (LLaMA-family) models: parameter counts, TP splits,
    stage edges, operators (JSON), saved tensors and stage memory."""
    out = []
    for name in list_models():
        spec = get_model(name)
        out.append([spec.to_json(), parameter_count(spec), layer_parameter_count(spec)])
        for tp in (1, 2, 4, 8):
            out.append([layer_tp_parameter_count(spec, tp), stage_edge_parameters(spec, 1, tp),
                        stage_edge_parameters(spec, 4, tp)])
            for b, s in ((1, 2048), (2, 512)):
                out.append([op.to_json() for op in layer_operators(spec, b, s, tp)])
                if spec.vocab % tp == 0:
                    edge = embedding_and_head_operators(spec, b, s, tp)
                    out.append({k: [op.to_json() for op in v] for k, v in edge.items()})
                out.append(layer_saved_tensors(spec, b, s, tp))
                out.append([layer_workspace_bytes(spec, b, s, tp, True), layer_workspace_bytes(spec, b, s, tp, False)])
        for pp, dp, tp, zero, act in itertools.product((1, 8), (1, 4), (1, 2), (0, 1, 2, 3), ("full", "ckpt", "fsr")):
            cfg = ParallelConfig(pp=pp, dp=dp, tp=tp, zero=zero, accum=16, activation=act, prefetch="bulk")
            out.append([st.to_json() for st in stage_memory(spec, cfg)])
    return hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()


def test_llama_family_numbers_unchanged():
    # pinned from the model side before the GPT family existed (MT-3000 reproduction inputs)
    assert _llama_family_digest() == "3d4450b4c01ab15805b0d14b7f68abe3c7acc4c440fff0a43486310012e04362"

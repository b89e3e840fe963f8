"""Memory of GPT as Megatron runs it: saved activations per mode, sequence parallelism, mixed-precision state.

Reference: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(2022), Section 4: a GPT layer stores sbh(34 + 5as/h) bytes for its backward without tensor
parallelism, sbh(10 + 24/t + 5as/(ht)) with TP, sbh(34/t + 5as/(ht)) with TP and sequence
parallelism, and sbh(34/t) under selective recomputation with sequence parallelism.
"""
from __future__ import annotations

import dataclasses
import math

import pytest

from ratrain.errors import ConfigError
from ratrain.spec.memory import (
    ATTENTION_CORE_TENSORS,
    DEFAULT_CONSTANTS,
    MemoryConstants,
    PeakMemory,
    attention_core_bytes,
    layer_activation_bytes,
    layer_checkpoint_bytes,
    layer_full_bytes,
    layer_saved_tensors,
    layer_selective_bytes,
    layer_workspace_bytes,
    max_peak,
    recovery_bytes,
    stage_bytes_without_activations,
    stage_memory,
)
from ratrain.spec.models import get_model, gpt_model, layer_tp_parameter_count, stage_edge_parameters
from ratrain.spec.parallel import ACTIVATION_MODES, ACTIVATION_POLICIES, ParallelConfig

MEGATRON = MemoryConstants.megatron()


def norm_statistics(b: int, s: int, tp: int = 1, sp: bool = False) -> int:
    """The two LayerNorms' FP32 mean and rstd per token: saved by apex's fused LayerNorm, left out
    of Korthikanti et al.'s count (4 x 4 bytes per token per layer, 0.05% of it at h = 1024)."""
    return 2 * 2 * 4 * b * s // (tp if sp else 1)


def korthikanti(b: int, s: int, h: int, a: int, tp: int = 1, sp: bool = False, selective: bool = False) -> float:
    replicated = 10 / tp if sp else 10
    core = 0 if selective else 5 * a * s / (h * tp)
    return s * b * h * (replicated + 24 / tp + core)


# ---------------------------------------------------------------- saved tensors per layer

@pytest.mark.parametrize("h, a, b, s", [(1024, 16, 1, 1024), (2048, 16, 4, 1024), (768, 12, 2, 512)])
def test_full_save_reproduces_korthikanti_without_tp(h, a, b, s):
    spec = gpt_model(h, a, 12, 1024)
    assert layer_full_bytes(spec, b, s) - norm_statistics(b, s) == korthikanti(b, s, h, a)


@pytest.mark.parametrize("tp, sp", [(2, False), (4, False), (8, False), (2, True), (4, True), (8, True)])
def test_full_save_reproduces_korthikanti_with_tp_and_sequence_parallelism(tp, sp):
    h, a, b, s = 2048, 16, 2, 1024
    spec = gpt_model(h, a, 24, 1024, tp=tp)
    full = layer_full_bytes(spec, b, s, tp, sequence_parallel=sp)
    assert full - norm_statistics(b, s, tp, sp) == korthikanti(b, s, h, a, tp, sp)


def test_saved_tensors_by_name():
    h, a, b, s, tp = 1024, 16, 2, 1024, 2
    m = b * s
    saved = layer_saved_tensors(gpt_model(h, a, 24, 1024, tp=tp), b, s, tp)
    probs = b * (a // tp) * s * s
    assert (saved["attn_probs"], saved["attn_probs_dropout_mask"], saved["attn_probs_dropped"]) == \
        (2 * probs, probs, 2 * probs)
    assert saved["q"] == saved["k"] == saved["v"] == saved["attn_context"] == m * h // tp * 2
    assert saved["fc1_output"] == saved["gelu_output"] == m * 4 * h // tp * 2
    assert saved["attn_dropout_mask"] == saved["mlp_dropout_mask"] == m * h          # replicated, 1 byte
    for name in ("attn_norm", "mlp_norm"):
        assert saved[f"{name}_input"] == saved[f"{name}_output"] == m * h * 2
        assert saved[f"{name}_mean"] == saved[f"{name}_rstd"] == m * 4
    assert set(ATTENTION_CORE_TENSORS) <= set(saved)


def test_selective_drops_only_the_attention_core():
    h, a, b, s = 2048, 16, 2, 1024
    for tp, sp in ((1, False), (2, False), (4, True)):
        spec = gpt_model(h, a, 24, 1024, tp=tp)
        sel = layer_selective_bytes(spec, b, s, tp, sequence_parallel=sp)
        assert sel - norm_statistics(b, s, tp, sp) == korthikanti(b, s, h, a, tp, sp, selective=True)
        assert attention_core_bytes(spec, b, s, tp) == 5 * a // tp * s * s * b
        assert layer_full_bytes(spec, b, s, tp, sequence_parallel=sp) - sel == attention_core_bytes(spec, b, s, tp)
    # without dropout (LLaMA) the core is the saved probabilities P alone
    llama = get_model("llama2-7b")
    assert attention_core_bytes(llama, 1, 2048) == layer_saved_tensors(llama, 1, 2048)["attn_probs"]


def test_checkpoint_is_the_layer_input():
    spec = gpt_model(1024, 16, 24, 1024, tp=4)
    assert layer_checkpoint_bytes(spec, 2, 1024) == 2 * 1024 * 1024 * 2
    assert layer_checkpoint_bytes(spec, 2, 1024, 4) == 2 * 1024 * 1024 * 2               # replicated over TP
    assert layer_checkpoint_bytes(spec, 2, 1024, 4, sequence_parallel=True) == 2 * 1024 * 1024 * 2 // 4
    assert recovery_bytes(spec, 2, 1024, 4) == layer_full_bytes(spec, 2, 1024, 4) - 2 * 1024 * 1024 * 2


def test_activation_bytes_by_mode():
    spec, b, s, tp = gpt_model(1024, 16, 24, 1024, tp=2), 1, 1024, 2
    assert layer_activation_bytes(spec, b, s, tp, "full") == layer_full_bytes(spec, b, s, tp)
    assert layer_activation_bytes(spec, b, s, tp, "selective") == layer_selective_bytes(spec, b, s, tp)
    assert layer_activation_bytes(spec, b, s, tp, "ckpt") == layer_activation_bytes(spec, b, s, tp, "fsr") == \
        layer_checkpoint_bytes(spec, b, s)
    with pytest.raises(ConfigError, match="activation must be one of full, ckpt, fsr, selective"):
        layer_activation_bytes(spec, b, s, tp, "none")


def test_sequence_parallelism_needs_seq_divisible_by_tp():
    spec = gpt_model(1024, 16, 24, 1024, tp=8)
    with pytest.raises(ConfigError, match="seq=1020 divisible by tp=8"):
        layer_full_bytes(spec, 1, 1020, 8, sequence_parallel=True)


def test_sequence_parallelism_on_a_llama_model_shards_its_norm_tensors():
    spec, b, s, tp = get_model("llama2-13b"), 1, 2048, 4
    plain, sharded = layer_saved_tensors(spec, b, s, tp), layer_saved_tensors(spec, b, s, tp, sequence_parallel=True)
    for name in plain:
        per_token_split = name.startswith(("attn_norm", "mlp_norm"))
        assert sharded[name] == (plain[name] // tp if per_token_split else plain[name]), name


def test_gelu_workspace_by_hand():
    # no dropout: the MLP and attention gradient transients only (GeLU: h + 2f per token at most)
    spec = dataclasses.replace(gpt_model(1024, 16, 24, 1024), dropout=0.0)
    m, h, f = 1024, 1024, 4096
    assert layer_workspace_bytes(spec, 1, 1024, 1, False) == m * 2 * (h + 2 * f)
    probs = 16 * 1024 * 1024 * 2
    # forward transients: norm out, q, k, v, P, context (5h + P) or residual, norm out, fc1 and gelu out
    assert layer_workspace_bytes(spec, 1, 1024, 1, True) == max(m * 2 * 5 * h + probs, m * 2 * (2 * h + 2 * f))
    # dropout: Megatron's unfused core also holds dP and dS (2 x b a s^2 FP16) in backward
    spec = gpt_model(1024, 16, 24, 1024)
    assert layer_workspace_bytes(spec, 1, 1024, 1, False) == max(m * 2 * (h + 2 * f), m * 2 * 3 * h + 2 * probs)


# ---------------------------------------------------------------- configurations and stage memory

def test_parallel_config_accepts_selective_and_the_planner_set_is_unchanged():
    assert ACTIVATION_POLICIES == ("full", "ckpt", "fsr")
    assert ACTIVATION_MODES == ("full", "ckpt", "fsr", "selective")
    cfg = ParallelConfig(pp=2, tp=2, activation="selective")
    assert cfg.describe() == "P=2,D=1,T=2,Z=2,Selective"
    with pytest.raises(ConfigError, match="activation must be one of full, ckpt, fsr, selective"):
        ParallelConfig(activation="partial")


def test_megatron_constants_state_per_parameter():
    assert (DEFAULT_CONSTANTS.weight_bytes, DEFAULT_CONSTANTS.grad_bytes, DEFAULT_CONSTANTS.optimizer_bytes) == \
        (2, 2, 12)                                     # the MT-3000 model: FP16 gradients
    assert (MEGATRON.weight_bytes, MEGATRON.grad_bytes, MEGATRON.optimizer_bytes) == (2, 4, 12)
    assert MEGATRON.runtime_reserve_bytes == 0 and not MEGATRON.gradsync_staging
    assert MemoryConstants.megatron(512 * 2 ** 20).runtime_reserve_bytes == 512 * 2 ** 20
    with pytest.raises(ConfigError, match="grad_bytes must be an integer >= 0"):
        MemoryConstants(grad_bytes=-1)


@pytest.mark.parametrize("zero, per_param", [(0, 18), (1, 6 + 12 / 4)])
def test_megatron_state_non_distributed_and_distributed_optimizer(zero, per_param):
    spec = gpt_model(1024, 16, 24, 1024, tp=2)
    cfg = ParallelConfig(pp=2, dp=4, tp=2, zero=zero, micro_batch=2, accum=8, seq=1024, activation="ckpt")
    stages = stage_memory(spec, cfg, constants=MEGATRON)
    layer = layer_tp_parameter_count(spec, 2)
    emb, head = stage_edge_parameters(spec, 2, 2)
    for st, edge in zip(stages, (emb, head), strict=True):
        params = 12 * layer + edge
        shard = math.ceil(params / 4) if zero else params
        assert st.breakdown["weights"] == 2 * params and st.breakdown["gradients"] == 4 * params
        assert st.breakdown["optimizer"] == 12 * shard
        assert st.state_bytes == pytest.approx(per_param * params, abs=12)
        assert st.breakdown["gradsync_staging"] == 0 and st.breakdown["runtime_reserve"] == 0


def test_selective_stage_memory():
    spec, b, s, tp = gpt_model(2048, 16, 24, 1024, tp=2), 2, 1024, 2
    cfg = ParallelConfig(pp=4, dp=1, tp=tp, zero=0, micro_batch=b, accum=8, seq=s, activation="selective")
    sel, core = layer_selective_bytes(spec, b, s, tp), attention_core_bytes(spec, b, s, tp)
    for st in stage_memory(spec, cfg, constants=MEGATRON):
        tokens = st.n_act * b * s * 4 * ((st.stage == 0) + (st.stage == 3))
        mask = st.n_act * b * s * 2048 if st.stage == 0 else 0          # embedding dropout mask, 1 byte
        assert st.breakdown["saved_activations"] == st.n_act * len(st.layers) * sel + tokens + mask
        assert st.breakdown["checkpoints"] == st.breakdown["recovery_buffer"] == 0
        assert st.breakdown["recompute_buffer"] == core
        assert st.breakdown["workspace"] >= layer_workspace_bytes(spec, b, s, tp, False)
    full = stage_memory(spec, dataclasses.replace(cfg, activation="full"), constants=MEGATRON)
    ckpt = stage_memory(spec, dataclasses.replace(cfg, activation="ckpt"), constants=MEGATRON)
    selective = stage_memory(spec, cfg, constants=MEGATRON)
    assert max_peak(ckpt) < max_peak(selective) < max_peak(full)


def test_sequence_parallelism_in_stage_memory():
    spec, b, s, tp = gpt_model(1024, 16, 24, 1024, tp=4), 1, 1024, 4
    cfg = ParallelConfig(pp=2, dp=1, tp=tp, zero=0, micro_batch=b, accum=4, seq=s, activation="ckpt")
    plain = stage_memory(spec, cfg, constants=MEGATRON)
    sp = stage_memory(spec, cfg, constants=MEGATRON, sequence_parallel=True)
    for a, c in zip(plain, sp, strict=True):
        assert c.breakdown["boundary_staging"] * tp == a.breakdown["boundary_staging"] == b * s * 1024 * 2
        tokens = a.n_act * b * s * 4
        mask = a.n_act * b * s * 1024 if a.stage == 0 else 0
        assert (c.breakdown["checkpoints"] - tokens - mask // tp) * tp == a.breakdown["checkpoints"] - tokens - mask
        assert c.state_bytes == a.state_bytes


@pytest.mark.parametrize("activation", ACTIVATION_MODES)
@pytest.mark.parametrize("sp", [False, True])
def test_peak_memory_matches_stage_memory_for_gpt(activation, sp):
    spec = gpt_model(2048, 16, 12, 1024, tp=2)
    peaks = PeakMemory(spec, "balanced", MEGATRON)
    for pp, dp, zero in ((1, 4, 0), (2, 2, 1), (4, 1, 0)):
        cfg = ParallelConfig(pp=pp, dp=dp, tp=2, zero=zero, micro_batch=2, accum=8, seq=1024, activation=activation)
        stages = stage_memory(spec, cfg, constants=MEGATRON, sequence_parallel=sp)
        assert peaks.peak(pp, dp, 2, zero, 2, 8, 1024, activation, "layerwise", sp) == max_peak(stages)
        st = stages[0]
        rest = stage_bytes_without_activations(spec, pp=pp, dp=dp, tp=2, zero=zero, micro_batch=2, seq=1024,
                                               activation=activation, prefetch="layerwise", first=True,
                                               last=pp == 1, n_layers=len(st.layers), constants=MEGATRON,
                                               sequence_parallel=sp)
        held = st.breakdown["saved_activations"] + st.breakdown["checkpoints"]
        assert rest == st.peak_bytes - held


def test_stage_memory_json_reports_every_part():
    spec = gpt_model(1024, 16, 24, 1024, tp=2)
    cfg = ParallelConfig(pp=2, dp=2, tp=2, zero=1, micro_batch=4, accum=8, seq=1024, activation="ckpt")
    for st in stage_memory(spec, cfg, constants=MEGATRON):
        out = st.to_json()
        assert out["peak_bytes"] == out["state_bytes"] + out["activation_bytes"] + out["buffer_bytes"]
        for part in ("weights", "gradients", "optimizer", "workspace"):
            assert out["breakdown"][part] > 0, part
        assert out["activation_bytes"] == sum(out["breakdown"][k] for k in
                                              ("saved_activations", "checkpoints", "recovery_buffer")) > 0
        assert sum(out["breakdown"].values()) == out["peak_bytes"]

"""Mixture-of-experts layers: specs and HF configs, routing with a capacity factor, expert
parallelism in the memory model and the cost terms; numbers derived here from first principles."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ratrain import cli
from ratrain.cost.terms import cost_terms, load_profile, pipeline_costs
from ratrain.errors import ConfigError
from ratrain.sim.simulator import simulate
from ratrain.sim.trace import chrome_trace
from ratrain.spec.memory import PeakMemory, layer_saved_tensors, max_peak, stage_memory
from ratrain.spec.models import (
    EXPERT_OPERATORS,
    from_hf_config,
    get_model,
    layer_device_parameter_count,
    layer_parameter_count,
    parameter_count,
)
from ratrain.spec.moe import MoeSpec, Routing, capacity_sweep, expert_capacity, expert_loads, route
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import TrainingPlatform

HF = Path(__file__).parent / "fixtures" / "hf"
MIXTRAL = HF / "tiny-mixtral.json"
QWEN2_MOE = HF / "tiny-qwen2-moe.json"


def _attention_params(h: int, heads: int, kv_heads: int, d: int, qkv_bias: bool) -> int:
    q, kv = heads * d, kv_heads * d
    return h * q + 2 * h * kv + q * h + ((q + 2 * kv) if qkv_bias else 0)


# ---------------------------------------------------------------- specs and HF configs

def test_mixtral_config_and_parameter_count():
    spec = from_hf_config(MIXTRAL)
    raw = json.loads(MIXTRAL.read_text())
    h, E, k, f = raw["hidden_size"], raw["num_local_experts"], raw["num_experts_per_tok"], raw["intermediate_size"]
    assert spec.family == "mixtral" and spec.moe == MoeSpec(E, k, f)
    d = h // raw["num_attention_heads"]
    # attention, two RMSNorms, the router (h x E) and E SwiGLU experts (gate, up, down)
    layer = _attention_params(h, raw["num_attention_heads"], raw["num_key_value_heads"], d, False) + 2 * h \
        + h * E + E * 3 * h * f
    assert layer_parameter_count(spec) == layer
    vocab = raw["vocab_size"]
    assert parameter_count(spec) == raw["num_hidden_layers"] * layer + vocab * h + h + vocab * h
    # EP=4: two of the eight experts per device; the rest stays whole
    dense, experts = layer_device_parameter_count(spec, 1, 4)
    assert experts == 2 * 3 * h * f and dense == layer - E * 3 * h * f


def test_qwen2_moe_config_has_shared_expert_and_qkv_bias():
    spec = from_hf_config(QWEN2_MOE)
    raw = json.loads(QWEN2_MOE.read_text())
    h, E = raw["hidden_size"], raw["num_experts"]
    fe, fs = raw["moe_intermediate_size"], raw["shared_expert_intermediate_size"]
    assert spec.moe == MoeSpec(E, raw["num_experts_per_tok"], fe, shared_experts=1, shared_ffn=fs)
    assert spec.has_qkv_bias and spec.ffn == fe
    d = h // raw["num_attention_heads"]
    layer = _attention_params(h, raw["num_attention_heads"], raw["num_key_value_heads"], d, True) + 2 * h \
        + h * E + E * 3 * h * fe + 3 * h * fs + h          # router, experts, shared expert and its 1-wide gate
    assert layer_parameter_count(spec) == layer


def test_qwen3_moe_family_from_a_written_config(tmp_path):
    raw = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 1024, "moe_intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    spec = from_hf_config(path)
    assert spec.family == "qwen3_moe" and spec.qk_norm and spec.moe.shared_ffn == 0
    assert spec.to_json()["moe"] == {"experts": 8, "experts_per_token": 2, "expert_ffn": 128, "shared_experts": 0,
                                     "shared_ffn": 0}


def test_dense_spec_json_has_no_moe_key():
    assert "moe" not in get_model("llama2-7b").to_json()
    assert set(ParallelConfig().to_json()) == {"pp", "dp", "tp", "zero", "micro_batch", "accum", "seq",
                                               "activation", "prefetch", "partition"}


def test_k_above_e_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="exceeds the experts"):
        MoeSpec(experts=4, experts_per_token=5, expert_ffn=64)
    raw = json.loads(MIXTRAL.read_text())
    raw["num_experts_per_tok"] = 9
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="num_experts_per_tok=9 exceeds the experts"):
        from_hf_config(path)


@pytest.mark.parametrize("c", [0.0, -1.0, math.inf])
def test_capacity_factor_must_be_positive(c):
    with pytest.raises(ConfigError, match="capacity factor"):
        ParallelConfig(capacity_factor=c)


def test_cli_bad_moe_input_is_one_line_exit_2(tmp_path, capsys):
    raw = json.loads(MIXTRAL.read_text())
    raw["num_experts_per_tok"] = 9
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    for argv in (["memory", "--hf-config", str(path)],
                 ["memory", "--hf-config", str(MIXTRAL), "--capacity-factor", "0"],
                 ["memory", "--hf-config", str(MIXTRAL), "--dp", "4", "--ep", "3"],
                 ["memory", "--model", "llama2-7b", "--dp", "2", "--ep", "2"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err


# ---------------------------------------------------------------- routing

def test_balanced_routing_fills_capacity_exactly():
    moe = MoeSpec(experts=8, experts_per_token=2, expert_ffn=64)
    r = route(moe, 1024, 4, Routing(capacity_factor=1.0))
    # 1024 tokens x 2 = 2048 dispatches, 256 per expert = floor(1.0 x 1024 x 2 / 8)
    assert r.capacity == 256 and r.dropped == 0 and r.padding_fraction == 0
    assert r.busiest_device_rows == 2 * 256 and r.load_factor == 1.0


def test_hot_experts_drops_and_padding_by_hand():
    moe = MoeSpec(experts=8, experts_per_token=2, expert_ffn=64)
    routing = Routing(capacity_factor=1.25, hot_share=0.25, hot_load=2.0)
    # 2 hot experts of 8 at 2 x 512 = 1024 dispatches each; the 6 cold share 4096 - 2048 = 2048 (342, 342, 341 x 4)
    assert expert_loads(8, 2, 2048, routing) == [1024, 1024, 342, 342, 341, 341, 341, 341]
    r = route(moe, 2048, 4, routing)
    capacity = math.floor(1.25 * 2048 * 2 / 8)               # 640
    dropped = 2 * (1024 - capacity)
    executed = 8 * capacity
    assert (r.capacity, r.dropped, r.executed_rows) == (capacity, dropped, executed)
    assert r.dropped_fraction == dropped / 4096
    assert r.padding_fraction == (executed - (4096 - dropped)) / executed
    assert r.busiest_device_rows == 2 * capacity                  # every expert runs its capacity
    # dropless: the first device holds both hot experts and waits for 2048 rows, the mean is 1024
    free = route(moe, 2048, 4, Routing(hot_share=0.25, hot_load=2.0))
    assert free.dropped == 0 and free.busiest_device_rows == 2048 and free.load_factor == 2.0
    assert free.dropless_capacity_factor == 1024 * 8 / 4096


@pytest.mark.parametrize("experts,k,tokens,share,load", [(8, 2, 2048, 0.25, 2.0), (16, 4, 999, 0.125, 3.0),
                                                          (64, 6, 4096, 0.05, 1.7), (4, 1, 7, 0.0, 1.0)])
def test_a_large_enough_capacity_factor_drops_nothing(experts, k, tokens, share, load):
    moe = MoeSpec(experts=experts, experts_per_token=k, expert_ffn=64)
    sweep = capacity_sweep(moe, tokens, 1, Routing(hot_share=share, hot_load=load))
    c = sweep["no_drop_capacity_factor"]
    loads = expert_loads(experts, k, tokens, Routing(hot_share=share, hot_load=load))
    assert expert_capacity(c, tokens, k, experts) >= max(loads)
    for factor in (c, c * 1.5, 10 * c):
        assert route(moe, tokens, 1, Routing(factor, share, load)).dropped == 0
    below = math.nextafter(c * (1 - 1e-9), 0)
    assert route(moe, tokens, 1, Routing(below, share, load)).dropped > 0


# ---------------------------------------------------------------- memory

def test_expert_state_lives_on_the_devices_that_hold_it():
    spec = from_hf_config(MIXTRAL)
    cfg1 = ParallelConfig(dp=4, zero=0, seq=1024)
    cfg4 = ParallelConfig(dp=4, ep=4, zero=0, seq=1024)
    dense, experts = layer_device_parameter_count(spec, 1, 4)
    state = 2 + 2 + 12                                           # FP16 weight and gradient, FP32 master + m + v
    full = stage_memory(spec, cfg1)[0].state_bytes
    quarter = stage_memory(spec, cfg4)[0].state_bytes
    # EP=4 frees three quarters of every layer's experts on each device
    assert full - quarter == state * spec.layers * 3 * experts


def test_only_the_routed_path_keeps_activations():
    spec = from_hf_config(MIXTRAL)
    saved = layer_saved_tensors(spec, 1, 1024, expert_rows=3000)
    fe, h = spec.moe.expert_ffn, spec.hidden
    assert saved["expert_gate"] == saved["expert_up"] == saved["expert_swiglu_output"] == 3000 * fe * 2
    assert saved["expert_input"] == saved["expert_output"] == 3000 * h * 2
    assert saved["router_probs"] == 1024 * spec.moe.experts * 4
    assert "gate" not in saved                                   # no dense MLP
    # the default rows: tokens x k, what a balanced, dropless device runs
    assert layer_saved_tensors(spec, 1, 1024)["expert_gate"] == 1024 * 2 * fe * 2


# ---------------------------------------------------------------- costs and the step

@pytest.fixture(scope="module")
def mixtral():
    spec = from_hf_config(MIXTRAL)
    platform = TrainingPlatform()
    return spec, platform, load_profile(spec, 1, 1024, 1, source="roofline", platform=platform)


def test_ep_alltoall_on_the_link(mixtral):
    spec, platform, prof = mixtral
    base = cost_terms(spec, ParallelConfig(dp=4, seq=1024), prof, platform)
    ep = cost_terms(spec, ParallelConfig(dp=4, ep=4, seq=1024), prof, platform)
    rows = 1024 * 2                                              # each device's tokens x k, balanced
    volume = rows * spec.hidden * 2
    a2a = 1e3 * (3 / 4 * volume / platform.link_bandwidth + 3 * platform.link_latency_s)
    assert ep.exchange["moe"]["alltoall_ms"] == pytest.approx(a2a, rel=1e-12)
    # dispatch and combine in the forward and again in the backward
    assert ep.mid.forward - base.mid.forward == pytest.approx(2 * a2a, rel=1e-9)
    assert ep.mid.backward - base.mid.backward == pytest.approx(2 * a2a, rel=1e-9)
    assert ep.mid.exchange_forward == pytest.approx(2 * a2a, rel=1e-12)


def test_the_step_waits_for_the_busiest_device(mixtral):
    spec, platform, prof = mixtral
    # the routed experts' GEMMs and SwiGLU (the combine works on each device's own tokens)
    expert_f = sum(o.forward_s for o in prof.ops if o.name in EXPERT_OPERATORS) * 1e3
    even = ParallelConfig(pp=2, dp=4, ep=4, accum=4, seq=1024)
    hot = ParallelConfig(pp=2, dp=4, ep=4, accum=4, seq=1024, hot_share=0.25, hot_load=2.0)
    t_even, t_hot = cost_terms(spec, even, prof, platform), cost_terms(spec, hot, prof, platform)
    # the first device holds both hot experts: twice the mean rows, twice the expert time and all-to-all volume
    assert t_hot.exchange["moe"]["expert_rows_scale"] == 2.0
    a2a_extra = 2 * (t_hot.exchange["moe"]["alltoall_ms"] - t_even.exchange["moe"]["alltoall_ms"])
    assert t_hot.mid.forward - t_even.mid.forward == pytest.approx(expert_f + a2a_extra, rel=1e-9)
    s_even = simulate(pipeline_costs(spec, even, prof, platform)).step_time_ms
    s_hot = simulate(pipeline_costs(spec, hot, prof, platform)).step_time_ms
    assert s_hot > s_even


def test_dense_model_at_ep1_is_todays_step():
    spec = get_model("llama2-7b")
    platform = TrainingPlatform()
    prof = load_profile(spec, 1, 2048, 1, source="roofline", platform=platform)
    cfg = ParallelConfig(pp=2, dp=2, accum=4)
    costs = pipeline_costs(spec, cfg, prof, platform)
    assert costs.microbatch_scales is None
    layer = costs.to_json()["stages"][0][0]
    assert "exchange_forward_ms" not in layer and "exchange_backward_ms" not in layer
    assert cost_terms(spec, cfg, prof, platform).exchange == {}


def test_simulate_cli_reports_capacity_and_traces_the_exchange(tmp_path, capsys):
    trace = tmp_path / "t.json"
    argv = ["simulate", "--hf-config", str(MIXTRAL), "--profile", "roofline", "--pp", "2", "--dp", "4", "--ep", "4",
            "--seq", "1024", "--accum", "2", "--capacity-factor", "1.25", "--hot-experts", "0.25:2",
            "--capacity-factors", "1,3", "--trace", str(trace), "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    moe = out["moe"]
    assert moe["routing"]["capacity"] == math.floor(1.25 * 4096 * 2 / 8)
    assert moe["capacity"]["no_drop_capacity_factor"] == 2.0
    factors = [r["capacity_factor"] for r in moe["capacity"]["per_capacity_factor"]]
    assert factors == [1.0, 1.25, 1.5, 2.0, 3.0]
    by_c = {r["capacity_factor"]: r for r in moe["capacity"]["per_capacity_factor"]}
    assert by_c[2.0]["dropped"] == 0 and by_c[3.0]["dropped"] == 0 and by_c[1.5]["dropped"] > 0
    steps = {r["capacity_factor"]: r["step_time_ms"] for r in moe["steps_per_capacity_factor"]}
    assert steps[3.0] > steps[1.0]                   # more padding rows on every device
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "Exchange" and e["tid"] == 2 for e in events)


def test_trace_without_costs_has_no_exchange_events(mixtral):
    spec, platform, prof = mixtral
    costs = pipeline_costs(spec, ParallelConfig(dp=4, ep=4, seq=1024, accum=2), prof, platform)
    result = simulate(costs)
    assert not [e for e in chrome_trace(result.tasks)["traceEvents"] if e.get("cat") == "Exchange"]
    ev = [e for e in chrome_trace(result.tasks, costs=costs)["traceEvents"] if e.get("cat") == "Exchange"]
    assert len(ev) == 2 * spec.layers * 2                        # every F and B of 4 layers x 2 micro-batches



def test_explicit_ep1_cp1_flags_change_nothing(capsys):
    for argv in (["simulate", "--model", "llama2-7b", "--profile", "roofline", "--pp", "2", "--dp", "2",
                  "--accum", "4", "--json"],
                 ["memory", "--model", "llama2-70b", "--pp", "8", "--dp", "4", "--tp", "2", "--json"]):
        assert cli.main(argv) == 0
        plain = capsys.readouterr().out
        assert cli.main(argv + ["--ep", "1", "--cp", "1"]) == 0
        assert capsys.readouterr().out == plain


@pytest.mark.parametrize("fields", [{}, {"ep": 4}, {"cp": 2}, {"ep": 4, "cp": 2},
                                    {"ep": 2, "capacity_factor": 1.5, "hot_share": 0.25, "hot_load": 2.0}])
@pytest.mark.parametrize("zero", [1, 3])
def test_planner_memory_check_is_stage_memory(fields, zero):
    spec = from_hf_config(MIXTRAL)
    cfg = ParallelConfig(pp=2, dp=4, tp=1, zero=zero, micro_batch=2, accum=4, seq=1024, **fields)
    fast = PeakMemory(spec, "balanced").peak(2, 4, 1, zero, 2, 4, 1024, "fsr", "layerwise", moe_cp=fields)
    assert fast == max_peak(stage_memory(spec, cfg))


def test_plan_searches_with_ep_and_cp(capsys):
    argv = ["plan", "--hf-config", str(MIXTRAL), "--clusters", "16", "--global-batch", "32", "--seq", "1024",
            "--profile", "roofline", "--ep", "4", "--cp", "2", "--top", "3", "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    best = out["best"]["config"]
    assert best["ep"] == 4 and best["cp"] == 2
    assert best["pp"] * best["dp"] * best["tp"] * 2 == 16 and (best["dp"] * 2) % 4 == 0

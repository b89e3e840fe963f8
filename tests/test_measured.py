"""GPU kernel and collective models, Megatron's iteration, and validation against measured runs."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ratrain.cost import megatron as megatron_cost
from ratrain.cost.collectives import GpuCollectives, Placement, fit_allreduce
from ratrain.cost.gpu_kernels import (
    TORCH_SOFTMAX_BYTES,
    attention_seconds,
    bytes_seconds,
    fused_softmax,
    gemm_seconds,
    gemm_tiles,
    gpu_layer_profile,
    operator_kernels,
    operator_profile,
)
from ratrain.cost.megatron import OPTIMIZER_BYTES_PER_PARAM, OPTIMIZER_KERNELS, megatron_step
from ratrain.errors import ConfigError
from ratrain.repro.measured import read_allreduce, read_runs, validate
from ratrain.sim.megatron_step import simulate_megatron
from ratrain.spec.models import (
    Operator,
    embedding_and_head_operators,
    gpt_model,
    layer_operators,
    layer_tp_parameter_count,
    stage_edge_parameters,
)
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platforms import load_platform

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "ratrain" / "data" / "measured"
A100 = ROOT / "platforms" / "a100-measured-cluster.toml"
HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
          "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)")


@pytest.fixture(scope="module")
def a100():
    return load_platform(A100)


def _bare(platform, **overrides):
    """The platform with the given constants (and no host floor unless asked)."""
    base = {"kernels.launch_s": 1e-9, "kernels.step_overhead_s": 0.0}
    base.update(overrides)
    return platform.with_overrides(**base)


# ---------------------------------------------------------------- kernels

def test_gemm_one_full_wave_is_its_tiles_flops_at_the_sm_rate(a100):
    p = _bare(a100, **{"kernels.gemm_efficiency": 0.5, "kernels.gemm_schedule": "waves"})
    sms, peak = p.device.sm_count, p.device.peak_fp16_flops
    m, n, k = 128 * 12, 128 * 9, 4096            # 108 reference tiles: exactly one wave on 108 SMs
    expected = 2 * 128 * 128 * k / (0.5 * peak / sms)
    assert gemm_seconds(m, k, n, p) == pytest.approx(expected, rel=1e-12)
    # one row more: two waves of 128 x 128 tiles, or one wave of 256 x 128 tiles (twice the FLOPs
    # per tile); smaller tiles cost 2.25-2.5x at their lower share, so the cheapest is 2x
    assert gemm_seconds(m + 1, k, n, p) == pytest.approx(2 * expected, rel=1e-12)


def test_gemm_tiles_share_follows_arithmetic_intensity(a100):
    tiles = {(a, b): share for a, b, share in gemm_tiles(a100)}
    assert tiles[(128, 128)] == 1.0 and tiles[(256, 128)] == 1.0 and tiles[(128, 256)] == 1.0
    assert tiles[(128, 64)] == pytest.approx((128 * 64 / 192) / 64)
    assert tiles[(64, 64)] == pytest.approx(0.5)


def test_stream_k_has_no_partial_wave(a100):
    p = _bare(a100, **{"kernels.gemm_efficiency": 0.5, "kernels.gemm_schedule": "stream-k"})
    sms, peak = p.device.sm_count, p.device.peak_fp16_flops
    m, n, k = 128 * 12, 128 * 9, 4096            # 108 reference tiles: one wave either way
    one_wave = 2 * 128 * 128 * k / (0.5 * peak / sms)
    assert gemm_seconds(m, k, n, p) == pytest.approx(one_wave, rel=1e-12)
    # 162 tiles: 1.5 waves' work spread over the SMs, where whole waves would take 2
    assert gemm_seconds(128 * 18, k, n, p) == pytest.approx(1.5 * one_wave, rel=1e-12)
    # a row more still rounds the tiles up: 13 x 9 = 117 reference tiles
    assert gemm_seconds(m + 1, k, n, p) == pytest.approx(117 / 108 * one_wave, rel=1e-12)


def test_gemm_wave_quantization_and_memory_floor(a100):
    p = _bare(a100, **{"kernels.gemm_schedule": "waves"})
    # n = 384 and n = 320 on m = 128 * 27: 81 tiles of 128 x 128 each, one wave (every other tile
    # takes 1.5 waves' time or more), so the same time
    assert gemm_seconds(128 * 27, 1024, 384, p) == gemm_seconds(128 * 27, 1024, 320, p)
    # n = 256 fits 108 tiles of 128 x 64 in one wave: half the FLOPs per tile at 2/3 of the rate
    assert gemm_seconds(128 * 27, 1024, 256, p) == pytest.approx(0.75 * gemm_seconds(128 * 27, 1024, 384, p))
    # a skinny GEMM is bound by HBM: (m k + k n + m n) FP16 bytes at the effective rate
    m, k, n = 8, 8192, 65536
    rate = p.device.hbm_bandwidth * p.kernels.hbm_efficiency
    assert gemm_seconds(m, k, n, p) == pytest.approx(2 * (m * k + k * n + m * n) / rate, rel=1e-12)


def test_host_issue_time_is_a_floor_per_operator(a100):
    slow_host = a100.with_overrides(**{"kernels.launch_s": 1e-3})
    model = gpt_model(1024, 16, 2, 1024)
    cfg = ParallelConfig(pp=1, dp=1, tp=1, zero=0, micro_batch=1, accum=1, seq=1024, partition="uniform")
    step = megatron_step(model, cfg, slow_host)
    layer = step.costs.stages[0][0]
    kf, kb = 0, 0
    for op in layer_operators(model, 1, 1024, 1):
        f, b = operator_kernels(op, slow_host)
        kf, kb = kf + 2 * f, kb + 2 * b                          # two layers
    kf, kb = kf - 2 * 2, kb - 2 * 2        # per layer two dropout + residual pairs fuse into one kernel each
    edges = embedding_and_head_operators(model, 1, 1024, 1)
    for op in edges["first"] + edges["last"]:
        f, b = operator_kernels(op, slow_host)
        kf, kb = kf + f, kb + b
    # every pass host-bound: as many milliseconds as kernels
    assert layer.forward_ms == pytest.approx(kf, rel=1e-12)
    assert layer.backward_ms == pytest.approx(kb, rel=1e-12)
    assert bytes_seconds(1e12, a100) == pytest.approx(1e12 / (a100.device.hbm_bandwidth * a100.kernels.hbm_efficiency))


def test_softmax_falls_back_to_pytorch_where_megatrons_kernel_does_not_take_the_shape(a100):
    p = _bare(a100)
    # 16 heads over T = 8 leave 2 per rank: micro-batch 1 gives 2 attention batches, not a multiple
    # of 4, so Megatron runs PyTorch's FP32 softmax (5 kernels each way); micro-batch 2 gives 4
    one = Operator("attention", "attention", batch=1, heads=2, kv_heads=2, seq=1024, head_dim=64, causal=True)
    two = Operator("attention", "attention", batch=2, heads=2, kv_heads=2, seq=1024, head_dim=64, causal=True)
    assert not fused_softmax(one) and fused_softmax(two)
    assert operator_kernels(one, p) == (7, 9) and operator_kernels(two, p) == (3, 5)
    fwd, bwd, _ = attention_seconds(one, p)
    qk, pv = gemm_seconds(1024, 64, 1024, p, batch=2), gemm_seconds(1024, 1024, 64, p, batch=2)
    scores = 2 * 1024 * 1024
    assert fwd == pytest.approx(qk + pv + bytes_seconds(TORCH_SOFTMAX_BYTES[0] * scores, p), rel=1e-12)
    fused_fwd, _, _ = attention_seconds(two, p)
    qk2, pv2 = gemm_seconds(1024, 64, 1024, p, batch=4), gemm_seconds(1024, 1024, 64, p, batch=4)
    assert fused_fwd == pytest.approx(qk2 + pv2 + bytes_seconds(2 * 2 * 2 * scores, p), rel=1e-12)


def test_pipeline_sends_and_receives_cost_the_host(a100):
    model = gpt_model(1024, 16, 4, 1024)
    cfg = ParallelConfig(pp=4, dp=1, tp=1, zero=0, micro_batch=1, accum=4, seq=1024, partition="uniform")
    base = megatron_step(model, cfg, a100.with_overrides(**{"kernels.p2p_host_s": 0.0})).costs.stages
    host = megatron_step(model, cfg, a100.with_overrides(**{"kernels.p2p_host_s": 1e-3})).costs.stages
    for p, neighbours in enumerate((1, 2, 2, 1)):              # the end stages have one neighbour
        assert host[p][0].forward_ms - base[p][0].forward_ms == pytest.approx(neighbours, rel=1e-9)
        assert host[p][0].backward_ms - base[p][0].backward_ms == pytest.approx(neighbours, rel=1e-9)
        assert host[p][0].recompute_ms == base[p][0].recompute_ms


# ---------------------------------------------------------------- collectives

def test_megatron_placement_and_which_link(a100):
    place = Placement(tp=2, dp=2, pp=2)
    assert place.group("tp") == [0, 1] and place.group("dp") == [0, 2] and place.group("pp") == [0, 4]
    small_nodes = a100.with_overrides(**{"node.gpus_per_node": 2})
    coll = GpuCollectives(small_nodes, place)
    assert not coll.crosses_nodes("tp") and coll.crosses_nodes("dp") and coll.crosses_nodes("pp")
    assert not GpuCollectives(a100, place).crosses_nodes("dp")


def test_ring_allreduce_closed_form(a100):
    p = a100.with_overrides(**{"collectives.algorithm": "ring", "collectives.byte_s": 2e-12})
    coll = GpuCollectives(p, Placement(tp=4, dp=1, pp=1))
    c, bus = p.collectives, p.node.intra_bandwidth * p.collectives.intra_bus_efficiency
    nbytes = 64e6
    expected = c.launch_s + 6 * c.step_latency_s + 2 * 3 / 4 * nbytes / bus + nbytes * 2e-12
    assert coll.allreduce_ms(nbytes, "tp") == pytest.approx(1e3 * expected, rel=1e-12)
    assert coll.allreduce_ms(nbytes, "dp") == 0.0            # a group of one rank
    rs = c.launch_s + 3 * c.step_latency_s + 3 / 4 * nbytes / bus + nbytes * 1e-12
    assert coll.reduce_scatter_ms(nbytes, "tp") == pytest.approx(1e3 * rs, rel=1e-12)


def test_no_peer_to_peer_halves_the_intra_node_bus(a100):
    p2p = GpuCollectives(a100, Placement(tp=8, dp=1, pp=1)).allreduce_ms(1e9, "tp")
    host = a100.with_overrides(**{"node.peer_to_peer": False, "node.intra_topology": "pcie-host"})
    staged = GpuCollectives(host, Placement(tp=8, dp=1, pp=1)).allreduce_ms(1e9, "tp")
    c = a100.collectives
    fixed = 1e3 * (c.launch_s + 14 * c.step_latency_s + 1e9 * c.byte_s)     # what no link carries
    assert staged - fixed == pytest.approx(2 * (p2p - fixed), rel=1e-9)


def test_allreduce_fit_recovers_its_constants():
    a, c, bus, e = 3e-5, 2e-6, 2e11, 1.5e-12
    samples = [(n, s, a + 2 * (n - 1) * c + 2 * (n - 1) / n * s / bus + s * e)
               for n in (2, 4, 8) for s in (1e6, 1e7, 1e8, 1e9)]
    fit = fit_allreduce(samples, 1e11)
    assert fit.launch_s == pytest.approx(a, rel=1e-6)
    assert fit.step_latency_s == pytest.approx(c, rel=1e-6)
    assert fit.byte_s == pytest.approx(e, rel=1e-6)
    assert fit.bus_bandwidth == pytest.approx(bus, rel=1e-9)
    assert fit.intra_bus_efficiency == pytest.approx(2.0, rel=1e-9)
    assert fit.max_abs_error < 1e-9


# ---------------------------------------------------------------- one iteration

def test_single_gpu_iteration_is_microbatches_times_the_layer_plus_the_step_end(a100):
    model = gpt_model(1024, 16, 4, 1024)
    cfg = ParallelConfig(pp=1, dp=1, tp=1, zero=0, micro_batch=2, accum=3, seq=1024, activation="ckpt",
                         partition="uniform")
    step = megatron_step(model, cfg, a100)
    res = simulate_megatron(step)
    layer = step.costs.stages[0][0]
    assert layer.recompute_ms > 0                              # ckpt: each layer's forward again
    expected = 3 * (layer.forward_ms + layer.backward_ms + layer.recompute_ms) + step.optimizer_ms[0] \
        + step.overhead_ms
    assert res.iteration_ms == pytest.approx(expected, rel=1e-12)
    assert sum(res.breakdown_ms.values()) == pytest.approx(res.iteration_ms, rel=1e-9)
    params = 4 * layer_tp_parameter_count(model, 1) + sum(stage_edge_parameters(model, 1, 1))
    opt = OPTIMIZER_BYTES_PER_PARAM * params / (a100.device.hbm_bandwidth * a100.kernels.hbm_efficiency)
    assert step.optimizer_ms[0] == pytest.approx(1e3 * max(opt, OPTIMIZER_KERNELS * a100.kernels.launch_s),
                                                 rel=1e-12)


def test_overflow_skipped_step_switch_is_off_and_moves_only_the_unscale_passes(a100, monkeypatch):
    assert megatron_cost.OVERFLOW_SKIPPED_STEP is False          # the shipped constants are fitted without it
    model = gpt_model(1024, 16, 4, 1024, tp=2)
    cfg = ParallelConfig(pp=1, dp=1, tp=2, zero=0, micro_batch=1, accum=2, seq=1024, activation="ckpt",
                         partition="uniform")
    update = megatron_step(model, cfg, a100)
    monkeypatch.setattr(megatron_cost, "OVERFLOW_SKIPPED_STEP", True)
    skipped = megatron_step(model, cfg, a100)
    assert skipped.optimizer_ms[0] == pytest.approx(
        update.optimizer_ms[0] * megatron_cost.SKIPPED_STEP_BYTES_PER_PARAM / OPTIMIZER_BYTES_PER_PARAM, rel=1e-12)
    assert skipped.barrier_ms == pytest.approx(update.barrier_ms / 2, rel=1e-12)   # no gradient-norm all-reduce
    assert skipped.costs.stages == update.costs.stages


def test_tensor_and_data_parallel_add_their_collectives(a100):
    model = gpt_model(1024, 16, 4, 1024, tp=2)
    base = dict(pp=1, micro_batch=1, accum=2, seq=1024, activation="ckpt", partition="uniform", zero=0)
    tp = megatron_step(model, ParallelConfig(dp=1, tp=2, **base), a100)
    assert tp.parts["tp_allreduce_ms"] > 0 and tp.dp_sync_ms == [0.0]
    dp = megatron_step(gpt_model(1024, 16, 4, 1024), ParallelConfig(dp=2, tp=1, **base), a100)
    assert dp.parts["tp_allreduce_ms"] == 0 and dp.dp_sync_ms[0] > 0
    with pytest.raises(ConfigError, match="do not split evenly"):
        megatron_step(model, ParallelConfig(pp=3, dp=1, tp=2, micro_batch=1, accum=2, seq=1024), a100)


# ---------------------------------------------------------------- runs files

def _write(tmp_path, lines):
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([HEADER, *lines]) + "\n")
    return path


@pytest.mark.parametrize("row, message", [
    ("2,16,8,1024,16,24,1024,1,1,1,372.1", "row 2: GPUs=2 is not tensor x data x pipeline"),
    ("2,16,8,1024,16,24,1024,1,1,2,fast", "row 2: field 'iteration time (ms)' must be a number"),
    ("2,16,8,1024,16,24,1024,1,1,2,-1", "row 2: field 'iteration time (ms)' must be a finite time"),
    ("2,15,8,1024,16,24,1024,1,2,1,10", "row 2: global batch 15 is not a multiple"),
    ("3,16,8,1024,16,24,1024,3,1,1,10", "row 2: tensor parallelism 3 must divide the 16 heads"),
    ("2,16,8,1024,16,24", "row 2: 6 fields, the header has 11"),
])
def test_bad_runs_are_one_line_naming_the_row(tmp_path, row, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_runs(_write(tmp_path, [row]))


def test_missing_column_is_named(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER.replace(",iteration time (ms)", "") + "\n2,16,8,1024,16,24,1024,1,1,2\n")
    with pytest.raises(ConfigError, match="missing column 'iteration time"):
        read_runs(path)


def test_calibration_set_reads_whole_and_validates_in_input_order(a100):
    runs = read_runs(MEASURED / "a100-single-node-runs.csv")
    assert len(runs) == 1440
    assert {r.gpus for r in runs} == {2, 4, 8}
    sample = runs[:12]
    v = validate(sample, a100)
    assert [r["row"] for r in v.runs] == [r.row for r in sample]
    for out, run in zip(v.runs, sample, strict=True):
        assert out["measured_ms"] == run.measured_ms and out["predicted_ms"] > 0
        assert math.isclose(sum(out["breakdown_ms"].values()), out["predicted_ms"], rel_tol=1e-9)
        assert out["memory"]["fits"]           # the runs ran: Megatron's state fits the A100's 38 GiB
    samples = read_allreduce(MEASURED / "a100-allreduce")
    assert {s[0] for s in samples} == set(range(2, 9))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.slow     # > 5 s: the full suite runs it, the quick layer does not
def test_cli_validate_measured_json_and_bad_input(tmp_path):
    good = _write(tmp_path, ["2,16,8,1024,16,24,1024,1,1,2,372.160408", "8,32,4,1024,16,24,1024,2,2,2,219.732754"])
    done = _cli("validate", "measured", str(good), "--platform", str(A100), "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert [r["measured_ms"] for r in payload["runs"]] == [372.160408, 219.732754]
    assert payload["summary"]["runs"] == 2
    bad = _write(tmp_path, ["2,16,8,1024,16,24,1024,1,1,1,372.1"])
    done = _cli("validate", "measured", str(bad), "--platform", str(A100), "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "row 2" in done.stderr
    mt3000 = _cli("validate", "measured", str(good), "--platform", str(ROOT / "platforms" / "mt3000-raw-ddr.toml"))
    assert mt3000.returncode == 2 and "needs a GPU-cluster platform" in mt3000.stderr


def test_operator_floor_and_fused_dropout_add(a100):
    slow_host = a100.with_overrides(**{"kernels.launch_s": 1e-3})
    gemm = Operator("fc1", "gemm", m=64, k=64, n=64, bias=True)
    prof = operator_profile(gemm, slow_host)
    assert (prof.forward_s, prof.backward_s) == (pytest.approx(1e-3), pytest.approx(3e-3))   # 1 and 3 kernels
    layer = gpt_model(1024, 16, 2, 1024)
    ops = {o.name: o for o in gpu_layer_profile(layer, 1, 1024, 1, a100).ops}
    elements = 1024 * 1024
    rate = a100.device.hbm_bandwidth * a100.kernels.hbm_efficiency
    assert ops["attn_dropout"].forward_s == pytest.approx(max(7 * elements / rate, a100.kernels.launch_s))
    assert ops["attn_residual"].forward_s == 0.0 and ops["mlp_residual"].backward_s == 0.0


def test_loss_is_megatrons_fp32_cross_entropy(a100):
    from ratrain.cost.gpu_kernels import CROSS_ENTROPY_BYTES, CROSS_ENTROPY_KERNELS
    model = gpt_model(1024, 16, 4, 1024, tp=2)
    rate = a100.device.hbm_bandwidth * a100.kernels.hbm_efficiency
    logits = 4 * 1024 * model.vocab // 2
    loss = next(o for o in gpu_layer_profile(model, 4, 1024, 2, a100).last_ops if o.kind == "loss")
    assert CROSS_ENTROPY_BYTES == (6 + 4 + 8 + 8 + 4 + 8, 8 + 6)      # the passes over the FP32 logits
    assert loss.forward_s == pytest.approx(CROSS_ENTROPY_BYTES[0] * logits / rate, rel=1e-12)
    assert loss.backward_s == pytest.approx(CROSS_ENTROPY_BYTES[1] * logits / rate, rel=1e-12)
    tiny = gpu_layer_profile(gpt_model(64, 2, 1, 32), 1, 32, 1, a100).last_ops[-1]   # host-bound: its kernels
    assert (tiny.forward_s, tiny.backward_s) == pytest.approx(
        tuple(k * a100.kernels.launch_s for k in CROSS_ENTROPY_KERNELS), rel=1e-12)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_cross_validation_predicts_each_gpu_count_with_a_fit_on_the_others(a100):
    from ratrain.repro.gpu_fit import FIT_START, cross_validate, fit_gpu_platform
    runs = read_runs(MEASURED / "a100-single-node-runs.csv")
    few = [r for g in (2, 4, 8) for r in [r for r in runs if r.gpus == g][:3]]
    samples = read_allreduce(MEASURED / "a100-allreduce")
    fitted, fit = fit_gpu_platform(a100, few, samples, evaluations=8)
    assert (fit.fit_rows, fit.held_out_rows, fit.held_out_error) == (9, 0, {})
    again, _ = fit_gpu_platform(a100.with_overrides(**{"kernels.launch_s": 1e-4}), few, samples, evaluations=8)
    assert again == fitted                     # every fit starts from FIT_START, not the file's values
    cv = cross_validate(a100, few, samples, evaluations=8)
    assert [f["held_out_gpus"] for f in cv.folds] == [2, 4, 8]
    assert [f["fit_rows"] for f in cv.folds] == [6, 6, 6] and cv.error["runs"] == 9
    fold8, _ = fit_gpu_platform(a100, few, samples, fit_gpus=(2, 4), evaluations=8)
    assert cv.folds[2]["constants"]["kernels.launch_s"] == fold8.kernels.launch_s
    assert cv.error["mean_abs_error"] == pytest.approx(sum(f["error"]["mean_abs_error"] for f in cv.folds) / 3)
    assert set(FIT_START) == set(cv.folds[0]["constants"])

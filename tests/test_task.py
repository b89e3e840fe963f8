"""`ratrain task`: completion time against a deadline, the noise-scale law, which resource decides,
the input pipeline and asynchronous saves, each against numbers derived here from first principles."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ratrain import cli
from ratrain.errors import ConfigError
from ratrain.plan import bottleneck, noise_scale
from ratrain.plan.checkpoints import (
    AsyncSave,
    async_lost_work_s,
    async_optimal_interval,
    async_overhead,
    daly_interval,
    exact_optimal_interval,
    exact_overhead_share,
    interval_table,
)
from ratrain.plan.input_pipeline import InputPipeline
from ratrain.plan.planner import simulate_config
from ratrain.plan.task import Failures, Layout, TrainingTask, deadline_devices, evaluate_scheme
from ratrain.spec.models import from_hf_config, get_model, parameter_count
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platforms import load_platform

ROOT = Path(__file__).resolve().parent.parent
A100 = str(ROOT / "platforms" / "dgx-a100.toml")
H100 = str(ROOT / "platforms" / "dgx-h100.toml")
A100_PEAK = 312e12            # the file's device.peak_fp16_flops (A100 datasheet, dense FP16)
SMALL = "gpt-h1024-l24-a16"   # GPT-2 medium as Megatron runs it: fits anywhere, plans in milliseconds
DAY = 86400.0


def _task_json(argv: list[str], capsys) -> dict:
    assert cli.main(["task", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _young_share(c: float, r: float, m: float) -> float:
    """First-order share at Young's interval: c/X + (X + c)/2M + r/M with X = sqrt(2 c M)."""
    x = math.sqrt(2 * c * m)
    return c / x + (x + c) / (2 * m) + r / m


# ---------------------------------------------------------------- the task and its completion time

def test_one_scheme_meets_and_one_misses_the_deadline(capsys):
    n = parameter_count(get_model(SMALL))
    tokens, seq, batch, mfu = 3e10, 1024, 512, 0.4
    h100_peak = load_platform(H100).peak_flops
    iterations = math.ceil(tokens / (seq * batch))                  # 57221 steps of 524288 tokens
    mtbf_h, c, r = 20000.0, 30.0, 300.0
    expected = {}
    for name, peak, p in (("dgx-a100", A100_PEAK, 8), ("dgx-h100", h100_peak, 16)):
        step = 6 * n * seq * batch / (p * peak * mfu)
        share = _young_share(c, r, mtbf_h * 3600 / p)
        expected[name] = (step, share, 1.0 + iterations * step * (1 + share) / DAY)
    # a deadline between the two completions: the H100 scheme meets it, the A100 one does not
    deadline = (expected["dgx-a100"][2] + expected["dgx-h100"][2]) / 2
    out = _task_json(["--model", SMALL, "--tokens", str(tokens), "--seq", str(seq), "--global-batch", str(batch),
                      "--deadline-days", repr(deadline), "--reserve-days", "1", "--platform", A100, "--devices", "8",
                      "--platform", H100, "--devices", "16", "--mfu", str(mfu), "--mtbf-hours", str(mtbf_h),
                      "--checkpoint-s", str(c), "--restart-s", str(r)], capsys)
    a, h = out["schemes"]
    for scheme, meets in ((a, False), (h, True)):
        step, share, done = expected[scheme["platform"]]
        assert scheme["iterations"] == iterations
        assert scheme["step_time_s"] == pytest.approx(step, rel=1e-12)
        assert scheme["overhead_share"] == pytest.approx(share, rel=1e-9)
        assert scheme["completion_days"] == pytest.approx(done, rel=1e-9)
        assert scheme["margin_days"] == pytest.approx(deadline - done, rel=1e-9)
        assert scheme["meets_deadline"] is meets
        # the per-step budget: what the deadline leaves over iterations x (1 + L)
        budget = (deadline - 1) * DAY / (iterations * (1 + share))
        assert scheme["affordable"]["margin_per_step_s"] == pytest.approx(budget - step, rel=1e-9)
        assert scheme["affordable"]["min_mfu"] == pytest.approx(mfu * step / budget, rel=1e-9)
    assert out["best"] == {"platform": "dgx-h100", "devices": 16}
    assert "iterations" not in out          # several schemes: only the list


def test_single_scheme_keys_at_the_top_and_async_save(capsys):
    n = parameter_count(get_model(SMALL))
    p, mfu, pause, write, slow, mtbf_h, r = 8, 0.5, 2.0, 120.0, 0.25, 10000.0, 60.0
    out = _task_json(["--model", SMALL, "--tokens", "1e9", "--seq", "1024", "--global-batch", "64",
                      "--deadline-days", "10", "--platform", A100, "--devices", str(p), "--mfu", str(mfu),
                      "--input-wait-s", "0.05", "--mtbf-hours", str(mtbf_h), "--restart-s", str(r),
                      "--async-pause-s", str(pause), "--async-write-s", str(write), "--async-slowdown", str(slow)],
                     capsys)
    m = mtbf_h * 3600 / p
    cost = pause + slow * write
    x = math.sqrt(2 * m * cost)
    share = cost / x + (x / 2 + write) / m + r / m
    step = 6 * n * 1024 * 64 / (p * A100_PEAK * mfu) + 0.05
    assert out["iterations"] == math.ceil(1e9 / 65536)
    assert out["step_time_s"] == pytest.approx(step, rel=1e-12)
    assert out["schemes"][0]["interval_s"] == pytest.approx(x, rel=1e-12)
    assert out["overhead_share"] == pytest.approx(share, rel=1e-12)
    assert out["completion_days"] == pytest.approx(out["iterations"] * step * (1 + share) / DAY, rel=1e-12)
    assert out["meets_deadline"] is True and out["schemes"][0]["completion_days"] == out["completion_days"]


def test_checkpoint_bytes_over_bandwidth_as_time_to_train(capsys):
    base = ["--model", SMALL, "--tokens", "1e10", "--seq", "1024", "--global-batch", "64", "--deadline-days", "20",
            "--platform", A100, "--devices", "8", "--mfu", "0.4", "--mtbf-hours", "1000"]
    by_bytes = _task_json([*base, "--checkpoint-bytes", "6e10", "--checkpoint-gbps", "2"], capsys)
    by_time = _task_json([*base, "--checkpoint-s", "30"], capsys)       # 6e10 B / 2e9 B/s
    assert by_bytes["overhead_share"] == by_time["overhead_share"] == pytest.approx(_young_share(30, 0, 450000))


def test_layout_given_is_simulated_and_memory_checked():
    task = TrainingTask(get_model(SMALL), 1e9, 1024, 64, 5.0, 1.0)
    platform = load_platform(A100)
    result = evaluate_scheme(task, platform, 8, Failures(), layout=Layout(tp=2, pp=2, micro_batch=2))
    cfg = result.step.config
    assert (cfg.tp, cfg.pp, cfg.dp, cfg.micro_batch, cfg.accum, cfg.activation) == (2, 2, 2, 2, 16, "ckpt")
    assert result.step.source == "simulated" and result.step.train_s == result.step.check.simulated_ms / 1e3
    assert result.memory_fits and result.overhead.total == 0.0
    assert result.completion_s == pytest.approx(1.0 * DAY + task.iterations * result.step.total_s, rel=1e-12)


def test_cli_layout_flags_give_the_simulated_step(capsys):
    out = _task_json(["--model", SMALL, "--tokens", "1e9", "--seq", "1024", "--global-batch", "64",
                      "--deadline-days", "5", "--platform", A100, "--devices", "8", "--tp", "2", "--pp", "2",
                      "--dp", "2", "--zero", "1", "--micro-batch", "2"], capsys)
    cfg = ParallelConfig(pp=2, dp=2, tp=2, zero=1, micro_batch=2, accum=16, seq=1024, activation="ckpt")
    check = simulate_config(get_model(SMALL), cfg, platform=load_platform(A100))
    assert out["schemes"][0]["config"] == cfg.to_json()
    assert out["step_time_s"] == pytest.approx(check.simulated_ms / 1e3, rel=1e-12)
    assert out["overhead_share"] == 0.0
    assert out["completion_days"] == pytest.approx(math.ceil(1e9 / 65536) * check.simulated_ms / 1e3 / DAY, rel=1e-12)


def test_qwen3_hf_config_head_dim_and_untied_head(tmp_path, capsys):
    h, f, layers, heads, kv, d, vocab = 1024, 3072, 28, 16, 8, 128, 151936     # head_dim x heads != hidden
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": h, "intermediate_size": f,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d,
           "vocab_size": vocab, "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
           "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False, "sliding_window": None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = from_hf_config(path)
    # q, k, v, o; the SwiGLU MLP; two norms; the q/k norms over head_dim
    per_layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * f + 2 * h + 2 * d
    n = layers * per_layer + vocab * h + (vocab * h + h)         # embedding; the untied head and the final norm
    assert (spec.head_dim, spec.tied_embeddings, spec.qk_norm) == (d, False, True)
    assert parameter_count(spec) == n
    out = _task_json(["--hf-config", str(path), "--tokens", "1e10", "--seq", "2048", "--global-batch", "128",
                      "--deadline-days", "30", "--platform", A100, "--devices", "8", "--mfu", "0.4"], capsys)
    assert out["step_time_s"] == pytest.approx(6 * n * 2048 * 128 / (8 * A100_PEAK * 0.4), rel=1e-12)


# ---------------------------------------------------------------- batch size against the noise scale

def test_noise_scale_law_passes_through_the_reference():
    bn, b, d = 4e6, 1e6, 1e11
    law = noise_scale.fit_reference(bn, b, d)
    assert law.critical_batch_tokens == pytest.approx(bn, rel=1e-12)
    assert law.steps(b) == pytest.approx(d / b, rel=1e-12) and law.tokens(b) == pytest.approx(d, rel=1e-12)
    for batch in (1e5, 3e6, 5e7):
        s, e = law.steps(batch), law.tokens(batch)
        assert e == pytest.approx(s * batch, rel=1e-12)                      # E = B S
        assert (s / law.s_min - 1) * (e / law.e_min - 1) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("ratio", [100.0, 0.01])
def test_weak_against_strong_scaling_on_both_sides_of_the_noise_scale(ratio):
    """B_noise = ratio x B_ref. Four times the devices: strong scaling is 4x either way; weak
    scaling is S_ref / S(4 B_ref) = (1 + ratio) / (1 + ratio / 4): near 4x far below the noise
    scale, near 1x far above it; its ceiling is 1 + ratio."""
    seq, batch, step = 1000, 100, 2.0
    b_ref = seq * batch
    law = noise_scale.fit_reference(ratio * b_ref, b_ref, 1e10)
    rows = {r["devices"]: r for r in noise_scale.scaling_table(law, 16, batch, seq, step)}
    s_ref = 1e10 / b_ref
    four = rows[64]
    assert four["strong"]["speedup"] == 4.0
    assert four["strong"]["completion_days"] == pytest.approx(s_ref * step / 4 / DAY, rel=1e-12)
    assert four["weak"]["speedup"] == pytest.approx((1 + ratio) / (1 + ratio / 4), rel=1e-12)
    assert four["weak"]["completion_days"] == pytest.approx(s_ref * (1 + ratio / 4) / (1 + ratio) * step / DAY,
                                                           rel=1e-12)
    assert noise_scale.weak_scaling_ceiling(ratio * b_ref, b_ref) == pytest.approx(1 + ratio, rel=1e-12)
    if ratio > 1:
        assert four["weak"]["speedup"] > 3.8
    else:
        assert four["weak"]["speedup"] < 1.01
    assert rows[256]["strong"]["speedup"] is None          # 256 devices, 100 sequences: not one each


# ---------------------------------------------------------------- which resource decides

def _mfu_scheme(train_s: float, pipeline: InputPipeline, tokens_per_step: int = 1000):
    """A scheme whose training step is ``train_s`` exactly: MFU chosen for it."""
    model = get_model(SMALL)
    task = TrainingTask(model, 1e9, 100, tokens_per_step // 100, 100.0)
    platform = load_platform(A100)
    mfu = task.flops_per_step / (8 * A100_PEAK * train_s)
    return evaluate_scheme(task, platform, 8, Failures(), mfu=mfu, pipeline=pipeline), platform


def test_amdahl_against_simulated_with_overlap_behind_the_input_queue():
    """Training 1.0 s, the input pipeline 1.5 s per batch behind a queue: the step waits 0.5 s, T = 1.5.
    f_compute = 1/1.5, f_input = 0.5/1.5. Input twice as fast: Amdahl 1 - 1/3 + 1/6 = 5/6, but the
    pipeline (0.75 s) now hides behind training: T' = 1.0, 2/3. Compute twice as fast: Amdahl 2/3, but
    the step is input-bound: T' = 0.5 + (1.5 - 0.5) = 1.5, no gain at all."""
    scheme, platform = _mfu_scheme(1.0, InputPipeline({"read": 2000.0, "tokenize": 1000 / 1.5}, queue_batches=2))
    assert scheme.step.input_wait_s == pytest.approx(0.5, rel=1e-12)
    table = bottleneck.resource_table(scheme, platform, InputPipeline({"read": 2000.0, "tokenize": 1000 / 1.5}, 2))
    rows = {row["resource"]: row for row in table["rows"]}
    at = {res: {q["r"]: q for q in rows[res]["ratios"]} for res in rows}
    assert rows["compute"]["share"] == pytest.approx(2 / 3, rel=1e-12)
    assert rows["input"]["share"] == pytest.approx(1 / 3, rel=1e-12)
    assert at["input"][2.0]["amdahl"] == pytest.approx(5 / 6, rel=1e-12)
    assert at["input"][2.0]["simulated"] == pytest.approx(2 / 3, rel=1e-12)
    assert at["compute"][2.0]["amdahl"] == pytest.approx(2 / 3, rel=1e-12)
    assert at["compute"][2.0]["simulated"] == pytest.approx(1.0, rel=1e-12)
    assert at["input"][0.5]["simulated"] == pytest.approx(2.0, rel=1e-12)      # 3.0 s of input, nothing hides it
    assert table["largest_share"] == "compute" and table["deciding"] == "input"


def test_simulated_link_behind_the_backward_gains_less_than_amdahl():
    """Data-parallel gradient syncs run layer by layer under the backward: a faster link gains less
    in the simulator, which sees them overlap, than the formula, which does not."""
    task = TrainingTask(get_model(SMALL), 1e9, 1024, 64, 5.0)
    platform = load_platform(A100)
    scheme = evaluate_scheme(task, platform, 16, Failures(), layout=Layout(dp=16, zero=1, micro_batch=2))
    table = bottleneck.resource_table(scheme, platform)
    link = next(row for row in table["rows"] if row["resource"] == "inter_link")
    assert link["share"] > 0.0
    for q in link["ratios"]:
        if q["r"] > 1:
            assert q["amdahl"] < q["simulated"] <= 1.0


def test_busy_times_cover_every_pass_once():
    """One GPU, one stage, no recomputation: the compute and memory operators' busy time is every
    forward and backward of the step (A x the stage's passes) plus the update; no link is busy."""
    task = TrainingTask(get_model(SMALL), 1e9, 1024, 8, 5.0)
    platform = load_platform(A100)
    scheme = evaluate_scheme(task, platform, 1, Failures(), layout=Layout(zero=0, activation="full"))
    (busy,) = bottleneck.stage_busy_s(scheme, platform)
    costs = scheme.step.check.costs
    passes = sum(lc.forward_ms + lc.backward_ms for lc in costs.stages[0]) * costs.microbatches / 1e3
    update = sum(lc.update_ms for lc in costs.stages[0]) / 1e3
    assert busy["compute"] + busy["memory"] == pytest.approx(passes + update, rel=1e-12)
    assert busy["intra_link"] == busy["inter_link"] == 0.0


def test_mt3000_simulated_scheme_on_the_planner_pick():
    task = TrainingTask(get_model(SMALL), 1e10, 1024, 64, 60.0)
    platform = load_platform(None)
    scheme = evaluate_scheme(task, platform, 16, Failures(), kernels="roofline")
    assert scheme.step.source == "simulated" and scheme.step.config.clusters == 16 and scheme.memory_fits
    table = bottleneck.resource_table(scheme, platform)
    names = [row["resource"] for row in table["rows"]]
    assert names == ["compute", "memory", "inter_link", "input"]          # MT-3000: no intra-node link
    compute = table["rows"][0]
    # roofline kernels scale exactly with the compute rate: twice as slow costs the whole compute share
    assert compute["ratios"][0]["simulated"] == pytest.approx(compute["ratios"][0]["amdahl"], rel=1e-6)


def test_required_efficiency_and_deadline_boundary():
    # 6 x 1e9 x 2e10 FLOPs = 1.2e20 in one day at MFU 0.5 on 312 TFLOP/s: 8.90 device-days, 9 devices
    assert deadline_devices(1e9, 2e10, A100_PEAK, 0.5, DAY) == 9
    assert deadline_devices(1e9, 2e10, A100_PEAK, 0.5, 10 * DAY) == 1
    scheme, platform = _mfu_scheme(1.0, None)     # 1e9 tokens, 1000 per step, 100 days, 8 devices
    n = parameter_count(get_model(SMALL))
    need = bottleneck.required_efficiency(scheme, Failures())
    assert [row["devices"] for row in need["rows"]] == [8, 4, 2, 1]
    for row in need["rows"]:
        assert row["required_mfu"] == pytest.approx(6 * n * 1e9 / (row["devices"] * A100_PEAK * 100 * DAY), rel=1e-12)
    assert need["achieved_mfu"] == pytest.approx(6 * n * 1000 / (8 * A100_PEAK * 1.0), rel=1e-12)
    rows = bottleneck.deadline_boundary(scheme.task, [platform], 0.5)
    assert rows[0]["parameters"] == pytest.approx(1e9) and rows[-1]["parameters"] == pytest.approx(1e12)
    assert rows[0]["devices"]["dgx-a100"] == math.ceil(6 * 1e9 * 1e9 / (A100_PEAK * 0.5 * 100 * DAY))
    assert rows[-1]["devices"]["dgx-a100"] == math.ceil(6 * 1e12 * 1e9 / (A100_PEAK * 0.5 * 100 * DAY))


# ---------------------------------------------------------------- input pipeline and checkpoints

def test_input_pipeline_wait_with_and_without_a_queue():
    pipe = InputPipeline({"read": 4e6, "tokenize": 1e6, "pack": 2e6, "h2d": 8e6}, queue_batches=1)
    assert pipe.slowest == "tokenize"
    assert pipe.wait_s(3e6, 2.0) == pytest.approx(1.0)          # 3 s of input, 2 s hidden under the step
    assert pipe.wait_s(1e6, 2.0) == 0.0
    assert InputPipeline(pipe.rates, queue_batches=0).wait_s(1e6, 2.0) == pytest.approx(1.0)   # nothing ahead


def test_async_save_failing_mid_write_redoes_the_previous_interval():
    x, w = 1000.0, 100.0
    assert async_lost_work_s(x, w, 50.0) == 1050.0            # mid-write: the previous checkpoint is the last good one
    assert async_lost_work_s(x, w, 500.0) == 500.0            # after commit: only the work since the snapshot
    # expected loss over a failure time uniform in the interval (midpoint rule): X/2 + w
    k = 100000
    mean = sum(async_lost_work_s(x, w, (i + 0.5) * x / k) for i in range(k)) / k
    assert mean == pytest.approx(x / 2 + w, rel=1e-6)
    save, m, r = AsyncSave(pause_s=5.0, write_s=w, slowdown_share=0.2), 50000.0, 30.0
    terms = async_overhead(x, save, r, m)
    assert (terms.save, terms.rework, terms.restart) == pytest.approx((25.0 / x, (x / 2 + w) / m, r / m))
    best = async_optimal_interval(save, m)
    assert best == pytest.approx(math.sqrt(2 * m * 25.0))
    grid = [best * (0.5 + i / 100) for i in range(101)]
    assert min(grid, key=lambda g: async_overhead(g, save, r, m).total) == pytest.approx(best, rel=0.01)


def test_save_interval_exact_optimum_beside_young_and_daly():
    c, r, m = 120.0, 600.0, 20000.0
    best = exact_optimal_interval(c, r, m)
    # E/X - 1 with E = M e^(r/M)(e^((X+c)/M) - 1): its derivative vanishes where
    # (X/M) e^((X+c)/M) = e^((X+c)/M) - 1
    lhs = best / m * math.exp((best + c) / m)
    assert lhs == pytest.approx(math.expm1((best + c) / m), rel=1e-7)
    assert exact_overhead_share(best, c, r, m) <= exact_overhead_share(best * 1.01, c, r, m)
    young = math.sqrt(2 * c * m)
    assert daly_interval(c, m) == pytest.approx(young * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c)
    assert abs(daly_interval(c, m) - best) < abs(young - best)      # Daly's correction moves towards the optimum
    table = interval_table(c, r, m)
    assert table["young_s"] == pytest.approx(young) and table["exact_optimum_s"] == pytest.approx(best)
    shares = [row["sync_exact_total"] for row in table["rows"]]
    assert min(shares) == pytest.approx(exact_overhead_share(best, c, r, m))


# ---------------------------------------------------------------- figures and bad input

@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_figures_are_written(tmp_path, capsys):
    out = _task_json(["--model", SMALL, "--tokens", "1e10", "--seq", "1024", "--global-batch", "64",
                      "--deadline-days", "20", "--reserve-days", "2", "--platform", A100, "--devices", "8,16",
                      "--mfu", "0.4", "--out-dir", str(tmp_path)], capsys)
    assert [s["devices"] for s in out["schemes"]] == [8, 16]
    names = sorted(Path(f).name for f in out["figures"])
    assert names == ["boundary.png", "completion.png"]
    assert all((tmp_path / n).read_bytes()[:4] == b"\x89PNG" for n in names)


BASE = ["--model", SMALL, "--tokens", "1e10", "--seq", "1024", "--global-batch", "64", "--deadline-days", "20",
        "--platform", A100, "--devices", "8", "--mfu", "0.4"]


def _with(flag: str, value: str) -> list[str]:
    argv = list(BASE)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


@pytest.mark.parametrize("argv, words", [
    (_with("--tokens", "0"), "tokens"),
    (_with("--tokens", "-5"), "tokens"),
    (_with("--global-batch", "0"), "global_batch"),
    (_with("--deadline-days", "-1"), "deadline_days"),
    (_with("--reserve-days", "30"), "planned stall"),
    (_with("--mfu", "0"), "mfu"),
    (_with("--mfu", "1.5"), "mfu"),
    (_with("--input-stage", "read=-3"), "read"),
    (_with("--mtbf-hours", "0"), "mtbf_hours"),
    (["--model", "llama2-70b", "--tokens", "1e10", "--seq", "4096", "--global-batch", "8", "--deadline-days", "20",
      "--platform", str(ROOT / "platforms" / "rtx4090-pcie.toml"), "--devices", "1", "--mfu", "0.4"],
     "smallest need"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys):
    assert cli.main(["task", *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("[")]     # progress lines aside
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err


def test_layout_that_does_not_use_the_devices_is_refused():
    task = TrainingTask(get_model(SMALL), 1e9, 1024, 64, 5.0)
    with pytest.raises(ConfigError, match="uses 4 devices"):
        evaluate_scheme(task, load_platform(A100), 8, Failures(), layout=Layout(tp=2, pp=1, dp=2), mfu=0.5)

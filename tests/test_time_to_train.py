"""Time to train: expected maximum of normals, Young interval, overhead terms, CLI handler and bad input."""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from ratrain import cli
from ratrain.cli.time_to_train import register
from ratrain.errors import ConfigError
from ratrain.plan.planner import simulate_config
from ratrain.plan.time_to_train import (
    Reliability,
    expected_max_normal,
    job_mtbf_s,
    overhead,
    straggler_step,
    sweep_clusters,
    time_to_train,
    young_daly_interval,
)
from ratrain.spec.models import get_model
from ratrain.spec.parallel import ParallelConfig

# E[max of n standard normals]: closed forms for n <= 3; the rest from an independent adaptive quadrature
# (scipy.integrate.quad, 1e-13), agreeing with Harter's (1961) tables to their 5 decimals.
KNOWN_MAX = {1: 0.0, 2: 1 / math.sqrt(math.pi), 3: 1.5 / math.sqrt(math.pi), 5: 1.1629644736,
             10: 1.5387527308, 100: 2.5075936364, 1024: 3.2482396014, 100_000: 4.3843194031}


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ratrain")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["time-to-train", *argv])


def _run(argv: list[str]) -> tuple[dict, str]:
    args = _parse(argv)
    return args.handler(args)


BASE = ["--step-s", "2", "--steps", "1000", "--clusters", "10", "--mtbf-hours", "100",
        "--checkpoint-s", "180", "--restart-s", "360"]


@pytest.mark.parametrize("n", sorted(KNOWN_MAX))
def test_expected_max_normal_known_values(n):
    assert expected_max_normal(n) == pytest.approx(KNOWN_MAX[n], abs=1e-9)


@pytest.mark.parametrize("n", [100, 1024])
def test_expected_max_normal_monte_carlo(n):
    samples = np.random.default_rng(12345).standard_normal((4000, n)).max(axis=1)
    standard_error = samples.std(ddof=1) / math.sqrt(len(samples))
    assert abs(expected_max_normal(n) - samples.mean()) < 4 * standard_error


def test_expected_max_normal_large_n():
    # its speed is a benchmark (bench/test_micro.py::test_expected_max_normal_100k), not a timed test
    assert expected_max_normal(100_000) == pytest.approx(KNOWN_MAX[100_000], abs=1e-6)


def test_straggler_step_and_job_mtbf():
    assert straggler_step(2.0, 1, 0.3) == pytest.approx(2.0)          # one cluster: no one to wait for
    assert straggler_step(2.0, 2, 0.1) == pytest.approx(2.0 * (1 + 0.1 / math.sqrt(math.pi)))
    assert straggler_step(2.0, 64, 0.0) == 2.0
    assert job_mtbf_s(100, 10) == pytest.approx(36_000.0)


def test_young_interval_and_overhead_terms_hand_computed():
    # M = 100 h / 10 clusters = 36000 s, c = 180 s: X* = sqrt(2 * 180 * 36000) = 3600 s.
    assert young_daly_interval(180, 36_000) == pytest.approx(3600.0)
    terms = overhead(3600, 180, 360, 36_000)
    assert terms.save == pytest.approx(180 / 3600)                     # 0.05
    assert terms.rework == pytest.approx((3600 + 180) / (2 * 36_000))  # 0.0525
    assert terms.restart == pytest.approx(360 / 36_000)                # 0.01
    assert terms.total == pytest.approx(0.1125)


def test_time_to_train_hand_computed():
    rel = Reliability(mtbf_hours=100, checkpoint_s=180, restart_s=360)
    result = time_to_train(2.0, 1000, 10, 1000, rel).to_json()
    assert result["optimal_interval_s"] == pytest.approx(3600.0)
    assert result["interval_s"] == result["optimal_interval_s"]
    assert result["interval_rule"] == "young"
    assert result["overhead"]["total"] == pytest.approx(0.1125)
    assert result["straggler_step_s"] == 2.0
    assert result["hours"] == pytest.approx(2000 * 1.1125 / 3600)
    assert result["expected_interruptions"] == pytest.approx(2225 / 36_000)
    assert result["tokens_per_s"] == pytest.approx(1000 * 1000 / 2225)
    assert result["progress_possible"] is True
    json.dumps(result, allow_nan=False)


def test_interval_table_minimum_at_optimum():
    rel = Reliability(mtbf_hours=5000, checkpoint_s=60, restart_s=300, compute_cv=0.02)
    result = time_to_train(10.0, 100_000, 64, None, rel, interval_s=900).to_json()
    assert result["interval_s"] == 900
    table = result["interval_table"]
    intervals = [row["interval_s"] for row in table]
    assert {300.0, 900.0, 1800.0, result["optimal_interval_s"]} <= set(intervals)
    best = min(table, key=lambda row: row["overhead"]["total"])
    assert best["interval_s"] == pytest.approx(result["optimal_interval_s"])
    assert best["hours"] == min(row["hours"] for row in table)
    # the minimum is flat: half or twice the optimum costs only 25% more save + rework
    optimal = result["optimal_interval_s"]
    at = {row["interval_s"]: row["overhead"] for row in table}
    core = at[optimal]["save"] + at[optimal]["rework"] - 60 / (2 * result["job_mtbf_s"])
    for other in (optimal / 2, 2 * optimal):
        assert at[other]["save"] + at[other]["rework"] - 60 / (2 * result["job_mtbf_s"]) == pytest.approx(1.25 * core)


def test_checkpoint_from_bytes_and_bandwidth():
    rel = Reliability(mtbf_hours=100, checkpoint_bytes=100e9, write_gbps=2.0)
    assert rel.save_seconds() == pytest.approx(50.0)


def test_no_progress_is_a_clear_field_not_a_number():
    # M = 3600 s; rework (3000 + 10) / 7200 + restart 3000 / 3600 > 1: failures eat all the time.
    rel = Reliability(mtbf_hours=1, checkpoint_s=10, restart_s=3000)
    result = time_to_train(1.0, 10, 1, 100, rel, interval_s=3000).to_json()
    assert result["progress_possible"] is False
    assert result["hours"] is None and result["tokens_per_s"] is None and result["expected_interruptions"] is None
    json.dumps(result, allow_nan=False)


@pytest.mark.parametrize("kwargs, field", [
    ({"mtbf_hours": 0}, "mtbf_hours"),
    ({"mtbf_hours": -5}, "mtbf_hours"),
    ({"mtbf_hours": math.nan}, "mtbf_hours"),
    ({"mtbf_hours": math.inf}, "mtbf_hours"),
    ({"checkpoint_s": -1}, "checkpoint_s"),
    ({"restart_s": -1}, "restart_s"),
    ({"compute_cv": -0.1}, "compute_cv"),
    ({"checkpoint_s": None}, "checkpoint_s"),
    ({"checkpoint_bytes": 1e9, "write_gbps": 1.0}, "checkpoint_s"),   # both ways given
    ({"checkpoint_s": None, "checkpoint_bytes": 1e9, "write_gbps": 0}, "write_gbps"),
])
def test_bad_reliability_names_the_field(kwargs, field):
    rel = Reliability(**{"mtbf_hours": 100, "checkpoint_s": 60, **kwargs})
    with pytest.raises(ConfigError, match=field):
        time_to_train(1.0, 10, 4, None, rel)


@pytest.mark.parametrize("call, field", [
    (lambda rel: time_to_train(1.0, 0, 4, None, rel), "steps"),
    (lambda rel: time_to_train(1.0, 10, 0, None, rel), "clusters"),
    (lambda rel: time_to_train(0.0, 10, 4, None, rel), "step_s"),
    (lambda rel: time_to_train(1.0, 10, 4, -1, rel), "tokens_per_step"),
    (lambda rel: time_to_train(1.0, 10, 4, None, rel, interval_s=60), "checkpoint_s=60 must be shorter"),
    (lambda rel: time_to_train(1.0, 10, 4, None, rel, interval_s=30), "interval_s=30"),
])
def test_bad_run_inputs_name_the_field(call, field):
    with pytest.raises(ConfigError, match=field):
        call(Reliability(mtbf_hours=100, checkpoint_s=60))


def test_checkpoint_beyond_twice_job_mtbf_has_no_optimum():
    # M = 3600 s over one cluster; c = 7200 s = 2M: the Young interval equals c.
    with pytest.raises(ConfigError, match="checkpoint_s=7200"):
        time_to_train(1.0, 10, 1, None, Reliability(mtbf_hours=1, checkpoint_s=7200))


def test_cli_payload_and_text():
    payload, text = _run([*BASE, "--compute-cv", "0.05", "--global-batch", "8", "--seq", "125", "--json"])
    for key in ("optimal_interval_s", "interval_s", "straggler_step_s", "hours", "tokens_per_s"):
        assert payload[key] is not None
    assert set(payload["overhead"]) == {"save", "rework", "restart", "total"}
    assert payload["tokens_per_step"] == 1000
    assert payload["straggler_step_s"] == pytest.approx(2 * (1 + 0.05 * KNOWN_MAX[10]))
    assert "young" in text and "interval (s)" in text
    json.dumps(payload, allow_nan=False)


def test_cli_token_budget_and_explicit_interval():
    payload, _ = _run(["--step-s", "2", "--tokens", "1000001", "--tokens-per-step", "1000", "--clusters", "10",
                       "--mtbf-hours", "100", "--checkpoint-bytes", "360e9", "--checkpoint-gbps", "2",
                       "--interval-s", "1800"])
    assert payload["steps"] == 1001
    assert payload["checkpoint_s"] == pytest.approx(180.0)
    assert payload["interval_s"] == 1800
    assert payload["overhead"]["save"] == pytest.approx(0.1)


def test_cli_plot_writes_png(tmp_path):
    out = tmp_path / "ttt.png"
    payload, _ = _run([*BASE, "--compute-cv", "0.02", "--plot", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [row["clusters"] for row in payload["cluster_sweep"]] == [8, 16, 32, 64, 128, 256, 512, 1024]
    # 100 h / 1024 clusters leaves a job MTBF of 352 s, shorter than the 360 s restart: no progress, no hours
    assert payload["cluster_sweep"][-1]["hours"] is None
    json.dumps(payload, allow_nan=False)


def test_sweep_hours_grow_with_clusters():
    rel = Reliability(mtbf_hours=5000, checkpoint_s=60, restart_s=300, compute_cv=0.02)
    hours = [row["hours"] for row in sweep_clusters(10.0, 1000, None, rel, [8, 64, 512])]
    assert hours == sorted(hours)


@pytest.mark.parametrize("extra, field", [
    (["--mtbf-hours", "0"], "mtbf_hours"),
    (["--mtbf-hours", "-3"], "mtbf_hours"),
    (["--interval-s", "120"], "checkpoint_s=180 must be shorter than interval_s=120"),
])
def test_cli_bad_input_writes_nothing(tmp_path, extra, field):
    # a repeated flag overrides BASE's value (argparse keeps the last)
    out = tmp_path / "ttt.png"
    with pytest.raises(ConfigError, match=field):
        _run([*BASE, *extra, "--plot", str(out)])
    assert list(tmp_path.iterdir()) == []


def test_cli_model_mode_takes_the_simulated_step():
    cfg = ParallelConfig(pp=2, dp=4, accum=16, seq=2048)
    step_s = simulate_config(get_model("llama2-7b"), cfg).simulated_ms / 1e3
    payload, _ = _run(["--model", "llama2-7b", "--pp", "2", "--dp", "4", "--accum", "16", "--steps", "10",
                       "--clusters", "8", "--mtbf-hours", "100", "--checkpoint-s", "60"])
    assert payload["step_s"] == pytest.approx(step_s, rel=1e-12)
    assert payload["label"] == cfg.describe()
    with pytest.raises(ConfigError, match="--clusters=4 but the configuration"):
        _run(["--model", "llama2-7b", "--pp", "2", "--dp", "4", "--steps", "10", "--clusters", "4",
              "--mtbf-hours", "100", "--checkpoint-s", "60"])


def test_main_exits_nonzero_on_bad_input(tmp_path, monkeypatch, capsys):
    out = tmp_path / "ttt.png"
    argv = ["time-to-train", *BASE, "--mtbf-hours", "0", "--plot", str(out), "--json"]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "mtbf_hours=0" in captured.err
    assert not out.exists()

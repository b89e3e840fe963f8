"""The reproduction driver on the analytic (roofline) profile: structure, files and the
invariants that do not depend on emulated latencies."""
import json

import pytest

from ratrain.repro.experiment import Settings
from ratrain.repro.report import EXPERIMENT_NAMES, registry, reproduce

pytestmark = pytest.mark.slow       # full experiments on emulated profiles

FAST = Settings(profile_source="roofline")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    exps = reproduce(["table3", "table4", "table6", "ablation"], out, progress=False, settings=FAST)
    return out, {e.key: e for e in exps}


def test_registry_covers_every_experiment():
    assert list(registry()) == list(EXPERIMENT_NAMES)


def test_files_and_report_are_written(run):
    out, exps = run
    for key in exps:
        data = json.loads((out / f"{key}.json").read_text())
        assert data["rows"] and data["checks"] and data["settings"]["profile_source"] == "roofline"
    report = (out / "report.md").read_text()
    assert "| check | ours | paper |" in report and "ablation.png" in report
    for name in ("ablation.png", "timeline_1f1b.png", "timeline_tail.png", "stage_memory.png", "table3_memory.png",
                 "table6_scaleout.png"):
        assert (out / name).stat().st_size > 5000, name
    trace = json.loads((out / "ablation_full_trace.json").read_text())
    assert trace["traceEvents"]


def test_planner_predicts_the_simulator_within_three_percent(run):
    _, exps = run
    for row in exps["table4"].rows:
        assert row["error"] <= 0.03, row


def test_minimum_footprints_respect_the_budget(run):
    _, exps = run
    for row in exps["table3"].rows:
        assert row["peak_gb"] <= 20.0
        assert row["pp"] * row["dp"] == row["min_clusters"]


def test_scale_out_keeps_per_replica_work(run):
    _, exps = run
    rows = exps["table6"].rows
    assert [r["clusters"] for r in rows] == [256, 512, 768, 1024]
    assert rows[0]["efficiency"] == 1.0
    assert all(0.5 < r["efficiency"] <= 1.0 + 1e-9 for r in rows)


def test_ablation_disabling_layerwise_never_shrinks_the_tail(run):
    _, exps = run
    by = {r["variant"]: r for r in exps["ablation"].rows}
    assert by["no-layerwise"]["exposed_tail_s"] >= by["full"]["exposed_tail_s"]
    assert by["no-fsr"]["step_s"] >= by["full"]["step_s"]


def test_model_driven_simulate_cli(capsys, tmp_path):
    from ratrain.cli import main
    trace = tmp_path / "step.json"
    assert main(["simulate", "--model", "llama2-13b", "--pp", "2", "--dp", "128", "--accum", "8",
                 "--profile", "roofline", "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "llama2-13b" and out["label"].startswith("P=2,D=128")
    assert abs(out["predicted_step_ms"] / out["step_time_ms"] - 1) <= 0.03
    assert {t["kind"] for t in out["timeline"]} >= {"F", "B", "GradSync", "PrefetchW"}
    assert json.loads(trace.read_text())["traceEvents"]
    assert main(["simulate", "--model", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err

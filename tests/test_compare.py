"""Before/after comparison of reproductions (ratrain.repro.compare) and its section in the report."""
from __future__ import annotations

import json

import pytest

from ratrain.errors import ConfigError
from ratrain.repro.compare import compare_markdown, load_baseline, moved, moved_rows
from ratrain.repro.experiment import Check, Experiment
from ratrain.repro.report import write_report


@pytest.mark.parametrize("before, after, tol, ok_b, ok_a, expect", [
    (64.0, 65.4, "±1.5 pp", True, True, False),
    (64.0, 65.6, "±1.5 pp", True, True, True),
    (100.0, 124.0, "±25%", False, False, False),
    (100.0, 126.0, "±25%", False, False, True),
    (0.99, 0.976, "±1.5 points", True, True, False),
    (0.99, 0.974, "±1.5 points", True, False, True),
    (0.010, 0.0104, "<= 3%", True, True, False),    # one-sided: 4 % relative, no flip
    (0.010, 0.0106, "<= 3%", True, True, True),     # one-sided: 6 % relative
    (1.0, 1.01, ">= 2x", False, True, True),        # one-sided: flip counts
    ("2,4", "2,4", "equal", True, True, False),
    ("12,4", "16,4", "equal", False, True, True),
])
def test_moved_follows_the_tolerance(before, after, tol, ok_b, ok_a, expect):
    assert moved(before, after, tol, ok_b, ok_a) is expect


def _payload(values: dict[str, tuple[float, bool]], why: dict | None = None) -> dict:
    checks = [{"name": n, "ours": v, "paper": 64.96, "tolerance": "±1.5 pp", "ok": ok} for n, (v, ok) in values.items()]
    return {"experiments": {"table5": {"title": "Table 5", "checks": checks}}, "why": why or {}}


def test_markdown_marks_moves_and_flips_with_one_sentence_each():
    before = _payload({"a": (60.0, False), "b": (63.25, False), "c": (66.0, True)}, why={"a": "because A."})
    after = _payload({"a": (64.9, True), "b": (64.3, True), "c": (66.1, True)})
    text = compare_markdown(before, after)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()
            if line.startswith("| ") and "---" not in line}
    assert rows["a"].endswith("| **yes** |") and rows["b"].endswith("| pass/miss |") and rows["c"].endswith("|  |")
    assert "- a: because A." in text
    assert "- b: moved since the baseline; no explanation is recorded" in text
    assert "- c:" not in text
    assert moved_rows(before, after) == [("table5", "a")]


def test_shipped_baseline_explains_every_move_of_its_own_snapshot():
    base = load_baseline()
    assert set(base["why"]) <= {c["name"] for e in base["experiments"].values() for c in e["checks"]}
    assert compare_markdown(base, base).count("**yes**") == 0


def test_bad_baseline_is_a_named_error(tmp_path):
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"experiments": {"table5": {"title": "x"}}}))
    with pytest.raises(ConfigError, match="table5.*checks"):
        load_baseline(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a reproduction payload"):
        load_baseline(bad)


def test_report_carries_before_and_after_tables(tmp_path):
    base = load_baseline()
    checks = [Check(c["name"], c["ours"], c["paper"], c["tolerance"], c["ok"])
              for c in base["experiments"]["table5"]["checks"]]
    checks[0] = Check(checks[0].name, 80.0, checks[0].paper, checks[0].tolerance, False)
    exps = [Experiment("table5", "Table 5 (run)", [], checks), Experiment("budget", "Budget", [], [])]
    text = write_report(exps, tmp_path).read_text()
    section = text.split("## Before and after the one-platform step", 1)[1]
    assert "### Table 5 (run)" in section and "| 80 |" not in section
    assert f"| {checks[0].name} | 63.25 MISS | 80 MISS |" in section and "**yes**" in section

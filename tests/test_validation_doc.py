"""docs/VALIDATION.md states the errors a fresh `ratrain validate measured` run gives."""
from __future__ import annotations

from pathlib import Path

import pytest

from ratrain.repro.measured import error_table, read_runs
from ratrain.spec.platforms import load_platform

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT.parent / "shared" / "measured" / "a100-single-node-runs.csv"


@pytest.mark.skipif(not RUNS.exists(), reason="the calibration set is not beside the checkout")
def test_validation_doc_error_table_matches_a_fresh_run():
    rows = error_table(read_runs(RUNS), load_platform(ROOT / "platforms" / "a100-measured-cluster.toml"))
    doc = (ROOT / "docs" / "VALIDATION.md").read_text()
    assert len(rows) == 3
    for row in rows:
        assert row in doc, f"docs/VALIDATION.md does not have the row a fresh run gives: {row}"

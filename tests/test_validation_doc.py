"""docs/VALIDATION.md states the errors a fresh `ratrain validate measured` run gives."""
from __future__ import annotations

from pathlib import Path

import pytest

from ratrain.repro.measured import (
    CALIBRATION_PLATFORM,
    CALIBRATION_RUNS,
    compare,
    cross_validated,
    cross_validation_table,
    error_table,
    read_runs,
    residual_table,
    validate,
)
from ratrain.spec.platforms import load_platform

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fresh_run():
    """The calibration runs, their platform and one `ratrain validate measured` of them (both tests read it)."""
    runs, platform = read_runs(CALIBRATION_RUNS), load_platform(CALIBRATION_PLATFORM)
    return runs, platform, validate(runs, platform)


@pytest.mark.slow     # > 5 s: the full suite runs it, the quick layer does not
def test_validation_doc_tables_match_a_fresh_run(fresh_run):
    runs, platform, validation = fresh_run
    doc = (ROOT / "docs" / "VALIDATION.md").read_text()
    rows = error_table(runs, platform) + cross_validation_table(runs, platform) + residual_table(validation)
    assert len(rows) == 4 + 4 + 5
    for row in rows:
        assert row in doc, f"docs/VALIDATION.md does not have the row a fresh run gives: {row}"


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_readme_quotes_the_errors_a_fresh_run_gives(fresh_run):
    runs, platform, validation = fresh_run
    whole = validation.summary
    held = compare(cross_validated(runs, platform)[1], platform.name).summary
    text = " ".join((ROOT / "README.md").read_text().split())
    quoted = (f"mean absolute error of {100 * whole['mean_abs_error']:.1f} % on all runs and "
              f"{100 * held['mean_abs_error']:.1f} % cross-validated")
    assert quoted in text
    assert f"Kendall tau of at least {whole['min_group_tau']:.2f}" in text

"""The memory-budget study: the 20 GB rows are Table 3's search, and more memory never costs clusters."""
import pytest

from ratrain.errors import ConfigError
from ratrain.repro.budget import budget_rows
from ratrain.repro.experiment import DEFAULT_SETTINGS


@pytest.fixture(scope="module")
def rows():
    return budget_rows(DEFAULT_SETTINGS, budgets=(15, 20, 30))


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_twenty_gb_rows_are_table3(rows):
    at20 = {r["model"]: (r["min_clusters"], r["pp"], r["dp"]) for r in rows if r["budget_gb"] == 20}
    # our Table 3: the paper's P, D except Qwen2.5-32B (48 clusters, P=24, D=2: with Eq. 6's single
    # recovery buffer, fewer layers per stage leave less recovery on the backward path)
    assert at20 == {"llama2-7b": (8, 2, 4), "baichuan2-13b": (16, 8, 2), "qwen2.5-32b": (48, 24, 2),
                    "llama2-70b": (96, 48, 2)}


def test_more_memory_never_needs_more_clusters(rows):
    for model in {r["model"] for r in rows}:
        mins = [r["min_clusters"] for r in sorted(rows, key=lambda r: r["budget_gb"]) if r["model"] == model]
        assert None not in mins and mins == sorted(mins, reverse=True), (model, mins)


def test_speedup_is_the_best_baseline_over_ratrain(rows):
    for r in rows:
        steps = [r[f"{m}_step_s"] for m in ("tp-heavy", "zero3-heavy", "backward-ckpt", "tuned")]
        best = min(v for v in steps if v is not None)
        assert r["speedup"] == pytest.approx(best / r["step_s"])


def test_a_budget_of_zero_is_refused():
    with pytest.raises(ConfigError, match="budget must be positive"):
        budget_rows(DEFAULT_SETTINGS, budgets=(0,))

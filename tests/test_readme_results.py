"""The README's results section says what the last full reproduction computed: its summary block is
rendered from the shipped summary, every figure of its key-figures table is a check value of that
run, its prose quotes those values, and the quick experiments still compute them."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mtemu.platform import DEFAULT as DEFAULT_PLATFORM
from mtemu.version import emulator_version
from ratrain.repro import report
from ratrain.repro.experiment import DEFAULT_SETTINGS, Check, Experiment
from ratrain.repro.kernels import FULL_SEARCH, full_search_gap
from ratrain.repro.report import registry, reproduce
from ratrain.repro.summary import by_key, readme_block, shipped_summary, splice_readme, summarize, summary_markdown
from rtcommon.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# a number on its own: not part of a name (7B, Qwen2.5-32B, LLaMA-2-70B, P=8) nor of a range (12-30)
NUMBER = re.compile(r"(?<![\w.=\-])(\d+(?:\.\d+)?)(?![\w\-]|\.\d)|(?<![\w.=\-])(\d+(?:\.\d+)?)(?=x\b)")


def _numbers(text: str) -> list[str]:
    text = re.sub(r"\b(Tables?|Fig\.|Eq\.) \d+", "", text)         # names of the paper's tables
    return [a or b for a, b in NUMBER.findall(text)]


def _key_figures() -> list[tuple[str, str, str]]:
    """(experiment key, label, ours) for each row of the README's key-figures table."""
    section = README.split("Key figures, ours beside the paper's", 1)[1].split("\n\n", 2)[1]
    rows = []
    for line in section.splitlines()[2:]:
        label, ours, _paper = (c.strip() for c in line.strip().strip("|").split("|"))
        key = re.match(r"`(\w+)`: ", label).group(1)
        rows.append((key, label, ours))
    return rows


def _matches(token: str, values: list[float]) -> bool:
    """``token`` is one of ``values`` as printed: at its decimals, as is, as a percentage, or as the
    percentage a ratio below 1 saves."""
    places = len(token.split(".")[1]) if "." in token else 0
    x = float(token)
    return any(abs(round(shown, places) - x) < 1e-9 for v in values for shown in (v, 100 * v, 100 * (1 - v)))


def _check_numbers(experiment: dict) -> list[float]:
    """Every number a run's checks of one experiment hold: their values, and the numbers in their names
    and notes."""
    out = []
    for name, ours, _paper, _ok, note in experiment["values"]:
        out += [float(t) for t in re.findall(r"\d+(?:\.\d+)?", f"{name} {note}")]
        if isinstance(ours, (int, float)) and not isinstance(ours, bool):
            out.append(float(ours))
        elif isinstance(ours, str):
            out += [float(t) for t in re.findall(r"\d+(?:\.\d+)?", ours)]
    return out


def test_the_readme_shows_the_shipped_summary():
    summary = shipped_summary()
    assert readme_block(README) == summary_markdown(summary)
    assert splice_readme(README, summary) == README
    assert [e["key"] for e in summary["experiments"]] == list(registry())      # every experiment, in run order


def test_every_key_figure_is_a_check_value_of_that_run():
    exps = by_key(shipped_summary())
    rows = _key_figures()
    assert {key for key, _l, _o in rows} <= set(exps) and len(rows) >= 15
    for key, label, ours in rows:
        values = _check_numbers(exps[key])
        context = _numbers(label)            # the row's own setting: clusters, sequence lengths
        stale = [t for t in _numbers(ours) if t not in context and not _matches(t, values)]
        assert not stale, f"README key figures, {label[:40]}...: {stale} are no check value of the shipped run"


def test_the_prose_quotes_the_runs_step_times():
    exps = by_key(shipped_summary())
    step = {name.split()[0]: ours for name, ours, *_rest in exps["table2"]["values"] if "step time" in name}
    before = json.loads((ROOT / "ratrain" / "data" / "reproduction-before-one-platform.json").read_text())
    old = {c["name"].split()[0]: c["ours"] for c in before["experiments"]["table2"]["checks"]
           if "step time" in c["name"]}
    fell = [round(100 * (1 - step[m] / old[m])) for m in ("llama2-13b", "qwen2.5-32b")]
    text = " ".join(README.split())
    assert (f"step times fell {fell[0]} % and {fell[1]} % (to {step['llama2-13b']:.0f} s and "
            f"{step['qwen2.5-32b']:.0f} s)") in text
    assert f"{step['llama2-13b']:.0f} s / {step['qwen2.5-32b']:.0f} s" in text


@pytest.mark.parametrize("key", [pytest.param("table3", marks=pytest.mark.slow),
                                 pytest.param("table4", marks=pytest.mark.slow), "table6"])
def test_the_quick_experiments_compute_the_shipped_values(key, tmp_path):
    exp = registry()[key](tmp_path, Progress(False), DEFAULT_SETTINGS)
    fresh = summarize({key: exp.to_json()})["experiments"][0]
    shipped = by_key(shipped_summary())[key]
    assert [fresh[f] for f in ("title", "passed", "checks")] == [shipped[f] for f in ("title", "passed", "checks")]
    _same(fresh["values"], shipped["values"])


def _same(a: list, b: list) -> None:
    for (na, oa, pa, ka, ta), (nb, ob, pb, kb, tb) in zip(a, b, strict=True):
        assert (na, pa, ka, ta) == (nb, pb, kb, tb)
        assert oa == (pytest.approx(ob, rel=1e-9) if isinstance(oa, float) else ob), na


def test_a_full_run_writes_its_summary_beside_the_report(tmp_path, monkeypatch):
    def fake(key):
        return lambda out, progress, settings: Experiment(key, key.title(), [], [Check("c", 1.5, 2, "-", key == "a")])

    monkeypatch.setattr(report, "registry", lambda: {"a": fake("a"), "b": fake("b")})
    done = reproduce(["a", "b"], tmp_path, progress=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == json.loads(json.dumps(summarize({e.key: e.to_json() for e in done})))
    assert (tmp_path / "summary.md").read_text() == summary_markdown(summary) + "\n"
    assert "passed 1 of 2 checks" in summary_markdown(summary)


def test_readme_and_report_state_what_tuned_tiles_leave_against_the_full_search():
    exps = by_key(shipped_summary())
    full = json.loads(FULL_SEARCH.read_text())
    shape = "x".join(map(str, full["shape"]))
    default = next(ours for name, ours, *_r in exps["table5"]["values"] if name == f"{shape} utilization")
    gain = next(ours for name, ours, *_r in exps["tune"]["values"] if name == f"{shape}: tuned over default")
    tuned = (default + gain) / 100            # both checks are rounded to 0.01 pp
    sentence = full_search_gap([{"shape": shape, "loop_order": full["loop_order"], "best_utilization": tuned}])
    assert sentence and "tuned tiles leave 11.9 pp" in sentence
    assert sentence in " ".join(README.split())
    assert full["platform_digest"] == DEFAULT_PLATFORM.digest() and full["emulated"] > 60
    # the report's tuner section carries the sentence (its rows from the run)
    row = {"shape": shape, "loop_order": full["loop_order"], "best_utilization": full["best"]["utilization"]}
    assert "leave 0.0 pp" in full_search_gap([row])


def test_the_shipped_full_search_is_of_the_current_emulator():
    assert json.loads(FULL_SEARCH.read_text())["emulator_version"] == emulator_version("gemm")

"""A reproduction run in a few numbers: checks passed per experiment, its time, every check's value.

A full ``ratrain reproduce`` writes ``summary.json`` (:func:`summarize`) and ``summary.md``
(:func:`summary_markdown`) beside its report. The README's results section is that markdown,
from the summary of the last full run shipped as ``ratrain/data/reproduce-summary.json``;
tests/test_readme_results.py checks that the README shows exactly what the shipped summary
renders, that every figure of its key-figures table is a check value of that run, and that the
quick experiments still compute the shipped values.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from rtcommon.fileio import atomic_write_json, atomic_write_text

SHIPPED_SUMMARY = Path(__file__).resolve().parent.parent / "data" / "reproduce-summary.json"
FORMAT = 1
# the studies that go beyond the paper (no paper number to meet); every other experiment checks
# the paper's tables and figures
BEYOND_THE_PAPER = ("schedules", "budget", "stragglers", "platforms", "ranking", "measured", "cross_platform")


def summarize(experiments: dict[str, dict]) -> dict:
    """The summary of a run from its experiments' JSON (``ratrain reproduce --json``'s ``experiments``,
    or the ``results/<key>.json`` files): per experiment its title, checks passed, seconds and every
    check as [name, ours, paper, ok, note], in run order (a list: JSON files here sort their keys)."""
    return {"format": FORMAT, "experiments": [
        {"key": key, "title": exp["title"], "passed": sum(bool(c["ok"]) for c in exp["checks"]),
         "checks": len(exp["checks"]), "seconds": round(float(exp.get("seconds", 0.0)), 1),
         "values": [[c["name"], c["ours"], c["paper"], bool(c["ok"]), c.get("note", "")] for c in exp["checks"]]}
        for key, exp in experiments.items()]}


def by_key(summary: dict) -> dict[str, dict]:
    """The summary's experiments by key."""
    return {e["key"]: e for e in summary["experiments"]}


def _totals(exps: list[dict]) -> tuple[int, int]:
    return sum(e["passed"] for e in exps), sum(e["checks"] for e in exps)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def summary_markdown(summary: dict) -> str:
    """The README's results paragraph and table: checks passed overall, against the paper and beyond
    it, and per experiment with its time in the run."""
    exps = summary["experiments"]
    passed, total = _totals(exps)
    p_pass, p_total = _totals([e for e in exps if e["key"] not in BEYOND_THE_PAPER])
    b_pass, b_total = _totals([e for e in exps if e["key"] in BEYOND_THE_PAPER])
    seconds = sum(e["seconds"] for e in exps)
    lines = [f"The last full `ratrain reproduce` passed {passed} of {total} checks: {p_pass} of the {p_total} "
             f"checks against the paper's numbers and {b_pass} of {b_total} in the studies beyond the paper; "
             f"its experiments took {_duration(seconds)} in all on 2 cores.", "",
             "| experiment | checks passed | time |", "| --- | --- | --- |"]
    for e in exps:
        lines.append(f"| `{e['key']}`: {e['title']} | {e['passed']}/{e['checks']} | {_duration(e['seconds'])} |")
    return "\n".join(lines)


def write_summary(experiments: dict[str, dict], out: Path) -> Path:
    """``summary.json`` and ``summary.md`` of a run in ``out`` (the shipped summary is a copy of the
    JSON: ``cp results/summary.json ratrain/data/reproduce-summary.json``)."""
    summary = summarize(experiments)
    atomic_write_json(out / "summary.json", summary)
    atomic_write_text(out / "summary.md", summary_markdown(summary) + "\n")
    return out / "summary.json"


def shipped_summary() -> dict:
    """The summary of the last full run, as shipped."""
    return json.loads(SHIPPED_SUMMARY.read_text())


README_START = "<!-- results summary: rendered by ratrain.repro.summary from ratrain/data/reproduce-summary.json -->\n"
README_END = "\n<!-- end of results summary -->"


def readme_block(text: str) -> str:
    """The rendered part of the README's results section."""
    start = text.index(README_START) + len(README_START)
    return text[start:text.index(README_END, start)]


def splice_readme(text: str, summary: dict) -> str:
    """The README with its results block rendered from ``summary``."""
    start = text.index(README_START) + len(README_START)
    return text[:start] + summary_markdown(summary) + text[text.index(README_END, start):]


def main(argv: list[str] | None = None) -> int:
    """``python -m ratrain.repro.summary [results/summary.json]``: ship a full run's summary and
    render it into README.md (from the repository's root)."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(main.__doc__.split(":")[0].strip("`"))
        return 0
    try:
        summary = json.loads(Path(args[0]).read_text()) if args else shipped_summary()
    except (OSError, ValueError) as exc:
        print(f"ratrain.repro.summary: {args[0]}: not a readable summary.json ({exc})", file=sys.stderr)
        return 2
    if not Path("README.md").is_file():
        print("ratrain.repro.summary: no README.md here: run it from the repository's root", file=sys.stderr)
        return 2
    atomic_write_json(SHIPPED_SUMMARY, summary)
    readme = Path("README.md")
    atomic_write_text(readme, splice_readme(readme.read_text(), summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Before and after: two reproductions compared check by check.

``compare_markdown`` renders, for each experiment, a table of before, after and the paper with every
row that moved by more than its tolerance marked, and one sentence for each such row: the shipped
explanation where the baseline file has one, else a plain statement that it is unexplained. The
report (``results/report.md``) compares every run against the shipped baseline
``ratrain/data/reproduction-before-one-platform.json`` (the reproduction at the last commit before
the one-platform step), so the before/after tables stay true as the code moves on.
``scripts/compare_reproductions.py`` compares any two ``ratrain reproduce --json`` payloads.
"""
from __future__ import annotations

import re
from pathlib import Path

from ratrain.errors import ConfigError
from rtcommon.jsonio import load_json_file

BASELINE_FILE = Path(__file__).parent.parent / "data" / "reproduction-before-one-platform.json"
DEFAULT_EXPERIMENTS = ("table5", "attention", "table2", "table3", "table4", "table6", "ablation")
# A one-sided tolerance ("<= 3%", ">= 2x") has no width: a change of pass/miss or of more than this
# relative amount counts as a move.
ONE_SIDED_MOVE = 0.05


def _number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def moved(before, after, tolerance: str, ok_before=None, ok_after=None) -> bool:
    """Did the value move by more than the check's tolerance (relative for '%', absolute otherwise)?"""
    b, a = _number(before), _number(after)
    if b is None or a is None:
        return before != after
    m = re.search(r"±\s*([0-9.]+)\s*(%|pp|GB|points)?", tolerance)
    if not m:
        return ok_before != ok_after or abs(a - b) > ONE_SIDED_MOVE * abs(b)
    tol = float(m.group(1))
    unit = m.group(2)
    if unit == "%":
        return abs(a - b) > tol / 100 * abs(b)
    if unit == "points":
        return abs(a - b) * 100 > tol
    return abs(a - b) > tol


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def _mark(ok) -> str:
    return "" if ok is None else (" pass" if ok else " MISS")


def load_baseline(path: str | Path = BASELINE_FILE) -> dict:
    """A reproduction payload (``{"experiments": {key: {"title", "checks"}}}``), checked for shape."""
    data = load_json_file(path, "reproduction payload", ConfigError)
    exps = data.get("experiments") if isinstance(data, dict) else None
    if not isinstance(exps, dict):
        raise ConfigError(f"{path}: not a reproduction payload (no 'experiments' object)")
    for key, exp in exps.items():
        if not isinstance(exp, dict) or not isinstance(exp.get("checks"), list):
            raise ConfigError(f"{path}: experiment {key!r} has no 'checks' list")
    return data


def moved_rows(before: dict, after: dict, only=DEFAULT_EXPERIMENTS) -> list[tuple[str, str]]:
    """(experiment key, check name) of every check that moved by more than its tolerance."""
    out = []
    for key in only:
        eb, ea = before["experiments"].get(key), after["experiments"].get(key)
        if eb is None or ea is None:
            continue
        old = {c["name"]: c for c in eb["checks"]}
        for c in ea["checks"]:
            o = old.get(c["name"], {})
            if moved(o.get("ours"), c["ours"], c["tolerance"], o.get("ok"), c["ok"]):
                out.append((key, c["name"]))
    return out


def compare_markdown(before: dict, after: dict, only=DEFAULT_EXPERIMENTS, heading: str = "###") -> str:
    """Markdown tables, one per experiment present in both, then a sentence per row that moved by more
    than its tolerance (**yes**) or crossed between pass and miss while inside it (pass/miss)."""
    why = before.get("why", {})
    moves = set(moved_rows(before, after, only))
    lines = []
    for key in only:
        eb, ea = before["experiments"].get(key), after["experiments"].get(key)
        if eb is None or ea is None:
            continue
        lines += [f"{heading} {ea['title']}", "", "| check | before | after | paper | tolerance | moved |",
                  "| --- | --- | --- | --- | --- | --- |"]
        old = {c["name"]: c for c in eb["checks"]}
        explained = []
        for c in ea["checks"]:
            o = old.get(c["name"], {})
            flag = "**yes**" if (key, c["name"]) in moves else ""
            if not flag and o.get("ok") is not None and o.get("ok") != c["ok"]:
                flag = "pass/miss"   # inside its tolerance, but it crossed the paper's band
            name = c["name"].replace("|", "&#124;")
            lines.append(f"| {name} | {_fmt(o.get('ours'))}{_mark(o.get('ok'))} | {_fmt(c['ours'])}{_mark(c['ok'])} "
                         f"| {_fmt(c['paper'])} | {c['tolerance']} | {flag} |")
            if flag:
                explained.append(f"- {name}: " + why.get(c["name"], "moved since the baseline; no explanation is "
                                                     "recorded for this move (see the experiment's notes above)."))
        lines += [""] + explained + ([""] if explained else [])
    return "\n".join(lines)

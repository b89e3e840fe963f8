"""Compare two `ratrain reproduce --json` payloads check by check: a Markdown table of before, after
and the paper, with every row that moved by more than its tolerance marked.

    python scripts/compare_reproductions.py before.json after.json [--only table2,table3] > diff.md
"""
from __future__ import annotations

import argparse
import json
import re
import sys

DEFAULT_EXPERIMENTS = ("table5", "attention", "table2", "table3", "table4", "table6", "ablation")


def _number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def moved(before, after, tolerance: str, ok_before=None, ok_after=None) -> bool:
    """Did the value move by more than the check's tolerance (relative for '%', absolute else)?
    A one-sided tolerance ('<= 3%', '>= 2x') counts a change of pass/miss or of more than 5 %."""
    b, a = _number(before), _number(after)
    if b is None or a is None:
        return before != after
    m = re.search(r"±\s*([0-9.]+)\s*(%|pp|GB|points)?", tolerance)
    if not m:
        return ok_before != ok_after or abs(a - b) > 0.05 * abs(b)
    tol = float(m.group(1))
    unit = m.group(2)
    if unit == "%":
        return abs(a - b) > tol / 100 * abs(b)
    if unit == "points":
        return abs(a - b) * 100 > tol
    return abs(a - b) > tol


def fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def compare(before: dict, after: dict, only=DEFAULT_EXPERIMENTS) -> str:
    lines = []
    for key in only:
        eb, ea = before["experiments"].get(key), after["experiments"].get(key)
        if eb is None or ea is None:
            continue
        lines += [f"### {ea['title']}", "", "| check | before | after | paper | tolerance | moved |",
                  "| --- | --- | --- | --- | --- | --- |"]
        old = {c["name"]: c for c in eb["checks"]}
        for c in ea["checks"]:
            o = old.get(c["name"], {})
            flag = "**yes**" if moved(o.get("ours"), c["ours"], c["tolerance"], o.get("ok"), c["ok"]) else ""
            mark = lambda ok: "" if ok is None else (" pass" if ok else " MISS")  # noqa: E731
            name = c["name"].replace("|", "&#124;")
            lines.append(f"| {name} | {fmt(o.get('ours'))}{mark(o.get('ok'))} | {fmt(c['ours'])}{mark(c['ok'])} "
                         f"| {fmt(c['paper'])} | {c['tolerance']} | {flag} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--only", default=",".join(DEFAULT_EXPERIMENTS))
    args = p.parse_args(argv)
    with open(args.before) as f1, open(args.after) as f2:
        before, after = json.load(f1), json.load(f2)
    sys.stdout.write(compare(before, after, tuple(args.only.split(","))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Exact comparison of two `ratrain reproduce --json` payloads: every value that differs, by path.

Unlike ``ratrain.repro.compare`` (checks against their tolerances, for a model change), this is for
a change that must not move anything (a faster run): floats are compared by their bits, strings and
structure exactly. What a run's cost or its output folder changes is left out:

- keys named in ``TIMING_KEYS`` (``seconds``, ``timing``, Table 4's planner speed ``configs_per_s``),
  anywhere;
- the output folder: each payload's folder (from its ``report`` path, or given) is replaced by
  ``<out>`` in every string, so figure paths compare;
- timings written into text (``TIMING_TEXT``: the ranking study's "Study time" note and the seconds
  column of its table).
"""
from __future__ import annotations

import math
import re
from typing import Any

TIMING_KEYS = frozenset({"seconds", "timing", "configs_per_s"})     # configs_per_s: the planner's speed
OUT_TOKEN = "<out>"
# (pattern, replacement) applied to every string of both payloads
TIMING_TEXT: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"Study time \d+ s\."), "Study time <t> s."),
)
# per experiment, text fields whose last column is a timing (format_table rows)
TIMED_COLUMNS = {"ranking": "seconds"}


def out_dir_of(payload: dict) -> str | None:
    """The output folder a full-run payload names (its ``report`` path without ``/report.md``)."""
    report = payload.get("report")
    if isinstance(report, str) and report.endswith("/report.md"):
        return report[: -len("/report.md")]
    return None


def _drop_last_column(text: str, column: str) -> str:
    """A format_table text without its last column when the header ends with ``column``."""
    lines = text.split("\n")
    if not lines or not lines[0].rstrip().endswith(column):
        return text
    return "\n".join(line.rstrip().rsplit(None, 1)[0] if line.strip() else line for line in lines)


def normalize(payload: Any, out_dir: str | None = None) -> Any:
    """``payload`` with timings removed and its output folder written ``<out>``."""
    def walk(v: Any, experiment: str | None) -> Any:
        if isinstance(v, dict):
            key = v.get("key") if isinstance(v.get("key"), str) else experiment
            got = {k: walk(x, key) for k, x in v.items() if k not in TIMING_KEYS}
            column = TIMED_COLUMNS.get(key or "")
            if column and isinstance(got.get("text"), str):
                got["text"] = _drop_last_column(got["text"], column)
            return got
        if isinstance(v, list):
            return [walk(x, experiment) for x in v]
        if isinstance(v, str):
            if out_dir:
                v = v.replace(out_dir, OUT_TOKEN)
            for pattern, repl in TIMING_TEXT:
                v = pattern.sub(repl, v)
            return v
        return v
    return walk(payload, None)


def _same_float(a: float, b: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    """One line per differing value (``path: before -> after``), in document order."""
    where = path or "(top)"
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for k in before:
            if k not in after:
                out.append(f"{path}.{k}: only before")
            else:
                out += differences(before[k], after[k], f"{path}.{k}" if path else k)
        out += [f"{path}.{k}: only after" for k in after if k not in before]
        return out
    if isinstance(before, list) and isinstance(after, list):
        out = [f"{where}: {len(before)} items -> {len(after)}"] if len(before) != len(after) else []
        for i, (a, b) in enumerate(zip(before, after, strict=False)):
            out += differences(a, b, f"{path}[{i}]")
        return out
    if isinstance(before, float) and isinstance(after, float):
        return [] if _same_float(before, after) else [f"{where}: {before!r} -> {after!r}"]
    if type(before) is not type(after) or before != after:
        if isinstance(before, str) and isinstance(after, str) and "\n" in before + after:
            return [f"{where}: text differs from line {_first_differing_line(before, after)}"]
        return [f"{where}: {before!r} -> {after!r}"]
    return []


def _first_differing_line(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a.split("\n"), b.split("\n"), strict=False)):
        if x != y:
            return i + 1
    return min(a.count("\n"), b.count("\n")) + 2


def compare_payloads(before: dict, after: dict, before_out: str | None = None,
                     after_out: str | None = None) -> list[str]:
    """Every difference of two reproduce payloads once timings and output folders are set aside."""
    return differences(normalize(before, before_out or out_dir_of(before)),
                       normalize(after, after_out or out_dir_of(after)))


__all__ = ["TIMING_KEYS", "compare_payloads", "differences", "normalize", "out_dir_of"]

"""Exact before/after check of two `ratrain reproduce --json` payloads (a change that must move no
number): every differing value by path, timings and output folders set aside
(ratrain.repro.payload_diff). Exit 0 when they agree, 1 when they differ.

    python scripts/compare_reproduce.py before.json after.json [--before-out DIR --after-out DIR]
"""
from __future__ import annotations

import argparse
import json
import sys

from ratrain.repro.payload_diff import compare_payloads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--before-out", help="the before run's --out (default: from its report path)")
    p.add_argument("--after-out", help="the after run's --out (default: from its report path)")
    args = p.parse_args(argv)
    with open(args.before, encoding="utf-8") as f:
        before = json.load(f)
    with open(args.after, encoding="utf-8") as f:
        after = json.load(f)
    diffs = compare_payloads(before, after, args.before_out, args.after_out)
    for line in diffs:
        print(line)
    print(f"{len(diffs)} difference(s)" if diffs else "identical (timings and output folders aside)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())

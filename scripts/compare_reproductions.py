"""Compare two `ratrain reproduce --json` payloads check by check: a Markdown table of before, after
and the paper, with every row that moved by more than its tolerance marked (ratrain.repro.compare).

    python scripts/compare_reproductions.py before.json after.json [--only table2,table3] > diff.md
"""
from __future__ import annotations

import argparse
import sys

from ratrain.repro.compare import DEFAULT_EXPERIMENTS, compare_markdown, load_baseline


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--only", default=",".join(DEFAULT_EXPERIMENTS))
    args = p.parse_args(argv)
    before, after = load_baseline(args.before), load_baseline(args.after)
    sys.stdout.write(compare_markdown(before, after, tuple(args.only.split(","))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

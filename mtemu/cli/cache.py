"""`mtemu cache`: every cache on disk (mtemu's and ratrain's), from the registry in rtcommon.caches."""
from __future__ import annotations

import argparse

from rtcommon import caches


def _size(nbytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def _cache(args: argparse.Namespace) -> tuple[dict, str]:
    rows = caches.describe()
    lines = [f"root {caches.root()}"]
    for r in rows:
        version = "-" if r["version"] is None else str(r["version"])
        lines.append(f"{r['name']:15s} {r['entries']:6d} entries {_size(r['bytes']):>9s}  v{version:2s} {r['folder']}")
    return {"root": str(caches.root()), "caches": rows}, "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("cache", help="list every cache: folder, entries, size on disk, format version")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cache)

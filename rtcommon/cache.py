"""Caches that heal: every read is validated, and a bad entry is discarded with a
:class:`~rtcommon.caches.CacheWarning` (then rebuilt by the caller), never trusted and never fatal.
A cache folder that cannot be written degrades to running without the cache (also with a warning).

Every entry carries a checksum (``_checksum``) of its file name (its key) and its content, written
with it and checked on every read: a copy edited by hand (even to plausible values), truncated, or
renamed to another key is discarded and rebuilt, never used. Shipped data read through the same
functions (``checksum=False``) is checked only when it carries one.

Usage::

    def valid(data):                       # None if usable, else the reason
        return check_fields(data, {"utilization": (0.0, 1.0), "cycles": (1, None)})

    hit = read_json_cache(path, valid)     # dict, or None (missing or discarded)
    ...
    write_json_cache(path, entry)          # False (with a warning) if the folder is unwritable
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from .caches import warn
from .errors import UserError
from .fileio import atomic_write_json
from .jsonio import parse_json

# Larger files are not cache entries we wrote.
MAX_CACHE_BYTES = 256 * 2 ** 20

Validator = Callable[[Any], "str | None"]
CHECKSUM_FIELD = "_checksum"


def entry_checksum(name: str, data: dict) -> str:
    """The checksum of a cache entry: its file name and its JSON content (as read back, keys sorted)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(f"{name}\n{text}".encode()).hexdigest()


def read_json_cache(path: str | os.PathLike, validate: Validator | None = None, checksum: bool = True) -> dict | None:
    """The JSON object cached at ``path`` (without its checksum field), or None when it is missing or
    unusable.

    Unusable (warned and ignored): unreadable, not UTF-8, not JSON, NaN/Infinity, deeply nested,
    not an object, a checksum missing (unless ``checksum`` is False: shipped data) or not matching,
    or refused by ``validate`` (which returns None when the entry is good, else the reason; an
    exception it raises counts as a refusal)."""
    where = os.fspath(path)
    try:
        size = os.path.getsize(where)
        if size > MAX_CACHE_BYTES:
            warn(f"{where}: {size} bytes is too large for a cache entry; ignored (it will be rebuilt)")
            return None
        with open(where, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:      # one warning per folder: every entry in it fails alike
        warn(f"cannot read the cache in {Path(where).parent} ({exc.strerror or exc}); running without it")
        return None
    try:
        data = parse_json(raw.decode("utf-8"), where)
    except UnicodeDecodeError:
        warn(f"{where}: not UTF-8 text; ignored (it will be rebuilt)")
        return None
    except UserError as exc:
        warn(f"{exc}; ignored (it will be rebuilt)")
        return None
    if not isinstance(data, dict):
        warn(f"{where}: not a JSON object; ignored (it will be rebuilt)")
        return None
    stored = data.pop(CHECKSUM_FIELD, None)
    if stored is None and checksum:
        warn(f"{where}: has no checksum (not written by this version); ignored (it will be rebuilt)")
        return None
    if stored is not None and stored != entry_checksum(Path(where).name, data):
        warn(f"{where}: checksum mismatch (edited or damaged since it was written); ignored (it will be rebuilt)")
        return None
    if validate is not None:
        try:
            reason = validate(data)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            reason = f"malformed ({type(exc).__name__}: {exc})"
        if reason:
            warn(f"{where}: {reason}; ignored (it will be rebuilt)")
            return None
    return data


def write_json_cache(path: str | os.PathLike, obj: Any) -> bool:
    """Write a cache entry atomically, with its checksum; on an OS error (read-only or full disk, a
    file where the folder should be) warn once and return False, so the caller runs on without the cache."""
    content = json.loads(json.dumps(obj, allow_nan=False))      # as a reader will see it (tuples, int keys)
    content.pop(CHECKSUM_FIELD, None)
    content[CHECKSUM_FIELD] = entry_checksum(Path(path).name, content)
    try:
        atomic_write_json(path, content)
    except OSError as exc:
        warn(f"cannot write the cache in {Path(path).parent} ({exc.strerror or exc}); running without it")
        return False
    return True


def check_number(value: Any, low: float | None = None, high: float | None = None, integer: bool = False,
                 name: str = "value") -> str | None:
    """None if ``value`` is a finite number (an int if ``integer``) within [low, high], else why not."""
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        return f"{name} is {value!r}, not {'an integer' if integer else 'a number'}"
    if not math.isfinite(value):
        return f"{name} is {value!r}"
    if low is not None and value < low:
        return f"{name} = {value!r} is below {low}"
    if high is not None and value > high:
        return f"{name} = {value!r} is above {high}"
    return None


def check_fields(data: dict, bounds: dict[str, tuple], optional: tuple[str, ...] = ()) -> str | None:
    """None if every field in ``bounds`` (name -> (low, high) or (low, high, integer)) is present
    (or listed in ``optional`` and absent) and in range, else the first reason it is not."""
    for name, spec in bounds.items():
        if name not in data:
            if name in optional:
                continue
            return f"field {name!r} is missing"
        low, high = spec[0], spec[1]
        reason = check_number(data[name], low, high, integer=len(spec) > 2 and spec[2], name=f"field {name!r}")
        if reason:
            return reason
    return None

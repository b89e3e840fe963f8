"""JSON in and out for both CLIs and every cache: read a user's file into a named error, never a
traceback, and print strict JSON (RFC 8259 has no NaN or Infinity, so neither does our output)."""
from __future__ import annotations

import json
import math
import os
import re
import tomllib
from itertools import accumulate
from typing import Any

from .errors import UserError

# Python's json module recurses once per nesting level; deeper input is not a config file.
MAX_NESTING = 200

NONFINITE_KEY = "nonfinite_as_null"


def read_text(path: str | os.PathLike, what: str = "file", error: type[UserError] = UserError) -> str:
    """The UTF-8 text of ``path``; any OS or decoding failure is ``error`` naming the file."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise error(f"{where}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where}: {what} is not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x})") from None


# a JSON string, its closing quote optional: an unterminated one runs to the end of the text
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _nesting(text: str) -> int:
    """Deepest bracket nesting outside strings (cheap pre-check before the recursive parser): the
    strings cut out and the brackets' running depth summed in C (a loop over every character took
    half of a warm ``ratrain plan``'s profile loading)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets)), default=0))


def parse_json(text: str, where: str, error: type[UserError] = UserError) -> Any:
    """Parse JSON text; bad syntax, deep nesting, huge integers, NaN/Infinity and a key given twice
    in one object are ``error``."""
    if _nesting(text) > MAX_NESTING:
        raise error(f"{where}: JSON nested deeper than {MAX_NESTING} levels")

    def no_constant(token: str) -> Any:
        raise error(f"{where}: JSON holds {token}, which is not a number")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
        # json keeps the last of two equal keys: in a config file that silently drops a value
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            key = next(k for k, _v in pairs if k in seen or seen.add(k))
            raise error(f"{where}: JSON object has the key {key!r} twice")
        return obj

    try:
        return json.loads(text, parse_constant=no_constant, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:   # e.g. an integer of more than 4300 digits
        if isinstance(exc, UserError):
            raise
        raise error(f"{where}: unreadable JSON value ({exc})") from None


def parse_toml(text: str, where: str, error: type[UserError] = UserError) -> dict:
    """Parse TOML text; bad syntax and deep nesting are ``error``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: not valid TOML ({exc})") from None
    except (RecursionError, ValueError) as exc:
        raise error(f"{where}: unreadable TOML ({type(exc).__name__})") from None


def load_json_file(path: str | os.PathLike, what: str = "JSON file", error: type[UserError] = UserError) -> Any:
    where = os.fspath(path)
    return parse_json(read_text(where, what, error), where, error)


def load_table_file(path: str | os.PathLike, what: str = "file", error: type[UserError] = UserError) -> dict:
    """A TOML (``.toml``) or JSON file whose top level must be a table/object."""
    where = os.fspath(path)
    text = read_text(where, what, error)
    data = parse_toml(text, where, error) if where.lower().endswith(".toml") else parse_json(text, where, error)
    if not isinstance(data, dict):
        raise error(f"{where}: top level must be a table of fields, got {type(data).__name__}")
    return data


def strict(obj: Any, path: str = "$", replaced: list[str] | None = None) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, scalars) with every NaN or infinite float as None;
    the JSON paths of the replaced values are appended to ``replaced``."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        if replaced is not None:
            replaced.append(f"{path} ({obj})")
        return None
    if isinstance(obj, dict):
        return {k: strict(v, f"{path}.{k}", replaced) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v, f"{path}[{i}]", replaced) for i, v in enumerate(obj)]
    if hasattr(obj, "item") and hasattr(obj, "dtype") and getattr(obj, "shape", None) == ():
        return strict(obj.item(), path, replaced)      # a NumPy scalar
    return obj


def dumps_strict(payload: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``payload``: non-finite numbers become null, and a top-level dict says
    which ones under ``nonfinite_as_null`` (a null is then never a silent zero or a lost value)."""
    replaced: list[str] = []
    clean = strict(payload, "$", replaced)
    if replaced and isinstance(clean, dict):
        clean[NONFINITE_KEY] = replaced
    return json.dumps(clean, indent=indent, allow_nan=False, default=_default)


def _default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return strict(obj.tolist())
    raise TypeError(f"value of type {type(obj).__name__} is not JSON-serialisable")

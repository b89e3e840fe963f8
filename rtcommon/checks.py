"""One rule for every number a user gives (platform files, HF configs, CLI sizes, library shapes):
an integer is an integer (a bool or a float is refused), a float is finite, and the range is
checked exactly, in Python's arbitrary precision, before any float or int64 arithmetic could
overflow (``math.isfinite(10**400)`` raises OverflowError; ``10**400 <= 1e6`` is simply False)."""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Callable

from .errors import UserError


def show_value(value: Any) -> str:
    """``repr`` short enough for a one-line message (a 401-digit integer is named, not printed)."""
    text = repr(value)
    if len(text) <= 40:
        return text
    if isinstance(value, Integral) and not isinstance(value, bool):
        return f"an integer of {len(str(abs(int(value))))} digits"
    return text[:37] + "..."


def as_float_for_hint(value: Any) -> float:
    """``value`` as a float for a unit hint; a number too large for a float gives 0 (no hint)."""
    try:
        as_float = float(value)
    except (OverflowError, TypeError, ValueError):
        return 0.0
    return as_float if math.isfinite(as_float) else 0.0


def is_integer(value: Any) -> bool:
    """An integer that is not a bool (NumPy integer scalars count: a computed size is one)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def checked_number(value: Any, what: str, *, integer: bool, lo: float | None = None, hi: float | None = None,
                   error: type[UserError] = UserError, hint: Callable[[float], str] | None = None,
                   bounds: str | None = None) -> Any:
    """``value`` checked and normalised to ``int`` or ``float``, else ``error``.

    ``what`` starts each message ("file.toml: field 'dsps'"); ``hint`` (given the value as a float)
    says what unit a value out of range probably meant; ``bounds`` replaces the printed range."""
    if isinstance(value, bool) or not isinstance(value, Integral if integer else Real):
        raise error(f"{what} must be {'an integer' if integer else 'a number'}, got {show_value(value)}")
    if not isinstance(value, Integral) and not math.isfinite(value):
        raise error(f"{what} must be a finite number, got {show_value(value)}")
    # Python compares int with float exactly, so a huge integer is compared without conversion
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if bounds is None:
            low = "" if lo is None else (f"{lo}" if integer else f"{lo:g}")
            high = "" if hi is None else (f"{hi}" if integer else f"{hi:g}")
            bounds = f"{low}..{high}"
        extra = hint(as_float_for_hint(value)) if hint else ""
        raise error(f"{what} = {show_value(value)} is outside the sane range {bounds}{extra}")
    return int(value) if integer else float(value)


def is_finite_number(value: Any) -> bool:
    """A real number (not a bool) that is finite; an integer of any size is (no float conversion)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return False
    return isinstance(value, Integral) or math.isfinite(value)


def positive_ints(prefix: str, error: type[UserError] = UserError, **values: Any) -> list[int]:
    """Each of ``values`` a positive integer (a bool, float or string is refused, not converted), as
    ints in order; ``prefix`` names the kind ("GEMM dimension m must be ...")."""
    out = []
    for name, value in values.items():
        if not is_integer(value) or value <= 0:
            raise error(f"{prefix} {name} must be a positive integer, got {show_value(value)}")
        out.append(int(value))
    return out

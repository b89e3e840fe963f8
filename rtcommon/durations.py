"""How a duration is written for people: seconds with a precision that suits the size, milliseconds
only under a second. Text outputs use it; JSON fields keep their own names and units."""
from __future__ import annotations


def time_unit(span_ms: float) -> tuple[str, float]:
    """(unit, milliseconds per unit) a span of ``span_ms`` reads best in: "ms" under a second, else "s"."""
    return ("ms", 1.0) if abs(span_ms) < 1e3 else ("s", 1e3)


def decimals_for(value: float) -> int:
    """Digits after the point: 3 below 10, 2 below 1000, 1 above (four or five significant digits)."""
    v = abs(value)
    return 3 if v < 10 else 2 if v < 1000 else 1


def format_ms(ms: float, width: int = 0) -> str:
    """``ms`` milliseconds as "963.01 s", "1.234 s" or "12.345 ms" (``width``: of the number)."""
    unit, per = time_unit(ms)
    value = ms / per
    return f"{value:{width}.{decimals_for(value)}f} {unit}"


def format_s(seconds: float, width: int = 0) -> str:
    """``seconds`` as :func:`format_ms` writes them."""
    return format_ms(seconds * 1e3, width)

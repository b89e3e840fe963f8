"""Where a latency profile's kernel times come from, importable without NumPy or the emulator (the
command line's parsers list them): ``emulated`` kernels on mtemu, their closed-form ``bound`` scaled by
the emulated efficiency, or the analytic ``roofline`` stand-in (``ratrain.cost.profile``)."""
from __future__ import annotations

PROFILE_SOURCES = ("emulated", "bound", "roofline")

__all__ = ["PROFILE_SOURCES"]

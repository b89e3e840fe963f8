"""Matplotlib on the Agg backend (the figures are files), imported when a figure is first drawn.

Importing matplotlib takes most of a second; a command that draws nothing (``--help``, a run without
``--plot``) should not pay it. ``plt`` and ``matplotlib`` here stand for the modules: the first
attribute read imports them (pyplot after the backend is set), later reads go straight through.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable


def pyplot() -> ModuleType:
    """``matplotlib.pyplot``, imported on the Agg backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _matplotlib() -> ModuleType:
    pyplot()
    import matplotlib
    return matplotlib


class _OnFirstUse:
    """A stand-in for a module that imports it on the first attribute read."""

    def __init__(self, load: Callable[[], ModuleType]) -> None:
        self._load = load

    def __getattr__(self, name: str) -> Any:
        return getattr(self._load(), name)


plt: Any = _OnFirstUse(pyplot)
matplotlib: Any = _OnFirstUse(_matplotlib)

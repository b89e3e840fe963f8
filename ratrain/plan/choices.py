"""The planner's methods and search limits, importable without NumPy: the command line's parsers show
them (``ratrain plan --help``), and ``ratrain.plan.planner`` and ``schedule_search`` take them from here."""
from __future__ import annotations

METHODS = ("ratrain", "tp-heavy", "zero3-heavy", "backward-ckpt", "full-save", "tuned")
MAX_MICRO_BATCH = 8        # b is searched over divisors of G/D up to this (longer b only adds memory)
MAX_TP = 8                 # T beyond 8 ranks on a 3.7 GB/s link is never competitive
DEFAULT_VIRTUAL_STAGES = 2     # chunks per stage of the interleaved schedule named without v

__all__ = ["DEFAULT_VIRTUAL_STAGES", "MAX_MICRO_BATCH", "MAX_TP", "METHODS"]

"""A memo of timing-mode kernel runs, on only inside :func:`enabled` (a caller that emulates the same
kernel more than once, e.g. the reproduction: Table 5's rows, its calibration study's Fig. 4 loop
order at the raw DDR rate and the tuner's default tiles are the same GEMMs on the same cluster).

A timing run is a function of its shape, tiles and platform alone (the machine is deterministic), so
a hit returns the run's own result; runs with a trace are never memoized. Off by default: outside
``enabled()`` every call emulates.
"""
from __future__ import annotations

import functools
from typing import Callable

from rtcommon.scoped import Scoped

# (runner, m, k, n, tiles, platform) -> result, inside enabled() only
_MEMO: Scoped[dict] = Scoped(dict)
enabled = _MEMO.enabled       # ``with enabled(): ...`` shares timing runs among the calls inside


def memoized(timing: Callable) -> Callable:
    """Wrap a ``timing(m, k, n, *, tiles, platform, trace)`` runner so that, inside ``enabled()``, equal
    (shape, tiles, platform) share one emulation. Unhashable arguments are emulated as usual."""
    @functools.wraps(timing)
    def run(m: int, k: int, n: int, *, tiles=None, platform=None, trace=None):
        memo = _MEMO.active
        if memo is None or trace is not None:
            return timing(m, k, n, tiles=tiles, platform=platform, trace=trace)
        key = (timing.__module__, timing.__qualname__, m, k, n, tiles, platform)
        try:
            hit = memo.get(key)
        except TypeError:           # a platform given as a dict or path: not a key
            return timing(m, k, n, tiles=tiles, platform=platform, trace=trace)
        if hit is None:
            hit = memo[key] = timing(m, k, n, tiles=tiles, platform=platform, trace=trace)
        return hit
    return run


__all__ = ["enabled", "memoized"]

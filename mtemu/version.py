"""Version of the code that produces emulated numbers: a hash of the emulator's sources.

Caches of emulated results (tuner sweeps, ratrain latency profiles) key on it, so any change to
the machine, the ISA or a kernel generator invalidates them instead of serving stale numbers.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

_SOURCES = ("isa.py", "assembler.py", "machine.py", "platform.py", "fp16.py",
            "kernels/gemm.py", "kernels/schedule.py")


@functools.lru_cache(maxsize=None)
def emulator_version(extra: tuple[str, ...] = ()) -> str:
    """Hash of the emulator sources (plus ``extra`` kernel files, relative to the package)."""
    from . import __version__
    root = Path(__file__).parent
    h = hashlib.sha256(__version__.encode())
    for rel in _SOURCES + tuple(extra):
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:16]

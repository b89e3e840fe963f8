"""Version of the emulated timing: keys every cache of emulated numbers.

``emulator_version()`` hashes the package version, ``TIMING_VERSION`` and the sources of the
GEMM generator, the list scheduler and the platform defaults. Changes elsewhere in the machine
(a new instruction, say) do not invalidate caches; a change that alters emulated timing must
bump ``TIMING_VERSION``. That rule is enforced by tests/test_profile.py, which re-emulates GEMMs
from the shipped latency cache and fails if any cycle count differs.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

# Bump when the machine's timing semantics change (DMA model, branch cost, scheduling...).
TIMING_VERSION = 1

# Sources whose change can alter a kernel's emulated cycles, per kernel family.
_SOURCES = {
    "gemm": ("platform.py", "kernels/gemm.py", "kernels/schedule.py"),
    "attention": ("platform.py", "kernels/attention.py", "kernels/schedule.py", "kernels/capacity.py"),
}


@functools.lru_cache(maxsize=None)
def emulator_version(kernel: str = "gemm") -> str:
    """Version of the emulated timing of one kernel family ('gemm' or 'attention'), or 'all'."""
    from . import __version__
    root = Path(__file__).parent
    h = hashlib.sha256(f"{__version__}|timing{TIMING_VERSION}".encode())
    if kernel == "all":
        for name in sorted(_SOURCES):
            h.update(emulator_version(name).encode())
        return h.hexdigest()[:16]
    for rel in _SOURCES[kernel]:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:16]

"""Version of the emulated timing: keys every cache of emulated numbers.

``emulator_version()`` hashes the package version, ``TIMING_VERSION`` and the sources of the
kernel generators and the list scheduler (platform values are keyed separately, by
``Platform.timing_digest``). Changes elsewhere in the machine
(a new instruction, say) do not invalidate caches; a change that alters emulated timing must
bump ``TIMING_VERSION``. That rule is enforced by tests/test_profile.py, which re-emulates GEMMs
from the shipped latency cache and fails if any cycle count differs.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from ._version import __version__

_ROOT = Path(__file__).parent

# Bump when the machine's timing semantics change (DMA model, branch cost, scheduling...).
TIMING_VERSION = 1

# Sources whose change can alter a kernel's emulated cycles, per kernel family (paths relative to
# the package; the attention family is every module of its package).
_SOURCES = {
    "gemm": ("kernels/gemm.py", "kernels/gemm_a_resident.py", "kernels/schedule.py"),
    "attention": (*sorted(p.relative_to(_ROOT).as_posix() for p in (_ROOT / "kernels/attention").glob("*.py")),
                  "kernels/schedule.py", "kernels/capacity.py"),
}


@functools.lru_cache(maxsize=None)
def emulator_version(kernel: str = "gemm") -> str:
    """Version of the emulated timing of one kernel family ('gemm' or 'attention'), or 'all'."""
    h = hashlib.sha256(f"{__version__}|timing{TIMING_VERSION}".encode())
    if kernel == "all":
        for name in sorted(_SOURCES):
            h.update(emulator_version(name).encode())
        return h.hexdigest()[:16]
    for rel in _SOURCES[kernel]:
        h.update(rel.encode())
        h.update((_ROOT / rel).read_bytes())
    return h.hexdigest()[:16]

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

from ._version import __version__

_ROOT = Path(__file__).parent

# Bump when the machine's timing semantics change (DMA model, branch cost, scheduling...).
TIMING_VERSION = 1

# Sources whose change can alter a kernel's emulated cycles, per kernel family (paths relative to
# the package; the attention family is every module of its package).
_SOURCES = {
    "gemm": ("platform.py", "kernels/gemm.py", "kernels/schedule.py"),
    "attention": ("platform.py",
                  *sorted(p.relative_to(_ROOT).as_posix() for p in (_ROOT / "kernels/attention").glob("*.py")),
                  "kernels/schedule.py", "kernels/capacity.py"),
}


# Sources that generate a kernel's program (its bits, not its timing): key the built-program cache
# (mtemu.kernels.program_cache). The platform enters that key through its digest.
_PROGRAM_SOURCES = {
    "gemm": ("isa.py", "assembler.py", "kernels/schedule.py", "kernels/gemm.py"),
    "gemm_a_resident": ("isa.py", "assembler.py", "kernels/schedule.py", "kernels/gemm.py",
                        "kernels/gemm_a_resident.py"),
}


@functools.lru_cache(maxsize=None)
def program_version(kernel: str) -> str:
    """Version of the program generator of ``kernel`` ('gemm' or 'gemm_a_resident')."""
    h = hashlib.sha256(f"{__version__}|program".encode())
    for rel in _PROGRAM_SOURCES[kernel]:
        h.update(rel.encode())
        h.update((_ROOT / rel).read_bytes())
    return h.hexdigest()[:16]


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

"""Host memory a request would need, checked before allocating: an oversized emulation or model
says how much it needs instead of being killed by the kernel's out-of-memory handler. And
:func:`small_pages`, for large buffers that are written once per run."""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from .errors import UserError

GIB = 2 ** 30


def available_bytes() -> int | None:
    """Memory the host can give without swapping (Linux MemAvailable; else free pages; else None)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def format_bytes(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / 2 ** 20:.2f} MiB"


def check_host_memory(nbytes: float, what: str, error: type[UserError] = UserError) -> None:
    """Raise ``error`` if ``what`` would need more than the host has available."""
    avail = available_bytes()
    if avail is not None and nbytes > avail:
        raise error(f"{what} needs {format_bytes(nbytes)} of host memory; {format_bytes(avail)} is available")


# NumPy asks the kernel for transparent huge pages (madvise) on arrays of 4 MB and more. Where the
# kernel's THP defrag setting is "madvise" (a common default), the first touch of each huge page may
# stall while the kernel compacts memory: on the 2-core CI machine a functional 1024^3 GEMM's first
# run spent 100-270 ms of system time faulting in its cluster memory that way, 11-28 ms on ordinary
# pages. The switch is process-wide, so nested and concurrent users share one count.
_numpy_core = getattr(np, "_core", None) or np.core
_set_madvise_hugepage = getattr(_numpy_core.multiarray, "_set_madvise_hugepage", None)
_pages_lock = threading.Lock()
_pages_depth = 0
_pages_saved = True


@contextmanager
def small_pages() -> Iterator[None]:
    """Arrays NumPy allocates inside the block use ordinary pages, not transparent huge pages (a no-op
    where NumPy offers no switch). For large buffers that are written once per run: emulated memories."""
    global _pages_depth, _pages_saved
    if _set_madvise_hugepage is None:
        yield
        return
    with _pages_lock:
        if _pages_depth == 0:
            _pages_saved = bool(_set_madvise_hugepage(False))
        _pages_depth += 1
    try:
        yield
    finally:
        with _pages_lock:
            _pages_depth -= 1
            if _pages_depth == 0:
                _set_madvise_hugepage(_pages_saved)

"""Host memory a request would need, checked before allocating: an oversized emulation or model
says how much it needs instead of being killed by the kernel's out-of-memory handler."""
from __future__ import annotations

import os

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

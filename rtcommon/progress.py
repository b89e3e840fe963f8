"""Progress lines on stderr for long jobs, stamped with the seconds since the job began."""
from __future__ import annotations

import sys
import time


class Progress:
    """Callable that prints ``[  12.3s] message`` on stderr when enabled, and nothing otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.t0 = time.time()

    def __call__(self, msg: str) -> None:
        if self.enabled:
            print(f"[{time.time() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

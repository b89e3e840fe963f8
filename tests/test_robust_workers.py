"""Worker processes end with their parent: `kill -TERM` (or -KILL) on a tuner leaves nothing behind."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARENT = """import time
from mtemu.tune import map_jobs
list(map_jobs([600.0, 600.0], 2, None, lambda note: None, fn=time.sleep))
"""


def _children(pid):
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and prctl")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_workers_end_with_their_parent(sig):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        workers = []
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = _children(parent.pid)
        assert len(workers) >= 2, "the pool never started"
        time.sleep(0.5)                   # let the initializers run
        parent.send_signal(sig)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 15
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [w for w in workers if _alive(w)]
    finally:
        if parent.poll() is None:
            parent.kill()


def _pid(_job) -> int:
    return os.getpid()


def test_a_local_pool_keeps_its_workers_between_calls():
    """map_jobs calls given one LocalPool run on the same worker processes (what the first call built
    stays in them), and closing it ends them."""
    from mtemu.tune import LocalPool, map_jobs
    with LocalPool(2) as pool:
        first = {pid for _, pid in map_jobs(list(range(6)), 5, None, lambda note: None, fn=_pid, pool=pool)}
        again = {pid for _, pid in map_jobs(list(range(6)), 5, None, lambda note: None, fn=_pid, pool=pool)}
        assert first == again and 1 <= len(first) <= 2 and os.getpid() not in first
    assert pool._pool is None
    for pid in first:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

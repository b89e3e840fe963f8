"""rtcommon.hostmem.small_pages: NumPy's huge-page advice is off inside the block and restored after,
also when blocks nest or overlap across threads."""
import threading

import numpy as np
import pytest

from mtemu.machine import Cluster
from rtcommon import hostmem
from rtcommon.hostmem import small_pages

setter = hostmem._set_madvise_hugepage
pytestmark = pytest.mark.skipif(setter is None, reason="this NumPy has no huge-page switch")


def advice() -> bool:
    """NumPy's current setting (read by setting it back)."""
    now = setter(True)
    setter(now)
    return bool(now)


@pytest.fixture(autouse=True)
def advice_on():
    before = setter(True)
    yield
    setter(before)


def test_off_inside_restored_after_also_when_nested():
    with small_pages():
        assert not advice()
        with small_pages():
            assert not advice()
        assert not advice()
    assert advice()
    with pytest.raises(RuntimeError), small_pages():
        raise RuntimeError("an error inside still restores the setting")
    assert advice()


def test_overlapping_blocks_in_threads_restore_once_the_last_leaves():
    inside, leave = threading.Event(), threading.Event()

    def other():
        with small_pages():
            inside.set()
            leave.wait(10)

    worker = threading.Thread(target=other)
    with small_pages():
        worker.start()
        assert inside.wait(10)
    assert not advice()              # the other thread's block is still open
    leave.set()
    worker.join(10)
    assert advice()


def test_a_cluster_allocates_its_memories_with_the_advice_off(monkeypatch):
    seen = []
    zeros = np.zeros

    def spy(*args, **kwargs):
        seen.append(advice())
        return zeros(*args, **kwargs)

    monkeypatch.setattr("mtemu.machine.np.zeros", spy)
    Cluster(ddr_bytes=1 << 20)
    assert seen[:2] == [False, False] and advice()

"""mtemu.timing_memo: inside enabled() equal (shape, tiles, platform) share one timing run; outside,
with a trace, or with unhashable arguments every call runs."""
from __future__ import annotations

from mtemu import timing_memo
from mtemu.kernels.gemm import gemm_timing
from mtemu.kernels.gemm_a_resident import a_resident_timing
from mtemu.platform import DEFAULT


def _counting():
    calls = []

    @timing_memo.memoized
    def timing(m, k, n, *, tiles=None, platform=None, trace=None):
        calls.append((m, k, n, tiles, trace))
        return object()
    return timing, calls


def test_shared_only_inside_the_block_and_only_for_equal_inputs():
    timing, calls = _counting()
    timing(8, 8, 8, platform=DEFAULT)
    timing(8, 8, 8, platform=DEFAULT)
    assert len(calls) == 2                                     # off by default
    with timing_memo.enabled():
        a = timing(8, 8, 8, platform=DEFAULT)
        assert timing(8, 8, 8, platform=DEFAULT) is a
        assert timing(8, 8, 16, platform=DEFAULT) is not a       # another shape
        assert timing(8, 8, 8, platform=DEFAULT, trace="t") is not a    # traced runs are never shared
        timing(8, 8, 8, platform={"clock_hz": 1e9})             # unhashable: runs, no error
        timing(8, 8, 8, platform={"clock_hz": 1e9})
        with timing_memo.enabled():                             # nested: the outer memo
            assert timing(8, 8, 8, platform=DEFAULT) is a
    assert len(calls) == 2 + 5
    timing(8, 8, 8, platform=DEFAULT)
    assert len(calls) == 2 + 6


def test_the_gemm_runners_are_memoized_and_keep_their_names():
    assert gemm_timing.__name__ == "gemm_timing" and a_resident_timing.__name__ == "a_resident_timing"
    assert gemm_timing.__wrapped__.__module__ == "mtemu.kernels.gemm"


def test_fig10_runs_are_cached_and_read_back_unchanged(monkeypatch):
    # tests run on their own cache root (conftest): the first call emulates and writes, the second reads
    from mtemu.validate import attention as fig10
    first = fig10.validate_attention(seqs=(512,))

    def refuse(*args, **kwargs):
        raise AssertionError("emulated again")
    monkeypatch.setattr(fig10, "attention_backward_timing", refuse)
    assert fig10.validate_attention(seqs=(512,)) == first
    assert fig10.validate_attention(seqs=(512,), cache=True) == first

"""The main job on two processes: the emulator's experiments in a forked worker, the same
experiments, files and order as one process, and a worker's error raised in the caller."""
import json
import os
import threading

import pytest

from ratrain.errors import ConfigError
from ratrain.repro import report
from ratrain.repro.experiment import Check, Experiment
from ratrain.repro.report import reproduce


def _fake(key):
    def run(out, progress, settings):
        # the pid says which process ran it; rows carry a float that must come back bit for bit
        return Experiment(key, key.title(), [{"pid": os.getpid(), "x": 0.1 + 0.2}],
                          [Check("c", 1.5, 2, "-", key != "table5")])
    return run


KEYS = ["table5", "table2", "tune", "budget", "measured", "ranking"]


@pytest.fixture
def fake_registry(monkeypatch):
    monkeypatch.setattr(report, "registry", lambda: {k: _fake(k) for k in KEYS})


def _strip_pid(exps):
    return [{**e.to_json(), "rows": [{k: v for k, v in r.items() if k != "pid"} for r in e.rows],
             "timing": None, "seconds": None} for e in exps]


def test_two_jobs_give_one_jobs_results_in_order(fake_registry, tmp_path):
    one = reproduce(KEYS, tmp_path / "one", progress=False, jobs=1)
    two = reproduce(KEYS, tmp_path / "two", progress=False, jobs=2)
    assert [e.key for e in two] == KEYS
    assert _strip_pid(two) == _strip_pid(one)
    pid = {e.key: e.rows[0]["pid"] for e in two}
    if threading.active_count() > 1:
        # a thread an earlier test left running: no fork, everything here (the fallback's own test below)
        assert set(pid.values()) == {os.getpid()}
    else:
        # the emulator's experiments, then the side ones, in the worker; the rest here
        assert pid["table5"] == pid["tune"] == pid["budget"] == pid["measured"] != os.getpid()
        assert pid["table2"] == pid["ranking"] == os.getpid()
    for key in KEYS:
        assert json.loads((tmp_path / "two" / f"{key}.json").read_text())["rows"][0]["x"] == 0.1 + 0.2
    assert (tmp_path / "two" / "report.md").read_text() == (tmp_path / "one" / "report.md").read_text()


def test_a_process_with_threads_does_not_fork(fake_registry, tmp_path):
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        exps = reproduce(KEYS, tmp_path, progress=False, jobs=2)
    finally:
        stop.set()
        thread.join()
    assert {e.rows[0]["pid"] for e in exps} == {os.getpid()}


def test_one_side_empty_runs_in_one_process(fake_registry, tmp_path):
    (exp,) = reproduce(["table5"], tmp_path, progress=False, jobs=2)
    assert exp.rows[0]["pid"] == os.getpid()


def test_a_worker_error_is_raised_here(monkeypatch, tmp_path):
    def bad(out, progress, settings):
        raise ConfigError("table5: no such shape")
    monkeypatch.setattr(report, "registry", lambda: {"table5": bad, "table2": _fake("table2")})
    with pytest.raises(ConfigError, match="no such shape"):
        reproduce(["table5", "table2"], tmp_path, progress=False, jobs=2)

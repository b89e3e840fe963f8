"""The main job on two processes: the emulator's experiments in a forked worker, the side ones in
whichever process is free first, the same experiments, files and order as one process, and a
worker's error raised in the caller."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

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


ROOT = Path(__file__).resolve().parent.parent
KEYS = ["table5", "table2", "tune", "budget", "measured", "ranking"]


@pytest.fixture
def fake_registry(monkeypatch):
    monkeypatch.setattr(report, "registry", lambda: {k: _fake(k) for k in KEYS})


def _strip_pid(exps):
    return [{**e, "rows": [{k: v for k, v in r.items() if k != "pid"} for r in e["rows"]],
             "timing": None, "seconds": None} for e in exps]


# A process with threads does not fork (its own test below), and the suite's process may hold one an
# earlier test left running: the two-process runs go in a fresh interpreter, which has none. It runs one
# of this module's scenarios and prints its pid and the experiments as JSON.
FRESH_RUN = """import json, os, sys
sys.path.insert(0, sys.argv[1])
import test_reproduce_jobs as scenarios
print(json.dumps({"pid": os.getpid(), "exps": [e.to_json() for e in getattr(scenarios, sys.argv[2])(*sys.argv[3:])]}))
"""


def _in_fresh_interpreter(scenario: str, *args: str) -> tuple[int, list[dict]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    got = subprocess.run([sys.executable, "-c", FRESH_RUN, str(Path(__file__).parent), scenario, *args],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert got.returncode == 0, got.stderr
    result = json.loads(got.stdout.strip().splitlines()[-1])
    return result["pid"], result["exps"]


def two_jobs(out):
    report.registry = lambda: {k: _fake(k) for k in KEYS}
    return reproduce(KEYS, Path(out), progress=False, jobs=2)


def test_two_jobs_give_one_jobs_results_in_order(fake_registry, tmp_path):
    one = [e.to_json() for e in reproduce(KEYS, tmp_path / "one", progress=False, jobs=1)]
    here, two = _in_fresh_interpreter("two_jobs", str(tmp_path / "two"))
    assert [e["key"] for e in two] == KEYS
    assert _strip_pid(two) == _strip_pid(one)
    pid = {e["key"]: e["rows"][0]["pid"] for e in two}
    # the emulator's experiments in the worker, the rest here; a side one in either
    assert pid["table5"] == pid["tune"] == pid["budget"] != here
    assert pid["table2"] == pid["ranking"] == here
    assert pid["measured"] in (pid["table5"], here)
    for key in KEYS:
        assert json.loads((tmp_path / "two" / f"{key}.json").read_text())["rows"][0]["x"] == 0.1 + 0.2
    assert (tmp_path / "two" / "report.md").read_text() == (tmp_path / "one" / "report.md").read_text()


def _waiting_registry(tmp_path, waits):
    """Fakes where ``waits`` blocks until the side experiment ``measured`` has run (it leaves a file),
    so that the other process must be the one that took it."""
    ran = tmp_path / "measured-ran"

    def make(key):
        inner = _fake(key)

        def run(out, progress, settings):
            if key == "measured":
                with open(ran, "a") as f:
                    f.write(f"{os.getpid()}\n")
            elif key == waits:
                deadline = time.monotonic() + 60
                while not ran.exists():
                    assert time.monotonic() < deadline, "the side experiment was never taken"
                    time.sleep(0.01)
            return inner(out, progress, settings)
        return run
    return {k: make(k) for k in KEYS}


def busy_side(tmp, busy):
    report.registry = lambda: _waiting_registry(Path(tmp), busy)
    return reproduce(KEYS, Path(tmp) / "out", progress=False, jobs=2)


# each case starts two fresh interpreters: the quick layer runs one, the full suite (CI) both
@pytest.mark.parametrize("busy", ["table2", pytest.param("table5", marks=pytest.mark.slow)])
def test_a_side_experiment_runs_in_the_process_free_first(tmp_path, busy):
    here, exps = _in_fresh_interpreter("busy_side", str(tmp_path), busy)
    pid = {e["key"]: e["rows"][0]["pid"] for e in exps}
    worker = pid["table5"]
    assert worker != here
    # whichever side was kept busy, the other ran the side experiment, exactly once
    assert pid["measured"] == (worker if busy == "table2" else here)
    assert (tmp_path / "measured-ran").read_text().split() == [str(pid["measured"])]
    assert list(pid) == KEYS


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


# ------------------------------------------------------------------------------------------
# two processes, one writer of Numba's cache: the parent loads no jitted code while the worker runs
# ------------------------------------------------------------------------------------------

# a fresh interpreter (no threads): the emulator's side faked, this side's real experiments on the
# shipped profiles; the jitted signatures this process holds are listed before and after (importing the
# machine loads its FP16 table's converter, before any fork)
PARENT_RUN = """import sys
from ratrain.repro import report
from ratrain.repro.experiment import Check, Experiment
from mtemu import jit
from numba.core.dispatcher import Dispatcher

def fake(key):
    def run(out, progress, settings):
        return Experiment(key, key, [{"x": 1}], [Check("c", 1, 1, "-", True)])
    return run

def loaded():
    return sorted(f"{m.__name__}.{n}:{s}" for m in list(sys.modules.values()) for n, v in vars(m).items()
                  if isinstance(v, Dispatcher) for s in v.signatures)

before = loaded()
real = report.registry()
keys = ["table5", "table4", "table6"]
report.registry = lambda: {k: real[k] if k in ("table4", "table6") else fake(k) for k in keys}
exps = report.reproduce(keys, sys.argv[1], progress=False, jobs=2)
assert [e.key for e in exps] == keys and all(e.checks for e in exps)
# the simulator's compiled loop is cached in a folder of its own under a file lock
# (ratrain.sim.event_loop): only the emulator's jitted code must wait for the worker
sim_loop = ("ratrain.sim.event_kernel.", "ratrain.sim.event_loop.")
mine = [d for d in set(loaded()) - set(before) if not d.startswith(sim_loop)]
print("loaded:", sorted(mine), "holds waited:", jit.HOLDS_WAITED[0])
"""


@pytest.mark.slow      # a fresh interpreter running two jobs: the full suite (CI) runs it
def test_the_parent_of_two_jobs_loads_no_jitted_code(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT_RUN)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    got = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True,
                         env=env, timeout=600, cwd=ROOT)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip().splitlines()[-1] == "loaded: [] holds waited: 0"


HELD = """import os, sys, time
from mtemu import jit
jit.configure()
from numba import njit

@njit(cache=True)
def plus_one(x):
    return x + 1

pid = os.fork()
if pid == 0:                    # the other process: 0.5 s of work, then gone
    time.sleep(0.5)
    os._exit(0)
start = time.monotonic()
jit.hold_jit_for(pid)
print(plus_one(41), time.monotonic() - start >= 0.5, plus_one(1), jit.HOLDS_WAITED[0], jit.WAIT_VARIABLE in os.environ)
os.waitpid(pid, 0)
"""


@pytest.mark.slow      # Numba imported and a function compiled in a fresh interpreter: the full suite runs it
def test_a_hold_makes_the_first_jitted_load_wait(tmp_path):
    script = tmp_path / "held.py"
    script.write_text(HELD)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": str(ROOT)}
    got = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert got.returncode == 0, got.stderr
    # the first call waited for the other process; the second (loaded) did not wait again
    assert got.stdout.split() == ["42", "True", "2", "1", "False"]
    assert "waiting for it to finish" in got.stderr


def test_two_jobs_by_default_with_two_cores(monkeypatch):
    from ratrain.repro import experiment_list
    for cores, jobs in (({0}, 1), ({0, 1}, 2), ({0, 1, 2, 3}, 2)):
        monkeypatch.setattr(experiment_list.os, "sched_getaffinity", lambda pid, cores=cores: cores, raising=False)
        assert experiment_list.default_jobs() == jobs

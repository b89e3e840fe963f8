"""Profiles built on a Dask cluster are the local profiles, bit for bit (docs/CHOICES.md, "Profiles on a Dask")."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ratrain.cost.profile as profile
from ratrain.spec.models import ModelSpec
from ratrain.spec.platform import TrainingPlatform

TINY = ModelSpec(name="tiny-dask", hidden=192, ffn=384, layers=2, heads=3, kv_heads=3, head_dim=64, vocab=384)
# (model, micro-batch, seq, tp): the b=2 profile also needs its b=1 reference's attention
REQUESTS = [(TINY, 1, 64, 1), (TINY, 2, 64, 1)]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A private, empty profile cache per call (nothing shipped)."""
    monkeypatch.setattr(profile, "SHIPPED_DIR", tmp_path / "shipped")

    def use(name: str):
        monkeypatch.setenv("RATRAIN_CACHE_DIR", str(tmp_path / name))
        profile._MEMO.clear()
        return tmp_path / name
    yield use
    profile._MEMO.clear()


def _dumps(profiles) -> list[str]:
    return [json.dumps(p.to_json(), sort_keys=True) for p in profiles]


def test_jobs_are_the_kernels_a_local_build_emulates(fresh):
    fresh("jobs")
    p = TrainingPlatform()
    jobs = profile.kernel_jobs(REQUESTS, p, profile.GemmCache(p))
    kinds = sorted({j[0] for j in jobs.values()})
    assert kinds == ["attention", "gemm"]
    # b=1 and b=2 GEMMs, attention only for the b=1 reference (fwd and bwd)
    assert sum(j[0] == "attention" for j in jobs.values()) == 2
    cache = profile.GemmCache(p)
    for spec, b, seq, tp in REQUESTS:
        profile.layer_profile(spec, b, seq, tp, platform=p, progress=False, cache=cache)
    assert set(jobs) == {k for k, e in cache.entries.items() if e["method"] == "emulated"}
    assert profile.kernel_jobs(REQUESTS, p, profile.GemmCache(p)) == {}      # all stored now


@pytest.mark.slow            # ~30 s on 2 busy cores: a local build, then two worker processes start and emulate
def test_two_worker_local_cluster_gives_the_local_profiles(fresh, monkeypatch):
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] not installed")
    fresh("local")
    local = [profile.layer_profile(*r, progress=False) for r in REQUESTS]
    remote_dir = fresh("dask")
    writes = []
    real_write = profile.write_json_cache
    monkeypatch.setattr(profile, "write_json_cache", lambda path, data: writes.append(path) or real_write(path, data))
    # worker processes, as on a real cluster: jobs and results cross a pickle boundary
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        with distributed.Client(c) as client:
            remote = profile.build_profiles(REQUESTS, scheduler=client)
            ran_on = {w for w in client.run(lambda: 1)}
    assert len(ran_on) == 2
    assert _dumps(remote) == _dumps(local)
    # the client alone wrote the GEMM cache, once; the profiles once each
    assert [p.name for p in writes].count("gemm_cache.json") == 1
    assert sorted(p.parent for p in writes if p.name != "gemm_cache.json") == [remote_dir / "profiles"] * 2
    profile._MEMO.clear()
    assert _dumps(profile.layer_profile(*r, progress=False) for r in REQUESTS) == _dumps(local)


@pytest.mark.slow     # > 5 s: the full suite runs it, the quick layer does not
def test_cli_refuses_an_unreachable_scheduler_in_one_line(fresh):
    pytest.importorskip("dask.distributed", reason="dask[distributed] not installed")
    out = subprocess.run([sys.executable, "-m", "ratrain.cli", "profile", "--model", "llama2-7b", "--seq", "64",
                          "--scheduler", "tcp://127.0.0.1:9"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "cannot reach the Dask scheduler" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_unbuilt_profiles_are_the_ones_a_load_would_build(fresh):
    fresh("unbuilt")
    p = TrainingPlatform()
    assert profile.unbuilt_profiles(REQUESTS, p) == REQUESTS
    profile.layer_profile(*REQUESTS[0], platform=p, progress=False)
    assert profile.unbuilt_profiles(REQUESTS, p) == REQUESTS[1:]
    profile._MEMO.clear()          # stored on disk: found there, and kept in memory as a load keeps it
    assert profile.unbuilt_profiles(REQUESTS, p) == REQUESTS[1:]
    assert any(k[1:4] == (1, 64, 1) for k in profile._MEMO)


def test_jobs_go_longest_first():
    cluster = TrainingPlatform().cluster
    jobs = [("gemm", "a-resident", 64, 64, 64, False, cluster), ("attention", "fwd", 3, 3, 64, 64, cluster),
            ("gemm", "a-resident", 128, 64, 64, False, cluster), ("attention", "bwd", 3, 3, 64, 64, cluster)]
    assert sorted(jobs, key=profile._job_cost, reverse=True) == [jobs[3], jobs[1], jobs[2], jobs[0]]


@pytest.mark.slow     # two worker processes start and emulate a tiny model's kernels
def test_a_plan_emulating_on_local_workers_is_the_plan_emulating_here(fresh, monkeypatch):
    from ratrain.plan.planner import Planner
    built = []
    real_build = profile.build_profiles
    monkeypatch.setattr("ratrain.plan.planner.build_profiles",
                        lambda requests, **kw: built.append((requests, kw["workers"], kw["pool"]))
                        or real_build(requests, **kw))

    def run(workers: int) -> dict:
        fresh(f"plan-{workers}")
        body = Planner(TINY, progress=False, workers=workers).plan(4, 8, 64, top=5, micro_batches=(1, 2)).to_json()
        return {k: v for k, v in body.items() if k not in ("elapsed_s", "profile_s", "configs_per_s", "analytic_s",
                                                                "analytic_configs_per_s")}

    here = run(1)
    assert built == []
    there = run(2)
    assert [w for _, w, _ in built] == [2, 2]          # the b=1 reference first, then the finalists' profiles
    assert built[0][0] == [(TINY, 1, 64, 1)]
    pool = built[0][2]
    assert pool is built[1][2] and pool.workers == 2 and pool._pool is None   # one set of workers, closed after
    assert there == here and here["confirmed"] == 3


def test_plan_refuses_no_workers(capsys):
    from ratrain.cli import main as cli_main
    assert cli_main(["plan", "--model", "llama2-7b", "--clusters", "8", "--global-batch", "8", "--profile", "roofline",
                     "--workers", "0"]) == 2
    assert "--workers: must be >= 1" in capsys.readouterr().err


def test_plan_uses_the_idle_cores(monkeypatch):
    import os

    from ratrain.cli.plan import idle_cores
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    for load, want in ((0.2, 4), (1.4, 3), (3.6, 1), (9.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert idle_cores() == want

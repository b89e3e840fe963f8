"""The benchmark harness stays runnable: asv configs, benchmark modules, a few direct calls.

Fast (a few seconds): the expensive benchmarks (Table 5, big GEMMs) are only imported, not run.
"""
from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:            # pytest may not put the repo root on sys.path
    sys.path.insert(0, str(ROOT))

ASV_PREFIXES = ("time_", "timeraw_", "track_", "mem_", "peakmem_")


def _load(name: str) -> dict:
    return json.loads((ROOT / name).read_text())      # strict JSON: no comments


def _bench_modules():
    import bench
    return [importlib.import_module(m.name) for m in pkgutil.iter_modules(bench.__path__, "bench.")]


def _asv_benchmarks(module) -> list[tuple[str, object]]:
    """(name, function) for every asv benchmark in the module, at top level and in classes."""
    out = []
    for name, obj in vars(module).items():
        if inspect.isfunction(obj) and name.startswith(ASV_PREFIXES):
            out.append((name, obj))
        elif inspect.isclass(obj) and obj.__module__ == module.__name__:
            out += [(f"{name}.{n}", f) for n, f in vars(obj).items()
                    if inspect.isfunction(f) and n.startswith(ASV_PREFIXES)]
    return out


def test_existing_env_config_has_the_expected_keys():
    conf = _load("asv.conf.json")
    assert conf["version"] == 1 and conf["repo"] == "."
    assert conf["environment_type"] == "existing"
    assert conf["branches"] == ["HEAD"]                 # a named branch breaks run/publish
    assert conf["benchmark_dir"] == "bench" and (ROOT / "bench" / "__init__.py").is_file()
    for key in ("results_dir", "html_dir", "env_dir"):
        assert conf[key].startswith(".asv/"), key
    assert 0 < conf["default_benchmark_timeout"] <= 600


def test_virtualenv_config_builds_one_wheel_per_commit():
    conf = _load("asv.virtualenv.conf.json")
    base = _load("asv.conf.json")
    assert conf["environment_type"] == "virtualenv" and conf["branches"] == ["HEAD"]
    assert conf["pythons"], "a virtualenv config must name its Python"
    for key in ("repo", "benchmark_dir", "results_dir", "html_dir"):
        assert conf[key] == base[key], key           # one dashboard for both configs
    build = " ".join(conf["build_command"])
    assert "pip wheel" in build and "--no-deps" in build and "{build_cache_dir}" in build
    assert any("{wheel_file}" in c for c in conf["install_command"])


def test_asv_output_is_gitignored():
    ignored = (ROOT / ".gitignore").read_text().split()
    assert ".asv/" in ignored and ".benchmarks/" in ignored


def test_every_bench_module_imports_and_tracks_carry_unit_and_version():
    modules = {m.__name__: m for m in _bench_modules()}
    assert {"bench.benchmarks", "bench.test_micro"} <= set(modules)
    found = {name: fn for name, fn in _asv_benchmarks(modules["bench.benchmarks"])}
    assert any(n.split(".")[-1].startswith("time_") for n in found)
    tracks = {n: f for n, f in found.items() if n.split(".")[-1].startswith("track_")}
    assert len(tracks) >= 3
    for name, fn in tracks.items():
        assert isinstance(getattr(fn, "unit", None), str) and fn.unit, f"{name} has no unit"
        assert isinstance(getattr(fn, "version", None), str) and fn.version, f"{name} has no explicit version"
    # asv also imports test_micro.py: it must define no asv benchmark names
    assert _asv_benchmarks(modules["bench.test_micro"]) == []


def test_table5_benchmarks_cover_the_paper_shapes_and_share_one_cache():
    from bench import benchmarks as bm
    from mtemu.validate import TABLE5, TABLE5_M
    assert bm.TrackTable5.params == [[f"{TABLE5_M}x{k}x{n}" for k, n, *_ in TABLE5]]
    # asv keys setup_cache by source location: the same function object emulates Table 5 once
    assert bm.TrackTable5Summary.setup_cache is bm.TrackTable5.setup_cache
    assert bm.TrackTable5.setup_cache.timeout >= 300


def test_table5_tracks_read_the_cache():
    from bench import benchmarks as bm
    cache = {"2048x4096x4096": (0.6525, 0.29), "2048x8192x8192": (0.6650, -1.63)}
    assert bm.TrackTable5().track_utilization(cache, "2048x4096x4096") == pytest.approx(65.25)
    assert bm.TrackTable5Summary().track_table5_max_abs_delta_pp(cache) == pytest.approx(1.63)


def test_cheap_time_benchmark_runs():
    from bench import benchmarks as bm
    b = bm.TimeRatrain()
    b.setup()
    assert b.time_stage_memory_llama2_7b() is None      # asv ignores the return value
    assert b.cfg.pp == 8 and b.costs is not None


# asv's own discovery in a fresh process (seconds); the quick layer imports every benchmark module above
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("asv") is None, reason="asv not installed (pip install -e '.[bench]')")
def test_asv_check_finds_no_problems():
    proc = subprocess.run(["asv", "check", "--python=same"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No problems found" in proc.stdout


def _main_job_folder(folder: Path) -> Path:
    """A main job's folder with one small ``<key>.json`` per experiment the tracks read."""
    rows = {
        "table5": [{"m": 2048, "k": 4096, "n": 4096, "utilization": 0.64, "delta_pp": -0.6}],
        "table2": [{"model": "llama2-13b", "method": "ratrain", "slowdown": 1.0},
                   {"model": "llama2-13b", "method": "tp-heavy", "slowdown": 1.15}],
        "table4": [{"error": 0.004}, {"error": 0.0064}],
        "table6": [{"clusters": 256, "efficiency": 1.0}, {"clusters": 1024, "efficiency": 0.9997}],
        "ablation": [{"variant": "full", "normalized_step": 1.0}, {"variant": "no-fsr", "normalized_step": 1.0024}],
        "sensitivity": [{"finding": "table6-link-latency", "fitted_link_latency_ms": 3.46},
                        {"finding": "ablation-tails", "smallest_link_meeting_paper": {"uniform": 3.7}}],
        "attention": [{"seq": 512, "speedup": 3.2}, {"seq": 1024, "speedup": 3.9}],
        "stragglers": [{"model": "step", "clusters": n, "cv": 0.0915, "efficiency": e, "paper_efficiency": p}
                       for n, e, p in ((512, 0.98, 0.9857), (768, 0.97, 0.9742), (1024, 0.95, 0.95))],
        "platforms": [{"platform": "mt3000", "model": "llama2-13b", "kind": "table2", "method": "tp-heavy",
                       "slowdown_vs_ratrain": 1.15},
                      {"platform": "mt3000", "model": "llama2-13b", "kind": "payoff", "fsr_gain": 1.0004,
                       "lifecycle_gain": 1.018}],
        "ranking": [{"kendall_tau": 0.97, "top1_regret_pct": 0.0, "top5_overlap": 1.0},
                    {"kendall_tau": 0.99, "top1_regret_pct": 0.5, "top5_overlap": 0.8}],
        "fig9": [{"model": "llama2-7b", "seq": 512, "mac_utilization": 0.538, "train_time_s": 18055.0}],
        "cross_platform": [{"platform": "mt3000", "model": "llama2-13b", "gpu_style_vs_ratrain": 0.86}],
    }
    extra = {"ranking": {"seconds": 19.1}, "fig9": {"checks": [{"ok": True}, {"ok": False}, {"ok": True}]}}
    for key, r in rows.items():
        (folder / f"{key}.json").write_text(json.dumps({"key": key, "rows": r, "checks": [], "seconds": 1.0}
                                                       | extra.get(key, {})))
    return folder


def test_tracks_read_the_main_job_named_and_refuse_a_folder_without_the_experiment(tmp_path, monkeypatch):
    """With RATRAIN_BENCH_MAIN_JOB set (as CI sets it), the experiments' tracks take their numbers from
    that run's files and run nothing; a folder missing an experiment fails rather than running it."""
    from bench import benchmarks as bm
    monkeypatch.setenv(bm.MAIN_JOB_VARIABLE, str(_main_job_folder(tmp_path)))
    monkeypatch.setattr(bm, "warm_numba", lambda: pytest.fail("a track ran the emulator"))
    import ratrain.repro.report
    monkeypatch.setattr(ratrain.repro.report, "reproduce", lambda *a, **k: pytest.fail("a track ran an experiment"))

    assert bm.TrackTable5().setup_cache() == {"2048x4096x4096": (0.64, -0.6)}
    repro = bm.TrackReproduction().setup_cache()
    assert repro == {"slowdown": {"llama2-13b/tp-heavy": 1.15}, "planner_error": 0.0064, "efficiency_1024": 0.9997,
                     "no_fsr": 1.0024}
    assert bm.TrackSensitivity().setup_cache() == {"latency_ms": 3.46, "link_gb_per_s": 3.7}
    assert bm.TrackAttention().setup_cache() == {512: 3.2, 1024: 3.9}
    strag = bm.TrackStragglers().setup_cache()
    assert strag["cv"] == pytest.approx(9.15) and strag["err_512"] == pytest.approx(-0.57)
    plat = bm.TrackPlatforms().setup_cache()
    assert plat == {"mt3000|llama2-13b|tp-heavy": 1.15, "mt3000|llama2-13b|fsr": 1.0004,
                    "mt3000|llama2-13b|lifecycle": 1.018}
    assert bm.TrackRanking().setup_cache() == {"min_tau": 0.97, "max_regret": 0.5, "min_overlap": 0.8,
                                               "seconds": 19.1}
    fig9 = bm.TrackFig9().setup_cache()
    assert fig9["passed"] == 2 and fig9["rows"][("llama2-7b", 512)]["mac_utilization"] == 0.538
    assert bm.TrackCrossPlatform().setup_cache() == {("mt3000", "llama2-13b"): 0.86}

    (tmp_path / "fig9.json").unlink()
    with pytest.raises(FileNotFoundError, match="fig9.json"):
        bm.TrackFig9().setup_cache()

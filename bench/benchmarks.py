"""asv suite: speed of the emulator, the step simulator and the memory model, plus tracked figures.

``time_*`` measure how fast our code runs; ``track_*`` record numbers the code computes (MAC
utilization of the paper's Table 5 shapes, the worst gap to the paper, functional throughput)
so a change that moves them shows up on the dashboard. Every ``track_*`` carries an explicit
``version`` so editing its body does not orphan its history; bump it only when the meaning of
the number changes.

asv re-runs ``setup`` before every timed call, so each ``setup`` here is idempotent and cheap
after its first call in a process (Numba compiles once, GEMM programs are cached).

The ``track_*`` figures of the main job's experiments (Tables 2, 4, 5 and 6, the ablation, sensitivity,
stragglers, platforms, ranking, Fig. 9, Fig. 10, cross-platform) read that experiment's
``<key>.json`` from the folder ``RATRAIN_BENCH_MAIN_JOB`` names, where it is set: CI sets it to the
main job it has just run on the same tree (``.ci/run``), so the experiments do not run twice. Unset
(a plain ``asv run``), each benchmark runs its experiment itself; both give the same numbers.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

# Only light modules at the top: asv starts a process per benchmark and parameter (about 150 in a quick
# run) and imports this file in each, where most of them only read a figure their ``setup_cache`` left;
# the emulator, Numba and the simulator load in the benchmarks that run them.
from mtemu.kernels.names import GEMM_LOOP_ORDERS as LOOP_ORDERS
from mtemu.paper_targets import TABLE5, TABLE5_M
from ratrain.repro.targets import TABLE3

if TYPE_CHECKING:
    import numpy as np

    from ratrain.cost.tasks import PipelineCosts
    from ratrain.spec.parallel import ParallelConfig

TIMING_SHAPE = (TABLE5_M, 4096, 4096)       # first Table 5 row
FUNCTIONAL_N = 512                          # time_: 512^3 functional GEMM
TRACK_FUNCTIONAL_N = 1024                   # track_: larger, so per-call overhead matters less
TABLE5_SHAPES = [f"{TABLE5_M}x{k}x{n}" for k, n, *_ in TABLE5]

_warmed = False


def warm_numba() -> None:
    """Compile (or load from cache) the jitted machine once per process; cheap afterwards."""
    global _warmed
    if not _warmed:
        import mtemu
        mtemu.gemm_timing(64, 64, 64)
        a, b = _operands(64, 64, 64)
        mtemu.run_gemm(a, b)
        _warmed = True


MAIN_JOB_VARIABLE = "RATRAIN_BENCH_MAIN_JOB"


def main_job(key: str) -> dict | None:
    """The experiment ``key`` as the main job wrote it (``<folder>/<key>.json``: rows, checks, seconds)
    when ``RATRAIN_BENCH_MAIN_JOB`` names that run's folder, else None: the caller runs it. A named
    folder without the file is an error (the main job did not run that experiment), not a silent rerun."""
    folder = os.environ.get(MAIN_JOB_VARIABLE)
    if not folder:
        return None
    path = Path(folder) / f"{key}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{MAIN_JOB_VARIABLE}={folder}: no {key}.json (run `ratrain reproduce --out {folder}`)")
    return json.loads(path.read_text())


def experiment_rows(keys: list[str]) -> dict[str, list[dict]]:
    """Each experiment's rows (as its ``<key>.json`` holds them): from the main job when named, else run
    here by the main job's driver (``ratrain.repro.report.reproduce``) into a scratch folder."""
    found = {key: main_job(key) for key in keys}
    missing = [key for key, exp in found.items() if exp is None]
    if missing:
        from ratrain.repro.report import reproduce
        out = tempfile.mkdtemp(prefix="asv-repro-")
        found |= {e.key: {"rows": e.rows} for e in reproduce(missing, out, progress=False)}
    return {key: found[key]["rows"] for key in keys}


def cached_track(name: str, key: str, unit: str, version: str = "1"):
    """An asv ``track_*`` method that reports ``cache[key]`` from the class's ``setup_cache``."""
    def track(self, cache):
        return cache[key]

    track.__name__ = track.__qualname__ = name
    track.unit = unit
    track.version = version
    return track


def cached_param_track(name: str, key: str, unit: str, version: str = "1"):
    """An asv ``track_*`` method of a parametrized class: ``cache[param][key]`` from its ``setup_cache``."""
    def track(self, cache, param):
        return cache[param][key]

    track.__name__ = track.__qualname__ = name
    track.unit = unit
    track.version = version
    return track


def _operands(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float16),
            rng.standard_normal((k, n)).astype(np.float16))


def step_costs() -> PipelineCosts:
    """Uniform 1F1B step: P=8 stages, A=128 micro-batches, 8 layers per stage (ms per layer)."""
    from ratrain.cost.tasks import PipelineCosts
    return PipelineCosts.uniform(8, 128, t_forward=1.0, t_backward=2.0, t_transfer=0.05,
                                 t_update=0.5, layers_per_stage=8, t_recompute=0.3,
                                 t_gradsync=2.0, t_prefetch=0.5)


def memory_config() -> ParallelConfig:
    from ratrain.spec.parallel import ParallelConfig
    return ParallelConfig(pp=8, dp=32, zero=2, micro_batch=1, accum=128, seq=2048, activation="fsr")


class TimeEmulator:
    """Wall time of the emulator itself (not the emulated cycles)."""

    timeout = 300

    def setup(self):
        from mtemu.kernels.gemm import build_gemm
        warm_numba()
        # program builds are lru-cached: the time_ functions measure the emulation
        build_gemm(*TIMING_SHAPE)
        build_gemm(FUNCTIONAL_N, FUNCTIONAL_N, FUNCTIONAL_N)
        self.a, self.b = _operands(FUNCTIONAL_N, FUNCTIONAL_N, FUNCTIONAL_N)

    def time_gemm_timing_2048x4096x4096(self):
        import mtemu
        mtemu.gemm_timing(*TIMING_SHAPE)

    # a few seconds per call: one process, few samples, no warmup beyond setup
    time_gemm_timing_2048x4096x4096.rounds = 1
    time_gemm_timing_2048x4096x4096.repeat = (1, 3, 20.0)
    time_gemm_timing_2048x4096x4096.warmup_time = 0.0

    def time_gemm_functional_512(self):
        import mtemu
        mtemu.run_gemm(self.a, self.b)


class TimeRatrain:
    """Wall time of one simulated training step and of one memory-model evaluation."""

    def setup(self):
        from ratrain.sim.simulator import simulate
        from ratrain.spec.memory import stage_memory
        from ratrain.spec.models import get_model
        self.simulate, self.stage_memory = simulate, stage_memory
        self.costs = step_costs()
        self.model = get_model("llama2-7b")
        self.cfg = memory_config()

    def time_simulate_step_p8_a128_l8(self):
        self.simulate(self.costs, schedule="1f1b")

    time_simulate_step_p8_a128_l8.repeat = (1, 5, 15.0)

    def time_stage_memory_llama2_7b(self):
        self.stage_memory(self.model, self.cfg)


class TrackTable5:
    """MAC utilization the emulator measures for each Table 5 shape, and the worst gap to the paper.

    ``setup_cache`` emulates the five shapes once (~35 s) and both benchmarks read from it.
    """

    params = [TABLE5_SHAPES]
    param_names = ["shape"]
    timeout = 600

    def setup_cache(self):
        exp = main_job("table5")
        if exp is not None:
            return {f"{r['m']}x{r['k']}x{r['n']}": (r["utilization"], r["delta_pp"]) for r in exp["rows"]}
        from mtemu.validate import table5
        warm_numba()
        return {f"{r.m}x{r.k}x{r.n}": (r.utilization, r.delta_pp) for r in table5()}

    setup_cache.timeout = 600

    def track_utilization(self, cache, shape):
        return 100.0 * cache[shape][0]

    track_utilization.unit = "%"
    track_utilization.version = "1"


class TrackTable5Summary:
    """Worst |utilization - paper| over Table 5, in percentage points."""

    timeout = 600
    # the same function object gives the same asv cache key: Table 5 is emulated once per run
    setup_cache = TrackTable5.setup_cache

    def track_table5_max_abs_delta_pp(self, cache):
        return max(abs(delta) for _, delta in cache.values())

    track_table5_max_abs_delta_pp.unit = "pp"
    track_table5_max_abs_delta_pp.version = "1"


class TrackTable5Study:
    """Closed-form Table 5 calibration study (seconds): the best worst-row gap any calibration of the
    GEMM reaches at the paper's 30 GB/s, and the lowest DDR rate at which one meets 1.5 pp."""

    timeout = 300

    def setup_cache(self):
        from mtemu.calibrate import bandwidth_study
        rows = bandwidth_study((30e9, 32e9, 34e9, 36e9, 38e9, 40e9))
        reach = [r.ddr_bandwidth for r in rows if r.oracle.worst_error_pp <= 1.5]
        return {"oracle_30": rows[0].oracle.worst_error_pp, "reach": reach[0] / 1e9 if reach else float("nan")}

    track_table5_best_calibration_worst_pp_at_30gbs = cached_track(
        "track_table5_best_calibration_worst_pp_at_30gbs", "oracle_30", "pp")
    track_table5_ddr_rate_needed_gb_per_s = cached_track("track_table5_ddr_rate_needed_gb_per_s", "reach", "GB/s")


class TrackThroughput:
    timeout = 300

    def setup(self):
        import mtemu
        warm_numba()
        self.run_gemm = mtemu.run_gemm
        n = TRACK_FUNCTIONAL_N
        self.a, self.b = _operands(n, n, n)
        self.run_gemm(self.a, self.b)       # builds and caches the 1024^3 program

    def track_functional_gmacs(self):
        """Host-side GMAC/s of a functional 1024^3 GEMM (best of 3)."""
        n = TRACK_FUNCTIONAL_N
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            self.run_gemm(self.a, self.b)
            best = min(best, time.perf_counter() - t0)
        return n * n * n / best / 1e9

    track_functional_gmacs.unit = "GMAC/s"
    track_functional_gmacs.version = "1"


class TrackTable5Speed:
    """The Table 5 set in timing mode per loop order (bench/speed.py): seconds (target 5 s), emulated
    bundles per second, and the ratio to NumPy's float32 matmul of the same shapes in the same run."""

    params = [list(LOOP_ORDERS)]
    param_names = ["loop_order"]
    timeout = 900

    def setup_cache(self):
        from .speed import TABLE5_SHAPES as TABLE5_DIMS
        from .speed import numpy_matmul_seconds, table5_timing
        warm_numba()
        numpy_s = numpy_matmul_seconds(TABLE5_DIMS)
        return {order: table5_timing(order, numpy_s) for order in LOOP_ORDERS}

    setup_cache.timeout = 900

    track_table5_timing_seconds = cached_param_track("track_table5_timing_seconds", "seconds", "s")
    track_table5_timing_ratio_to_numpy = cached_param_track("track_table5_timing_ratio_to_numpy",
                                                            "ratio_to_numpy", "x")
    track_table5_timing_bundles_per_s = cached_param_track("track_table5_timing_bundles_per_s", "bundles_per_s",
                                                           "bundles/s")


class TrackFunctionalSpeed:
    """Functional 1024^3 GEMM per loop order (bench/speed.py): first call in the process (programs from
    the disk cache) and warm call as ratios to NumPy's float32 matmul in the same run (target 10x, first
    call included), and emulated bundles per second."""

    params = [list(LOOP_ORDERS)]
    param_names = ["loop_order"]
    timeout = 600

    def setup_cache(self):
        from .speed import functional_gemm
        warm_numba()
        return {order: functional_gemm(TRACK_FUNCTIONAL_N, order) for order in LOOP_ORDERS}

    setup_cache.timeout = 600

    track_functional_first_call_ratio_to_numpy = cached_param_track(
        "track_functional_first_call_ratio_to_numpy", "first_call_ratio_to_numpy", "x", "2")
    track_functional_warm_ratio_to_numpy = cached_param_track("track_functional_warm_ratio_to_numpy",
                                                              "warm_ratio_to_numpy", "x", "2")
    track_functional_bundles_per_s = cached_param_track("track_functional_bundles_per_s", "bundles_per_s",
                                                        "bundles/s", "2")


class TimePlanner:
    """Algorithm 2 search speed (profiles are shipped, so loading them is not timed)."""

    timeout = 300

    def setup(self):
        from ratrain.plan.planner import Planner
        from ratrain.spec.models import get_model
        self.planner = Planner(get_model("llama2-70b"), progress=False)
        self.planner.profile(1, 2048, 1)

    def time_plan_llama2_70b_96_clusters(self):
        # the search on the fast kernel model (T=2 ranks from the shipped T=1 profile; nothing emulated)
        self.planner.plan(96, 32, 2048, "ratrain", top=5, micro_batches=(1,), tp_degrees=(1, 2), confirm=0)

    def track_planner_configs_per_s(self):
        res = self.planner.plan(1024, 1024, 2048, "ratrain", top=1, micro_batches=(1,), tp_degrees=(1, 2), confirm=0)
        return res.enumerated / max(res.elapsed_s - res.profile_s, 1e-9)

    track_planner_configs_per_s.unit = "configs/s"
    track_planner_configs_per_s.version = "1"


class TimePlannerSchedules:
    """The search over every pipeline schedule (``ratrain plan --schedules all``): 1F1B over arrays, the
    others one configuration at a time, the finalists simulated under their schedule."""

    timeout = 300

    def setup(self):
        from ratrain.plan.planner import Planner
        from ratrain.plan.schedule_search import parse_schedules
        from ratrain.spec.models import get_model
        self.schedules = parse_schedules("all")
        self.planner = Planner(get_model("llama2-7b"), progress=False)
        self.planner.plan(8, 8, 2048, schedules=self.schedules)     # loads every profile the search reads

    def time_plan_llama2_7b_all_schedules(self):
        self.planner.plan(8, 8, 2048, schedules=self.schedules)

    def track_configs_per_s_all_schedules(self):
        res = self.planner.plan(8, 8, 2048, schedules=self.schedules)
        return res.enumerated / max(res.elapsed_s - res.profile_s, 1e-9)

    track_configs_per_s_all_schedules.unit = "configs/s"
    track_configs_per_s_all_schedules.version = "1"


class TimePlannerTable3:
    """``ratrain plan`` on each Table 3 case, the search alone (profiles loaded in ``setup``, nothing
    emulated: ``confirm=0``); target well under 10 s, and ``configs/s`` of the analytic path."""

    timeout = 600
    params = [f"{model}-{clusters}-{gb}" for model, clusters, *_r, gb in TABLE3]
    param_names = ["case"]

    def setup(self, case):
        from ratrain.plan.planner import Planner
        from ratrain.spec.models import get_model
        model, clusters, gb = case.rsplit("-", 2)
        self.args = (int(clusters), int(gb))
        self.planner = Planner(get_model(model), progress=False)
        self.planner.plan(*self.args, confirm=0)           # loads (or builds) every profile the search reads

    def time_plan_table3(self, case):
        self.planner.plan(*self.args, confirm=0)

    def track_configs_per_s(self, case):
        res = self.planner.plan(*self.args, confirm=0)
        return res.enumerated / max(res.elapsed_s - res.profile_s, 1e-9)

    track_configs_per_s.unit = "configs/s"
    track_configs_per_s.version = "1"

    def track_analytic_configs_per_s(self, case):
        """The analytic pass alone (every configuration's memory check and main-path bound; the
        finalists' lifecycle chains and profiles aside): the target is at least 100,000 a second."""
        return self.planner.plan(*self.args, confirm=0).analytic_configs_per_s

    track_analytic_configs_per_s.unit = "configs/s"
    track_analytic_configs_per_s.version = "1"

    def track_configs_per_cpu_s(self, case):
        """End to end as `ratrain plan` runs it (a new planner, --confirm 3, its profiles already loaded),
        per CPU-second of this process (the machine may be shared), median of 5."""
        return self._configs_per_cpu_s(fresh=False)

    track_configs_per_cpu_s.unit = "configs/s"
    track_configs_per_cpu_s.version = "1"

    def track_configs_per_cpu_s_fresh(self, case):
        """``track_configs_per_cpu_s`` with the planner's process-wide memos (partitions, layer sizes)
        forgotten before each plan, as a new ``ratrain plan`` process starts."""
        return self._configs_per_cpu_s(fresh=True)

    track_configs_per_cpu_s_fresh.unit = "configs/s"
    track_configs_per_cpu_s_fresh.version = "1"

    def _configs_per_cpu_s(self, fresh: bool) -> float:
        from ratrain.plan.planner import Planner, clear_memos
        model = self.planner.model
        self.planner.plan(*self.args)                        # the finalists' emulated profiles, loaded once
        spent = []
        for _ in range(5):
            if fresh:
                clear_memos()
            planner = Planner(model, progress=False)
            planner._profiles = dict(self.planner._profiles)
            start = time.process_time()
            res = planner.plan(*self.args)
            spent.append(time.process_time() - start)
        return res.enumerated / max(sorted(spent)[2], 1e-9)


class TimeStartup:
    """Commands that start at once: wall time of a fresh interpreter answering ``--help``, an argument
    error and a uniform simulation (target < 0.5 s; nothing of the emulator, Numba or Matplotlib loads)."""

    timeout = 120
    params = ["ratrain --help", "ratrain plan --help", "ratrain reproduce --help", "ratrain plan --clusters x",
              "ratrain simulate --uniform --stages 4 --microbatches 8 --t-forward 1 --t-backward 2 --json",
              "mtemu --help", "mtemu gemm --help"]
    param_names = ["command"]

    def time_command(self, command):
        tool, *argv = command.split()
        subprocess.run([sys.executable, "-m", f"{tool}.cli", *argv], capture_output=True, check=False)


class TimeModelStep:
    """One simulated step of Qwen2.5-32B at P=8, A=128 from its emulated profile (target < 5 s)."""

    timeout = 300

    def setup(self):
        from ratrain.cost.terms import pipeline_costs
        from ratrain.plan.planner import Planner
        from ratrain.sim.simulator import simulate
        from ratrain.spec.models import get_model
        from ratrain.spec.parallel import ParallelConfig
        self.simulate = simulate
        model = get_model("qwen2.5-32b")
        cfg = ParallelConfig(pp=8, dp=32, zero=2, micro_batch=1, accum=128, seq=2048, activation="fsr")
        self.costs = pipeline_costs(model, cfg, Planner(model).profile(1, 2048, 1))

    def time_simulate_qwen_p8_a128(self):
        self.simulate(self.costs)


class TrackReproduction:
    """Validation figures of the reproduction (emulated profiles): Table 2 slowdowns, planner vs
    simulator error (Table 4), scaling efficiency at 1024 clusters (Table 6), the ablation."""

    timeout = 900

    def setup_cache(self):
        rows = experiment_rows(["table2", "table4", "table6", "ablation"])
        slow = {f"{r['model']}/{r['method']}": r["slowdown"] for r in rows["table2"]
                if r["method"] not in ("ratrain", "full-save")}
        return {"slowdown": slow,
                "planner_error": max(r["error"] for r in rows["table4"]),
                "efficiency_1024": next(r["efficiency"] for r in rows["table6"] if r["clusters"] == 1024),
                "no_fsr": next(r["normalized_step"] for r in rows["ablation"] if r["variant"] == "no-fsr")}

    setup_cache.timeout = 900

    def track_table4_max_planner_error(self, cache):
        return 100.0 * cache["planner_error"]

    track_table4_max_planner_error.unit = "%"
    track_table4_max_planner_error.version = "1"

    def track_table6_efficiency_1024(self, cache):
        return 100.0 * cache["efficiency_1024"]

    track_table6_efficiency_1024.unit = "%"
    track_table6_efficiency_1024.version = "1"

    def track_ablation_no_fsr_step(self, cache):
        return cache["no_fsr"]

    track_ablation_no_fsr_step.unit = "x"
    track_ablation_no_fsr_step.version = "1"


class TrackSensitivity:
    """What the platform would need for the rows the honest model misses (ratrain.repro.sensitivity):
    the per-message link latency that reproduces Table 6 at 1024 clusters, and the smallest link
    bandwidth (uniform partition) at which the ablation's tail ratios meet the paper's."""

    timeout = 900

    def setup_cache(self):
        by = {r["finding"]: r for r in experiment_rows(["sensitivity"])["sensitivity"]}
        t6 = by.get("table6-link-latency")
        link = by["ablation-tails"]["smallest_link_meeting_paper"].get("uniform")
        return {"latency_ms": t6["fitted_link_latency_ms"] if t6 else float("nan"),
                "link_gb_per_s": link if link is not None else float("nan")}

    setup_cache.timeout = 900

    track_table6_fitted_link_latency_ms = cached_track("track_table6_fitted_link_latency_ms", "latency_ms", "ms")
    track_ablation_link_needed_gb_per_s = cached_track("track_ablation_link_needed_gb_per_s", "link_gb_per_s", "GB/s")


class TrackTable2:
    """Slowdown of each GPU-style strategy vs RATrain on the same backend (Table 2)."""

    params = [["llama2-13b/tp-heavy", "llama2-13b/zero3-heavy", "llama2-13b/backward-ckpt", "llama2-13b/tuned",
               "qwen2.5-32b/tp-heavy", "qwen2.5-32b/zero3-heavy", "qwen2.5-32b/backward-ckpt",
               "qwen2.5-32b/tuned"]]
    param_names = ["model/method"]
    timeout = 900
    setup_cache = TrackReproduction.setup_cache

    def track_slowdown(self, cache, key):
        return cache["slowdown"][key]

    track_slowdown.unit = "x"
    track_slowdown.version = "1"


class TrackAttention:
    """Resident over DDR-staged attention backward speedup (paper Fig. 10), per sequence length."""

    params = [[512, 1024, 2048, 4096]]
    param_names = ["seq"]
    timeout = 900

    def setup_cache(self):
        exp = main_job("attention")
        if exp is not None:
            return {r["seq"]: r["speedup"] for r in exp["rows"]}
        from mtemu.validate import validate_attention
        warm_numba()
        return {r["seq"]: r["speedup"] for r in validate_attention()}

    setup_cache.timeout = 900

    def track_attention_speedup(self, cache, seq):
        return cache[seq]

    track_attention_speedup.unit = "x"
    track_attention_speedup.version = "1"


class TimeTuner:
    """A small tile sweep (12 candidates) on 2048x4096x4096, uncached, on local processes.
    The 100-candidate target (< 5 min) is bench/test_micro.py::test_tuner_sweep_100_candidates."""

    timeout = 600
    number = 1
    repeat = 1

    def setup(self):
        warm_numba()

    def time_tune_gemm_12_candidates(self):
        from mtemu.tune import tune_gemm
        tune_gemm(2048, 4096, 4096, grid={"mg": (1024, 2048), "k2": (128, 256), "n2": (576, 768, 960),
                                          "mr_nv": ((6, 4),)}, out_dir=None, progress=False, cache=False,
                  loop_order="c-stationary")


class TrackPlanFreshCache:
    """`ratrain plan` as a new user meets it: a fresh process and empty caches but the compiled machine's
    (the shipped micro-batch-1 profiles only). Target: each README plan example within 10 s and 2 GB."""
    timeout = 900
    number = 1
    repeat = 1
    CASES = {"llama2-7b-8": ["--model", "llama2-7b", "--clusters", "8", "--global-batch", "512"],
             "llama2-70b-96": ["--model", "llama2-70b", "--clusters", "96", "--global-batch", "32"],
             # a model without shipped profiles: its 19 kernels emulated first (target 10 s)
             "mistral-7b-hf-64": ["--hf-config", str(Path(__file__).parent.parent / "tests" / "fixtures" / "hf" /
                                                     "mistral-7b.json"), "--clusters", "64", "--global-batch", "512"]}

    def setup_cache(self):
        from rtcommon import caches
        out = {}
        for key, argv in self.CASES.items():
            # empty caches but the compiled machine's (its first compile is measured by TrackMainJob)
            env = {**os.environ, "RATRAIN_CACHE_DIR": tempfile.mkdtemp(prefix="ratrain-bench-"),
                   "MTEMU_CACHE_DIR": tempfile.mkdtemp(prefix="mtemu-bench-"),
                   "NUMBA_CACHE_DIR": str(caches.numba_base())}
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "ratrain.cli", "plan", *argv, "--json"], env=env, check=True,
                           capture_output=True)
            out[f"{key}_s"] = time.perf_counter() - t0
            # ru_maxrss of children is the largest child so far (KiB on Linux)
            out[f"{key}_mb"] = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
        return out

    track_plan_llama2_7b_8_seconds = cached_track("track_plan_llama2_7b_8_seconds", "llama2-7b-8_s", "seconds")
    track_plan_llama2_7b_8_peak_mb = cached_track("track_plan_llama2_7b_8_peak_mb", "llama2-7b-8_mb", "MB")
    track_plan_llama2_70b_96_seconds = cached_track("track_plan_llama2_70b_96_seconds", "llama2-70b-96_s", "seconds")
    track_plan_llama2_70b_96_peak_mb = cached_track("track_plan_llama2_70b_96_peak_mb", "llama2-70b-96_mb", "MB")
    track_plan_mistral_7b_hf_64_seconds = cached_track("track_plan_mistral_7b_hf_64_seconds", "mistral-7b-hf-64_s",
                                                       "seconds")
    track_plan_mistral_7b_hf_64_peak_mb = cached_track("track_plan_mistral_7b_hf_64_peak_mb", "mistral-7b-hf-64_mb",
                                                       "MB")


def run_measured(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run ``argv`` to the end; its wall seconds, CPU seconds and peak resident MB (of the process and
    of the children it waited for: ``wait4``'s usage)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


class TrackMainJob:
    """`ratrain reproduce` (the README's main job, every experiment) as a new user meets it: first on
    empty caches (Numba compiles, every kernel program is built and emulated), then again on the
    caches that run left. Targets: 120 s wall, 240 CPU-seconds and 1.5 GB on 2 idle cores."""
    timeout = 7200
    number = 1
    repeat = 1

    def setup_cache(self):
        caches = tempfile.mkdtemp(prefix="ratrain-mainjob-")
        env = {**os.environ, "NUMBA_CACHE_DIR": os.path.join(caches, "numba"),
               "MTEMU_CACHE_DIR": os.path.join(caches, "mtemu"), "RATRAIN_CACHE_DIR": os.path.join(caches, "ratrain")}
        out = {}
        for run in ("first", "later"):
            argv = [sys.executable, "-m", "ratrain.cli", "reproduce", "--json", "--out",
                    tempfile.mkdtemp(prefix=f"ratrain-mainjob-{run}-")]
            out |= {f"{run}_{k}": v for k, v in run_measured(argv, env).items()}
        return out

    setup_cache.timeout = 7200

    track_main_job_first_run_wall_s = cached_track("track_main_job_first_run_wall_s", "first_wall_s", "seconds")
    track_main_job_first_run_cpu_s = cached_track("track_main_job_first_run_cpu_s", "first_cpu_s", "seconds")
    track_main_job_first_run_peak_mb = cached_track("track_main_job_first_run_peak_mb", "first_rss_mb", "MB")
    track_main_job_later_run_wall_s = cached_track("track_main_job_later_run_wall_s", "later_wall_s", "seconds")
    track_main_job_later_run_cpu_s = cached_track("track_main_job_later_run_cpu_s", "later_cpu_s", "seconds")
    track_main_job_later_run_peak_mb = cached_track("track_main_job_later_run_peak_mb", "later_rss_mb", "MB")


class TrackStragglers:
    """The straggler study (ratrain.repro.stragglers): the per-cluster spread cv that gives the paper's Table 6
    efficiency at 1024 clusters ('step' model), and the held-out efficiency errors at 512 and 768 clusters."""

    timeout = 900

    def setup_cache(self):
        rows = experiment_rows(["stragglers"])["stragglers"]
        step = {r["clusters"]: r for r in rows if r.get("model") == "step" and "clusters" in r}
        cv = step[1024]["cv"]
        err = {n: 100.0 * (step[n]["efficiency"] - step[n]["paper_efficiency"]) if cv is not None else float("nan")
               for n in (512, 768)}
        return {"cv": 100.0 * cv if cv is not None else float("nan"), "err_512": err[512], "err_768": err[768]}

    setup_cache.timeout = 900

    track_stragglers_fitted_cv_pct = cached_track("track_stragglers_fitted_cv_pct", "cv", "%")
    track_stragglers_held_out_error_512_points = cached_track("track_stragglers_held_out_error_512_points",
                                                              "err_512", "points")
    track_stragglers_held_out_error_768_points = cached_track("track_stragglers_held_out_error_768_points",
                                                              "err_768", "points")


def platform_track(name: str, metric: str):
    """A ``track_*`` method of :class:`TrackPlatforms`: ``metric`` (x) of one platform and model."""
    def track(self, cache, platform, model):
        return cache[f"{platform}|{model}|{metric}"]

    track.__name__ = track.__qualname__ = name
    track.unit = "x"
    track.version = "1"
    return track


class TrackPlatforms:
    """The second-platform study (ratrain.repro.platforms) on each simulated what-if
    platform and the default: Table 2's TP-heavy and ZeRO-3 layouts' slowdown vs RATrain, the
    planner's best GPU-style pick over its RATrain pick, and what FSR and the lifecycle pipeline
    gain (step without / step with; below 1 they cost). One run of the study (about a minute
    with the shipped profiles) feeds every number."""

    params = [["mt3000", "bandwidth-rich", "more-memory", "bandwidth-rich-more-memory"],
              ["llama2-13b", "qwen2.5-32b"]]
    param_names = ["platform", "model"]
    timeout = 900

    def setup_cache(self):
        out = {}
        for r in experiment_rows(["platforms"])["platforms"]:
            key = (r["platform"], r["model"])
            if r["kind"] == "table2" and r["method"] in ("tp-heavy", "zero3-heavy"):
                out[(*key, r["method"])] = r["slowdown_vs_ratrain"]
            elif r["kind"] == "planner" and r["method"] not in ("ratrain", "ratrain-no-fsr") \
                    and r["slowdown_vs_ratrain"] is not None:
                best = out.get((*key, "planner-best-baseline"))
                out[(*key, "planner-best-baseline")] = min(r["slowdown_vs_ratrain"], best or float("inf"))
            elif r["kind"] == "payoff":
                out[(*key, "fsr")] = r["fsr_gain"]
                out[(*key, "lifecycle")] = r["lifecycle_gain"]
        return {"|".join(k): (float("nan") if v is None else v) for k, v in out.items()}

    setup_cache.timeout = 900

    track_platforms_tp_heavy_slowdown = platform_track("track_platforms_tp_heavy_slowdown", "tp-heavy")
    track_platforms_zero3_slowdown = platform_track("track_platforms_zero3_slowdown", "zero3-heavy")
    track_platforms_planner_best_baseline = platform_track("track_platforms_planner_best_baseline",
                                                           "planner-best-baseline")
    track_platforms_fsr_gain = platform_track("track_platforms_fsr_gain", "fsr")
    track_platforms_lifecycle_gain = platform_track("track_platforms_lifecycle_gain", "lifecycle")


class TrackRanking:
    """Does the planner rank RATrain's feasible configurations as the simulator does
    (ratrain.repro.ranking): the worst Kendall tau and top-1 regret over the Table 3 / Table 4 cases,
    the worst top-5 overlap, and the study's own wall time (from the main job: its time of the study in
    that run)."""

    timeout = 900

    def setup_cache(self):
        exp = main_job("ranking")
        if exp is None:
            from ratrain.repro.ranking import run_ranking
            out = Path(tempfile.mkdtemp(prefix="asv-ranking-"))
            t0 = time.perf_counter()
            exp = {"rows": run_ranking(out, lambda msg: None).rows, "seconds": time.perf_counter() - t0}
        rows = exp["rows"]
        return {"min_tau": min(r["kendall_tau"] for r in rows),
                "max_regret": max(r["top1_regret_pct"] for r in rows),
                "min_overlap": min(r["top5_overlap"] for r in rows),
                "seconds": exp["seconds"]}

    setup_cache.timeout = 900

    track_ranking_min_kendall_tau = cached_track("track_ranking_min_kendall_tau", "min_tau", "tau")
    track_ranking_max_top1_regret = cached_track("track_ranking_max_top1_regret", "max_regret", "%")
    track_ranking_min_top5_overlap = cached_track("track_ranking_min_top5_overlap", "min_overlap", "share")
    track_ranking_study_seconds = cached_track("track_ranking_study_seconds", "seconds", "seconds")


class TrackFig9:
    """Fig. 9 (sequence length): MAC-only utilization and training time of the planner's RATrain plan
    per (model, sequence length) at 256 clusters, global batch 4096, and how many of the caption's
    shape checks hold (ratrain.repro.fig9; shipped profiles, about a minute)."""

    params = [["llama2-7b", "baichuan2-13b", "qwen2.5-32b"], [512, 1024, 2048, 3072, 4096]]
    param_names = ["model", "seq"]
    timeout = 900

    def setup_cache(self):
        exp = main_job("fig9")
        if exp is None:
            from ratrain.repro.fig9 import fig9_rows, shape_checks
            rows = fig9_rows()
            passed = sum(c.ok for c in shape_checks(rows))
        else:
            # the experiment's checks are the caption's shape checks of its rows (ratrain.repro.fig9.run_fig9)
            rows, passed = exp["rows"], sum(c["ok"] for c in exp["checks"])
        return {"rows": {(r["model"], r["seq"]): r for r in rows}, "passed": passed}

    setup_cache.timeout = 900

    def track_fig9_mac_utilization(self, cache, model, seq):
        return 100.0 * (cache["rows"][(model, seq)]["mac_utilization"] or float("nan"))

    track_fig9_mac_utilization.unit = "%"
    track_fig9_mac_utilization.version = "1"

    def track_fig9_train_time_hours(self, cache, model, seq):
        return (cache["rows"][(model, seq)]["train_time_s"] or float("nan")) / 3600

    track_fig9_train_time_hours.unit = "h"
    track_fig9_train_time_hours.version = "1"


class TrackFig9Shape:
    """How many of Fig. 9's caption checks (rising utilization, slight dip, training-time valley) hold."""

    timeout = 900
    setup_cache = TrackFig9.setup_cache

    track_fig9_shape_checks_passed = cached_track("track_fig9_shape_checks_passed", "passed", "checks")


class TimeValidateMeasured:
    """The simulator against the 1,440 measured A100 runs (`ratrain validate measured`): wall time
    (target: 60 s on 2 cores) and the mean and max |error| it reports, tracked over commits."""

    timeout = 300.0

    def setup(self):
        from ratrain.repro.measured import CALIBRATION_PLATFORM, CALIBRATION_RUNS, read_runs, validate
        from ratrain.spec.platforms import load_platform
        self.validate = validate
        self.runs = read_runs(CALIBRATION_RUNS)
        self.platform = load_platform(CALIBRATION_PLATFORM)

    def time_validate_1440_runs(self):
        self.validate(self.runs, self.platform)

    time_validate_1440_runs.repeat = (1, 2, 60.0)

    def track_mean_abs_error_pct(self):
        return 100 * self.validate(self.runs, self.platform).summary["mean_abs_error"]

    track_mean_abs_error_pct.version = "1"
    track_mean_abs_error_pct.unit = "%"


class TrackCrossPlatform:
    """`ratrain reproduce cross_platform`: the best GPU-style planner pick's step over RATrain's, per
    platform and model (above 1: lifecycle scheduling wins there)."""

    params = [["mt3000", "dgx-a100", "rtx4090-pcie"], ["llama2-13b", "qwen2.5-32b"]]
    param_names = ["platform", "model"]
    timeout = 300

    def setup_cache(self):
        from ratrain.repro.cross_platform import cross_platform_rows
        exp = main_job("cross_platform")       # the experiment's rows are the summaries
        summaries = cross_platform_rows()[1] if exp is None else exp["rows"]
        return {(s["platform"], s["model"]): s["gpu_style_vs_ratrain"] for s in summaries}

    def track_gpu_style_over_ratrain(self, cache, platform, model):
        value = cache[(platform, model)]
        return float("nan") if value is None else value

    track_gpu_style_over_ratrain.unit = "x"
    track_gpu_style_over_ratrain.version = "1"

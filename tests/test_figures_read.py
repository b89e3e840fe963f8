"""Every figure the project draws reads: no two text artists overlap, no text is cut by the canvas or
its axes, and no legend covers plotted data (rtcommon.figure_check), each drawn by its own function
from small inputs shaped like a run's (no emulation, no experiment runs).

``FIGURES`` lists every function that makes a figure; a test fails when a function in the packages
makes one (calls ``subplots``/``figure``) without being listed here, so a new figure is checked too.
"""
from __future__ import annotations

import ast
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.figure  # noqa: E402
import matplotlib.pyplot  # noqa: E402
import pytest  # noqa: E402

import rtcommon.fileio  # noqa: E402
from rtcommon.figure_check import check_figure  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# makers of figures that draw nothing themselves: the house style's ``plt.subplots``
HELPERS = {"rtcommon.figstyle:subplots"}


# ------------------------------------------------------------------ inputs shaped like a run's
def _uniform_costs(microbatches: int = 32):
    from ratrain.cost.tasks import PipelineCosts
    return PipelineCosts.uniform(8, microbatches, t_forward=1500, t_backward=3000, t_transfer=50, t_update=3000,
                                 layers_per_stage=4, t_recompute=600, t_gradsync=2000, t_prefetch=1500)


def _step(schedule="1f1b", virtual_stages: int = 1):
    from ratrain.sim.pipeline_order import PipelineSchedule
    from ratrain.sim.simulator import simulate
    return simulate(_uniform_costs(), schedule=PipelineSchedule(schedule, virtual_stages=virtual_stages))


def _reproduction_timelines(out: Path) -> None:
    """ratrain.repro.training's two windows and the schedules study's start and tail per schedule."""
    from ratrain.sim.plots import plot_timeline
    sim = _step()
    first_b = min(t.start_ms for t in sim.tasks if t.kind == "B")
    plot_timeline(sim, out / "timeline_1f1b.png", stages=list(range(8)), t_range=(0.0, first_b * 2.2),
                  title="qwen2.5-32b P=8 D=32 T=1 Z=2 b=1 A=128 fsr: start of the step (F, B, R; lifecycle rows)")
    tail = sim.step_time_ms - sim.last_backward_end_ms
    plot_timeline(sim, out / "timeline_tail.png", stages=list(range(8)),
                  t_range=(max(0.0, sim.last_backward_end_ms - 3 * tail - 20000), sim.step_time_ms),
                  title="End of the step: layer-wise GradSync / UpdateShard / PrefetchW")
    for name, v in (("interleaved", 2), ("zb-h1", 1)):
        res = _step(name, v)
        span = 3.0 * min(t.end_ms for t in res.tasks if t.kind == "B")
        for part, window in (("start", (0.0, span)), ("tail", (max(0.0, res.step_time_ms - span), res.step_time_ms))):
            plot_timeline(res, out / f"timeline_{name}_{part}.png", t_range=window,
                          title=f"llama2-13b P=8 D=32 under {name}: {part} of the step "
                                f"(step {res.step_time_ms / 1e3:.1f} s)")


def _simulate_plot(out: Path) -> None:
    """``ratrain simulate --plot``: the whole step, no window."""
    from ratrain.sim.plots import plot_timeline
    plot_timeline(_step(), out / "simulate.png")


def _stage_memory(out: Path) -> None:
    from ratrain.sim.plots import plot_stage_memory
    plot_stage_memory([17.1 * 2 ** 30, 16.4 * 2 ** 30, 15.2 * 2 ** 30, 14.0 * 2 ** 30, 13.1 * 2 ** 30, 12.5 * 2 ** 30,
                       11.9 * 2 ** 30, 21.3 * 2 ** 30], 20 * 2 ** 30, out / "stage_memory.png",
                      title="qwen2.5-32b P=8 D=32 T=1 Z=2 b=1 A=128 fsr: per-stage peak memory vs the 20 GB budget")


def _table2(out: Path) -> None:
    from ratrain.repro import figures
    from ratrain.repro import targets as paper
    rows = [r for r in paper.TABLE2 if r[1] != "ratrain"]
    figures.bar_comparison(out / "table2_slowdown.png", [f"{m.split('-')[0]}\n{method}" for m, method, *_ in rows],
                           [(r[9] or 0.0) * 1.03 for r in rows], [r[9] or 0.0 for r in rows],
                           "slowdown vs RATrain (x)", "Table 2: GPU-style strategies on the same backend", ref=1.0,
                           missing="OOM")


def _table3(out: Path) -> None:
    from ratrain.repro import figures
    rows = [{"model": model, "config": f"P={p},D={96 // p if p < 96 else 1},T=1,Z=2,b=1,A=128,seq=2048,FSR,"
                                       "layerwise,balanced",
             "stages": [{"state_gb": 12.0 + i % 3, "activation_gb": 2.0 + (i % 2), "buffer_gb": 3.0}
                        for i in range(p)]}
            for model, p in (("llama2-7b", 2), ("baichuan2-13b", 8), ("qwen2.5-32b", 24), ("llama2-70b", 48))]
    figures.stage_memory_figure(rows, out / "table3_memory.png")


def _table5(out: Path) -> None:
    from ratrain.repro import figures
    rows = [SimpleNamespace(k=k, n=n, utilization=u, paper_utilization=p)
            for (k, n), u, p in zip(((4096, 4096), (4096, 11008), (11008, 4096), (6656, 6656), (8192, 8192)),
                                    (0.643, 0.676, 0.682, 0.699, 0.713), (0.6345, 0.6716, 0.6795, 0.6978, 0.7103),
                                    strict=True)]
    variants = [{"variant": name, "utilization": u, "stalls": {"dma_wait": d, "barrier": 2.1e6, "latency": 4e5}}
                for name, u, d in (("a-resident (default)", 0.643, 9e6), ("c-stationary pipelined", 0.872, 3e6),
                                   ("c-stationary no pipeline", 0.61, 1.2e7),
                                   ("c-stationary tiles mg=256 k2=64 n2=96", 0.402, 2.4e7))]
    figures.table5_figure(rows, variants, out / "table5_utilization.png",
                          "a-resident tiles: mg=512 kg=768 k2=256 n2=384 mr=6 nv=2 b_slots=3")


def _table6(out: Path) -> None:
    from ratrain.repro import figures
    from ratrain.repro import targets as paper
    figures.scaleout_figure([{"clusters": c, "tokens_per_s": tok * 1.01, "paper_tokens_per_s": tok, "efficiency": e}
                             for c, _b, _s, tok, _x, e in paper.TABLE6], out / "table6_scaleout.png")


def _ablation(out: Path) -> None:
    from ratrain.repro import figures
    from ratrain.repro import targets as paper
    figures.ablation_figure([{"variant": v, "normalized_step": step * 1.02, "paper_normalized_step": step,
                              "tail_amplification": tail * 1.1 if tail else None, "paper_tail_amplification": tail}
                             for v, step, tail in paper.ABLATION], out / "ablation.png")


def _attention(out: Path) -> None:
    from ratrain.repro import figures
    figures.attention_figure([{"seq": s, "speedup": 3.0 + s / 2048} for s in (512, 1024, 2048, 4096)],
                             out / "attention_speedup.png", 1.24, 1.54)


def _fig9(out: Path) -> None:
    from ratrain.repro import fig9
    from ratrain.repro import targets as paper
    rows = []
    for i, model in enumerate(("llama2-7b", "llama2-13b", "qwen2.5-32b")):
        for seq in paper.FIG9_SEQS:
            hours = (20 + 30 * i) * seq / 2048
            rows.append({"model": model, "seq": seq, "train_time_s": 3600 * hours, "mac_utilization": 0.42 - 0.03 * i,
                         "alt_train_time_s": 3600 * hours * 1.1, "alt_mac_utilization": 0.40 - 0.03 * i,
                         "activation": "full" if seq <= 1024 else "fsr", "alt_recovery": "dsp"})
    fig9.figure(rows, out / "fig9_seq.png")


def _platforms(out: Path) -> None:
    from ratrain.repro import platforms
    names = ["mt3000", "bandwidth-rich", "more-memory", "bandwidth-rich-more-memory"]
    rows = [{"kind": kind, "platform": p, "model": m, "method": method,
             "slowdown_vs_ratrain": None if method == "full-save" and p == "mt3000" else 1.05 + 0.1 * j}
            for kind in ("table2", "planner") for p in names for m in platforms.MODELS
            for j, method in enumerate(platforms.BASELINES)]
    platforms._figure(rows, names, out / "platforms_slowdown.png")


def _budget(out: Path) -> None:
    from ratrain.repro import budget
    rows = [{"model": m, "budget_gb": gb, "min_clusters": c * 20 // gb, "speedup": 1.0 + 0.3 * (gb == 16) + 0.05 * i}
            for i, (m, c) in enumerate((("llama2-7b", 8), ("llama2-13b", 16), ("qwen2.5-32b", 48), ("llama2-70b", 96)))
            for gb in (12, 16, 20, 32, 64)]
    budget._figure(rows, out / "budget.png")


def _sensitivity(out: Path) -> None:
    from ratrain.repro import sensitivity
    from ratrain.repro.experiment import DEFAULT_SETTINGS
    ns = (256, 512, 768, 1024)
    sweep = [{"link_latency_ms": lat, "efficiency": {n: 1 - lat * (n / 256 - 1) / 30 for n in ns}}
             for lat in (0.0, 0.1, 0.3, 1.0, 3.0)]
    tails = [{"partition": part, "link_gb_per_s": gbs,
              "tail_amplification": {"no-update-prefetch": 1.5 + 4 / gbs + (part == "uniform"),
                                     "no-layerwise": 2.5 + 8 / gbs + (part == "uniform")}}
             for part in sensitivity.PARTITIONS for gbs in (2, 4, 8, 16, 32)]
    rows = [{"finding": "table6-link-latency", "sweep": sweep, "efficiency": {n: 1 - 0.02 * (n / 256 - 1) for n in ns},
             "fitted_link_latency_ms": 0.61},
            {"finding": "ablation-tails", "sweep": tails}]
    sensitivity._figure(rows, DEFAULT_SETTINGS, out / "sensitivity.png")


def _ranking(out: Path) -> None:
    from ratrain.repro import ranking
    rows = []
    for i, (model, clusters) in enumerate((("llama2-7b", 256), ("llama2-13b", 256), ("qwen2.5-32b", 256),
                                           ("qwen2.5-32b", 512), ("llama2-70b", 1024))):
        pts = [{"simulated_ms": 1e5 * (1 + i) * (1 + j / 10), "predicted_ms": 1e5 * (1 + i) * (1 + j / 10) * 0.98,
                "activation": ("fsr", "ckpt", "full")[j % 3]} for j in range(12)]
        rows.append({"model": model, "clusters": clusters, "kendall_tau": 0.93, "top1_regret_pct": 0.4, "points": pts})
    ranking.ranking_figure(rows, out / "ranking.png")


def _cross_platform(out: Path) -> None:
    from ratrain.repro import cross_platform
    names = ["mt3000-30gbps", "dgx-a100", "rtx4090-pcie"]
    methods = [m for m in cross_platform.PLANNER_METHODS if m != "ratrain"]
    rows = [{"platform": p, "model": m, "method": method,
             "slowdown_vs_ratrain": None if method == "full-save" else 0.8 + 0.3 * j + 0.2 * i}
            for i, p in enumerate(names) for m in cross_platform.MODELS for j, method in enumerate(methods)]
    cross_platform._figure(rows, names, out / "cross_platform_slowdown.png")


def _stragglers(out: Path) -> None:
    from ratrain.repro import stragglers
    from ratrain.repro import targets as paper
    rows = [{"model": m, "clusters": c, "paper_efficiency": e, "efficiency_without": 0.999 - 0.0005 * i,
             "efficiency": e + 0.002 * (k - 0.5), "cv": 0.0123 * (k + 1)}
            for k, m in enumerate(stragglers.MODELS) for i, (c, *_x, e) in enumerate(paper.TABLE6)]
    stragglers._figure(rows, out / "stragglers.png")


def _schedule_rows() -> list[dict]:
    layouts = (("llama2-13b", 2, 128), ("llama2-13b", 4, 64), ("qwen2.5-32b", 8, 32), ("qwen2.5-32b", 16, 16),
               ("llama2-70b", 16, 16), ("llama2-70b", 48, 2))
    return [{"model": m, "pp": p, "dp": d, "schedule": name, "vs_1f1b": None if name == "zb-h1" and p == 48 else
             1.0 - 0.03 * j, "gain": 1.2 + 0.1 * j, "max_peak_gb": 12.0 + j + p / 8}
            for m, p, d in layouts for j, name in enumerate(("1f1b", "gpipe", "interleaved", "zb-h1"))]


def _schedules_steps(out: Path) -> None:
    from ratrain.repro import schedules
    schedules._steps_figure(_schedule_rows(), out / "schedules_steps.png")


def _schedules_memory(out: Path) -> None:
    from ratrain.repro import schedules
    schedules._memory_figure(_schedule_rows(), out / "schedules_memory.png", 20.0)


def _validation(out: Path) -> None:
    from ratrain.repro.measured import Validation, plot_validation
    runs = [{"gpus": g, "measured_ms": ms, "predicted_ms": ms * (1 + 0.08 * math.sin(i))}
            for i, (g, ms) in enumerate((g, 50 * 1.15 ** k) for g in (2, 4, 8, 16) for k in range(40))]
    summary = {"platform": "a100-measured-cluster", "runs": len(runs), "mean_abs_error": 0.051, "max_abs_error": 0.08}
    plot_validation(Validation(runs, summary, [], []), out / "validation.png")


def _time_to_train(out: Path) -> None:
    from ratrain.plan.time_to_train import plot_time_to_train_vs_clusters
    plot_time_to_train_vs_clusters([(2 ** k, 4000 / 2 ** k * (1 + 0.01 * k)) for k in range(4, 12)], out / "ttt.png")


def _task_scheme(platform: str, devices: int, late: bool = False) -> dict:
    return {"platform": platform, "devices": devices, "reserve_days": 2.0, "base_days": 9.5 * 8 / devices,
            "save_and_recovery_days": 0.2, "completion_days": 11.7 * 8 / devices + (30 if late else 0),
            "meets_deadline": not late}


def _task_completion(out: Path) -> None:
    from ratrain.plan import task_figures
    task_figures.completion_figure([_task_scheme("dgx-a100", 8), _task_scheme("dgx-a100", 16),
                                    _task_scheme("dgx-h100", 8, late=True)], 20.0, out / "completion.png")


def _task_resources(out: Path) -> None:
    from ratrain.plan import task_figures
    shares = {"compute": 0.69, "memory": 0.30, "intra_link": 0.10, "inter_link": 0.0, "input": 0.0}
    rows = [{"resource": name, "share": f, "ratios": [{"r": r, "amdahl": 1 - f + f / r, "simulated": 1 - f + f / r}
                                                      for r in (0.5, 2.0, 10.0)]} for name, f in shares.items()]
    task_figures.resource_figure({"rows": rows}, "dgx-a100 x 8", out / "resources.png")


def _task_scaling(out: Path) -> None:
    from ratrain.plan import task_figures
    rows = [{"devices": 2 ** k, "weak": {"completion_days": 3.1 / 2 ** (k / 2)},
             "strong": {"completion_days": 3.1 / 2 ** (k * 0.8) if k < 9 else None}} for k in range(1, 12)]
    task_figures.scaling_figure(rows, 306.18, out / "scaling.png")


def _task_intervals(out: Path) -> None:
    from ratrain.plan import task_figures
    rows = [{"interval_s": t, "sync": {"total": 60 / t + t / 45e6}, "sync_exact_total": 60 / t + t / 44e6,
             "async": {"total": 6 / t + t / 45e6}} for t in (13e3 * 2 ** (k / 2) for k in range(9))]
    task_figures.interval_figure({"rows": rows, "young_s": 51961.5, "daly_s": 51921.5, "exact_optimum_s": 51921.5},
                                 out / "intervals.png")


def _task_boundary(out: Path) -> None:
    from ratrain.plan import task_figures
    rows = [{"parameters": 1e9 * 2 ** k, "devices": {"dgx-a100": 2 ** k, "dgx-h100": max(1, 2 ** k // 3)}}
            for k in range(10)]
    task_figures.boundary_figure(rows, 1e10, 0.4, 18.0, out / "boundary.png")


def _correctness(out: Path) -> None:
    from ratrain.replay.correctness import CorrectnessConfig, CorrectnessResult, render_plot
    base = [4.6 * math.exp(-k / 15) + 1.0 for k in range(40)]
    rat = [v * (1 + 1e-4 * math.sin(k)) for k, v in enumerate(base)]
    rel = [abs(a - b) / b for a, b in zip(rat, base, strict=True)]
    result = CorrectnessResult(CorrectnessConfig(), base, rat, base, rel, [0.0] * 40,
                               reordered_loss=[v * (1 + 5e-5 * math.cos(k)) for k, v in enumerate(base)])
    (out / "correctness.png").write_bytes(render_plot(result))


def _tune_heatmap(out: Path) -> None:
    from mtemu.calibrate import A_RESIDENT_GRID
    from mtemu.tune import Candidate, TuneResult, _heatmap
    grid = {"mg": A_RESIDENT_GRID["mg"], "n2": A_RESIDENT_GRID["n2"]}

    def cand(mg, n2, u, emulated=True):
        return Candidate({"mg": mg, "n2": n2, "kg": 768}, True, utilization=u if emulated else None,
                         bound_utilization=None if emulated else u)
    emulated = [cand(mg, n2, 0.6 + mg / 8192 + n2 / 1e4) for mg in (512, 768, 1024) for n2 in (384, 768)]
    screened = [cand(mg, n2, 0.5 + mg / 8192, False) for mg in (256, 384, 1536) for n2 in (384, 768, 1152)]
    result = TuneResult("gemm", (2048, 4096, 4096), emulated[0], emulated, [], screened=screened,
                        loop_order="a-resident")
    _heatmap(result, out / "gemm_heatmap.png", None, ("mg", "n2"), grid)


def _calibration_study(out: Path) -> None:
    from mtemu.calibrate import SHAPES, StudyRow, Table5Fit, plot_study
    from mtemu.kernels.gemm import GemmTiles
    from mtemu.kernels.gemm_a_resident import AResidentGemmTiles

    def fit(strategy, gb, err, tiles=None, source="bound"):
        return Table5Fit(strategy, gb * 1e9, tiles or GemmTiles(), 1.1, tuple(SHAPES[:2]),
                         tuple(65.0 + err * (i - 2) for i in range(5)), source)
    rows = [StudyRow(gb * 1e9, fit("fixed", gb, 2.5 - gb / 30), fit("protocol", gb, 2 - gb / 30),
                     fit("oracle", gb, 1.5 - gb / 40), fit("a-resident", gb, 3 - gb / 25, AResidentGemmTiles()))
            for gb in (30, 36, 41, 46, 51)]
    plot_study(rows, str(out / "table5_study.png"), [fit("oracle", 30, 1.2, source="emulated"),
                                                     fit("raw-ddr", 51, 0.8, AResidentGemmTiles(), "emulated")])


def _roofline(out: Path) -> None:
    from mtemu.explain import Explanation, plot_roofline
    ex = Explanation(cycles=10 ** 7, dsps=24, clock_hz=1.5e9, bounds=[], stall_share={}, group_share={}, server_busy={},
                     binding="ddr", verdict="", macs=2048 * 4096 * 4096, mac_per_s=2.1e12, peak_mac_per_s=3.2e12,
                     ddr_bytes=2 * 10 ** 9, gsm_bytes=6 * 10 ** 9, ddr_bandwidth=30e9, gsm_bandwidth=300e9)
    plot_roofline(ex, out / "roofline.png", "GEMM 2048x4096x4096: bound by ddr")


# module:function that draws -> what draws it here
FIGURES: dict[str, Callable[[Path], None]] = {
    "ratrain.sim.plots:plot_timeline": _reproduction_timelines,
    "ratrain.sim.plots:plot_stage_memory": _stage_memory,
    "ratrain.repro.figures:bar_comparison": _table2,
    "ratrain.repro.figures:stage_memory_figure": _table3,
    "ratrain.repro.figures:table5_figure": _table5,
    "ratrain.repro.figures:scaleout_figure": _table6,
    "ratrain.repro.figures:ablation_figure": _ablation,
    "ratrain.repro.figures:attention_figure": _attention,
    "ratrain.repro.fig9:figure": _fig9,
    "ratrain.repro.platforms:_figure": _platforms,
    "ratrain.repro.budget:_figure": _budget,
    "ratrain.repro.sensitivity:_figure": _sensitivity,
    "ratrain.repro.ranking:ranking_figure": _ranking,
    "ratrain.repro.cross_platform:_figure": _cross_platform,
    "ratrain.repro.stragglers:_figure": _stragglers,
    "ratrain.repro.schedules:_steps_figure": _schedules_steps,
    "ratrain.repro.schedules:_memory_figure": _schedules_memory,
    "ratrain.repro.measured:plot_validation": _validation,
    "ratrain.plan.time_to_train:plot_time_to_train_vs_clusters": _time_to_train,
    "ratrain.plan.task_figures:completion_figure": _task_completion,
    "ratrain.plan.task_figures:resource_figure": _task_resources,
    "ratrain.plan.task_figures:scaling_figure": _task_scaling,
    "ratrain.plan.task_figures:interval_figure": _task_intervals,
    "ratrain.plan.task_figures:boundary_figure": _task_boundary,
    "ratrain.replay.correctness:render_plot": _correctness,
    "mtemu.tune:_heatmap": _tune_heatmap,
    "mtemu.calibrate:plot_study": _calibration_study,
    "mtemu.explain:plot_roofline": _roofline,
}
# drawn again from other inputs: the unwindowed step of `ratrain simulate --plot`
EXTRA = {"ratrain simulate --plot": _simulate_plot}
# slow to draw (many boxes), or the quick layer's costliest (0.4 s and more each): checked in the full suite
# (CI) only; the quick layer keeps the cheaper ones, of every package
SLOW = {"ratrain.sim.plots:plot_timeline", "ratrain simulate --plot",
        "ratrain.repro.figures:stage_memory_figure", "ratrain.repro.ranking:ranking_figure",
        "ratrain.repro.cross_platform:_figure", "mtemu.calibrate:plot_study", "ratrain.repro.sensitivity:_figure",
        "ratrain.repro.platforms:_figure", "ratrain.repro.figures:table5_figure",
        "ratrain.repro.measured:plot_validation",
        "mtemu.explain:plot_roofline", "ratrain.repro.budget:_figure", "ratrain.repro.fig9:figure",
        "ratrain.repro.schedules:_steps_figure", "ratrain.repro.schedules:_memory_figure",
        "ratrain.plan.task_figures:boundary_figure", "ratrain.repro.figures:ablation_figure"}


def _figure_makers() -> set[str]:
    """module:function of every function in the packages that makes a figure."""
    makers = set()
    for package in ("ratrain", "mtemu", "rtcommon"):
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            if not any(word in source for word in ("subplots", "figure(", "Figure(", "subplot_mosaic")):
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for fn in ast.walk(ast.parse(source, str(path))):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.Call):
                        f = node.func       # plt.subplots, plt.figure, figstyle's subplots, Figure
                        if (isinstance(f, ast.Attribute) and f.attr in ("subplots", "figure", "subplot_mosaic")) \
                                or (isinstance(f, ast.Name) and f.id in ("subplots", "Figure")):
                            makers.add(f"{module}:{fn.name}")
    return makers


def test_every_figure_maker_is_listed():
    makers = _figure_makers() - HELPERS
    assert makers - set(FIGURES) == set(), "draws a figure this test does not check: add it to FIGURES"
    assert set(FIGURES) - makers == set(), "listed in FIGURES but draws nothing (renamed?)"


def draw(build: Callable[[Path], None], out: Path) -> list[tuple[str, object, dict]]:
    """Run ``build``; every figure it writes as (file name, figure, savefig keywords), written nowhere."""
    seen: list[list] = []
    real_savefig, real_write = matplotlib.figure.Figure.savefig, rtcommon.fileio.atomic_write_bytes

    def savefig(fig, fname, **kwargs):
        seen.append(["", fig, kwargs])

    def write(path, data):
        unnamed = [s for s in seen if not s[0]]
        if unnamed:
            unnamed[-1][0] = Path(path).name

    matplotlib.figure.Figure.savefig, rtcommon.fileio.atomic_write_bytes = savefig, write
    try:
        build(out)
    finally:
        matplotlib.figure.Figure.savefig, rtcommon.fileio.atomic_write_bytes = real_savefig, real_write
    return [(name or "(bytes)", fig, kwargs) for name, fig, kwargs in seen]


def _params():
    for key, build in {**FIGURES, **EXTRA}.items():
        yield pytest.param(build, id=key, marks=[pytest.mark.slow] if key in SLOW else [])


@pytest.mark.parametrize("build", _params())
def test_figure_reads(build, tmp_path):
    drawn = draw(build, tmp_path)
    assert drawn, "drew no figure"
    problems = [f"{name}: {finding}" for name, fig, kwargs in drawn for finding in check_figure(fig, kwargs)]
    assert problems == [], "\n".join(problems)


def test_a_figure_that_does_not_read_is_caught_by_name(tmp_path):
    """The capture sees a figure written the project's way, under its file name, and the check fails it."""
    def crowded(out: Path) -> None:
        fig, ax = matplotlib.pyplot.subplots(figsize=(3, 2))
        ax.plot([0, 1], [0, 1], label="a line under the legend")
        ax.legend(loc="center")
        ax.text(0.1, 0.8, "one note")
        ax.text(0.15, 0.8, "another note")
        rtcommon.fileio.atomic_write_figure(out / "crowded.png", fig)
    ((name, fig, kwargs),) = draw(crowded, tmp_path)
    kinds = {f.kind for f in check_figure(fig, kwargs)}
    assert name == "crowded.png" and {"overlap", "legend over data"} <= kinds
    assert not (tmp_path / "crowded.png").exists() or (tmp_path / "crowded.png").stat().st_size == 0

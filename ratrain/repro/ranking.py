"""Does the planner rank right (`ratrain reproduce ranking`)?

Table 4 reports how far the planner's step time is from the measurement for the one
configuration it picks. This study asks whether it picks the right one. For every Table 3 and
Table 4 case it takes RATrain's search space (``Settings.ratrain_tp_degrees``,
``ratrain_zero_stages``, b = ``Settings.micro_batch``), keeps every memory-feasible configuration
(a fixed-seed sample of ``Settings.ranking_max_configs`` when there are more, always including
the planner's pick), and simulates each one with the event simulator. It then compares the
planner's order with the simulator's:

- Kendall tau-b of predicted vs simulated step times (ties counted as tau-b counts them),
- top-1 regret: how much slower the planner's pick simulates than the simulator's best (%),
- top-5 overlap: the share of the simulator's five fastest that are among the planner's five.

Both sides use the same latencies: ``Planner.plan`` ranks on the fast kernel model and confirms
every candidate on the emulated profile (at b = 1, T = 1 the two are the same profile), and the
simulator gets ``pipeline_costs`` from that same emulated profile. So the comparison isolates
the analytic model (``ratrain.plan.estimator.step_breakdown``) from the event simulation.

Where a pair is ordered wrongly, the study splits both sides' step into the main path (to the
end of the last backward) and the exposed tail (state tasks after it) and names the term whose
error difference flips the pair.

Long steps are simulated at three short micro-batch counts and extrapolated (``simulate_step``):
once the 1F1B pipeline is in steady state each further micro-batch adds the same slot, and the
third point checks that; if it does not hold, the full step is simulated.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import multiprocessing
import random
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ratrain.cost.terms import pipeline_costs
from ratrain.plan.planner import Candidate
from ratrain.repro import targets as paper
from ratrain.repro.experiment import DEFAULT_SETTINGS, Check, Experiment, Settings, format_table
from ratrain.repro.figures import plt, save_figure
from ratrain.sim.simulator import Mechanisms, simulate_step_time
from ratrain.spec.models import ModelSpec, get_model
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import TrainingPlatform
from rtcommon.progress import Progress

# the study's own targets (not the paper's: the paper does not report ranking quality)
MIN_TAU = 0.9
MAX_REGRET_PCT = 1.0
TOP_K = 5

# steady-state extrapolation: points at A1 = P + LEAD, A1 + STRIDE, A1 + 2 STRIDE; the third
# must lie on the line through the first two within EXTRAPOLATION_RTOL, else simulate all of A
EXTRAPOLATION_LEAD = 4
EXTRAPOLATION_STRIDE = 4
EXTRAPOLATION_RTOL = 1e-9

TERMS = ("main path", "exposed tail")


# ---------------------------------------------------------------- ranking measures

def _sign(a: float, b: float) -> int:
    return (a > b) - (a < b)


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b of two equally long sequences (exact float ties; nan if either is constant).

    tau_b = (concordant - discordant) / sqrt(pairs untied in x * pairs untied in y); a pair tied
    in x or in y is neither concordant nor discordant."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b: sequences differ in length ({len(x)} vs {len(y)})")
    concordant = discordant = untied_x = untied_y = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        sx, sy = _sign(x[i], x[j]), _sign(y[i], y[j])
        untied_x += sx != 0
        untied_y += sy != 0
        concordant += sx * sy > 0
        discordant += sx * sy < 0
    if not untied_x or not untied_y:
        return math.nan
    return (concordant - discordant) / math.sqrt(untied_x * untied_y)


def top1_regret_pct(simulated: list[float], pick: int = 0) -> float:
    """How much slower (%) the configuration at ``pick`` simulates than the fastest one."""
    best = min(simulated)
    return 100.0 * (simulated[pick] / best - 1.0)


def top_k(values: list[float], k: int) -> list[int]:
    """Indices of the k smallest values; ties go to the lower index (the planner's order)."""
    return sorted(range(len(values)), key=lambda i: (values[i], i))[:k]


def topk_overlap(predicted: list[float], simulated: list[float], k: int = TOP_K) -> float:
    """|top-k by prediction ∩ top-k by simulation| / min(k, n), ties broken by position."""
    n = min(k, len(predicted))
    if n == 0:
        return math.nan
    return len(set(top_k(predicted, n)) & set(top_k(simulated, n))) / n


# ---------------------------------------------------------------- simulated step

@dataclass
class SimulatedStep:
    step_ms: float
    main_ms: float          # end of the step's last backward
    tail_ms: float          # exposed tail (step - main)
    extrapolated: bool      # from three short runs (steady state checked), not one run of all A


def _run(model: ModelSpec, cfg: ParallelConfig, profile, platform: TrainingPlatform, mech: Mechanisms,
         recovery_resource: str) -> tuple[float, float]:
    # the step time and main-path end only: simulate's own numbers, without its task records
    return simulate_step_time(pipeline_costs(model, cfg, profile, platform, recovery_resource=recovery_resource),
                              mechanisms=mech)


def simulate_step(model: ModelSpec, cfg: ParallelConfig, profile, platform: TrainingPlatform,
                  mech: Mechanisms, recovery_resource: str = "compute") -> SimulatedStep:
    """The event simulator's step time of ``cfg`` (``simulate`` on ``pipeline_costs``).

    If three short runs (A1 = P + LEAD, A1 + STRIDE, A1 + 2 STRIDE micro-batches) cost fewer
    micro-batches than one run of A, the step is extrapolated from the first two; the third
    must agree within EXTRAPOLATION_RTOL (step and main path), otherwise all A are simulated.
    Why it holds: in 1F1B's steady state every further micro-batch adds one slot to the main
    path, and the state tasks after the last backward do not depend on A."""
    a1 = cfg.pp + EXTRAPOLATION_LEAD
    points = (a1, a1 + EXTRAPOLATION_STRIDE, a1 + 2 * EXTRAPOLATION_STRIDE)
    if sum(points) < cfg.accum:
        runs = [_run(model, dataclasses.replace(cfg, accum=a), profile, platform, mech, recovery_resource)
                for a in points]
        lines = []
        for v in range(2):      # step, main path
            slope = (runs[1][v] - runs[0][v]) / EXTRAPOLATION_STRIDE
            check = runs[0][v] + slope * 2 * EXTRAPOLATION_STRIDE
            lines.append((runs[0][v] + slope * (cfg.accum - a1),
                          abs(check - runs[2][v]) <= EXTRAPOLATION_RTOL * runs[2][v]))
        if all(ok for _, ok in lines):
            step, main = lines[0][0], lines[1][0]
            return SimulatedStep(step, main, step - main, True)
    step, main = _run(model, cfg, profile, platform, mech, recovery_resource)
    return SimulatedStep(step, main, step - main, False)


def _simulate_job(job: tuple) -> SimulatedStep:
    return simulate_step(*job)


def _job_size(job: tuple) -> int:
    """Micro-batch-layers the job simulates (what its run time scales with)."""
    model, cfg = job[0], job[1]
    a1 = cfg.pp + EXTRAPOLATION_LEAD
    return model.layers * min(cfg.accum, 3 * a1 + 3 * EXTRAPOLATION_STRIDE)


def _spawn_pool(workers: int) -> ProcessPoolExecutor:
    # spawn, not fork: the parent may hold Numba's worker threads (the kernel experiments ran first),
    # and forking a threaded process is unsafe; the workers only simulate and never load Numba
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def _simulate_all(jobs: list[tuple], workers: int, progress: Progress,
                  pool: ProcessPoolExecutor | None = None) -> list[SimulatedStep]:
    """``simulate_step`` of every job, on ``workers`` processes (largest first) when > 1; ``pool``
    (the study's, started once for every case) is used when given."""
    if workers <= 1 or len(jobs) <= 1:
        return [simulate_step(*job) for job in jobs]
    if pool is None:
        with _spawn_pool(workers) as own:
            return _simulate_all(jobs, workers, progress, own)
    order = sorted(range(len(jobs)), key=lambda i: -_job_size(jobs[i]))
    out: list[SimulatedStep | None] = [None] * len(jobs)
    for n, (i, got) in enumerate(zip(order, pool.map(_simulate_job, [jobs[i] for i in order]), strict=True)):
        out[i] = got
        if (n + 1) % 10 == 0:
            progress(f"Ranking: {n + 1}/{len(jobs)} simulated")
    return out


# ---------------------------------------------------------------- one case

def _cases(s: Settings) -> list[tuple[str, str, int, int]]:
    """(source, model, clusters, global batch): Table 3's minimum footprints, Table 4's scales."""
    return ([("table3", m, n, gb) for m, n, *_rest, gb in paper.TABLE3]
            + [("table4", m, n, s.table4_global_batch) for m, n, *_rest in paper.TABLE4])


def _sample(ranked: list[Candidate], s: Settings) -> tuple[list[Candidate], bool]:
    """All candidates, or the planner's pick plus a fixed-seed sample (planner order kept)."""
    if len(ranked) <= s.ranking_max_configs:
        return ranked, False
    rest = random.Random(s.ranking_seed).sample(range(1, len(ranked)), s.ranking_max_configs - 1)
    return [ranked[0]] + [ranked[i] for i in sorted(rest)], True


def _discordant_terms(points: list[dict]) -> dict[str, int]:
    """Per analytic term, the discordant pairs whose ordering error it carries most of.

    For a pair ordered one way by prediction and the other by simulation, the gap
    (pred_i - pred_j) - (sim_i - sim_j) is the sum of each term's error difference; the term
    whose error difference has the flipping sign and the largest size is charged."""
    counts = dict.fromkeys(TERMS, 0)
    for a, b in itertools.combinations(points, 2):
        sp = _sign(a["predicted_ms"], b["predicted_ms"])
        ss = _sign(a["simulated_ms"], b["simulated_ms"])
        if sp * ss >= 0:
            continue
        diffs = {"main path": (a["predicted_main_ms"] - a["simulated_main_ms"])
                 - (b["predicted_main_ms"] - b["simulated_main_ms"]),
                 "exposed tail": (a["predicted_tail_ms"] - a["simulated_tail_ms"])
                 - (b["predicted_tail_ms"] - b["simulated_tail_ms"])}
        # the prediction's gap has sign sp where the simulation's has -sp: errors of sign sp flipped it
        counts[max(TERMS, key=lambda t: sp * diffs[t])] += 1
    return counts


def _spread_pct(points: list[dict], key: str) -> float:
    """max - min over configurations of (predicted - simulated) term / simulated step, in %."""
    errs = [100.0 * (p[f"predicted_{key}_ms"] - p[f"simulated_{key}_ms"]) / p["simulated_ms"] for p in points]
    return max(errs) - min(errs)


def case_ranking(model_name: str, clusters: int, global_batch: int, s: Settings = DEFAULT_SETTINGS,
                 progress: Progress | None = None, source: str = "", pool: ProcessPoolExecutor | None = None) -> dict:
    """One row: the planner's order of RATrain's feasible space against the simulator's."""
    progress = progress or (lambda msg: None)
    t0 = time.perf_counter()
    model = get_model(model_name)
    planner = s.planner(model, progress=False)
    # every feasible candidate, each confirmed on the simulator's (emulated) profile, in the planner's order
    res = planner.plan(clusters, global_batch, s.seq, "ratrain", top=10**9, micro_batches=(s.micro_batch,),
                       tp_degrees=s.ratrain_tp_degrees, zero_stages=s.ratrain_zero_stages, confirm=10**9)
    ranked, sampled = _sample(res.ranked, s)
    progress(f"Ranking: {model_name} on {clusters} clusters: simulating {len(ranked)} of {res.timed} "
             "feasible configurations")
    # identical simulator inputs (e.g. Z = 0/1/2 at D = 1) are simulated once
    unique: list[tuple] = []        # (costs, mechanisms, job)
    which: list[int] = []
    for cand in ranked:
        cfg = cand.config
        mech = s.mechanisms("ratrain", cfg)
        prof = planner.profile(cfg.micro_batch, cfg.seq, cfg.tp)
        costs = pipeline_costs(model, cfg, prof, s.platform, recovery_resource=s.recovery_resource)
        k = next((i for i, (c, m, _) in enumerate(unique) if m == mech and c == costs), None)
        if k is None:
            k = len(unique)
            unique.append((costs, mech, (model, cfg, prof, s.platform, mech, s.recovery_resource)))
        which.append(k)
    steps = _simulate_all([job for _, _, job in unique], s.ranking_workers, progress, pool)
    points: list[dict] = []
    for cand, k in zip(ranked, which, strict=True):
        cfg, got, bd = cand.config, steps[k], cand.breakdown
        points.append({"config": cfg.describe(verbose=True), "pp": cfg.pp, "dp": cfg.dp, "zero": cfg.zero,
                       "accum": cfg.accum, "activation": cfg.activation, "prefetch": cfg.prefetch,
                       "kernels": cand.kernels, "predicted_ms": cand.step_ms,
                       "predicted_main_ms": bd.t_1f1b_ms + bd.e_rec_ms, "predicted_tail_ms": bd.exposed_tail_ms,
                       "simulated_ms": got.step_ms, "simulated_main_ms": got.main_ms,
                       "simulated_tail_ms": got.tail_ms, "extrapolated": got.extrapolated})
    pred = [p["predicted_ms"] for p in points]
    sim = [p["simulated_ms"] for p in points]
    best = top_k(sim, 1)[0]
    errors = [abs(p - q) / q for p, q in zip(pred, sim, strict=True)]
    by_term = _discordant_terms(points)
    return {"source": source, "model": model_name, "clusters": clusters, "global_batch": global_batch,
            "feasible": res.timed, "configs": len(points), "sampled": sampled,
            "kendall_tau": kendall_tau_b(pred, sim), "top1_regret_pct": top1_regret_pct(sim, 0),
            "top5_overlap": topk_overlap(pred, sim, TOP_K),
            "planner_pick": points[0]["config"], "simulator_best": points[best]["config"],
            "pick_simulated_s": sim[0] / 1e3, "best_simulated_s": sim[best] / 1e3,
            "discordant_pairs": sum(by_term.values()), "discordant_by_term": by_term,
            "main_error_spread_pct": _spread_pct(points, "main"), "tail_error_spread_pct": _spread_pct(points, "tail"),
            "max_abs_error_pct": 100.0 * max(errors), "simulations": len(steps),
            "extrapolated": sum(x.extrapolated for x in steps),
            "seconds": time.perf_counter() - t0, "points": points}


# ---------------------------------------------------------------- the experiment

def ranking_rows(s: Settings = DEFAULT_SETTINGS, progress: Progress | None = None) -> list[dict]:
    if s.ranking_workers <= 1:
        return [case_ranking(m, n, gb, s, progress, src) for src, m, n, gb in _cases(s)]
    with _spawn_pool(s.ranking_workers) as pool:       # one pool for every case: spawning costs imports
        return [case_ranking(m, n, gb, s, progress, src, pool) for src, m, n, gb in _cases(s)]


def run_ranking(out: Path, progress: Progress, s: Settings = DEFAULT_SETTINGS) -> Experiment:
    rows = ranking_rows(s, progress)
    checks = []
    for r in rows:
        label = f"{r['model']} @{r['clusters']} ({r['configs']} configs)"
        checks.append(Check(f"{label}: Kendall tau", r["kendall_tau"], None, f">= {MIN_TAU}",
                            r["kendall_tau"] >= MIN_TAU, "ranking target"))
        worst = max(r["discordant_by_term"], key=r["discordant_by_term"].get) if r["discordant_pairs"] else ""
        checks.append(Check(f"{label}: top-1 regret %", r["top1_regret_pct"], None, f"<= {MAX_REGRET_PCT}",
                            r["top1_regret_pct"] <= MAX_REGRET_PCT,
                            f"discordant pairs mostly from the {worst}" if worst else "no discordant pair"))
    fig = out / "ranking.png"
    ranking_figure(rows, fig)
    text = format_table(rows, ["model", "clusters", "configs", "sampled", "kendall_tau", "top1_regret_pct",
                               "top5_overlap", "planner_pick", "simulator_best", "discordant_pairs",
                               "main_error_spread_pct", "tail_error_spread_pct", "max_abs_error_pct", "seconds"])
    total = sum(r["seconds"] for r in rows)
    notes = [f"Space per case: RATrain's (T in {list(s.ratrain_tp_degrees)}, Z in {list(s.ratrain_zero_stages)}, "
             f"b = {s.micro_batch}, activation full/ckpt/fsr, prefetch layerwise/bulk), every memory-feasible "
             f"configuration; a fixed-seed (seed {s.ranking_seed}) sample of {s.ranking_max_configs} where there "
             "are more ('sampled'). Table 3 cases at the paper's minimum cluster count and global batch, Table 4 "
             f"cases at global batch {s.table4_global_batch}.",
             "Planner and simulator see the same emulated latencies (the planner's fast model equals the emulated "
             "profile at b = 1, T = 1, and every candidate is confirmed on it), so the study measures the analytic "
             "model against the event simulation only.",
             "Ties: tau-b on exact float equality (configurations with identical costs, e.g. Z = 0/1/2 at D = 1, "
             "simulate identically and are tied on both sides); top-5 ties are broken by the planner's order.",
             f"Steps with many micro-batches are simulated at A = P+{EXTRAPOLATION_LEAD}, "
             f"P+{EXTRAPOLATION_LEAD + EXTRAPOLATION_STRIDE} and P+{EXTRAPOLATION_LEAD + 2 * EXTRAPOLATION_STRIDE} "
             "and extrapolated to A (the third point must lie on the line within 1e-9, else the full A is "
             f"simulated): {sum(r['extrapolated'] for r in rows)} of {sum(r['simulations'] for r in rows)} "
             "simulations. Identical inputs are simulated once.",
             "Error spread: max - min over a case's configurations of (predicted - simulated) main path (or tail) "
             "as a share of the simulated step. A uniform error does not reorder anything; the spread does.",
             f"Study time {total:.0f} s."]
    return Experiment("ranking", "Planner ranking: does the analytic model order configurations as the simulator "
                      "does", rows, checks, [str(fig)], text, notes)


def ranking_figure(rows: list[dict], path: Path) -> None:
    """Predicted vs simulated step per case, the planner's pick and the simulator's best marked."""
    cols = min(4, len(rows))
    nrows = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 3.4 * nrows), squeeze=False)
    colors = {"full": "#2ca02c", "ckpt": "#ff7f0e", "fsr": "#1f77b4"}
    for ax, r in zip(axes.flat, rows, strict=False):
        pts = r["points"]
        for act, color in colors.items():
            sel = [p for p in pts if p["activation"] == act]
            if sel or ax is axes.flat[0]:       # the first panel's legend names every policy
                ax.scatter([p["simulated_ms"] / 1e3 for p in sel], [p["predicted_ms"] / 1e3 for p in sel], s=14,
                           color=color, alpha=0.7, label=act)
        lo = min(min(p["simulated_ms"], p["predicted_ms"]) for p in pts) / 1e3
        hi = max(max(p["simulated_ms"], p["predicted_ms"]) for p in pts) / 1e3
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls=":")
        pick = pts[0]
        best = min(pts, key=lambda p: p["simulated_ms"])
        ax.scatter([pick["simulated_ms"] / 1e3], [pick["predicted_ms"] / 1e3], s=90, facecolors="none",
                   edgecolors="red", lw=1.5, label="planner's pick")
        ax.scatter([best["simulated_ms"] / 1e3], [best["predicted_ms"] / 1e3], s=60, marker="x", color="k",
                   label="simulator's best")
        ax.set_title(f"{r['model']} @{r['clusters']}: tau {r['kendall_tau']:.3f}, "
                     f"regret {r['top1_regret_pct']:.2f} %", fontsize=8)
        ax.set_xlabel("simulated step (s)", fontsize=8)
        ax.set_ylabel("planner's estimate (s)", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(rows):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()     # below the panels: off every panel's points
    fig.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels),
               frameon=False)
    fig.suptitle("Planner ranking: every memory-feasible configuration, estimate vs simulation")
    save_figure(fig, path)

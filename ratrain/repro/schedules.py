"""`ratrain reproduce schedules`: RATrain's layouts under other pipeline schedules.

For the paper's Table 2 (RATrain rows) and Table 3 layouts, every schedule of
``ratrain.sim.pipeline_order`` (1F1B, GPipe, Megatron's interleaved 1F1B with v
chunks per stage, the zero-bubble paper's ZB-H1) is simulated twice on the
training platform of ``Settings`` (MT-3000, 3.7 GB/s links): with RATrain's
mechanisms (layer-wise lifecycle, update-prefetch, FSR) and without them
(Baseline-1F1B's bulk step-end processing and backward-time recompute). Rows
report the step times and the gain, the per-stage idle time, the per-stage peak
memory and the bytes each stage's link carries.

Memory: the simulator's timeline is the reference for activations
(``activation_residency``: checkpoints, full sets, recovery buffers, and under
ZB-H1 what W still reads between B and W); state and buffers come from the
analytic Eq. 9 model of the same layout. The analytic activation term assumes
1F1B's N_act = min(P - p, A); ``in_flight_analytic`` vs ``in_flight_schedule``
(``ratrain.spec.parallel.in_flight_activation_sets``) and the measured
``activation_sets`` show where each schedule departs from it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ratrain.cost.terms import load_profile, pipeline_costs
from ratrain.plan.planner import layout_schedule, simulate_config
from ratrain.repro import targets as paper
from ratrain.repro.experiment import DEFAULT_SETTINGS, Check, Experiment, Settings, format_table
from ratrain.repro.figures import plt, save_figure
from ratrain.sim.pipeline_order import PipelineSchedule
from ratrain.sim.plots import plot_timeline
from ratrain.sim.simulator import Mechanisms, activation_residency, stage_task_counts
from ratrain.sim.weight_split import layer_weight_gradient_bytes
from ratrain.spec.memory import (
    DEFAULT_CONSTANTS,
    GRAD_BYTES,
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
    MemoryConstants,
    stage_memory,
)
from ratrain.spec.models import FP16, ModelSpec, get_model, layer_tp_parameter_count, stage_edge_parameters
from ratrain.spec.parallel import ParallelConfig, in_flight_activation_sets, in_flight_microbatches
from ratrain.spec.platform import GIB
from rtcommon.progress import Progress

# (name, virtual stages): the schedules compared; interleaved with two chunks per stage
SCHEDULE_SET: tuple[tuple[str, int], ...] = (("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb-h1", 1))


def paper_layouts(s: Settings = DEFAULT_SETTINGS) -> list[tuple[str, str, ParallelConfig]]:
    """(source, model, config) of Table 2's RATrain rows and Table 3's layouts (T=1, ZeRO-2, FSR)."""
    out = []
    for model_name, method, P, D, T, Z, act, *_ in paper.TABLE2:
        if method == "ratrain":
            out.append(("table2", model_name,
                        ParallelConfig(pp=P, dp=D, tp=T, zero=Z, micro_batch=s.micro_batch,
                                       accum=paper.TABLE2_GLOBAL_BATCH // (D * s.micro_batch), seq=s.seq,
                                       activation=act)))
    for model_name, _, P, D, A, *_ in paper.TABLE3:
        out.append(("table3", model_name, ParallelConfig(pp=P, dp=D, tp=1, zero=2, micro_batch=s.micro_batch,
                                                         accum=A, seq=s.seq, activation="fsr")))
    return out


def _stage_params(model: ModelSpec, cfg: ParallelConfig, layers: list[int]) -> int:
    emb, head = stage_edge_parameters(model, cfg.pp, cfg.tp)
    return (len(layers) * layer_tp_parameter_count(model, cfg.tp) + (emb if 0 in layers else 0)
            + (head if model.layers - 1 in layers else 0))


def link_bytes(model: ModelSpec, cfg: ParallelConfig, result) -> list[dict]:
    """Per stage, the bytes its link port moves in one step: stage-boundary activations and
    activation gradients (one FP16 b*seq*hidden tensor per Send or Recv in the timeline), the
    GradSync ring (reduce-scatter for ZeRO >= 2, else all-reduce, of the stage's FP16 gradients)
    and the PrefetchW all-gather of the updated FP16 shards (ZeRO 1-2, D > 1). Ring traffic is what
    one rank sends: (D-1)/D of the bytes per pass."""
    act = cfg.micro_batch * cfg.seq * model.hidden * FP16
    D = cfg.dp
    ring = (D - 1) / D if D > 1 else 0.0
    out = []
    counts = stage_task_counts(result, ("Send", "Recv"))
    for p, layers in enumerate(result.stage_layers):
        transfers = counts[p]
        grads = FP16 * _stage_params(model, cfg, layers)
        sync = grads * ring * (1 if cfg.zero >= 2 else 2)
        gather = grads * ring if cfg.zero in (1, 2) else 0.0
        out.append({"boundary": transfers * act, "gradsync": sync, "prefetch": gather,
                    "total": transfers * act + sync + gather})
    return out


def _layer_state_bytes(model: ModelSpec, cfg: ParallelConfig) -> float:
    """State one transformer layer adds to a stage (Eq. 9's state tier, ZeRO-sharded over D)."""
    d, z = cfg.dp, cfg.zero
    per_param = (WEIGHT_BYTES / (d if z >= 3 else 1) + GRAD_BYTES / (d if z >= 2 else 1)
                 + OPTIMIZER_BYTES / (d if z >= 1 else 1))
    return per_param * layer_tp_parameter_count(model, cfg.tp)


def _memory(model: ModelSpec, cfg: ParallelConfig, result, costs, wbytes: list[int],
            constants: MemoryConstants = DEFAULT_CONSTANTS) -> dict:
    """Per-stage peak bytes: Eq. 9's state + buffers of the layout (a stage holding a different layer
    count under interleaving gains or loses one layer's state per layer), plus the simulated activations."""
    analytic = stage_memory(model, cfg, constants=constants)
    per_layer = _layer_state_bytes(model, cfg)
    act = activation_residency(result, costs, weight_grad_bytes=wbytes)
    peaks = [st.state_bytes + (len(layers) - len(st.layers)) * per_layer + st.buffer_bytes + a
             for st, layers, a in zip(analytic, result.stage_layers, act, strict=True)]
    return {"peaks": [round(x) for x in peaks], "activations": act, "analytic": [st.peak_bytes for st in analytic]}


def schedule_rows(s: Settings = DEFAULT_SETTINGS, progress: Progress | None = None,
                  layouts: list[tuple[str, str, ParallelConfig]] | None = None,
                  schedules: tuple[tuple[str, int], ...] = SCHEDULE_SET) -> tuple[list[dict], dict]:
    """One row per (layout, schedule); also the SimChecks of the first layout (for figures)."""
    progress = progress or (lambda msg: None)
    budget = s.platform.memory_budget_bytes
    rows, first = [], {}
    for li, (source, model_name, cfg) in enumerate(layouts or paper_layouts(s)):
        model = get_model(model_name)
        profile = load_profile(model, cfg.micro_batch, cfg.seq, cfg.tp, source=s.profile_source)
        with_mech = s.mechanisms("ratrain", cfg)
        without = Mechanisms.all_off()
        wbytes = layer_weight_gradient_bytes(model, model.layers, cfg.micro_batch, cfg.seq, cfg.tp)
        # the step's costs do not depend on the schedule (zb-h1 takes W's share from them)
        costs = pipeline_costs(model, cfg, profile, s.platform, recovery_resource=s.recovery_resource)
        for name, v in schedules:
            row = {"source": source, "model": model_name, "config": cfg.describe(verbose=True), "schedule": name,
                   "virtual_stages": v, "pp": cfg.pp, "dp": cfg.dp, "accum": cfg.accum}
            if name == "interleaved" and model.layers < cfg.pp * v:
                row["note"] = (f"n/a: {model.layers} layers cannot be cut into P x v = {cfg.pp} x {v} chunks")
                rows.append(row)
                continue
            progress(f"schedules: {model_name} {cfg.describe()} under {name}{f' v={v}' if v > 1 else ''}")
            sched = layout_schedule(PipelineSchedule(name, virtual_stages=v), model, cfg, costs, profile)
            runs = {}
            for key, mech in (("with", with_mech), ("without", without)):
                runs[key] = simulate_config(model, cfg, platform=s.platform, profile=profile,
                                            recovery_resource=s.recovery_resource, mechanisms=mech, schedule=sched)
            res, res0 = runs["with"].result, runs["without"].result
            mem = _memory(model, cfg, res, runs["with"].costs, wbytes, s.memory_constants())
            mem0 = _memory(model, cfg, res0, runs["without"].costs, wbytes, s.memory_constants())
            links = link_bytes(model, cfg, res)
            step, step0 = res.step_time_ms / 1e3, res0.step_time_ms / 1e3
            row.update(
                step_s=step, step_without_s=step0, gain=step0 / step,
                exposed_tail_s=res.exposed_tail_ms / 1e3,
                idle_s=[x / 1e3 for x in res.stage_idle_ms], max_idle_s=max(res.stage_idle_ms) / 1e3,
                peak_gb=[x / GIB for x in mem["peaks"]], max_peak_gb=max(mem["peaks"]) / GIB,
                fits=max(mem["peaks"]) <= budget,
                peak_without_gb=max(mem0["peaks"]) / GIB,
                activation_gb=[x / GIB for x in mem["activations"]],
                analytic_peak_gb=max(mem["analytic"]) / GIB,
                in_flight_analytic=[in_flight_microbatches(p, cfg.pp, cfg.accum) for p in range(cfg.pp)],
                in_flight_schedule=[in_flight_activation_sets(name, p, cfg.pp, cfg.accum, v)
                                    for p in range(cfg.pp)],
                activation_sets=res.peak_activation_sets,
                link_gb=[x["total"] / GIB for x in links], max_link_gb=max(x["total"] for x in links) / GIB,
                boundary_gb=sum(x["boundary"] for x in links) / GIB,
                link_busy_s=max(st.link_busy_ms for st in res.stages) / 1e3)
            row["stage_layer_counts"] = [len(x) for x in res.stage_layers]
            rows.append(row)
            if li == 0:
                first[name] = runs["with"]
    for r in rows:
        base = next((x for x in rows if x["config"] == r["config"] and x["schedule"] == "1f1b"), None)
        if r.get("step_s") is not None and base is not None and base.get("step_s"):
            r["vs_1f1b"] = r["step_s"] / base["step_s"]
    return rows, first


def _steps_figure(rows: list[dict], path: Path) -> None:
    layouts = list(dict.fromkeys((r["model"], r["pp"], r["dp"]) for r in rows))
    names = list(dict.fromkeys(r["schedule"] for r in rows))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.2))
    x = np.arange(len(layouts))
    w = 0.8 / len(names)
    for i, name in enumerate(names):
        got = {(r["model"], r["pp"], r["dp"]): r for r in rows if r["schedule"] == name}
        rel = [(got[k].get("vs_1f1b") or 0.0) if k in got else 0.0 for k in layouts]
        gain = [(got[k].get("gain") or 0.0) if k in got else 0.0 for k in layouts]
        at = x + (i - (len(names) - 1) / 2) * w
        a1.bar(at, rel, w, label=name)
        a2.bar(at, gain, w, label=name)
        for ax, values in ((a1, rel), (a2, gain)):
            for xi, v in zip(at, values, strict=True):
                if not v:       # the schedule does not apply to this layout
                    ax.text(xi, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=7, color="#555555")
    labels = [f"{m.split('-')[0]}\nP={p} D={d}" for m, p, d in layouts]
    for ax, ylab, title in ((a1, "step / 1F1B step (with RATrain)", "step time by schedule"),
                            (a2, "step without / step with (x)", "do RATrain's mechanisms still pay?")):
        ax.set_xticks(x, labels, fontsize=7)
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_ylabel(ylab)
        ax.set_title(title, fontsize=10)
    handles, names_shown = a1.get_legend_handles_labels()       # one legend, below the panels
    fig.legend(handles, names_shown, loc="lower center", ncol=len(names), bbox_to_anchor=(0.5, -0.05), frameon=False)
    save_figure(fig, path)


def _memory_figure(rows: list[dict], path: Path, budget_gb: float) -> None:
    done = [r for r in rows if r.get("max_peak_gb") is not None]
    layouts = list(dict.fromkeys((r["model"], r["pp"], r["dp"]) for r in done))
    names = list(dict.fromkeys(r["schedule"] for r in done))
    fig, ax = plt.subplots(figsize=(13, 4))
    x = np.arange(len(layouts))
    w = 0.8 / len(names)
    for i, name in enumerate(names):
        got = {(r["model"], r["pp"], r["dp"]): r for r in done if r["schedule"] == name}
        ax.bar(x + (i - (len(names) - 1) / 2) * w, [got[k]["max_peak_gb"] if k in got else 0.0 for k in layouts],
               w, label=name)
    ax.axhline(budget_gb, color="red", lw=1, ls="--", label=f"{budget_gb:.0f} GB budget")
    ax.set_xticks(x, [f"{m.split('-')[0]}\nP={p} D={d}" for m, p, d in layouts], fontsize=7)
    ax.set_ylabel("max per-stage peak (GB = 2^30 B)")
    ax.set_yscale("log")
    ax.set_title("peak memory by schedule (simulated activations + Eq. 9 state and buffers), with RATrain")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def run_schedules(out: Path, progress: Progress, s: Settings = DEFAULT_SETTINGS, *,
                  layouts: list[tuple[str, str, ParallelConfig]] | None = None) -> Experiment:
    """The experiment: ``schedule_rows`` for the paper's layouts (or ``layouts``), checks, figures."""
    rows, first = schedule_rows(s, progress, layouts=layouts)
    checks = []
    for r in rows:
        if r.get("step_s") is None:
            continue
        label = f"{r['model']} P={r['pp']} D={r['dp']} {r['schedule']}"
        if r["schedule"] == "1f1b":      # the memory timeline reproduces Eq. 9 where both model the same thing
            checks.append(Check(f"{label} without: simulated peak GB = Eq. 9", r["peak_without_gb"], None,
                                "±0.01 GB of Eq. 9", abs(r["peak_without_gb"] - r["analytic_peak_gb"]) <= 0.01,
                                f"Eq. 9: {r['analytic_peak_gb']:.2f} GB (backward-time recompute under 1F1B)"))
            checks.append(Check(f"{label} with: simulated peak GB = Eq. 9", r["max_peak_gb"], None,
                                "±0.01 GB of Eq. 9", abs(r["max_peak_gb"] - r["analytic_peak_gb"]) <= 0.01,
                                f"Eq. 9: {r['analytic_peak_gb']:.2f} GB (FSR, {s.fsr_buffer_layers}-layer "
                                "recovery buffer, under 1F1B)"))
        checks.append(Check(f"{label}: mechanisms pay (step without / with)", r["gain"], None, "> 1",
                            r["gain"] > 1.0))
        if r["schedule"] in ("zb-h1", "interleaved"):
            checks.append(Check(f"{label}: step <= 1F1B step", r.get("vs_1f1b"), None, "<= 1",
                                r.get("vs_1f1b") is not None and r["vs_1f1b"] <= 1.0 + 1e-9))
    figs = []
    fig = out / "schedules_steps.png"
    _steps_figure(rows, fig)
    figs.append(str(fig))
    fig = out / "schedules_memory.png"
    _memory_figure(rows, fig, s.platform.memory_budget_bytes / GIB)
    figs.append(str(fig))
    for name in ("interleaved", "zb-h1"):
        if name not in first:
            continue
        res = first[name].result
        vs = f" v={res.virtual_stages}" if res.virtual_stages > 1 else ""
        label = f"{first[name].config.describe()} under {name}{vs}"
        # the warm-up and the tail, where the schedules differ from 1F1B (the middle is steady state)
        span = 3.0 * min(t.end_ms for t in res.tasks if t.kind == "B")
        tail = (max(0.0, res.step_time_ms - span), res.step_time_ms)
        for part, window in (("start", (0.0, span)), ("tail", tail)):
            path = out / f"timeline_{name}_{part}.png"
            plot_timeline(res, path, t_range=window,
                          title=f"{label}: {part} of the step (step {res.step_time_ms / 1e3:.1f} s)")
            figs.append(str(path))
    text = format_table(rows, ["model", "pp", "dp", "accum", "schedule", "virtual_stages", "step_s",
                               "step_without_s", "gain", "vs_1f1b", "max_idle_s", "max_peak_gb",
                               "peak_without_gb", "analytic_peak_gb", "fits", "max_link_gb", "note"])
    notes = [
        f"Platform: link {s.platform.link_bandwidth / 1e9:.1f} GB/s, budget "
        f"{s.platform.memory_budget_bytes / GIB:.0f} GB; FSR recovery on '{s.recovery_resource}'. 'with' = RATrain "
        "(layer-wise lifecycle, update-prefetch, FSR); 'without' = Baseline-1F1B's mechanisms (bulk step-end "
        "GradSync/update/prefetch, backward-time recompute) under the same schedule.",
        "Interleaved: Megatron's order with v=2 chunks per stage; the model's layers are re-cut into P x v chunks "
        "by the layout's partition rule (parameter-balanced, embedding on the first and LM head on the last chunk), "
        "chunk c on stage c mod P; about v times the stage-boundary transfers of 1F1B.",
        "ZB-H1: W = the profile's dW GEMMs (and the embedding's scatter-add); B = the rest of the backward "
        "(recompute under backward-time checkpointing). Between B and W a layer keeps what W reads (GEMM inputs "
        "and output gradients, ratrain.sim.weight_split.weight_gradient_bytes).",
        "Peak memory: simulated activation residency (the reference) + Eq. 9 state and buffers. The analytic "
        "activation term assumes 1F1B's N_act = min(P-p, A) (in_flight_analytic); interleaved holds "
        "(2(P-p-1) + (v-1)P + 1)/v stage-sets on stage p, ZB-H1 min(P, A) on every stage (activations live until "
        "W), GPipe A (in_flight_schedule; activation_sets is measured). Under backward-time recompute ('without') "
        "the simulated 1F1B peak equals Eq. 9 (checked); with FSR too (checked): the simulator recovers ahead no "
        f"further than the recovery buffer holds ({s.fsr_buffer_layers} layer(s), Eq. 6's M_rec; Settings."
        "fsr_buffer_layers), and Eq. 9 counts exactly that buffer.",
        "Every number here is simulated; the planner's schedule search (`ratrain plan --schedules`) estimates the "
        "same schedules analytically and confirms its finalists with this simulator (docs/CHOICES.md, 'Schedules "
        "in the planner').",
    ]
    return Experiment("schedules", "Pipeline schedules: RATrain's layouts under 1F1B, GPipe, interleaved 1F1B and "
                      "ZB-H1 (3.7 GB/s links)", rows, checks, figs, text, notes=notes)


__all__ = ["SCHEDULE_SET", "link_bytes", "paper_layouts", "run_schedules",
           "schedule_rows"]

"""Fig. 9 of the paper (`ratrain reproduce fig9`): training time and MAC-only utilization
of LLaMA-2-7B, Baichuan2-13B and Qwen2.5-32B at sequence lengths 512-4096 (256 clusters, global
batch 4096 sequences).

For every (model, sequence length) the planner picks RATrain's configuration (its own space,
``Settings.ratrain_*``, micro-batch ``Settings.micro_batch``) on the emulated micro-batch-1
profile of that length, whose GEMM shapes (m = micro-batch x seq) and attention kernels (seq x
seq) are emulated at that length; the event simulator then runs the chosen step. Definitions
(docs/CHOICES.md, "Fig. 9"):

- step: one optimizer step of the global batch (4096 sequences of ``seq`` tokens);
- training time: the time to train on ``Settings.fig9_token_budget`` tokens, i.e. whole steps
  ``ceil(budget / (global batch x seq))`` times the simulated step. A fixed sequence count would
  make training time grow with the length by construction; the paper's falling curve needs a
  fixed token budget (fewer, longer steps at the same number of tokens);
- MAC-only utilization: the model's MACs in one step (forward + backward = 3 x forward of every
  GEMM, the LM head included, and of causal attention counting the unmasked query-key pairs,
  seq (seq + 1) / 2 per head; recomputation and bandwidth-bound work not counted) over
  step time x clusters x the cluster's peak MAC/s.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from ratrain.cost.profile import LayerProfile
from ratrain.errors import ConfigError
from ratrain.plan.planner import simulate_config
from ratrain.repro import targets as paper
from ratrain.repro.experiment import DEFAULT_SETTINGS, Check, Experiment, Settings, format_table
from ratrain.repro.figures import plt, save_figure
from ratrain.spec.models import ModelSpec, embedding_and_head_operators, get_model, layer_operators
from ratrain.spec.platform import GIB
from rtcommon.figstyle import sparse_log_minor_labels
from rtcommon.progress import Progress


# ------------------------------------------------------------------------------------------
# definitions
# ------------------------------------------------------------------------------------------
def sequence_macs(spec: ModelSpec, seq: int) -> tuple[int, int]:
    """(all, attention) useful MACs of forward + backward for one sequence of ``seq`` tokens
    through the whole model; backward is twice forward (GEMM: dX and dW; attention: dV, dP, dQ, dK)."""
    layer = layer_operators(spec, 1, seq, 1)
    extra = embedding_and_head_operators(spec, 1, seq, 1)
    total = spec.layers * sum(o.useful_macs for o in layer) + sum(o.useful_macs
                                                                     for o in extra["first"] + extra["last"])
    attention = spec.layers * sum(o.useful_macs for o in layer if o.kind == "attention")
    return 3 * total, 3 * attention


def step_macs(spec: ModelSpec, seq: int, global_batch: int) -> int:
    """Useful MACs of one step of ``global_batch`` sequences."""
    return global_batch * sequence_macs(spec, seq)[0]


def mac_utilization(macs: float, step_s: float, clusters: int, peak_mac_per_s: float) -> float:
    """MAC-only utilization: useful MACs over what ``clusters`` clusters could do in the step."""
    if step_s <= 0 or clusters < 1 or peak_mac_per_s <= 0:
        raise ConfigError(f"mac_utilization needs a positive step, clusters and peak (got {step_s}, {clusters}, "
                          f"{peak_mac_per_s})")
    return macs / (step_s * clusters * peak_mac_per_s)


def training_steps(token_budget: int, global_batch: int, seq: int) -> int:
    """Whole steps needed to train on ``token_budget`` tokens (the last step may be partly past it)."""
    if token_budget < 1:
        raise ConfigError(f"fig9_token_budget must be a positive number of tokens, got {token_budget!r}")
    return math.ceil(token_budget / (global_batch * seq))


def training_time_s(step_s: float, token_budget: int, global_batch: int, seq: int) -> float:
    """Time to train on ``token_budget`` tokens at ``seq`` tokens per sequence."""
    return training_steps(token_budget, global_batch, seq) * step_s


def kernel_mac_utilization(prof: LayerProfile, spec: ModelSpec, peak_mac_per_s: float) -> float:
    """Utilization of one layer's GEMM and attention kernels alone (forward + backward, emulated
    at the profile's shapes): the shape effect, without pipeline bubbles or state traffic."""
    ops = {o.name: o for o in layer_operators(spec, prof.micro_batch, prof.seq, prof.tp)}
    timed = [o for o in prof.ops if o.kind in ("gemm", "attention")]
    seconds = sum(o.forward_s + o.backward_s for o in timed)
    macs = 3 * sum(ops[o.name].useful_macs for o in timed)
    return macs / (seconds * peak_mac_per_s)


# ------------------------------------------------------------------------------------------
# the study
# ------------------------------------------------------------------------------------------
def fig9_rows(s: Settings = DEFAULT_SETTINGS, progress: Progress | None = None,
              models: tuple[str, ...] = paper.FIG9_MODELS, seqs: tuple[int, ...] = paper.FIG9_SEQS) -> list[dict]:
    """One row per (model, seq): the planner's RATrain configuration, simulated."""
    progress = progress or (lambda msg: None)
    clusters, gb = paper.FIG9_CLUSTERS, paper.FIG9_GLOBAL_BATCH
    peak = s.platform.peak_mac_per_s
    rows = []
    for model_name in models:
        model = get_model(model_name)
        planner = s.planner(model, progress=False)
        for seq in seqs:
            progress(f"Fig. 9: {model_name} at seq {seq}: planning on {clusters} clusters, then simulating")
            best = planner.plan(clusters, gb, seq, "ratrain", top=1, micro_batches=(s.micro_batch,),
                                tp_degrees=s.ratrain_tp_degrees, zero_stages=s.ratrain_zero_stages, confirm=0).best
            macs, attn = sequence_macs(model, seq)
            row = {"model": model_name, "seq": seq, "clusters": clusters, "global_batch": gb,
                   "steps": training_steps(s.fig9_token_budget, gb, seq), "config": None, "step_s": None,
                   "train_time_s": None, "mac_utilization": None, "attention_mac_share": attn / macs}
            if best is not None:
                cfg = best.config
                chk = simulate_config(model, cfg, method="ratrain", platform=s.platform,
                                      profile_source=s.profile_source, recovery_resource=s.recovery_resource,
                                      mechanisms=s.mechanisms("ratrain", cfg))
                step_s = chk.simulated_ms / 1e3
                stages = chk.result.stages
                busy = sum(st.compute_busy_ms for st in stages) / (len(stages) * chk.simulated_ms)
                recompute = _recompute_fraction(chk, s) if cfg.activation != "full" else 0.0
                prof = planner.profile(cfg.micro_batch, seq, cfg.tp)
                row.update(config=cfg.describe(), activation=cfg.activation, step_s=step_s,
                           predicted_s=chk.predicted_ms / 1e3,
                           train_time_s=training_time_s(step_s, s.fig9_token_budget, gb, seq),
                           tokens_per_s=gb * seq / step_s,
                           mac_utilization=mac_utilization(gb * macs, step_s, clusters, peak),
                           kernel_mac_utilization=kernel_mac_utilization(prof, model, peak),
                           compute_busy_fraction=busy, recompute_fraction=recompute,
                           peak_gb=best.peak_bytes / GIB)
            rows.append(row)
    return rows


def _recompute_fraction(chk, s: Settings) -> float:
    """Share of the step the DSPs spend recomputing activations (FSR's R tasks, or inside the
    backward under checkpointing), mean over stages; zero when recovery does not use the DSPs."""
    if s.recovery_resource != "compute":
        return 0.0
    costs = chk.costs
    per_stage = [costs.microbatches * sum(layer.recompute_ms for layer in stage) for stage in costs.stages]
    return sum(per_stage) / (len(per_stage) * chk.simulated_ms)


def _series(rows: list[dict], model: str, key: str) -> dict[int, float | None]:
    return {r["seq"]: r[key] for r in rows if r["model"] == model}


def shape_checks(rows: list[dict]) -> list[Check]:
    """The caption's shape, per model (a missing point, nothing fitting, is a miss)."""
    checks = []
    tol = paper.TOL_FIG9_DIP
    for model in dict.fromkeys(r["model"] for r in rows):
        u = _series(rows, model, "mac_utilization")
        t = _series(rows, model, "train_time_s")
        rise = [u.get(n) for n in (512, 1024, 2048)]
        ok = None not in rise and rise[0] < rise[1] < rise[2]
        checks.append(Check(f"{model}: utilization rises 512 -> 1024 -> 2048", _fmt(rise), "rising", "strictly", ok))
        after = [u.get(n) for n in (3072, 4096)]
        ok = None not in after and u.get(2048) is not None and all(v <= u[2048] for v in after)
        checks.append(Check(f"{model}: utilization at 3072, 4096 <= 2048", _fmt([u.get(2048), *after]),
                            "dips", "<= 2048's", ok))
        worst = min(after) / u[2048] - 1 if None not in after and u.get(2048) else None
        checks.append(Check(f"{model}: the dip is slight", worst, f">= -{tol:.0%}", f"relative, >= -{tol:.0%}",
                            worst is not None and worst >= -tol, "lowest of 3072, 4096 vs 2048"))
        times = [t.get(n) for n in paper.FIG9_SEQS]
        if model in paper.FIG9_VALLEY_MODELS:
            ok = None not in times and times[0] > times[1] > times[2] < times[3] < times[4]
            checks.append(Check(f"{model}: training time falls to 2048, then rises", _fmt(times, 4), "valley at 2048",
                                "strictly", ok, "hours"))
        elif None not in times:
            best = min((v, n) for n, v in t.items())[1]
            checks.append(Check(f"{model}: best training time at 1024 or 2048", best, "1024 or 2048", "in",
                                best in paper.FIG9_SWEET_SEQS))
    return checks


def _fmt(values: list[float | None], hours: int = 0) -> str:
    """A series as text; ``hours``: seconds shown in hours."""
    if hours:
        return ", ".join("-" if v is None else f"{v / 3600:.2f}" for v in values)
    return ", ".join("-" if v is None else f"{v:.3f}" for v in values)


def with_other_recovery(rows: list[dict], s: Settings, progress: Progress | None = None) -> tuple[str, list[dict]]:
    """The same study with FSR recovery on the other resource (compute <-> ddr), its plan, training
    time and utilization added to ``rows`` as ``alt_*``: how much of the shape recomputation makes."""
    other = "ddr" if s.recovery_resource == "compute" else "compute"
    alt = fig9_rows(replace(s, recovery_resource=other), progress)
    for row, a in zip(rows, alt, strict=True):
        row.update(alt_recovery=other, alt_config=a["config"], alt_train_time_s=a["train_time_s"],
                   alt_mac_utilization=a["mac_utilization"])
    return other, alt


def run_fig9(out: Path, progress: Progress, s: Settings = DEFAULT_SETTINGS) -> Experiment:
    rows = fig9_rows(s, progress)
    checks = shape_checks(rows)
    other, alt = with_other_recovery(rows, s, progress)
    alt_passed = sum(c.ok for c in shape_checks(alt))
    fig = out / "fig9_sequence_length.png"
    figure(rows, fig, s)
    text = format_table(rows, ["model", "seq", "config", "step_s", "steps", "train_time_s", "tokens_per_s",
                               "mac_utilization", "kernel_mac_utilization", "compute_busy_fraction",
                               "recompute_fraction", "attention_mac_share", "peak_gb", "alt_config",
                               "alt_train_time_s", "alt_mac_utilization"])
    notes = [f"Training time = ceil({s.fig9_token_budget} tokens / ({paper.FIG9_GLOBAL_BATCH} x seq)) steps x the "
             "simulated step (a fixed token budget); MAC-only utilization = useful GEMM + attention MACs of a step "
             "(3 x forward, causal pairs only, no recomputation) / (step x clusters x peak). docs/CHOICES.md, "
             "'Fig. 9'.",
             "Why the shape: kernel_mac_utilization is the layer's GEMM + attention kernels alone at that length "
             "(the GEMM shape effect: m = micro-batch x seq); compute_busy_fraction the DSPs' busy share of the step "
             "(the rest: bubbles, exposed state and link work), recompute_fraction the share of the step they spend "
             "recomputing activations (FSR or checkpointing; not useful MACs); attention_mac_share the part of the "
             "work that grows with seq.",
             _why(rows),
             f"alt_*: the same study with recovery on '{other}' (dashed in the figure); {alt_passed}/{len(checks)} "
             "shape checks hold there."]
    return Experiment("fig9", "Fig. 9: training time and MAC-only utilization vs sequence length "
                      f"({paper.FIG9_CLUSTERS} clusters, global batch {paper.FIG9_GLOBAL_BATCH})",
                      rows, checks, [str(fig)], text, notes=notes)


def _why(rows: list[dict]) -> str:
    """One sentence per model from the measured decomposition (not from the paper)."""
    parts = []
    for model in dict.fromkeys(r["model"] for r in rows):
        got = {r["seq"]: r for r in rows if r["model"] == model and r["step_s"] is not None}
        if not got:
            parts.append(f"{model}: nothing fits")
            continue
        best_u = max(got, key=lambda n: got[n]["mac_utilization"])
        best_k = max(got, key=lambda n: got[n]["kernel_mac_utilization"])
        best_t = min(got, key=lambda n: got[n]["train_time_s"])
        fsr = [n for n in got if got[n]["recompute_fraction"] > 0]
        parts.append(f"{model}: utilization peaks at {best_u}, the kernels alone at {best_k}, training time is "
                     f"lowest at {best_t}; "
                     + (f"recomputation from {min(fsr)} ({100 * got[min(fsr)]['recompute_fraction']:.0f} % of "
                        "the step)" if fsr else "no recomputation")
                     + f"; attention {100 * got[max(got)]['attention_mac_share']:.0f} % of the MACs at {max(got)}")
    return "Measured: " + "; ".join(parts) + "."


def figure(rows: list[dict], path: Path, s: Settings = DEFAULT_SETTINGS) -> None:
    """Two panels like the paper's: training time (hours) and MAC-only utilization (%) vs sequence length."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    for i, model in enumerate(dict.fromkeys(r["model"] for r in rows)):
        pts = [r for r in rows if r["model"] == model]
        color = f"C{i}"
        hours = [r["train_time_s"] / 3600 if r["train_time_s"] else float("nan") for r in pts]
        util = [100 * r["mac_utilization"] if r["mac_utilization"] else float("nan") for r in pts]
        for ax, ys, key in ((a1, hours, "alt_train_time_s"), (a2, util, "alt_mac_utilization")):
            ax.plot([r["seq"] for r in pts], ys, "-", color=color, label=model)
            if any(r.get(key) for r in pts):
                scale = 1 / 3600 if key == "alt_train_time_s" else 100
                ax.plot([r["seq"] for r in pts], [r[key] * scale if r.get(key) else float("nan") for r in pts],
                        "--", color=color, alpha=0.6, lw=1)
            for r, y in zip(pts, ys, strict=True):
                # hollow: the plan recomputes activations (FSR or checkpointing), MACs that are not useful work
                saves = r.get("activation", "full") == "full"
                ax.plot(r["seq"], y, "o", color=color, markerfacecolor=color if saves else "white")
    for ax in (a1, a2):
        ax.set_xlabel("sequence length (tokens)")
        ax.set_xticks(list(paper.FIG9_SEQS))
        ax.axvline(2048, color="grey", ls=":")
    a1.set_ylabel(f"training time for {s.fig9_token_budget / 1e9:.2f} B tokens (h)")
    a1.set_yscale("log")
    a1.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _pos: f"{v:g}"))
    sparse_log_minor_labels(a1.yaxis, text=lambda v: f"{v:g}")
    a2.set_ylabel("MAC-only utilization (%)")
    alt = next((r["alt_recovery"] for r in rows if r.get("alt_recovery")), None)
    handles, labels = a1.get_legend_handles_labels()       # the models, below both panels: off the lines
    fig.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels),
               frameon=False)
    fig.suptitle(f"Fig. 9: sequence length ({paper.FIG9_CLUSTERS} clusters, global batch {paper.FIG9_GLOBAL_BATCH})\n"
                 f"solid: recovery on {s.recovery_resource}, hollow where activations are recomputed"
                 + (f"; dashed: recovery on {alt}" if alt else ""), fontsize=10)
    save_figure(fig, path)

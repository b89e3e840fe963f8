"""The second-platform study (`ratrain reproduce platforms`): do RATrain's principles
transfer beyond MT-3000?

Platforms: the settings' platform (MT-3000 by default) and the simulated what-ifs shipped in
``platforms/``: ``bandwidth-rich`` (DDR and inter-cluster links 10x faster, as on a GPU node),
``more-memory`` (40 GB usable per cluster instead of 20) and both at once. None is a real chip;
each file's header says how its numbers were chosen.

On each platform, for the Table 2 models at Table 2's scale (256 clusters, global batch 4096):

- ``kind = "table2"``: Table 2's fixed layouts, simulated on the platform's emulated kernels
  (a layout that does not fit the platform's memory has no step); slowdown against RATrain's row;
- ``kind = "planner"``: the planner's pick per method (RATrain in its own space: T = 1, Z <= 2;
  the baselines in theirs), as in the budget study; steps are the planner's estimates on the fast
  kernel model; slowdown against RATrain's pick;
- ``kind = "payoff"``: whether the lifecycle mechanisms still pay, from the fixed layouts (same
  P, D, T, Z, only the mechanism differs): FSR's gain = the best of backward-ckpt and full-save
  (where full activations fit) over RATrain's step (``fsr_vs_ckpt`` and ``fsr_vs_full`` apart);
  the lifecycle gain = tuned step / backward-ckpt step (bulk step-end GradSync/update/prefetch vs
  the layer-wise deadline-aware pipeline, both with checkpointing); and FSR at the planner: the
  best non-FSR pick in RATrain's space over RATrain's pick. A gain below 1 means the mechanism costs.

A platform on which no configuration of a model fits under any method is a ConfigError naming the
platform, the model and the smallest peak any configuration would need; nothing is written.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from ratrain.errors import ConfigError
from ratrain.plan.planner import Planner, search_space
from ratrain.repro import targets as paper
from ratrain.repro.experiment import DEFAULT_SETTINGS, Check, Experiment, Settings, format_table
from ratrain.repro.figures import save_figure
from ratrain.repro.training import table2_rows
from ratrain.spec.models import get_model
from ratrain.spec.platform import GIB, TrainingPlatform
from rtcommon.figstyle import subplots
from rtcommon.progress import Progress

# the what-if platform files, in the source checkout's platforms/ folder (not part of the wheel)
PLATFORMS_DIR = Path(__file__).resolve().parents[2] / "platforms"
WHAT_IF_FILES = ("bandwidth-rich.toml", "more-memory.toml", "bandwidth-rich-more-memory.toml")
MODELS = tuple(dict.fromkeys(row[0] for row in paper.TABLE2))
PLANNER_METHODS = ("ratrain", "tp-heavy", "zero3-heavy", "backward-ckpt", "full-save", "tuned")
BASELINES = PLANNER_METHODS[1:]
# a baseline within 5 % of RATrain's step is "competitive"; a mechanism "pays" when turning it
# off costs more than 2 % (about the planner-vs-simulator error of Table 4)
COMPETITIVE = 1.05
PAYS = 1.02


def what_if_platforms(files: tuple[str | Path, ...] | None = None) -> list[TrainingPlatform]:
    """The shipped what-if platforms (or ``files``), read with the platform file reader."""
    out = []
    for f in files if files is not None else WHAT_IF_FILES:
        path = Path(f) if Path(f).is_absolute() or Path(f).exists() else PLATFORMS_DIR / f
        if not path.exists():
            raise ConfigError(f"platforms study: platform file {path} not found (the what-if platforms are read "
                              "from the source checkout's platforms/ folder)")
        out.append(TrainingPlatform.from_file(path))
    return out


def _planner(model_name: str, platform: TrainingPlatform, s: Settings) -> Planner:
    return s.planner(get_model(model_name), platform, progress=False)


def smallest_peak_gb(planner: Planner, clusters: int, global_batch: int, s: Settings) -> tuple[float, str]:
    """The lowest worst-stage peak (GB) of any configuration in the widest search space (every
    T, Z, activation and prefetch policy) and the configuration that reaches it."""
    best, label = math.inf, "-"
    for p, d, t, z, b, a, act, pref in search_space(planner.model, clusters, global_batch, "ratrain",
                                                     micro_batches=(s.micro_batch,)):
        peak = planner.memory.peak(p, d, t, z, b, a, s.seq, act, pref)
        if peak < best:
            best, label = peak, f"P={p},D={d},T={t},Z={z},{act}"
    return best / GIB, label


def require_feasible(platform: TrainingPlatform, s: Settings = DEFAULT_SETTINGS,
                     clusters: int = paper.TABLE2_CLUSTERS, global_batch: int = paper.TABLE2_GLOBAL_BATCH,
                     models: tuple[str, ...] = MODELS) -> None:
    """ConfigError unless every model has at least one configuration that fits ``platform``."""
    for model_name in models:
        planner = _planner(model_name, platform, s)
        fits = any(planner.memory.peak(p, d, t, z, b, a, s.seq, act, pref) <= platform.memory_budget_bytes
                   for p, d, t, z, b, a, act, pref in search_space(planner.model, clusters, global_batch, "ratrain",
                                                                    micro_batches=(s.micro_batch,)))
        if not fits:
            need, label = smallest_peak_gb(planner, clusters, global_batch, s)
            raise ConfigError(f"platform '{platform.name}': no configuration of {model_name} fits its "
                              f"{platform.memory_budget_bytes / GIB:.4g} GB per cluster on {clusters} clusters "
                              f"(global batch {global_batch}, seq {s.seq}) under any method; the smallest "
                              f"worst-stage peak is {need:.2f} GB ({label}): raise the platform's ddr_bytes")


def planner_rows(platform: TrainingPlatform, s: Settings = DEFAULT_SETTINGS, models: tuple[str, ...] = MODELS,
                 clusters: int = paper.TABLE2_CLUSTERS, global_batch: int = paper.TABLE2_GLOBAL_BATCH) -> list[dict]:
    """The planner's pick per method on ``platform`` (estimates), plus the best non-FSR pick in
    RATrain's own space (``method = "ratrain-no-fsr"``) that prices FSR at the planner."""
    rows = []
    ratrain_space = {"tp_degrees": s.ratrain_tp_degrees, "zero_stages": s.ratrain_zero_stages}
    for model_name in models:
        planner = _planner(model_name, platform, s)

        def pick(method: str, planner: Planner = planner, **space):
            return planner.plan(clusters, global_batch, s.seq, method, top=1, micro_batches=(s.micro_batch,),
                                confirm=0, **space).best

        picks = {m: pick(m, **(ratrain_space if m == "ratrain" else {})) for m in PLANNER_METHODS}
        no_fsr = [c for c in (pick("backward-ckpt", **ratrain_space), pick("full-save", **ratrain_space)) if c]
        picks["ratrain-no-fsr"] = min(no_fsr, key=lambda c: c.step_ms) if no_fsr else None
        ours = picks["ratrain"]
        for method, c in picks.items():
            rows.append({"kind": "planner", "platform": platform.name, "model": model_name, "method": method,
                         "config": c.config.describe() if c else None,
                         "activation": c.config.activation if c else None,
                         "peak_gb": c.peak_bytes / GIB if c else None, "fits": c is not None,
                         "step_s": c.step_ms / 1e3 if c else None,
                         "slowdown_vs_ratrain": c.step_ms / ours.step_ms if c and ours else None})
    return rows


def _table2_rows(platform: TrainingPlatform, s: Settings, progress: Progress) -> list[dict]:
    rows = table2_rows(replace(s, platform=platform), lambda msg: progress(f"{platform.name}: {msg}"), steps_only=True)
    return [{"kind": "table2", "platform": platform.name, "model": r["model"], "method": r["method"],
             "config": r["config"], "activation": None, "peak_gb": r["peak_gb"], "fits": not r["oom"],
             "step_s": r["step_s"], "slowdown_vs_ratrain": r["slowdown"]} for r in rows]


def payoff_rows(rows: list[dict]) -> list[dict]:
    """FSR and lifecycle gains per platform and model from the table2 and planner rows."""
    def step(kind, plat, model, method):
        r = next((x for x in rows if (x["kind"], x["platform"], x["model"], x["method"]) == (kind, plat, model,
                                                                                              method)), None)
        return r["step_s"] if r else None

    def ratio(a, b):
        return a / b if a is not None and b else None

    out = []
    for plat, model in dict.fromkeys((r["platform"], r["model"]) for r in rows):
        ratrain, ckpt, full, tuned = (step("table2", plat, model, m)
                                      for m in ("ratrain", "backward-ckpt", "full-save", "tuned"))
        pick, pick_no_fsr = step("planner", plat, model, "ratrain"), step("planner", plat, model, "ratrain-no-fsr")
        act = next(r["activation"] for r in rows
                   if (r["kind"], r["platform"], r["model"], r["method"]) == ("planner", plat, model, "ratrain"))
        out.append({"kind": "payoff", "platform": plat, "model": model,
                    "fsr_vs_ckpt": ratio(ckpt, ratrain), "fsr_vs_full": ratio(full, ratrain),
                    "fsr_gain": ratio(min(x for x in (ckpt, full) if x is not None), ratrain)
                    if (ckpt or full) else None,
                    "lifecycle_gain": ratio(tuned, ckpt), "planner_fsr_gain": ratio(pick_no_fsr, pick),
                    "planner_pick_activation": act})
    return out


def platforms_rows(s: Settings = DEFAULT_SETTINGS, progress: Progress | None = None,
                   platforms: list[TrainingPlatform] | None = None) -> list[dict]:
    """Every row of the study; ``platforms`` defaults to the settings' platform and the shipped
    what-ifs. Every platform is checked for feasibility before anything is simulated."""
    progress = progress or (lambda msg: None)
    platforms = platforms if platforms is not None else [s.platform, *what_if_platforms()]
    names = [p.name for p in platforms]
    if len(set(names)) != len(names):
        raise ConfigError(f"platforms study: platform names must differ (got {', '.join(names)})")
    for p in platforms:
        require_feasible(p, s)
    rows = []
    for p in platforms:
        progress(f"Platforms: planner picks on {p.name}")
        rows += planner_rows(p, s)
        rows += _table2_rows(p, s, progress)
    return rows + payoff_rows(rows)


# ------------------------------------------------------------------------------------------
# findings: checks and notes over the rows
# ------------------------------------------------------------------------------------------
def _get(rows, kind, plat, model, method=None):
    return next((r for r in rows if r["kind"] == kind and r["platform"] == plat and r["model"] == model
                 and (method is None or r["method"] == method)), None)


def _checks(rows: list[dict], base: str, rich: str | None, mem: str | None, both: str | None) -> list[Check]:
    checks = []
    for lo, hi in ((base, mem), (rich, both)):
        if lo is None or hi is None:
            continue
        # capacity is not in the timing: a fixed layout that fits both runs the same step
        pairs = [(a, _get(rows, "table2", hi, a["model"], a["method"])) for a in rows
                 if a["kind"] == "table2" and a["platform"] == lo and a["step_s"] is not None]
        if pairs:
            # a layout that fits the smaller memory fits the larger one, with the same step
            worst = max(abs(b["step_s"] / a["step_s"] - 1) if b and b["step_s"] else math.inf for a, b in pairs)
            checks.append(Check(f"{hi} vs {lo}: fixed layouts' steps equal", worst, 0.0, "max rel. diff < 1e-9",
                                worst < 1e-9, "memory capacity does not enter a step's timing"))
        # a bigger budget only adds candidates, so no pick may get slower
        slower = [f"{r['model']}/{r['method']}" for r in rows if r["kind"] == "planner" and r["platform"] == lo
                  and r["step_s"] is not None
                  and not ((h := _get(rows, "planner", hi, r["model"], r["method"])) and h["step_s"] is not None
                           and h["step_s"] <= r["step_s"] * (1 + 1e-12))]
        checks.append(Check(f"{hi} vs {lo}: no planner pick slower", ", ".join(slower) or "none", "none",
                            "every model and method", not slower))
    if rich is not None:
        pairs = [(a, _get(rows, "table2", rich, a["model"], a["method"])) for a in rows
                 if a["kind"] == "table2" and a["platform"] == base and a["step_s"] is not None]
        slower = [f"{a['model']}/{a['method']}" for a, b in pairs if not (b["step_s"] and b["step_s"] < a["step_s"])]
        checks.append(Check(f"{rich}: every fixed layout faster than on {base}", ", ".join(slower) or "none", "none",
                            "strictly faster", not slower))
        for model in MODELS:
            for method in ("tp-heavy", "zero3-heavy"):
                lo, hi = (_get(rows, "table2", plat, model, method) for plat in (base, rich))
                if lo and hi and lo["slowdown_vs_ratrain"] is not None and hi["slowdown_vs_ratrain"] is not None:
                    checks.append(Check(f"{rich}: {model} {method} slowdown shrinks (Table 2 layout)",
                                        hi["slowdown_vs_ratrain"], lo["slowdown_vs_ratrain"], f"below {base}'s",
                                        hi["slowdown_vs_ratrain"] < lo["slowdown_vs_ratrain"],
                                        "paper column: the same layout on " + base))
            lo, hi = (_get(rows, "payoff", plat, model) for plat in (base, rich))
            if lo and hi and lo["lifecycle_gain"] is not None and hi["lifecycle_gain"] is not None:
                checks.append(Check(f"{rich}: {model} lifecycle gain shrinks", hi["lifecycle_gain"],
                                    lo["lifecycle_gain"], f"<= {base}'s", hi["lifecycle_gain"] <= lo["lifecycle_gain"],
                                    "paper column: the same layout on " + base))
    return checks


def _findings(rows: list[dict], platforms: list[str]) -> list[str]:
    notes = []
    for plat in platforms:
        for kind, what in (("table2", "Table 2's fixed layouts"), ("planner", "the planner's picks")):
            comp = [f"{r['model']} {r['method']} ({r['slowdown_vs_ratrain']:.3f}x)" for r in rows
                    if r["kind"] == kind and r["platform"] == plat and r["method"] in ("tp-heavy", "zero3-heavy")
                    and r["slowdown_vs_ratrain"] is not None and r["slowdown_vs_ratrain"] <= COMPETITIVE]
            notes.append(f"{plat}, {what}: TP-heavy / ZeRO-3 within {COMPETITIVE - 1:.0%} of RATrain or faster: "
                         + (", ".join(comp) if comp else "none"))
        for r in rows:
            if r["kind"] != "payoff" or r["platform"] != plat:
                continue
            parts = []
            for key, label in (("fsr_gain", "FSR vs its best alternative (fixed layout)"),
                               ("lifecycle_gain", "lifecycle (fixed layout)"),
                               ("planner_fsr_gain", "FSR (planner)")):
                g = r[key]
                parts.append(f"{label} {g:.3f}x ({'pays' if g > PAYS else 'does not pay'})" if g is not None
                             else f"{label} -")
            notes.append(f"{plat}, {r['model']}: " + "; ".join(parts)
                         + f"; planner's RATrain pick uses {r['planner_pick_activation']} activations")
    return notes


def run_platforms(out: Path, progress: Progress, s: Settings = DEFAULT_SETTINGS) -> Experiment:
    # the settings' platform is the reference; a what-if of the same name (it was passed as --platform) is it
    platforms = [s.platform, *(p for p in what_if_platforms() if p.name != s.platform.name)]
    rows = platforms_rows(s, progress, platforms)
    names = [p.name for p in platforms]
    by_role = {p.name: p for p in platforms}
    base = names[0]
    rich = next((n for n in names[1:] if by_role[n].ddr_bandwidth > s.platform.ddr_bandwidth
                 and by_role[n].memory_budget_bytes == s.platform.memory_budget_bytes), None)
    mem = next((n for n in names[1:] if by_role[n].ddr_bandwidth == s.platform.ddr_bandwidth
                and by_role[n].memory_budget_bytes > s.platform.memory_budget_bytes), None)
    both = next((n for n in names[1:] if by_role[n].ddr_bandwidth > s.platform.ddr_bandwidth
                 and by_role[n].memory_budget_bytes > s.platform.memory_budget_bytes), None)
    checks = _checks(rows, base, rich, mem, both)
    fig = out / "platforms_slowdown.png"
    _figure(rows, names, fig)
    cols = ["platform", "model", "method", "config", "peak_gb", "step_s", "slowdown_vs_ratrain"]
    text = ("Table 2's fixed layouts (simulated)\n"
            + format_table([r for r in rows if r["kind"] == "table2"], cols)
            + "\n\nThe planner's pick per method (estimates)\n"
            + format_table([r for r in rows if r["kind"] == "planner"], cols)
            + "\n\nDo FSR and the lifecycle pipeline still pay? (step without / step with)\n"
            + format_table([r for r in rows if r["kind"] == "payoff"],
                           ["platform", "model", "fsr_vs_ckpt", "fsr_vs_full", "fsr_gain", "lifecycle_gain",
                            "planner_fsr_gain",
                            "planner_pick_activation"]))
    notes = ["The what-if platforms are simulated, not real chips: see the header of each file in platforms/.",
             *_findings(rows, names),
             "FSR gain = min(backward-ckpt, full-save where it fits) / RATrain on Table 2's layout; "
             "lifecycle gain = tuned / backward-ckpt (same layout and activation, bulk step-end state processing "
             "instead of the layer-wise pipeline); "
             f"planner FSR gain = best non-FSR pick in RATrain's space / RATrain's pick. A gain above {PAYS} pays."]
    return Experiment("platforms", "Second platform: do the principles transfer beyond MT-3000? (256 clusters, "
                      "global batch 4096)", rows, checks, [str(fig)], text, notes=notes)


def _figure(rows: list[dict], names: list[str], path: Path) -> None:
    fig, axes = subplots(1, 2, figsize=(14, 5), sharey=True)
    groups = [(p, m) for p in names for m in MODELS]
    width = 0.8 / len(BASELINES)
    for ax, kind, title in ((axes[0], "table2", "Table 2's fixed layouts (simulated)"),
                            (axes[1], "planner", "planner's pick per method (estimates)")):
        for i, method in enumerate(BASELINES):
            vals = []
            for p, m in groups:
                r = _get(rows, kind, p, m, method)
                vals.append(r["slowdown_vs_ratrain"] if r and r["slowdown_vs_ratrain"] is not None else 0.0)
            ax.bar([g + (i - (len(BASELINES) - 1) / 2) * width for g in range(len(groups))], vals, width,
                   label=method)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(groups)), [f"{p}\n{m}" for p, m in groups])      # rotated as needed on save
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("slowdown vs RATrain (x); 0 = does not fit")
    axes[1].legend(ncol=len(BASELINES), loc="upper center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    axes[1].set_ylim(0, 1.25 * axes[1].get_ylim()[1])                       # room for the legend above the bars
    fig.suptitle("Second platform: GPU-style strategies vs RATrain on simulated what-if platforms")
    save_figure(fig, path)

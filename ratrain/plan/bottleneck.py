"""Which resource decides: the share of each resource in a step, Amdahl's estimate beside the simulator's.

Resources: ``compute`` (GEMM and attention kernels), ``memory`` (DDR on MT-3000, HBM on a GPU: the
bandwidth-bound elementwise, embedding and loss operators and the optimizer's passes),
``intra_link`` (a GPU node's NVLink/PCIe; MT-3000 has one device per node and no such link),
``inter_link`` (MT-3000's inter-cluster link, a GPU cluster's NICs) and ``input`` (the per-step
input wait; the host-to-device stage of the input pipeline is the host link).

Share f of a resource: the time it is busy on the critical stage (the stage whose resources are
busy longest in all), over the step time T, read off the step's cost breakdown: per micro-batch
and layer the profile's compute and memory operators of the forward, the backward and the
recomputation (under ckpt and fsr), the tensor-parallel all-reduces of each pass and ZeRO-3's
per-use gathers; per layer its gradient sync, update and prefetch; per micro-batch the stage's
boundary transfers. Each collective is booked on the link its group uses (``crosses_nodes`` of
the GPU collectives: inside a node or across; on MT-3000 every collective is on the one link).
The input's busy time is the exposed wait.

For each ratio r (0.5, 2, 10) beside Amdahl's T'/T = 1 - f + f/r stands the simulated value: the
step simulated again with the resource r times faster in the cost model's inputs (its operators'
latencies in the profile, its DDR/HBM rates, the platform's link bandwidth; the input pipeline's
stage rates), which also sees what overlaps (a link hidden behind compute gains nothing when it is
faster; an input pipeline behind a queue stops costing anything once it keeps up). The resource
that decides is the one whose simulated step gains most at r = 2 (the largest share when none
gains): a large share hidden behind another resource decides nothing.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.cost.collectives import collectives_for
from ratrain.cost.profile import LayerProfile, OpProfile
from ratrain.cost.terms import cost_terms
from ratrain.errors import ConfigError
from ratrain.plan.planner import simulate_config
from ratrain.plan.task import (
    SchemeResult,
    TrainingTask,
    deadline_devices,
    device_peak_flops,
    failure_overhead,
    required_mfu,
)
from ratrain.spec.gpu import GpuPlatform
from ratrain.spec.platforms import AnyPlatform

RESOURCES = ("compute", "memory", "intra_link", "inter_link", "input")
RATIOS = (0.5, 2.0, 10.0)
COMPUTE_KINDS = ("gemm", "attention")
MEMORY_KINDS = ("elementwise", "embedding", "loss")
# Model sizes of the deadline boundary: 1 B to 1 T parameters, three per decade
BOUNDARY_PARAMETERS = tuple(10.0 ** (9 + k / 3) for k in range(10))


def _scale_ops(ops: list[OpProfile], kinds: tuple[str, ...], r: float) -> list[OpProfile]:
    return [replace(o, forward_s=o.forward_s / r, backward_s=o.backward_s / r) if o.kind in kinds else o for o in ops]


def scaled_profile(profile: LayerProfile, resource: str, r: float) -> LayerProfile:
    """``profile`` with ``resource`` (compute or memory) r times faster."""
    if resource == "compute":
        kinds, rates = COMPUTE_KINDS, profile.ddr_rates
    elif resource == "memory":
        kinds, rates = MEMORY_KINDS, {k: v * r for k, v in profile.ddr_rates.items()}
    else:
        return profile
    return replace(profile, ops=_scale_ops(profile.ops, kinds, r), first_ops=_scale_ops(profile.first_ops, kinds, r),
                   last_ops=_scale_ops(profile.last_ops, kinds, r), ddr_rates=rates)


def scaled_platform(platform: AnyPlatform, resource: str, r: float) -> AnyPlatform:
    """``platform`` with a link r times faster (its range checks apply: a ConfigError past them)."""
    if isinstance(platform, GpuPlatform):
        if resource == "intra_link":
            return platform.with_overrides(**{"node.intra_bandwidth": platform.node.intra_bandwidth * r})
        if resource == "inter_link":
            return platform.with_overrides(**{"network.nic_bandwidth": platform.network.nic_bandwidth * r})
        return platform
    if resource == "inter_link":
        return platform.with_overrides(link_bandwidth=platform.link_bandwidth * r)
    return platform


def applies(platform: AnyPlatform, resource: str) -> bool:
    return not (resource == "intra_link" and not isinstance(platform, GpuPlatform))


def _op_seconds(ops: list[OpProfile]) -> dict[str, tuple[float, float]]:
    """(forward, backward) seconds of the compute and the memory operators."""
    out = {}
    for res, kinds in (("compute", COMPUTE_KINDS), ("memory", MEMORY_KINDS)):
        out[res] = (sum(o.forward_s for o in ops if o.kind in kinds), sum(o.backward_s for o in ops if o.kind in kinds))
    return out


def stage_busy_s(scheme: SchemeResult, platform: AnyPlatform) -> list[dict[str, float]]:
    """Per stage, the seconds each resource is busy in one step (module docstring)."""
    step, model = scheme.step, scheme.task.model
    cfg, prof, costs = step.config, step.profile, step.check.costs
    net = collectives_for(platform, cfg.tp, cfg.dp, cfg.pp)
    gpu = isinstance(platform, GpuPlatform)

    def link(group: str) -> str:
        return ("inter_link" if net.crosses_nodes(group) else "intra_link") if gpu else "inter_link"

    parts = cost_terms(model, cfg, prof, platform).parts
    ar_s, gather_s, transfer_s = (parts["tp_allreduce_ms"] / 1e3, parts["zero3_gather_ms"] / 1e3,
                                  parts["transfer_ms"] / 1e3)
    A, P = cfg.accum, cfg.pp
    rec = cfg.activation in ("ckpt", "fsr")
    layer, first, last = _op_seconds(prof.ops), _op_seconds(prof.first_ops), _op_seconds(prof.last_ops)
    out = []
    for p, layers in enumerate(costs.stages):
        n = len(layers)
        busy = dict.fromkeys(("compute", "memory", "intra_link", "inter_link"), 0.0)
        for res in ("compute", "memory"):
            f, b = layer[res]
            busy[res] += A * n * (f + b + (f if rec else 0.0))
            for edge, present in ((first, p == 0), (last, p == P - 1)):
                if present:
                    busy[res] += A * sum(edge[res])
        busy["memory"] += sum(lc.update_ms for lc in layers) / 1e3
        # two all-reduces per pass and layer (forward, backward, recomputation); one at each edge
        busy[link("tp")] += A * (n * (4 + (2 if rec else 0)) + (p == 0) + (p == P - 1)) * ar_s
        # ZeRO-3 gathers at use: one per forward and backward (ckpt shares one with its recompute; fsr does not)
        busy[link("dp")] += A * n * (2 + (cfg.activation == "fsr")) * gather_s
        busy[link("dp")] += sum(lc.gradsync_ms + lc.prefetch_ms for lc in layers) / 1e3
        busy[link("pp")] += 2 * A * ((p > 0) + (p < P - 1)) * transfer_s
        out.append(busy)
    return out


def step_breakdown(scheme: SchemeResult, platform: AnyPlatform) -> dict:
    """Where a step goes: the critical stage's compute and memory work, the rest of the training step
    (communication left exposed and pipeline bubbles) and the input wait (seconds)."""
    step = scheme.step
    if step.source == "mfu":
        return {"source": "mfu", "compute_s": step.train_s, "memory_s": None, "exposed_other_s": None,
                "input_wait_s": step.input_wait_s}
    stages = stage_busy_s(scheme, platform)
    crit = max(range(len(stages)), key=lambda p: sum(stages[p].values()))
    work = stages[crit]["compute"] + stages[crit]["memory"]
    return {"source": "simulated", "critical_stage": crit, "compute_s": stages[crit]["compute"],
            "memory_s": stages[crit]["memory"], "links_busy_s": stages[crit]["intra_link"] + stages[crit]["inter_link"],
            "exposed_other_s": max(0.0, step.train_s - work), "input_wait_s": step.input_wait_s}


def _simulate(scheme: SchemeResult, platform: AnyPlatform, resource: str, r: float):
    step = scheme.step
    return simulate_config(scheme.task.model, step.config, platform=scaled_platform(platform, resource, r),
                           profile=scaled_profile(step.profile, resource, r), profile_source=step.kernels)


def _wait(scheme: SchemeResult, train_s: float, input_r: float, pipeline) -> float:
    if pipeline is not None:
        return pipeline.scaled(input_r).wait_s(scheme.task.tokens_per_step, train_s)
    return scheme.step.input_wait_s / input_r


def resource_table(scheme: SchemeResult, platform: AnyPlatform, pipeline=None,
                   ratios: tuple[float, ...] = RATIOS) -> dict:
    """Shares, Amdahl and simulated T'/T per resource (module docstring) for one scheme."""
    step = scheme.step
    total = step.total_s
    busy: dict[str, float] = {}
    simulated: dict[str, dict[float, float | None]] = {}
    notes: dict[str, str] = {}
    if step.source == "mfu":
        # the fixed-MFU step has no breakdown: all of it is compute, the input wait beside it
        busy["compute"] = step.train_s
        for r in ratios:
            simulated.setdefault("compute", {})[r] = (step.train_s / r + _wait(scheme, step.train_s / r, 1.0, pipeline))
        notes["compute"] = "fixed MFU: the step is compute alone"
    else:
        stages = stage_busy_s(scheme, platform)
        crit = max(range(len(stages)), key=lambda p: sum(stages[p].values()))
        for res in ("compute", "memory", "intra_link", "inter_link"):
            if not applies(platform, res):
                continue
            busy[res] = stages[crit][res]
            try:
                for r in ratios:
                    train = _simulate(scheme, platform, res, r).simulated_ms / 1e3
                    simulated.setdefault(res, {})[r] = train + _wait(scheme, train, 1.0, pipeline)
            except ConfigError as err:       # a scaled link past the platform's sane range
                notes[res] = str(err)
                simulated[res] = {r: None for r in ratios}
    busy["input"] = step.input_wait_s
    simulated["input"] = {r: step.train_s + _wait(scheme, step.train_s, r, pipeline) for r in ratios}
    rows = []
    for res in RESOURCES:
        if res not in busy:
            continue
        f = busy[res] / total
        rows.append({"resource": res, "busy_s": busy[res], "share": f,
                     "ratios": [{"r": r, "amdahl": 1.0 - f + f / r,
                                 "simulated": None if simulated[res][r] is None else simulated[res][r] / total}
                                for r in ratios],
                     **({"note": notes[res]} if res in notes else {})})
    # what decides is what pays when it is faster: the lowest simulated T'/T at the first ratio above 1
    # (overlap can hide a resource with a large share), then the largest share
    probe = next((j for j, r in enumerate(ratios) if r > 1), None)

    def gain(row: dict) -> tuple[float, float]:
        sim = row["ratios"][probe]["simulated"] if probe is not None else None
        return (1.0 if sim is None else sim, -row["share"])

    return {"critical_stage": None if step.source == "mfu" else crit, "step_time_s": total, "rows": rows,
            "largest_share": max(rows, key=lambda row: row["share"])["resource"],
            "deciding": min(rows, key=gain)["resource"]}


def required_efficiency(scheme: SchemeResult, failures, fractions: tuple[float, ...] = (1.0, 0.5, 0.25, 0.125)) -> dict:
    """The MFU each smaller machine (the scheme's device count times a fraction) would need to meet
    the deadline, beside the MFU the scheme reaches."""
    rows = []
    for frac in fractions:
        devices = int(scheme.devices * frac)
        if devices < 1 or devices != scheme.devices * frac:
            continue
        ovh, _ = failure_overhead(failures, devices, scheme.step.total_s, scheme.iterations)
        need = required_mfu(scheme.task, scheme.peak_flops, devices, ovh.total) if ovh.progress_possible else None
        rows.append({"devices": devices, "overhead_share": ovh.total, "required_mfu": need,
                     "possible": need is not None and need <= 1.0})
    return {"achieved_mfu": scheme.achieved_mfu, "rows": rows}


def deadline_boundary(task: TrainingTask, platforms: list[AnyPlatform], mfu: float,
                      parameters: tuple[float, ...] = BOUNDARY_PARAMETERS) -> list[dict]:
    """Devices each platform needs at ``mfu`` to train a model of N parameters on the task's tokens
    in the time the deadline leaves: p = ceil(6 N D / (peak x MFU x T))."""
    rows = []
    for n in parameters:
        rows.append({"parameters": n, "devices": {p.name: deadline_devices(n, task.tokens, device_peak_flops(p), mfu,
                                                                           task.available_s) for p in platforms}})
    return rows


__all__ = ["BOUNDARY_PARAMETERS", "RATIOS", "RESOURCES", "applies", "deadline_boundary", "required_efficiency",
           "resource_table", "scaled_platform", "scaled_profile", "stage_busy_s", "step_breakdown"]

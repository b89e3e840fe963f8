"""Offloading in the event simulator: transfers over the host link and the host-side update.

Each stage gets three more resources: ``d2h`` and ``h2d`` (the two directions of its link to host
memory, full duplex) and ``host`` (its share of the host's cores). A transfer is one task on one
direction lasting V / B + latency (``ratrain.spec.host.HostSide.transfer_ms``); it starts once the
tensor exists and the direction is free, and the operator that needs the tensor depends on it, so
it waits max(0, V/B - W) where W is the window between the moment the transfer may start and the
moment the operator would otherwise start. What moves (``ratrain.spec.offload`` names the targets):

* activations: ``ToHost(m, l)`` after F(m, l) (the saved set: checkpoint, or the full set under
  full); ``FromHost(m, l)`` once that has ended and the main-path compute task ``reload_lookahead + 1``
  places before B(m, l) on the stage has ended; its consumer is R(m, l) under FSR, else B(m, l).
* optimizer state with a device-side update: ``FromHost(l)`` of the offloaded state of the layer's
  shard once its gradient accumulation completes (bulk processing: after the stage's last
  backward), before its UpdateShard; ``ToHost(l)`` of the updated state after it.
* host-side update (CPU Adam): the gradient of the layer's shard goes to the host after its
  GradSync, as 32-bit (``Convert(l)`` on the device's DDR first, then ``ToHost``) or as 16-bit
  (``ToHost``, then ``Convert(l)`` on the host); UpdateShard runs on ``host``, streaming
  ``HOST_ADAM_BYTES`` per parameter through host memory with ``ADAM_FLOPS`` per parameter on the
  cores (the slower of the two); ``FromHost(l)`` brings the FP16 weights back before PrefetchW(l).

State transfers are lifecycle tasks (earliest deadline first with the other state tasks);
activation transfers are main-path tasks (first come, first served).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ratrain.errors import ConfigError
from ratrain.spec.gpu import GpuPlatform
from ratrain.spec.host import HostSide, host_of
from ratrain.spec.offload import GRAD16, GRAD32, Offload

# host-side Adam per parameter: FP32 master, m, v read and written (24 B), the 32-bit gradient
# read (4 B), the FP16 weight written (2 B)
HOST_ADAM_BYTES = 3 * 4 * 2 + GRAD32 + GRAD16
# its arithmetic per parameter: m and v updates (3 + 4), bias-corrected step (sqrt, divide, add,
# multiply, subtract), counted as 12 FP32 operations
ADAM_FLOPS = 12
# converting a gradient from 16 to 32 bits streams 2 B in and 4 B out per parameter
CONVERT_BYTES = GRAD16 + GRAD32


@dataclass(frozen=True)
class OffloadPlan:
    """Everything the simulator needs to offload: the targets, the host, how state is sharded,
    and the device's streaming rate for a gradient conversion (bytes/s)."""
    offload: Offload
    host: HostSide
    dp: int = 1
    zero: int = 0
    device_stream_rate: float = 1e11

    def __post_init__(self) -> None:
        if not isinstance(self.offload, Offload) or not isinstance(self.host, HostSide):
            raise ConfigError("OffloadPlan needs an Offload and a HostSide")
        if not (math.isfinite(self.device_stream_rate) and self.device_stream_rate > 0):
            raise ConfigError(f"OffloadPlan.device_stream_rate must be > 0 bytes/s, got {self.device_stream_rate!r}")

    def shard_params(self, grad_bytes: int) -> int:
        """Parameters of the local shard of a layer whose FP16 gradient on the rank is ``grad_bytes``."""
        params = grad_bytes // GRAD16
        return math.ceil(params / self.dp) if self.zero >= 1 else params

    def host_adam_ms(self, params: int) -> float:
        return self.host.stream_ms(params * HOST_ADAM_BYTES, params * ADAM_FLOPS)


def conversion_paths(host: HostSide, params: int, device_stream_rate: float) -> dict:
    """Both ways of getting ``params`` 16-bit gradients to a host-side update as 32-bit.

    device: convert on the device (``CONVERT_BYTES`` per parameter at the device's streaming rate),
    send 4 B; host: send 2 B, convert on the host (at host memory bandwidth). The latency is paid
    once either way, so the choice flips where 2 / B = 6 / host_bw - 6 / device_rate: above that
    link bandwidth B the device path is faster (none when the host converts at least as fast)."""
    n = params
    device = 1e3 * n * CONVERT_BYTES / device_stream_rate + host.transfer_ms(n * GRAD32)
    on_host = host.transfer_ms(n * GRAD16) + 1e3 * n * CONVERT_BYTES / host.memory_bandwidth
    gap = CONVERT_BYTES / host.memory_bandwidth - CONVERT_BYTES / device_stream_rate
    flip = (GRAD32 - GRAD16) / gap if gap > 0 else None
    return {"params": n, "device_path_ms": device, "host_path_ms": on_host,
            "faster": "device" if device < on_host else "host", "flip_link_bandwidth": flip,
            "device_buffer_bytes": {"device": n * GRAD32, "host": 0},
            "host_buffer_bytes": {"device": n * GRAD32, "host": n * GRAD16 + n * GRAD32}}


def conversion_choice(plan: OffloadPlan, params: int) -> str:
    """Where gradients are converted: the plan's choice, or the faster path (``auto``)."""
    if plan.offload.convert != "auto":
        return plan.offload.convert
    return conversion_paths(plan.host, params, plan.device_stream_rate)["faster"]


def _edge(a, b) -> None:
    a.succs.append(b)
    b.preds.append(a)
    b.npred += 1
    if b.fsr_r is not None and a is not b.fsr_r:
        b.other += 1          # a backward's FSR promotion waits for its other predecessors too


class _Attach:
    """Adds the plan's tasks to a built simulation graph (``ratrain.sim.simulator._Sim``)."""

    def __init__(self, sim, plan: OffloadPlan):
        self.sim, self.plan = sim, plan
        self.records: list[tuple] = []        # (job, what, bytes, consumer)

    def _xfer(self, p, kind, mb, layer, res, nbytes, cls, what, consumer=None):
        """A transfer of ``nbytes`` on one direction of the host link."""
        return self._task(p, kind, mb, layer, res, self.plan.host.transfer_ms(nbytes), cls, what, nbytes, consumer)

    def _convert(self, p, layer, res, params, rate, cls, consumer=None):
        """A 16-to-32-bit conversion of ``params`` gradients streamed at ``rate`` bytes/s."""
        return self._task(p, "Convert", None, layer, res, 1e3 * params * CONVERT_BYTES / rate, cls,
                          "gradient conversion", 0, consumer)

    def _task(self, p, kind, mb, layer, res, dur, cls, what, nbytes, consumer):
        j = self.sim._job(p, kind, mb, layer, res, dur, cls)
        j.order_hint = layer if layer is not None else 0
        self.records.append((j, what, nbytes, consumer))
        return j

    def activations(self, main_cls: int) -> None:
        sim = self.sim
        policy = sim.mech.policy
        lookahead = self.plan.offload.reload_lookahead
        backward = {f.idx: sim.B[key][i] for key, jobs in sim.F.items() for i, f in enumerate(jobs)}
        for p in range(sim.P):
            chain = sim.main_chain[p]
            where = {j.idx: i for i, j in enumerate(chain)}
            for j in chain:
                if j.kind != "F":
                    continue
                m, layer = j.mb, j.layer
                b = backward[j.idx]
                r = b.fsr_r
                lc = sim.flat[layer]
                nbytes = lc.act_full_bytes if (policy == "full" or (policy == "fsr" and r is None)) \
                    else lc.act_ckpt_bytes
                if nbytes <= 0:
                    continue
                out = self._xfer(p, "ToHost", m, layer, "d2h", nbytes, main_cls, "activations")
                _edge(j, out)
                consumer = r if r is not None else b
                back = self._xfer(p, "FromHost", m, layer, "h2d", nbytes, main_cls, "activations", consumer)
                _edge(out, back)
                gate = where[b.idx] - 1 - lookahead
                if gate >= 0:
                    _edge(chain[gate], back)
                _edge(back, consumer)

    def state(self, life_cls: int) -> None:
        sim, plan, off = self.sim, self.plan, self.plan.offload
        for p in range(sim.P):
            new = []
            updates = sim.update_of[p]
            for layer in sim.stage_layers[p]:
                n = plan.shard_params(sim.flat[layer].grad_bytes)
                if n <= 0:
                    continue
                u = updates[layer]
                if off.host_adam:
                    path = conversion_choice(plan, n)
                    g = sim.gradsync_of[p][layer]
                    if path == "device":
                        c = self._convert(p, layer, "ddr", n, plan.device_stream_rate, life_cls)
                        x = self._xfer(p, "ToHost", None, layer, "d2h", n * GRAD32, life_cls, "gradients", u)
                        _edge(g, c)
                        _edge(c, x)
                        _edge(x, u)
                        new += [c, x]
                    else:
                        x = self._xfer(p, "ToHost", None, layer, "d2h", n * GRAD16, life_cls, "gradients")
                        c = self._convert(p, layer, "host", n, plan.host.memory_bandwidth, life_cls, u)
                        _edge(g, x)
                        _edge(x, c)
                        _edge(c, u)
                        new += [x, c]
                    w = sim.prefetch[p][layer]
                    y = self._xfer(p, "FromHost", None, layer, "h2d", n * GRAD16, life_cls, "weights", w)
                    _edge(u, y)
                    _edge(y, w)
                    new.append(y)
                elif off.state_bytes_per_param:
                    nbytes = n * off.state_bytes_per_param
                    start = sim.acc_done[p][layer] if sim.mech.layerwise else sim.main_chain[p][-1]
                    f = self._xfer(p, "FromHost", None, layer, "h2d", nbytes, life_cls, "optimizer state", u)
                    s = self._xfer(p, "ToHost", None, layer, "d2h", nbytes, life_cls, "optimizer state")
                    _edge(start, f)
                    _edge(f, u)
                    _edge(u, s)
                    new += [f, s]
            if off.host_adam:
                self._move_updates_to_host(p)
            sim.life[p].extend(new)

    def _move_updates_to_host(self, p: int) -> None:
        sim, plan = self.sim, self.plan
        by_job: dict[int, list[int]] = {}
        jobs = {}
        for layer, u in sim.update_of[p].items():
            by_job.setdefault(u.idx, []).append(layer)
            jobs[u.idx] = u
        for idx, layers in by_job.items():
            u = jobs[idx]
            u.res = sim.host_res(p)
            u.dur = sum(plan.host_adam_ms(plan.shard_params(sim.flat[layer].grad_bytes)) for layer in layers)


def attach(sim, plan: OffloadPlan, main_cls: int, life_cls: int) -> list[tuple]:
    """Add the plan's tasks to ``sim`` before it runs; returns (job, what, bytes, consumer) records."""
    a = _Attach(sim, plan)
    if plan.offload.has("activations"):
        a.activations(main_cls)
    if plan.offload.state_bytes_per_param or plan.offload.host_adam:
        a.state(life_cls)
    return a.records


def transfer_summary(records: list[tuple]) -> dict:
    """Per kind of tensor: transfers, bytes, link time, and what the consumers waited for them:
    max(0, transfer end - the moment the consumer was otherwise ready), the V/B - W of each."""
    out: dict[str, dict] = {}
    for job, what, nbytes, consumer in records:
        s = out.setdefault(what, {"tasks": 0, "bytes": 0, "busy_ms": 0.0, "consumer_wait_ms": 0.0,
                                  "max_consumer_wait_ms": 0.0})
        s["tasks"] += 1
        s["bytes"] += nbytes
        s["busy_ms"] += job.end - job.start
        if consumer is not None:
            others = [q.end for q in consumer.preds if q is not job and not _feeds(q, job)]
            ready = max(others, default=0.0)
            wait = max(0.0, job.end - ready)
            s["consumer_wait_ms"] += wait
            s["max_consumer_wait_ms"] = max(s["max_consumer_wait_ms"], wait)
    return out


def offload_report(sim, plan: OffloadPlan, res_busy: list[list[float]], res_names: tuple[str, ...]) -> dict:
    """What moved over the host link, how long each direction and the host were busy, and the device
    buffers state transfers held: a layer's state from the start of its fetch to the end of its
    write-back, a 32-bit gradient from the start of its conversion to the end of its transfer."""
    index = {r: res_names.index(r) for r in ("d2h", "h2d", "host")}
    ddr = res_names.index("ddr")
    events: list[list[tuple[float, int]]] = [[] for _ in range(sim.P)]
    converting: dict[tuple[int, int], float] = {}
    for job, what, nbytes, _ in sim.host_records:
        ev = events[job.stage]
        if what == "optimizer state":
            ev.append((job.start, nbytes) if job.kind == "FromHost" else (job.end, -nbytes))
        elif what == "gradient conversion" and job.res % len(res_names) == ddr:
            converting[(job.stage, job.layer)] = job.start
        elif what == "gradients" and (job.stage, job.layer) in converting:
            ev += [(converting[(job.stage, job.layer)], nbytes), (job.end, -nbytes)]
    return {**plan.offload.to_json(), "host": plan.host.to_json(), "transfers": transfer_summary(sim.host_records),
            "stages": [{"stage": p, **{f"{r}_busy_ms": res_busy[p][i] for r, i in index.items()},
                        "state_buffer_peak_bytes": _peak_bytes(events[p])} for p in range(sim.P)]}


def _peak_bytes(events: list[tuple[float, int]]) -> int:
    cur = peak = 0
    for _, d in sorted(events):            # frees (negative) sort before allocations at one instant
        cur += d
        peak = max(peak, cur)
    return peak


def _feeds(q, job) -> bool:
    """Whether ``q`` is part of the transfer chain that ends in ``job`` (a conversion before it)."""
    return q in job.preds and q.kind in ("Convert", "ToHost", "FromHost")




def device_stream_rate(platform, profile=None) -> float:
    """The device's streaming rate for a gradient conversion (bytes/s): the profile's measured rate of
    the optimizer's streams where there is a profile, else the platform's nominal memory bandwidth."""
    if profile is not None:
        return profile.ddr_rate("optimizer_update")
    if isinstance(platform, GpuPlatform):
        return platform.device.hbm_bandwidth * platform.kernels.hbm_efficiency
    return platform.ddr_bandwidth


def plan_for(offload: Offload, platform, *, dp: int, zero: int, profile=None,
             host_link_bandwidth: float | None = None) -> OffloadPlan:
    """The simulator's plan for ``offload`` on ``platform`` (its host side, the link bandwidth
    overridden by ``host_link_bandwidth`` if given)."""
    host = host_of(platform)
    if host_link_bandwidth is not None:
        host = replace(host, link_bandwidth=host_link_bandwidth)
    return OffloadPlan(offload, host, dp=dp, zero=zero, device_stream_rate=device_stream_rate(platform, profile))


def conversion_report(plan: OffloadPlan, grad_bytes: list[int]) -> dict:
    """Both gradient-conversion paths for the largest layer shard and summed over the given layers'
    shards, the faster, the link bandwidth where the choice flips, and each path's extra buffers."""
    shards = [plan.shard_params(b) for b in grad_bytes if b > 0]
    if not shards:
        return {}
    largest = conversion_paths(plan.host, max(shards), plan.device_stream_rate)
    every = [conversion_paths(plan.host, n, plan.device_stream_rate) for n in shards]
    return {"largest_layer": largest, "chosen": conversion_choice(plan, max(shards)),
            "step_device_path_ms": sum(x["device_path_ms"] for x in every),
            "step_host_path_ms": sum(x["host_path_ms"] for x in every)}


__all__ = ["ADAM_FLOPS", "CONVERT_BYTES", "HOST_ADAM_BYTES", "OffloadPlan", "attach", "conversion_choice",
           "conversion_paths", "conversion_report", "device_stream_rate", "offload_report", "plan_for",
           "transfer_summary"]

"""Cost model: a latency profile + a parallel configuration -> the simulator's per-layer costs.

Inputs: a ``LayerProfile`` (``ratrain.cost.profile.layer_profile``; times in seconds for one
transformer layer and one micro-batch on one TP rank, compute only) and a ``ParallelConfig``.
Output: ``PipelineCosts`` (milliseconds), plus the per-layer "kinds" the planner uses.

Every term and the resource it occupies (reasoning in docs/CHOICES.md, "ratrain cost model
and planner"):

* F / B per layer and micro-batch: the profile's compute plus two tensor-parallel
  all-reduces of the b*seq*hidden FP16 activations per direction (T > 1), ring over T ranks on
  the inter-cluster link: 2(T-1)/T * bytes / link_bw + 2(T-1) * latency. The all-reduce sits
  between the projection GEMMs of one layer, so the compute waits for it (critical path; the
  simulator sees it as part of the F/B task, the compute unit idle while waiting on the link).
  Stage 0's first layer also carries the embedding (+ its all-reduce under vocab-parallel TP),
  the last stage's last layer the final norm + LM head + loss (+ the LM head's input-gradient
  all-reduce and a small loss all-reduce under TP).
* Recompute (R): the layer's forward, all-reduces included (the embedding and LM head are not
  recomputed: the layer-0 checkpoint is the embedding output, the logits live F->B). Runs on
  ``compute`` (it is GEMM work): under ckpt it is folded into B, under FSR the simulator places
  it in compute bubbles.
* ZeRO-3 with per-use gathers (prefetch policy 'layerwise', D > 1): before every F, B and R of
  every micro-batch the layer's FP16 weights are all-gathered over D: (D-1)/D * bytes / link_bw
  + (D-1) * latency. memory.py reserves a one-layer prefetch buffer next to the working
  weights, so the gather for the next compute task runs on the link while the current one
  computes: each compute task lasts max(compute, gather) (the overflow is the compute unit
  waiting on the link). ZeRO-3 with 'bulk' prefetch gathers the whole stage once per step
  (memory.py counts the stage-sized buffer): no per-use gathers, the gather is PrefetchW's.
* GradSync per layer per step (D > 1): reduce-scatter (Z >= 2) or all-reduce (Z < 2) of the
  layer's FP16 gradients over a D ring on the link. Gradients only: the all-gather of the
  updated weights is PrefetchW's.
* UpdateShard per layer per step: Adam over the local shard (1/D of the layer for Z >= 1),
  DDR-bound: FP32 master, m, v read and written (24 B), FP16 gradient read (2 B), FP16 weight
  written (2 B) per parameter, at the DDR rate the emulator measures for Adam's streams
  (``profile.ddr_rate("optimizer_update")``, mtemu.ddr_probe). Resource ``ddr``.
* PrefetchW per layer per step: for Z = 1, 2 (and Z = 3 with bulk prefetch), D > 1, the ring
  all-gather of the updated FP16 shards over D on the link, (D-1)/D * bytes / link_bw +
  (D-1) * latency; the arriving chunks are written to DDR as they come (bytes at the measured
  ``prefetch_write`` rate,
  streamed), so the task lasts max(all-gather, DDR write). Zero otherwise (Z = 0 and D = 1
  update the FP16 weights in place; Z = 3 layer-wise gathers at use). Resource ``link``
  (``PipelineCosts.prefetch_resource``), so it competes with GradSync and transfers there.
* Link sharing: GradSync runs while the layer's backward collectives (2 TP all-reduces, the
  ZeRO-3 gather) also need the link; the simulator's link only holds GradSync, PrefetchW and
  transfers, so GradSync's duration includes that displaced link time (conservative: it
  assumes every such collective falls inside the sync's window).
* Stage-boundary transfer per micro-batch and direction: b*seq*hidden FP16 / link_bw + latency.
* Mixture-of-experts layers (``spec.moe``): the profile times the routed experts at the mean rows a
  device runs (tokens x k); the step waits for the busiest device, so the expert operators
  (``ratrain.spec.models.EXPERT_OPERATORS``) are scaled by its rows over that mean
  (``ratrain.spec.moe.route``: imbalance, capacity and padding). Under EP > 1 each F and B carries
  two all-to-alls (dispatch and combine) of the busiest device's rows x hidden FP16 over the EP
  group (``collectives.alltoall_in_data_group``), on the critical path like the TP all-reduces. The
  dense parameters' gradients are reduced over the D x CP data ranks, the experts' over the
  D x CP / EP ranks holding the same experts; the update and prefetch likewise.
* Context parallelism CP > 1: a device runs s/CP tokens of every sequence, so the profile's compute
  (taken at the whole sequence) divides by CP (the attention too: the causal work split evenly, as
  a zig-zag assignment of sequence chunks gives it), and the TP all-reduces and the stage transfer
  carry s/CP tokens. Ring attention passes each device's K/V chunk (b x s/CP x kv heads x head_dim,
  K and V, FP16) around the CP ring: CP - 1 steps, each overlapped with the attention on the chunk
  in hand, so F waits (CP - 1) x max(0, step - attention / CP); B passes K/V again and the dK/dV
  partials back, twice the bytes per step. Gradients reduce over D x CP.

On a GPU cluster (``ratrain.spec.gpu.GpuPlatform``) the same terms hold with the GPU kernel
model's profile (``ratrain.cost.gpu_kernels``), HBM rates for the bandwidth-bound terms, and each
collective on the link its group uses under Megatron's rank placement (``ratrain.cost.collectives``:
tensor groups inside a node, data and pipeline groups inside or across nodes); GradSync holds its
link for the tensor-parallel all-reduces only where both share a link.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ratrain.cost.collectives import collectives_for, ring_allreduce_ms, ring_reduce_scatter_ms
from ratrain.cost.gpu_kernels import gpu_layer_profile
from ratrain.cost.profile import PROFILE_SOURCES, LayerProfile, layer_profile
from ratrain.cost.tasks import LayerCosts, PipelineCosts
from ratrain.errors import ConfigError
from ratrain.spec.gpu import GpuPlatform
from ratrain.spec.lengths import LengthPlan
from ratrain.spec.memory import MoeCpLayout, layer_checkpoint_bytes, layer_full_bytes
from ratrain.spec.models import (
    EXPERT_OPERATORS,
    FP16,
    ModelSpec,
    check_tp,
    layer_device_parameter_count,
    stage_edge_parameters,
)
from ratrain.spec.moe import capacity_factors, capacity_sweep, route
from ratrain.spec.parallel import ParallelConfig, partition_model
from ratrain.spec.platform import TrainingPlatform

# Adam bytes moved per parameter of the local shard: FP32 master + m + v read and written
# (3 * 4 * 2), FP16 gradient read (2), FP16 weight written (2).
ADAM_BYTES_PER_PARAM = 3 * 4 * 2 + FP16 + FP16
# PrefetchW is the all-gather of the updated shards (zero-length where there is none): link work
PREFETCH_RESOURCE = "link"


# ---------------------------------------------------------------- collectives (milliseconds)

def p2p_ms(nbytes: float, platform: TrainingPlatform) -> float:
    """One point-to-point message on the inter-cluster link."""
    return 1e3 * (nbytes / platform.link_bandwidth + platform.link_latency_s)


def allreduce_ms(nbytes: float, ranks: int, platform: TrainingPlatform) -> float:
    """Ring all-reduce on the inter-cluster link: 2(n-1) steps each moving bytes/n per rank."""
    return ring_allreduce_ms(nbytes, ranks, platform.link_bandwidth, platform.link_latency_s)


def reduce_scatter_ms(nbytes: float, ranks: int, platform: TrainingPlatform) -> float:
    """Ring reduce-scatter (and, by symmetry, all-gather) on the inter-cluster link: (n-1) steps of bytes/n."""
    return ring_reduce_scatter_ms(nbytes, ranks, platform.link_bandwidth, platform.link_latency_s)


all_gather_ms = reduce_scatter_ms


# ---------------------------------------------------------------- per-layer kinds

@dataclass(frozen=True)
class LayerKind:
    """Costs (ms) of one layer in one configuration; ``backward`` excludes recompute."""
    forward: float
    backward: float
    recompute: float
    gradsync: float
    update: float
    prefetch: float
    params: int = 0           # the layer's parameters on one device, routed experts included (2 B of gradient each)
    exchange_forward: float = 0.0     # EP all-to-all and CP K/V ring time inside the forward (link)
    exchange_backward: float = 0.0    # ... inside the backward


@dataclass(frozen=True)
class CostTerms:
    """The distinct layer kinds of a configuration and what they are made of.

    mid: any layer without embedding/head; first: layer 0 (stage 0, with the embedding);
    last: the final layer (stage P-1, with norm + LM head + loss); only: the single layer of a
    one-layer model. ``parts`` keeps the components for breakdowns (ms).
    """
    mid: LayerKind
    first: LayerKind
    last: LayerKind
    only: LayerKind
    transfer: float
    parts: dict
    exchange: dict = field(default_factory=dict)   # MoE routing and EP/CP exchange (empty: dense, CP=1)


def _profile_ms(profile, name: str) -> float:
    value = getattr(profile, name)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"layer profile: field {name} must be a finite number >= 0 s, got {value!r}")
    return 1e3 * float(value)


def cost_terms(model: ModelSpec, cfg: ParallelConfig, profile, platform: TrainingPlatform | GpuPlatform) -> CostTerms:
    """The per-layer costs of ``cfg`` (see the module docstring for every term); each collective on
    the link its group uses (``ratrain.cost.collectives``: on MT-3000 all on the one link)."""
    check_tp(model, cfg.tp)
    if model.vocab % cfg.tp:
        raise ConfigError(f"model {model.name}: vocab={model.vocab} not divisible by tp={cfg.tp}")
    T, D, Z = cfg.tp, cfg.data_ranks, cfg.zero
    m = cfg.micro_batch * (cfg.seq // cfg.cp)
    act = m * model.hidden * FP16
    net = collectives_for(platform, T, D, cfg.pp)
    ar = net.allreduce_ms(act, "tp")
    f_core, b_core = _profile_ms(profile, "forward_s"), _profile_ms(profile, "backward_s")
    fx_first, bx_first = _profile_ms(profile, "first_forward_s"), _profile_ms(profile, "first_backward_s")
    fx_last, bx_last = _profile_ms(profile, "last_forward_s"), _profile_ms(profile, "last_backward_s")
    exchange: dict = {}
    ex_f = ex_b = ex_link = 0.0
    expert_ranks = 1
    if cfg.cp > 1:
        cp = cfg.cp
        f_core, b_core, fx_first, bx_first, fx_last, bx_last = (
            x / cp for x in (f_core, b_core, fx_first, bx_first, fx_last, bx_last))
        exchange["context_parallel"] = ring = _cp_ring(model, cfg, profile, net)
        ex_f, ex_b = ring["forward_wait_ms"], ring["backward_wait_ms"]
        ex_link = ring["backward_ring_ms"]
    if model.moe is not None:
        moe = _moe_terms(model, cfg, profile, net, m)
        exchange["moe"] = moe
        f_core += moe["expert_forward_extra_ms"]
        b_core += moe["expert_backward_extra_ms"]
        ex_f, ex_b = ex_f + moe["alltoall_forward_ms"], ex_b + moe["alltoall_backward_ms"]
        ex_link += moe["alltoall_backward_ms"]
        expert_ranks = D // cfg.ep
    elif cfg.ep > 1:
        raise ConfigError(f"expert parallelism EP={cfg.ep} needs a MoE model; {model.name} is dense")

    # per device: the dense parameters (a dense model's all) and the E/EP routed experts
    layer_params, expert_params = layer_device_parameter_count(model, T, cfg.ep)
    emb_params, head_params = stage_edge_parameters(model, cfg.pp, T)

    # TP traffic of the embedding / head (vocab-parallel): embedding output all-reduce (F),
    # LM-head input-gradient all-reduce (B), loss max + sum-exp all-reduces of m FP32 values (F).
    first_f_comm = ar
    last_f_comm = 2 * net.allreduce_ms(m * 4, "tp")
    last_b_comm = ar

    update_rate, prefetch_rate = profile.ddr_rate("optimizer_update"), profile.ddr_rate("prefetch_write")
    per_use_gather = Z == 3 and D > 1 and cfg.prefetch == "layerwise"
    prefetch_gather = D > 1 and (Z in (1, 2) or (Z == 3 and cfg.prefetch == "bulk"))

    def kind(f_extra: float, b_extra: float, f_comm: float, b_comm: float, params: int) -> LayerKind:
        fwd = f_core + 2 * ar + f_extra + f_comm
        bwd = b_core + 2 * ar + b_extra + b_comm
        rec = f_core + 2 * ar
        if exchange:        # EP all-to-alls and the CP ring the compute waits for
            fwd, bwd, rec = fwd + ex_f, bwd + ex_b, rec + ex_f
        gather = 0.0
        if per_use_gather:
            g = gather = net.all_gather_ms(params * FP16, "dp")
            if expert_params:
                g = gather = g + _expert_collective(net, expert_params * FP16, expert_ranks, cfg.ep, "gather")
            fwd = max(fwd, g)
            if cfg.activation == "ckpt":
                bwd = max(bwd + rec, g) - rec     # one gather serves recompute + backward
            elif cfg.activation == "fsr":
                rec, bwd = max(rec, g), max(bwd, g)
            else:
                bwd = max(bwd, g)
        if cfg.activation == "full":
            rec = 0.0
        grad_bytes = params * FP16
        if D > 1:
            sync = net.reduce_scatter_ms(grad_bytes, "dp") if Z >= 2 else net.allreduce_ms(grad_bytes, "dp")
        else:
            sync = 0.0
        if expert_params:
            sync += _expert_collective(net, expert_params * FP16, expert_ranks, cfg.ep,
                                       "scatter" if Z >= 2 else "reduce")
        if sync > 0 and net.shares_link("tp", "dp"):
            # The link also carries the layer's main-path collectives during the backward window
            # GradSync runs in (its TP all-reduces, its ZeRO-3 gather); the simulator's link only
            # sees GradSync, so GradSync holds the link for that time too (conservative).
            sync += 2 * ar + (gather if per_use_gather else 0.0)
            if ex_link:
                sync += ex_link       # the backward's all-to-alls and K/V ring on the same link
        shard = math.ceil(params / D) if Z >= 1 else params
        if expert_params:
            shard += math.ceil(expert_params / expert_ranks) if Z >= 1 else expert_params
        upd = 1e3 * shard * ADAM_BYTES_PER_PARAM / update_rate
        # the all-gather streams into DDR as it arrives: the slower of the two sets the time
        pre = max(net.all_gather_ms(params * FP16, "dp"), 1e3 * params * FP16 / prefetch_rate) \
            if prefetch_gather else 0.0
        if expert_params and prefetch_gather:
            pre = max(net.all_gather_ms(params * FP16, "dp")
                      + _expert_collective(net, expert_params * FP16, expert_ranks, cfg.ep, "gather"),
                      1e3 * (params + expert_params) * FP16 / prefetch_rate)
        # the gradient buckets and offloading size the layer by all of its gradient on the device
        return LayerKind(fwd, bwd, rec, sync, upd, pre, params + expert_params, ex_f, ex_b)

    mid = kind(0.0, 0.0, 0.0, 0.0, layer_params)
    first = kind(fx_first, bx_first, first_f_comm, 0.0, layer_params + emb_params)
    last = kind(fx_last, bx_last, last_f_comm, last_b_comm, layer_params + head_params)
    only = kind(fx_first + fx_last, bx_first + bx_last, first_f_comm + last_f_comm, last_b_comm,
                layer_params + emb_params + head_params)
    parts = {
        "compute_forward_ms": f_core, "compute_backward_ms": b_core,
        "tp_allreduce_ms": ar, "tp_comm_per_layer_mb_ms": 4 * ar,
        "zero3_gather_ms": net.all_gather_ms(layer_params * FP16, "dp") if per_use_gather else 0.0,
        "transfer_ms": net.p2p_ms(act),      # used only between stages (P > 1)
        # GradSync's cost at zero bytes: what one collective pays whatever its size (gradient buckets)
        "gradsync_launch_ms": ((net.reduce_scatter_ms(0, "dp") if Z >= 2 else net.allreduce_ms(0, "dp"))
                               if D > 1 else 0.0),
    }
    return CostTerms(mid, first, last, only, parts["transfer_ms"], parts, exchange)


def _expert_collective(net, nbytes: float, ranks: int, stride: int, op: str) -> float:
    """A collective over the ranks holding the same experts (``ranks`` of them, EP apart in the data group)."""
    if op == "gather":
        return net.reduce_in_data_group(nbytes, ranks, stride, scatter=True)
    return net.reduce_in_data_group(nbytes, ranks, stride, scatter=op == "scatter")


def _moe_terms(model: ModelSpec, cfg: ParallelConfig, profile, net, tokens: int) -> dict:
    """The busiest device's expert work and all-to-alls (module docstring); ``tokens`` per device and micro-batch."""
    moe, ep = model.moe, cfg.ep
    report = route(moe, tokens * ep, ep, cfg.routing)
    mean_rows = tokens * moe.experts_per_token
    scale = report.busiest_device_rows / mean_rows
    f_exp = sum(1e3 * o.forward_s for o in profile.ops if o.name in EXPERT_OPERATORS) / cfg.cp
    b_exp = sum(1e3 * o.backward_s for o in profile.ops if o.name in EXPERT_OPERATORS) / cfg.cp
    volume = report.busiest_device_rows * model.hidden * FP16
    a2a = net.alltoall_in_data_group(volume, ep) if ep > 1 else 0.0
    return {"routing": report.to_json(), "ep": ep, "expert_rows_scale": scale,
            "expert_forward_ms": f_exp * scale, "expert_backward_ms": b_exp * scale,
            "expert_forward_extra_ms": f_exp * (scale - 1), "expert_backward_extra_ms": b_exp * (scale - 1),
            "alltoall_bytes": volume, "alltoall_ms": a2a,
            "alltoall_forward_ms": 2 * a2a, "alltoall_backward_ms": 2 * a2a}


def _cp_ring(model: ModelSpec, cfg: ParallelConfig, profile, net) -> dict:
    """Ring attention's K/V exchange over the CP group and what the compute waits for (module docstring)."""
    cp = cfg.cp
    chunk = 2 * cfg.micro_batch * (cfg.seq // cp) * (model.kv_heads // cfg.tp) * model.head_dim * FP16
    attn_f = sum(1e3 * o.forward_s for o in profile.ops if o.kind == "attention") / cp
    attn_b = sum(1e3 * o.backward_s for o in profile.ops if o.kind == "attention") / cp
    ring_f = net.ring_exchange_in_data_group(chunk, cp)
    ring_b = net.ring_exchange_in_data_group(2 * chunk, cp)
    steps = cp - 1
    wait_f = max(0.0, ring_f - attn_f * steps / cp)
    wait_b = max(0.0, ring_b - attn_b * steps / cp)
    return {"cp": cp, "chunk_bytes": chunk, "steps": steps, "forward_ring_ms": ring_f, "backward_ring_ms": ring_b,
            "attention_forward_ms": attn_f, "attention_backward_ms": attn_b,
            "forward_wait_ms": wait_f, "backward_wait_ms": wait_b}


def stage_kinds(terms: CostTerms, parts: list[range]) -> list[list[LayerKind]]:
    """Per stage, the layer kinds in forward order."""
    P = len(parts)
    out = []
    for p, layers in enumerate(parts):
        n = len(layers)
        ks = [terms.mid] * n
        if P == 1 and n == 1:
            ks[0] = terms.only
        else:
            if p == 0:
                ks[0] = terms.first
            if p == P - 1:
                ks[-1] = terms.last
        out.append(ks)
    return out


def pipeline_costs(model: ModelSpec, cfg: ParallelConfig, profile,
                   platform: TrainingPlatform | GpuPlatform | None = None,
                   *, recovery_resource: str = "compute", lengths: LengthPlan | None = None) -> PipelineCosts:
    """The simulator's input for one data-parallel replica of ``cfg``; ``lengths``: the step's
    micro-batches of unequal sequences (``ratrain.spec.lengths``), their times scaled per micro-batch."""
    platform = platform or TrainingPlatform()
    terms = cost_terms(model, cfg, profile, platform)
    parts = partition_model(model, cfg.pp, cfg.partition)
    b, s, t = cfg.micro_batch, cfg.seq, cfg.tp
    layout = MoeCpLayout.of(model, cfg)
    if layout is None:
        full = layer_full_bytes(model, b, s, t)
        ckpt = layer_checkpoint_bytes(model, b, s)
    else:
        local = s // cfg.cp
        full = layer_full_bytes(model, b, local, t, kv_seq=s if cfg.cp > 1 else None, expert_rows=layout.expert_rows)
        ckpt = layer_checkpoint_bytes(model, b, local)
    scales = microbatch_scales(profile, cfg, lengths) if lengths is not None else None
    cache: dict[int, LayerCosts] = {}

    def lc(k: LayerKind) -> LayerCosts:
        got = cache.get(id(k))
        if got is None:
            got = cache[id(k)] = LayerCosts(
                forward_ms=k.forward, backward_ms=k.backward, recompute_ms=k.recompute,
                gradsync_ms=k.gradsync, update_ms=k.update, prefetch_ms=k.prefetch,
                act_full_bytes=full, act_ckpt_bytes=ckpt, recovery_bytes=full - ckpt,
                grad_bytes=k.params * FP16,
                exchange_forward_ms=k.exchange_forward, exchange_backward_ms=k.exchange_backward)
        return got

    stages = [[lc(k) for k in ks] for ks in stage_kinds(terms, parts)]
    return PipelineCosts(stages=stages, transfer_ms=terms.transfer, microbatches=cfg.accum, dp=cfg.dp,
                         recovery_resource=recovery_resource, update_resource="ddr",
                         prefetch_resource=PREFETCH_RESOURCE, gradsync_launch_ms=terms.parts["gradsync_launch_ms"],
                         microbatch_scales=scales)


def attention_and_linear_ms(profile) -> tuple[float, float]:
    """One layer's forward + backward per micro-batch split into (GEMM-like, attention) ms."""
    attention = sum(1e3 * (o.forward_s + o.backward_s) for o in profile.ops if o.kind == "attention")
    return 1e3 * (profile.forward_s + profile.backward_s) - attention, attention


def microbatch_scales(profile, cfg: ParallelConfig, lengths: LengthPlan) -> tuple[float, ...] | None:
    """Per micro-batch time factors of a length plan (None when every one is the uniform micro-batch)."""
    if (lengths.seq, lengths.micro_batch, len(lengths.microbatches)) != (cfg.seq, cfg.micro_batch, cfg.accum):
        raise ConfigError(f"length plan for seq={lengths.seq}, b={lengths.micro_batch}, "
                          f"A={len(lengths.microbatches)} does not match the configuration's seq={cfg.seq}, "
                          f"b={cfg.micro_batch}, A={cfg.accum}")
    scales = lengths.scales(*attention_and_linear_ms(profile))
    return None if all(x == 1.0 for x in scales) else scales


def load_profile(model: ModelSpec, micro_batch: int, seq: int, tp: int = 1, source: str = "emulated",
                 platform: TrainingPlatform | GpuPlatform | None = None, progress: bool | None = None) -> LayerProfile:
    """The per-layer latency profile on ``platform``: emulated on MT-3000
    (``ratrain.cost.profile.layer_profile``, ``source`` as it says), or the GPU kernel model's
    (``ratrain.cost.gpu_kernels``, whatever ``source``)."""
    if isinstance(platform, GpuPlatform):
        return gpu_layer_profile(model, micro_batch, seq, tp, platform)
    return layer_profile(model, micro_batch, seq, tp, source=source, platform=platform, progress=progress)


__all__ = ["ADAM_BYTES_PER_PARAM", "PREFETCH_RESOURCE", "PROFILE_SOURCES", "CostTerms", "LayerKind",
           "all_gather_ms", "allreduce_ms", "attention_and_linear_ms", "mechanism_report", "microbatch_scales",
           "cost_terms", "load_profile", "p2p_ms", "pipeline_costs", "reduce_scatter_ms", "stage_kinds"]


def mechanism_report(model: ModelSpec, cfg: ParallelConfig, profile, platform: TrainingPlatform | GpuPlatform,
                     lengths: LengthPlan | None = None, factors: tuple[float, ...] = ()) -> dict:
    """What the MoE layers, context parallelism and a length distribution do to one configuration's
    step: the busiest device's experts, the all-to-alls and the routing per capacity factor (``moe``:
    ``capacity_factors`` of ``factors``),
    the K/V ring (``context_parallel``), the micro-batches and their time factors (``lengths``). Empty
    for a dense model at CP = 1 and uniform lengths."""
    terms = cost_terms(model, cfg, profile, platform)
    out: dict = {}
    if "moe" in terms.exchange:
        moe = dict(terms.exchange["moe"])
        tokens = cfg.micro_batch * (cfg.seq // cfg.cp) * cfg.ep
        moe["capacity"] = capacity_sweep(model.moe, tokens, cfg.ep, cfg.routing,
                                         capacity_factors(factors, cfg.capacity_factor))
        moe["group_tokens"] = tokens
        out["moe"] = moe
    if "context_parallel" in terms.exchange:
        out["context_parallel"] = terms.exchange["context_parallel"]
    if lengths is not None:
        out["lengths"] = lengths.to_json(*attention_and_linear_ms(profile))
    return out

"""Costs of one training iteration as Megatron runs it on a GPU cluster: the simulator's input.

A layout (P pipeline stages, D data-parallel replicas, T tensor-parallel ranks, micro-batch b, A
micro-batches per replica) on a ``GpuPlatform``. Every term and the link it uses:

* Per layer and micro-batch, F and B: the GPU kernel model's compute (``ratrain.cost.gpu_kernels``)
  plus, under T > 1, Megatron's two all-reduces of the b * seq * hidden FP16 activations per
  direction (after the attention projection and after the second MLP GEMM in forward; their
  conjugates before the QKV and first MLP GEMMs in backward), on the tensor group's link. They
  sit on the critical path of the layer, so they are part of F and B. With sequence parallelism
  each all-reduce is a reduce-scatter plus an all-gather (the same ring time).
* Recompute (R), folded into B as Megatron runs it: ``ckpt`` re-runs the layer's forward (its
  all-reduces included); ``selective`` re-runs only the attention core (Q K^T, softmax, attention
  dropout, the product with V); ``full`` re-runs nothing.
* Stage 0 carries the embedding (and its vocab-parallel all-reduce under T > 1); the last stage
  the final norm, the LM head and the vocab-parallel loss (two all-reduces of b * seq FP32 values,
  and the LM head's input-gradient all-reduce in backward).
* Stage boundary: one b * seq * hidden FP16 message per micro-batch and direction to the
  neighbour T * D ranks away.
* After the last backward of a stage (no gradient bucketing, as the measured runs): the
  data-parallel all-reduce of the stage's gradients (``grad_bytes`` per parameter: FP16 by
  default, Megatron's buffer when it does not accumulate in FP32), or under the distributed
  optimizer (ZeRO-1) a reduce-scatter of them and, after the update, an all-gather of the FP16
  weights; then, with P > 1, the all-reduce of the tied embedding's gradient between the first and
  the last stage.
* Optimizer: Megatron's FP16 optimizer as memory-bound passes over the local parameters,
  ``OPTIMIZER_BYTES_PER_PARAM`` bytes each (below); its gradient-norm and overflow checks are
  all-reduces over every model-parallel rank, so every stage waits for the slowest one first.
* Pipeline sends and receives also cost the host ``p2p_host_s`` each (Megatron's p2p path waits
  for its batched isend/irecv), on the F and B of every stage next to another.
* ``step_overhead_s`` of the platform's kernel model: a fixed cost per iteration (framework,
  optimizer kernel launches, data loading), fitted.

Layers of a stage run back to back with nothing between them in this baseline (no per-layer
lifecycle task), so the stage's layers are folded into one simulator layer with their summed
costs: the same step, with a P x (A x 2) event graph instead of P x L x (A x 2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ratrain.cost.collectives import GpuCollectives, Placement
from ratrain.cost.gpu_kernels import bytes_seconds, gpu_layer_profile, host_seconds
from ratrain.cost.tasks import LayerCosts, PipelineCosts
from ratrain.errors import ConfigError
from ratrain.spec.gpu import GpuPlatform
from ratrain.spec.models import (
    FP16,
    FP32,
    ModelSpec,
    Operator,
    check_tp,
    embedding_and_head_operators,
    layer_operators,
    layer_tp_parameter_count,
    stage_edge_parameters,
)
from ratrain.spec.parallel import ParallelConfig

# Megatron's FP16 optimizer step per parameter, as passes over memory: copy the FP16 gradient into
# the FP32 main gradient (read 2, write 4); unscale and check for overflow (read 4, write 4);
# gradient norm (read 4); Adam over master weight, gradient, m, v (read 16, write 12); copy the
# master weight back to the FP16 weight (read 4, write 2); zero the FP16 gradient (write 2).
OPTIMIZER_BYTES_PER_PARAM = 6 + 8 + 4 + 28 + 6 + 2
# ZeRO-1 (distributed optimizer): the same passes over the 1/D shard, the FP16 copy of the full
# weights written by the all-gather. The passes are multi-tensor kernels, one launch each.
OPTIMIZER_KERNELS = 6
# Model switch, off by default (the shipped constants are fitted without it): the step end as
# Megatron-DeepSpeed's FP16 optimizer runs it while its dynamic loss scaler backs off from the
# initial 2**32 (``--initial-loss-scale``, hysteresis 2): the unscale finds an overflow and
# ``Float16OptimizerWithFloat16Params.step`` returns before clipping, Adam and the copy back
# (Megatron-DeepSpeed's optimizer module; its ``train_step`` zeroes the gradient buffer every
# iteration). What is left per parameter: the local DDP's ``buffer /= D`` before the all-reduce
# (read 2, write 2), the FP16 main gradient to FP32 (read 2, write 4), unscale and overflow check
# (read 4, write 4), the buffer's zeroing (write 2); one all-reduce over the model-parallel ranks
# (the overflow flag; no gradient norm). Written for the measured runs' local DDP (under ZeRO-1 the
# all-gather, which a skipped step would not run, is kept). Whether the measured iterations fall
# in that back-off the calibration set does not say: screened, see docs/VALIDATION.md.
OVERFLOW_SKIPPED_STEP = False
SKIPPED_STEP_BYTES_PER_PARAM = 4 + 6 + 8 + 2
SKIPPED_STEP_KERNELS = 4
ACTIVATION_MODES = ("full", "ckpt", "selective")
ATTENTION_CORE = ("attention", "attn_probs_dropout")
# a GPU layer profile depends only on its arguments (all frozen): the many layouts of one model,
# micro-batch and T on one platform share it (read here, never changed)
_layer_profile = lru_cache(maxsize=1024)(gpu_layer_profile)


@dataclass
class MegatronStep:
    """One iteration's costs: the pipeline (one folded layer per stage) and the step-end terms."""
    costs: PipelineCosts
    dp_sync_ms: list[float]          # per stage, after its last backward
    embedding_sync_ms: float         # first <-> last stage, after the data-parallel sync
    optimizer_ms: list[float]        # per stage
    weight_gather_ms: list[float]    # per stage, ZeRO-1's all-gather of the updated weights
    barrier_ms: float                # the gradient-norm / overflow all-reduce over model-parallel ranks
    overhead_ms: float
    parts: dict = field(default_factory=dict)


def _group_ms(coll: GpuCollectives, nbytes: float, kind: str, sequence_parallel: bool) -> float:
    if sequence_parallel:
        return coll.reduce_scatter_ms(nbytes, kind) + coll.all_gather_ms(nbytes, kind)
    return coll.allreduce_ms(nbytes, kind)


def megatron_step(model: ModelSpec, cfg: ParallelConfig, platform: GpuPlatform, *, activation: str = "ckpt",
                  sequence_parallel: bool = False, grad_bytes: int = FP16) -> MegatronStep:
    """The costs of ``cfg`` on ``platform`` (see the module docstring for every term)."""
    if activation not in ACTIVATION_MODES:
        raise ConfigError(f"activation must be one of {', '.join(ACTIVATION_MODES)}, got {activation!r}")
    check_tp(model, cfg.tp)
    if model.vocab % cfg.tp:
        raise ConfigError(f"model {model.name}: vocab={model.vocab} not divisible by tp={cfg.tp}")
    P, D, T = cfg.pp, cfg.dp, cfg.tp
    if model.layers % P:
        raise ConfigError(f"model {model.name}: {model.layers} layers do not split evenly over pp={P}")
    coll = GpuCollectives(platform, Placement(T, D, P))
    prof = _layer_profile(model, cfg.micro_batch, cfg.seq, T, platform)
    m = cfg.micro_batch * cfg.seq
    act = m * model.hidden * FP16
    tp_ar = _group_ms(coll, act, "tp", sequence_parallel)
    n = model.layers // P
    emb_params, head_params = stage_edge_parameters(model, P, T)
    layer_params = layer_tp_parameter_count(model, T)
    loss_ar = coll.allreduce_ms(m * FP32, "tp")

    # each pass as its operators' times, a collective on its link (Megatron's tensor-parallel
    # all-reduces run on the compute stream, so the pass waits for them)
    def stream(profiles: list, ops: list[Operator], backward: bool) -> list[float]:
        return [tp_ar if op.kind == "allreduce" else 1e3 * (o.backward_s if backward else o.forward_s)
                for o, op in zip(profiles, ops, strict=True)]

    layer_ops = layer_operators(model, cfg.micro_batch, cfg.seq, T)
    edge_ops = embedding_and_head_operators(model, cfg.micro_batch, cfg.seq, T)
    fwd = stream(prof.ops, layer_ops, False)
    bwd = stream(prof.ops, layer_ops, True)
    if activation == "ckpt":
        rec = fwd
    elif activation == "selective":
        core = [i for i, op in enumerate(layer_ops) if op.name in ATTENTION_CORE]
        rec = stream([prof.ops[i] for i in core], [layer_ops[i] for i in core], False)
    else:
        rec = []
    first_f, first_b = stream(prof.first_ops, edge_ops["first"], False), stream(prof.first_ops, edge_ops["first"], True)
    last_f = stream(prof.last_ops, edge_ops["last"], False) + ([loss_ar] * 2 if T > 1 else [])
    last_b = ([tp_ar] if T > 1 else []) + stream(prof.last_ops, edge_ops["last"], True)
    ar_per_layer = (6 if activation == "ckpt" else 4) * tp_ar
    p2p_host = 1e3 * platform.kernels.p2p_host_s
    stages, dp_sync, gather, opt, tp_comm = [], [], [], [], []
    for p in range(P):
        f_seq, b_seq, r_seq = fwd * n, bwd * n, rec * n
        params, comm = n * layer_params, n * ar_per_layer
        if p == 0:
            f_seq, b_seq = first_f + f_seq, b_seq + first_b
            params += emb_params
            comm += tp_ar
        if p == P - 1:
            f_seq, b_seq = f_seq + last_f, last_b + b_seq
            params += head_params
            comm += (2 * loss_ar + tp_ar) if T > 1 else 0.0
        passes = [sum(seq) for seq in (f_seq, b_seq, r_seq)]
        # the host's cost of the pass's sends and receives to the neighbouring stages (Megatron's
        # p2p path synchronises the device after its batched isend/irecv): F receives from p - 1
        # and sends to p + 1, B the reverse
        neighbours = (p > 0) + (p < P - 1)
        if neighbours and p2p_host:
            passes[0] += neighbours * p2p_host
            passes[1] += neighbours * p2p_host
        tp_comm.append(comm)
        stages.append([LayerCosts(forward_ms=passes[0], backward_ms=passes[1], recompute_ms=passes[2])])
        if cfg.zero >= 1 and D > 1:
            dp_sync.append(coll.reduce_scatter_ms(params * grad_bytes, "dp"))
            gather.append(coll.all_gather_ms(params * FP16, "dp"))
            local = -(-params // D)
        else:
            dp_sync.append(coll.allreduce_ms(params * grad_bytes, "dp"))
            gather.append(0.0)
            local = params
        per_param, kernels = ((SKIPPED_STEP_BYTES_PER_PARAM, SKIPPED_STEP_KERNELS) if OVERFLOW_SKIPPED_STEP
                              else (OPTIMIZER_BYTES_PER_PARAM, OPTIMIZER_KERNELS))
        opt.append(1e3 * max(bytes_seconds(local * per_param, platform), host_seconds(kernels, platform)))
    emb_sync = coll.allreduce_ms(emb_params * grad_bytes, "embedding") if P > 1 else 0.0
    # the overflow check's and the gradient norm's all-reduces (only the first when the step is skipped)
    barrier = 1e3 * platform.collectives.launch_s * (1 if OVERFLOW_SKIPPED_STEP else 2) if P * T > 1 else 0.0
    costs = PipelineCosts(stages=stages, transfer_ms=coll.p2p_ms(act), microbatches=cfg.accum, dp=D)
    parts = {"tp_allreduce_ms": tp_ar, "compute_forward_ms": 1e3 * prof.forward_s,
             "compute_backward_ms": 1e3 * prof.backward_s,
             "transfer_ms": costs.transfer_ms, "layers_per_stage": n, "tp_comm_per_microbatch_ms": tp_comm,
             "tp_crosses_nodes": coll.crosses_nodes("tp"), "dp_crosses_nodes": coll.crosses_nodes("dp")}
    return MegatronStep(costs, dp_sync, emb_sync, opt, gather, barrier,
                        1e3 * platform.kernels.step_overhead_s, parts)


__all__ = ["ACTIVATION_MODES", "OPTIMIZER_BYTES_PER_PARAM", "OPTIMIZER_KERNELS", "OVERFLOW_SKIPPED_STEP",
           "SKIPPED_STEP_BYTES_PER_PARAM", "SKIPPED_STEP_KERNELS", "MegatronStep", "megatron_step"]

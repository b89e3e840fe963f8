"""Per-stage peak memory, paper Eq. 9: M_p = M_state + M_act(pi_act) + M_buf(pi_pref, pi_act).

State (per parameter held by the stage's TP rank): FP16 weights (2 B), FP16 gradients (2 B),
FP32 master weights + Adam m and v (12 B).  ZeRO shards over the D replicas only:
Z=1 shards the optimizer states, Z=2 also the gradients, Z=3 also the weights and then
needs a gathered working-weight buffer for the layer being computed (counted in the
buffer tier: the paper's runtime treats working weights as medium-lived, not as state).  TP divides the
projection weights (and the vocab-parallel embedding / LM head); norms are replicated.

Activations (Eq. 5 / 6), with N_act(p) = min(P - p, A) micro-batches in flight under 1F1B:
  full: N_act * layers * (every tensor a LLaMA layer's backward reads, FP16; the attention
        keeps its probabilities P, b*heads*seq*seq, as Algorithm 1 loads saved P tiles)
  ckpt: N_act * layers * (layer-boundary input only); the one layer recomputed at backward
        time lives in a recompute buffer (buffer tier)
  fsr:  N_act * layers * (layer-boundary input) + a recovery buffer holding
        ``fsr_buffer_layers`` layers' recovered intermediates (Eq. 6's single M_rec: one layer by
        default; the simulator recovers ahead no further than that buffer holds, so its
        activation timeline meets this term). Eq. 6 puts M_rec in the activation term, so do we.

Buffers: Z=3 working weights, GradSync staging (one layer's FP16 gradient when D > 1), boundary send staging,
TP all-reduce staging, the Z=3 prefetch buffer (next layer's working weights; the whole
stage under bulk prefetch), operator workspace derived from shapes (transient tensors of a
layer's forward/backward and of the LM head + loss), and a fixed runtime reserve, the one
constant fitted to the paper (docs/CHOICES.md, "ratrain models and memory").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ratrain.errors import ConfigError
from ratrain.spec.models import (
    FP16,
    FP32,
    ModelSpec,
    check_tp,
    layer_tp_parameter_count,
    stage_edge_parameters,
)
from ratrain.spec.parallel import (
    ParallelConfig,
    in_flight_microbatches,
    partition_model,
)
from ratrain.spec.platform import GIB, TrainingPlatform

WEIGHT_BYTES = FP16          # working weights
GRAD_BYTES = FP16            # gradients
OPTIMIZER_BYTES = 3 * FP32   # FP32 master + Adam m + Adam v
# FSR's recovery buffer, in layers (Eq. 6's one short-lived M_rec). The one home of the default:
# the memory model counts it and ratrain.sim.simulator.Mechanisms recovers ahead no further.
FSR_BUFFER_LAYERS = 1


@dataclass(frozen=True)
class MemoryConstants:
    """The free constants of the memory model (see docs/CHOICES.md for how they were fit).

    runtime_reserve_bytes: per-cluster memory the shape-derived tiers do not see (runtime
    and communication library, DMA descriptors, allocator fragmentation).  832 MiB is the
    mean residual of three Table 3 rows (LLaMA-2-7B, Baichuan2-13B, LLaMA-2-70B), rounded to
    64 MiB; every other paper row is held out.
    """
    runtime_reserve_bytes: int = 832 * 2 ** 20
    fsr_buffer_layers: int = FSR_BUFFER_LAYERS

    def __post_init__(self) -> None:
        if isinstance(self.fsr_buffer_layers, bool) or not isinstance(self.fsr_buffer_layers, int) \
                or self.fsr_buffer_layers < 1:
            raise ConfigError(f"MemoryConstants.fsr_buffer_layers must be an integer >= 1, "
                              f"got {self.fsr_buffer_layers!r}")


DEFAULT_CONSTANTS = MemoryConstants()


@dataclass
class StageMemory:
    stage: int
    layers: range
    n_act: int
    state_bytes: int
    activation_bytes: int
    buffer_bytes: int
    peak_bytes: int
    breakdown: dict[str, int] = field(default_factory=dict)

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    def to_json(self) -> dict:
        out = asdict(self)
        out["layers"] = [self.layers.start, self.layers.stop]
        return out


# ---------------------------------------------------------------- per-layer activation sets

def layer_saved_tensors(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1) -> dict[str, int]:
    """Bytes of every tensor one layer keeps for its backward under full-save (one micro-batch).

    Norm inputs/outputs and the residual stream are replicated across TP ranks (no sequence
    parallelism); per-head tensors and the MLP intermediates are split by T.
    """
    check_tp(spec, tp)
    m = micro_batch * seq
    h, d, f = spec.hidden, spec.head_dim, spec.ffn // tp
    hq, hkv = spec.heads // tp, spec.kv_heads // tp
    out = {
        "attn_norm_input": m * h * FP16,        # layer input = the checkpoint
        "attn_norm_rstd": m * FP32,
        "attn_norm_output": m * h * FP16,       # input of the q/k/v GEMMs (their dW)
    }
    if spec.qk_norm:
        out["qk_norm_input"] = m * (hq + hkv) * d * FP16
        out["qk_norm_rstd"] = m * (hq + hkv) * FP32
    out.update({
        "q": m * hq * d * FP16,                 # after RoPE / q-norm, read by attention backward
        "k": m * hkv * d * FP16,
        "v": m * hkv * d * FP16,
        "attn_probs": micro_batch * hq * seq * seq * FP16,   # saved P (Algorithm 1, line 5)
        "attn_context": m * hq * d * FP16,      # input of o_proj (its dW)
        "mlp_norm_input": m * h * FP16,         # residual stream after attention
        "mlp_norm_rstd": m * FP32,
        "mlp_norm_output": m * h * FP16,        # input of gate/up (their dW)
        "gate": m * f * FP16,                   # SwiGLU backward needs gate and up
        "up": m * f * FP16,
        "swiglu_output": m * f * FP16,          # input of down_proj (its dW)
    })
    return out


def layer_checkpoint_bytes(spec: ModelSpec, micro_batch: int, seq: int) -> int:
    """Layer-boundary checkpoint: the layer input, b*seq*hidden FP16."""
    return micro_batch * seq * spec.hidden * FP16


def layer_full_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1) -> int:
    return sum(layer_saved_tensors(spec, micro_batch, seq, tp).values())


def recovery_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1) -> int:
    """M_rec: one layer's recomputed intermediates (everything but the checkpointed input)."""
    return layer_full_bytes(spec, micro_batch, seq, tp) - layer_checkpoint_bytes(spec, micro_batch, seq)


def layer_workspace_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1,
                          forward_transients: bool = True) -> int:
    """Largest set of short-lived tensors alive inside one layer's forward or backward.

    Backward, MLP half: dY, d(swiglu), d(gate), d(up)  -> h + 3f per token, then
                        dY, d(gate), d(up), d(norm out) -> 2h + 2f.
    Backward, attention half (dP/dS tiles stay on chip, Algorithm 1):
                        dY, d(context), dQ, dK, dV -> h + 2q + 2kv, then
                        dY, dQ, dK, dV, d(norm out) -> 2h + q + 2kv.
    Forward without saving (ckpt/fsr) materializes the attention probabilities and the
    MLP intermediates transiently: norm out + q + k + v + P + context, or
    residual + norm out + gate + up + swiglu out.  Under full-save those are the saved set.
    """
    m = micro_batch * seq
    h, d, f = spec.hidden, spec.head_dim, spec.ffn // tp
    q, kv = spec.heads // tp * d, spec.kv_heads // tp * d
    bwd = m * FP16 * max(h + 3 * f, 2 * h + 2 * f, h + 2 * q + 2 * kv, 2 * h + q + 2 * kv)
    if not forward_transients:
        return bwd
    probs = micro_batch * (spec.heads // tp) * seq * seq * FP16
    fwd = max(m * FP16 * (h + 2 * q + 2 * kv) + probs, m * FP16 * (2 * h + 3 * f))
    return max(bwd, fwd)


def head_workspace_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1) -> int:
    """Last stage, live only between F and B of the same micro-batch: the final-norm output,
    the FP16 logits from the LM-head GEMM, and an FP32 copy for a numerically safe
    log-softmax whose gradient is written in place (mixed-precision practice: reductions in
    FP32) and cast back into the FP16 logits buffer for the LM-head backward."""
    m = micro_batch * seq
    v = spec.vocab // tp
    return m * spec.hidden * FP16 + m * v * (FP16 + FP32) + 2 * m * FP32


# ---------------------------------------------------------------- stage memory

def _shard(count: int, d: int) -> int:
    return math.ceil(count / d)


@dataclass(frozen=True)
class _LayerBytes:
    """Per-(b, seq, tp, pp) sizes every stage of a configuration shares."""
    ckpt: int
    full: int
    workspace_fsr: int          # forward transients recomputed (ckpt / fsr)
    workspace_full: int
    head_workspace: int
    layer_params: int
    embedding_params: int
    head_params: int


def _layer_bytes(model: ModelSpec, b: int, s: int, t: int, pp: int) -> _LayerBytes:
    emb, head = stage_edge_parameters(model, pp, t)
    return _LayerBytes(layer_checkpoint_bytes(model, b, s), layer_full_bytes(model, b, s, t),
                       layer_workspace_bytes(model, b, s, t, True), layer_workspace_bytes(model, b, s, t, False),
                       head_workspace_bytes(model, b, s, t), layer_tp_parameter_count(model, t), emb, head)


def _stage_bytes(model: ModelSpec, sizes: _LayerBytes, *, first: bool, last: bool, n_layers: int, n_act: int,
                 dp: int, tp: int, zero: int, tokens_per_mb: int, activation: str, prefetch: str,
                 reserve: int, fsr_buffer_layers: int = FSR_BUFFER_LAYERS) -> dict[str, int]:
    """Eq. 9's terms for one stage: the single home of the memory model (stage_memory and the
    planner's PeakMemory both call it)."""
    d, z, m = dp, zero, tokens_per_mb
    layer_params, emb_params, head_params = sizes.layer_params, sizes.embedding_params, sizes.head_params
    rec = sizes.full - sizes.ckpt
    params = n_layers * layer_params + (emb_params if first else 0) + (head_params if last else 0)
    # Largest single weight object on the stage (what ZeRO-3 gathers at once).
    biggest = max([layer_params] + ([emb_params] if first else []) + ([head_params] if last else []))

    bd: dict[str, int] = {}
    bd["weights"] = WEIGHT_BYTES * (params if z < 3 else _shard(params, d))
    bd["gradients"] = GRAD_BYTES * (params if z < 2 else _shard(params, d))
    bd["optimizer"] = OPTIMIZER_BYTES * (params if z < 1 else _shard(params, d))

    tokens = n_act * m * 4 * ((1 if first else 0) + (1 if last else 0))   # int32 ids / labels
    if activation == "full":
        bd["saved_activations"] = n_act * n_layers * sizes.full + tokens
        bd["checkpoints"] = 0
        bd["recovery_buffer"] = 0
    else:
        bd["saved_activations"] = 0
        bd["checkpoints"] = n_act * n_layers * sizes.ckpt + tokens
        bd["recovery_buffer"] = min(fsr_buffer_layers, n_layers) * rec if activation == "fsr" else 0

    # GradSync staging: the full FP16 gradient of the object being reduced.  The
    # embedding gradient is sparse (at most b*seq rows per micro-batch).
    grad_objects = [layer_params]
    if first:
        grad_objects.append(min(m, model.vocab // tp) * model.hidden)
    if last:
        grad_objects.append(head_params)
    bd["gradsync_staging"] = GRAD_BYTES * max(grad_objects) if d > 1 else 0
    neighbours = (0 if first else 1) + (0 if last else 1)
    bd["boundary_staging"] = neighbours * m * model.hidden * FP16
    bd["tp_staging"] = m * model.hidden * FP16 if tp > 1 else 0
    # Z=3: the gathered working weights of the object being computed (a medium-lived
    # buffer in the paper's lifetime tiers, so it sits in the buffer tier, not in state).
    bd["working_weights"] = WEIGHT_BYTES * biggest if (z == 3 and d > 1) else 0
    if z == 3 and d > 1:
        bd["prefetch_buffer"] = WEIGHT_BYTES * (biggest if prefetch == "layerwise" else params)
    else:
        bd["prefetch_buffer"] = 0      # Z < 3: updated shards are gathered in place
    bd["recompute_buffer"] = rec if activation == "ckpt" else 0
    ws = sizes.workspace_full if activation == "full" else sizes.workspace_fsr
    if last:
        ws = max(ws, sizes.head_workspace)
    bd["workspace"] = ws
    bd["runtime_reserve"] = reserve
    return bd


_STATE = ("weights", "gradients", "optimizer")
_ACTIVATION = ("saved_activations", "checkpoints", "recovery_buffer")
_BUFFER = ("working_weights", "gradsync_staging", "boundary_staging", "tp_staging", "prefetch_buffer",
           "recompute_buffer", "workspace", "runtime_reserve")


def _check_vocab(model: ModelSpec, tp: int) -> None:
    check_tp(model, tp)
    if model.vocab % tp:
        raise ConfigError(f"model {model.name}: vocab={model.vocab} not divisible by tp={tp}")


def stage_memory(model: ModelSpec, cfg: ParallelConfig, platform: TrainingPlatform | None = None,
                 constants: MemoryConstants = DEFAULT_CONSTANTS) -> list[StageMemory]:
    """Eq. 9 for every pipeline stage of `cfg` (one cluster = one TP rank of one stage).

    `platform` is accepted for symmetry with `fits`; the bytes themselves do not depend on it.
    """
    _check_vocab(model, cfg.tp)
    parts = partition_model(model, cfg.pp, cfg.partition)
    sizes = _layer_bytes(model, cfg.micro_batch, cfg.seq, cfg.tp, cfg.pp)
    result = []
    for p, layers in enumerate(parts):
        n_act = in_flight_microbatches(p, cfg.pp, cfg.accum)
        bd = _stage_bytes(model, sizes, first=p == 0, last=p == cfg.pp - 1, n_layers=len(layers), n_act=n_act,
                          dp=cfg.dp, tp=cfg.tp, zero=cfg.zero, tokens_per_mb=cfg.micro_batch * cfg.seq,
                          activation=cfg.activation, prefetch=cfg.prefetch, reserve=constants.runtime_reserve_bytes,
                          fsr_buffer_layers=constants.fsr_buffer_layers)
        state, act, buf = (sum(bd[k] for k in keys) for keys in (_STATE, _ACTIVATION, _BUFFER))
        result.append(StageMemory(stage=p, layers=layers, n_act=n_act, state_bytes=state,
                                  activation_bytes=act, buffer_bytes=buf,
                                  peak_bytes=state + act + buf, breakdown=bd))
    return result


class PeakMemory:
    """``max_peak(stage_memory(model, cfg))`` for many configurations of one model: the same
    per-stage terms (``_stage_bytes``) with the partitions and layer sizes cached, and no
    StageMemory objects built. The planner's memory check."""

    def __init__(self, model: ModelSpec, partition: str, constants: MemoryConstants = DEFAULT_CONSTANTS):
        self.model, self.partition, self.constants = model, partition, constants
        self._parts: dict[int, list[int]] = {}
        self._sizes: dict[tuple[int, int, int, int], _LayerBytes] = {}

    def counts(self, pp: int) -> list[int]:
        got = self._parts.get(pp)
        if got is None:
            got = self._parts[pp] = [len(r) for r in partition_model(self.model, pp, self.partition)]
        return got

    def peak(self, pp: int, dp: int, tp: int, zero: int, b: int, accum: int, seq: int,
             activation: str, prefetch: str) -> int:
        key = (b, seq, tp, pp)
        sizes = self._sizes.get(key)
        if sizes is None:
            _check_vocab(self.model, tp)
            sizes = self._sizes[key] = _layer_bytes(self.model, b, seq, tp, pp)
        reserve = self.constants.runtime_reserve_bytes
        best = 0
        for p, n in enumerate(self.counts(pp)):
            bd = _stage_bytes(self.model, sizes, first=p == 0, last=p == pp - 1, n_layers=n,
                              n_act=in_flight_microbatches(p, pp, accum), dp=dp, tp=tp, zero=zero,
                              tokens_per_mb=b * seq, activation=activation, prefetch=prefetch, reserve=reserve,
                              fsr_buffer_layers=self.constants.fsr_buffer_layers)
            best = max(best, sum(bd.values()))
        return best


def stage_bytes_without_activations(model: ModelSpec, *, pp: int, dp: int, tp: int, zero: int, micro_batch: int,
                                    seq: int, activation: str, prefetch: str, first: bool, last: bool,
                                    n_layers: int, constants: MemoryConstants = DEFAULT_CONSTANTS) -> int:
    """Eq. 9 for one stage holding ``n_layers`` layers with no micro-batch in flight: state, buffers and
    FSR's recovery buffer. A pipeline schedule's peak adds the activation sets its order keeps alive
    (``ratrain.plan.schedule_search``); under 1F1B that is N_act(p) sets and the sum is ``stage_memory``."""
    _check_vocab(model, tp)
    sizes = _layer_bytes(model, micro_batch, seq, tp, pp)
    bd = _stage_bytes(model, sizes, first=first, last=last, n_layers=n_layers, n_act=0, dp=dp, tp=tp, zero=zero,
                      tokens_per_mb=micro_batch * seq, activation=activation, prefetch=prefetch,
                      reserve=constants.runtime_reserve_bytes, fsr_buffer_layers=constants.fsr_buffer_layers)
    return sum(bd.values())


def max_peak(stages: list[StageMemory]) -> int:
    """max_p M_p(c), the left side of Eq. 10."""
    return max(st.peak_bytes for st in stages)


def fits(model: ModelSpec, cfg: ParallelConfig, platform: TrainingPlatform | None = None,
         constants: MemoryConstants = DEFAULT_CONSTANTS) -> bool:
    """Eq. 10: every stage within the platform's memory budget."""
    platform = platform or TrainingPlatform()
    return max_peak(stage_memory(model, cfg, platform, constants)) <= platform.memory_budget_bytes


def smallest_feasible(model: ModelSpec, global_batch: int, platform: TrainingPlatform | None = None,
                      micro_batch: int = 1, seq: int = 2048, zero: int = 2, tp: int = 1,
                      activation: str = "fsr", partition: str = "balanced",
                      constants: MemoryConstants = DEFAULT_CONSTANTS) -> tuple[ParallelConfig, int] | None:
    """The feasible (P, D) with the fewest clusters P*D*T for a fixed global batch.

    D ranges over divisors of global_batch / micro_batch (A = global_batch / (D * b)), P over
    1..layers.  Ties go to the lower peak.  Returns (config, peak bytes) or None.
    """
    platform = platform or TrainingPlatform()
    if global_batch % micro_batch:
        raise ConfigError(f"global_batch={global_batch} not divisible by micro_batch={micro_batch}")
    seqs = global_batch // micro_batch
    best: tuple[int, int, ParallelConfig] | None = None
    for d in (x for x in range(1, seqs + 1) if seqs % x == 0):
        for p in range(1, model.layers + 1):
            if best is not None and p * d * tp > best[0]:
                break
            cfg = ParallelConfig(pp=p, dp=d, tp=tp, zero=zero, micro_batch=micro_batch,
                                 accum=seqs // d, seq=seq, activation=activation, partition=partition)
            peak = max_peak(stage_memory(model, cfg, platform, constants))
            if peak <= platform.memory_budget_bytes:
                key = (p * d * tp, peak)
                if best is None or key < best[:2]:
                    best = (key[0], key[1], cfg)
                break       # larger P only costs more clusters for this D
    return None if best is None else (best[2], best[1])

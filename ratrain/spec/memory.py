"""Per-stage peak memory, paper Eq. 9: M_p = M_state + M_act(pi_act) + M_buf(pi_pref, pi_act).

State (per parameter held by the stage's TP rank), by default (the MT-3000 runtime): FP16 weights
(2 B), FP16 gradients (2 B), FP32 master weights + Adam m and v (12 B); ``MemoryConstants.megatron()``
is Megatron's mixed precision instead (FP32 main gradients, 18 B).  ZeRO shards over the D replicas only:
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
  selective (Megatron's selective recomputation): N_act * layers * (the full set without the
        attention core's seq x seq tensors); one layer's core, recomputed in backward, lives in
        the recompute buffer (buffer tier).
For GPT as Megatron runs it the full set is Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models" (2022): sbh(34 + 5as/h) bytes per layer without
TP, sbh(10 + 24/t + 5as/(ht)) with TP, sbh(34/t + 5as/(ht)) with sequence parallelism
(``sequence_parallel=True``: the norm and dropout regions shard their tokens over T), plus the
norms' per-token FP32 statistics the paper leaves out.

Buffers: Z=3 working weights, GradSync staging (one layer's FP16 gradient when D > 1), boundary send staging,
TP all-reduce staging, the Z=3 prefetch buffer (next layer's working weights; the whole
stage under bulk prefetch), operator workspace derived from shapes (transient tensors of a
layer's forward/backward and of the LM head + loss), and a fixed runtime reserve, the one
constant fitted to the paper (docs/CHOICES.md, "ratrain models and memory").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from ratrain.errors import ConfigError
from ratrain.spec.models import (
    FP16,
    FP32,
    MASK,
    ModelSpec,
    check_tp,
    layer_device_parameter_count,
    layer_tp_parameter_count,
    stage_edge_parameters,
)
from ratrain.spec.moe import route
from ratrain.spec.offload import Offload, offload_stage_terms
from ratrain.spec.parallel import (
    ACTIVATION_MODES,
    ParallelConfig,
    in_flight_microbatches,
    partition_model,
)
from ratrain.spec.platform import GIB, TrainingPlatform

WEIGHT_BYTES = FP16          # working weights
GRAD_BYTES = FP16            # gradients
OPTIMIZER_BYTES = 3 * FP32   # FP32 master + Adam m + Adam v
# Tensors of the attention core (QK^T, scaled masked softmax, dropout, probabilities x V) that
# selective recomputation drops and recomputes: the b x heads x seq x seq ones.
ATTENTION_CORE_TENSORS = ("attn_probs", "attn_probs_dropout_mask", "attn_probs_dropped")
# FSR's recovery buffer, in layers (Eq. 6's one short-lived M_rec). The one home of the default:
# the memory model counts it and ratrain.sim.mechanisms.Mechanisms recovers ahead no further.
FSR_BUFFER_LAYERS = 1


@dataclass(frozen=True)
class MemoryConstants:
    """The free constants of the memory model (see docs/CHOICES.md for how they were fit).

    runtime_reserve_bytes: per-cluster memory the shape-derived tiers do not see (runtime
    and communication library, DMA descriptors, allocator fragmentation).  832 MiB is the
    mean residual of three Table 3 rows (LLaMA-2-7B, Baichuan2-13B, LLaMA-2-70B), rounded to
    64 MiB; every other paper row is held out.
    weight_bytes, grad_bytes, optimizer_bytes: state per parameter (the working weight, the
    gradient the backward accumulates into, the optimizer's master weight and Adam moments).
    gradsync_staging: whether a GradSync stages one object's gradient in a separate buffer
    (the MT-3000 runtime) or reduces the gradient buffer in place (Megatron).
    """
    runtime_reserve_bytes: int = 832 * 2 ** 20
    fsr_buffer_layers: int = FSR_BUFFER_LAYERS
    weight_bytes: int = WEIGHT_BYTES
    grad_bytes: int = GRAD_BYTES
    optimizer_bytes: int = OPTIMIZER_BYTES
    gradsync_staging: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.fsr_buffer_layers, bool) or not isinstance(self.fsr_buffer_layers, int) \
                or self.fsr_buffer_layers < 1:
            raise ConfigError(f"MemoryConstants.fsr_buffer_layers must be an integer >= 1, "
                              f"got {self.fsr_buffer_layers!r}")
        for name in ("runtime_reserve_bytes", "weight_bytes", "grad_bytes", "optimizer_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"MemoryConstants.{name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.gradsync_staging, bool):
            raise ConfigError(f"MemoryConstants.gradsync_staging must be true or false, got {self.gradsync_staging!r}")

    @classmethod
    def megatron(cls, runtime_reserve_bytes: int = 0) -> MemoryConstants:
        """Megatron's mixed-precision state: FP16 weight (2 B), FP32 main gradient (4 B), FP32
        master weight and Adam m, v (12 B) per parameter, 18 B in all; the distributed optimizer
        (Z=1) shards the 12 B over D: 6 + 12/D. FP32 main gradients because Megatron(-DeepSpeed)
        accumulates and all-reduces gradients in an FP32 main-grad buffer
        (--accumulate-allreduce-grads-in-fp32; with FP16 gradients Megatron still builds FP32 main
        gradients for the step, 20 B per parameter). The buffer is reduced in place, so there is no
        GradSync staging. ``runtime_reserve_bytes`` (CUDA context, cuBLAS and NCCL workspaces,
        allocator fragmentation) is not fitted here: 0 unless given."""
        return cls(runtime_reserve_bytes=runtime_reserve_bytes, weight_bytes=FP16, grad_bytes=FP32,
                   optimizer_bytes=3 * FP32, gradsync_staging=False)


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
    host: dict[str, int] = field(default_factory=dict)     # host-memory terms when state is offloaded

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    def to_json(self) -> dict:
        out = asdict(self)
        out["layers"] = [self.layers.start, self.layers.stop]
        if not self.host:
            out.pop("host")
        return out


# ---------------------------------------------------------------- per-layer activation sets

def _replicated_tokens(micro_batch: int, seq: int, tp: int, sequence_parallel: bool) -> int:
    """Tokens of the tensors TP replicates (norm and dropout regions): all of them, or 1/T of
    the sequence under sequence parallelism."""
    if not sequence_parallel:
        return micro_batch * seq
    if seq % tp:
        raise ConfigError(f"sequence parallelism needs seq={seq} divisible by tp={tp}")
    return micro_batch * (seq // tp)


def layer_saved_tensors(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, *,
                        sequence_parallel: bool = False, kv_seq: int | None = None,
                        expert_rows: int | None = None) -> dict[str, int]:
    """Bytes of every tensor one layer keeps for its backward under full-save (one micro-batch).

    Norm inputs/outputs, norm statistics, dropout masks of the hidden stream and the residual
    stream are replicated across TP ranks, or hold 1/T of the tokens under sequence
    parallelism (Megatron then saves the sharded norm output and all-gathers it again in
    backward); per-head tensors and the MLP intermediates are split by T. With dropout (GPT as
    Megatron runs it) the attention keeps its softmax output (FP16), the dropout mask (1 byte)
    and the dropped probabilities (FP16, the input of the product with V), each
    b x heads/T x seq x seq; the hidden dropouts keep a 1-byte mask each.

    ``kv_seq``: the keys each query attends over when it differs from ``seq`` (context parallelism:
    a device holds seq = s/CP queries against all s keys). A MoE layer (``spec.moe``) keeps its
    router's FP32 probabilities and, on the routed path only, the ``expert_rows`` rows its device
    runs (default the balanced, dropless tokens x k): their dispatched input, the expert SwiGLU's
    gate, up and output, and the expert output the combine weights; the shared experts keep the
    dense SwiGLU's three tensors for every token.
    """
    check_tp(spec, tp)
    m = micro_batch * seq
    mr = _replicated_tokens(micro_batch, seq, tp, sequence_parallel)
    h, d, f = spec.hidden, spec.head_dim, spec.ffn // tp
    hq, hkv = spec.heads // tp, spec.kv_heads // tp
    dropout = spec.dropout > 0
    probs = micro_batch * hq * seq * (seq if kv_seq is None else kv_seq)

    def norm(prefix: str) -> dict[str, int]:
        out = {f"{prefix}_input": mr * h * FP16}
        if spec.norm == "layernorm":
            out[f"{prefix}_mean"] = mr * FP32
        out[f"{prefix}_rstd"] = mr * FP32
        out[f"{prefix}_output"] = mr * h * FP16          # input of the next GEMMs (their dW)
        return out

    out = norm("attn_norm")                     # its input is the layer input = the checkpoint
    if spec.qk_norm:
        out["qk_norm_input"] = m * (hq + hkv) * d * FP16
        out["qk_norm_rstd"] = m * (hq + hkv) * FP32
    out.update({
        "q": m * hq * d * FP16,                 # after RoPE / q-norm, read by attention backward
        "k": m * hkv * d * FP16,
        "v": m * hkv * d * FP16,
        "attn_probs": probs * FP16,             # saved P (Algorithm 1, line 5; softmax backward)
    })
    if dropout:
        out["attn_probs_dropout_mask"] = probs * MASK
        out["attn_probs_dropped"] = probs * FP16        # input of probabilities x V (dV)
    out["attn_context"] = m * hq * d * FP16     # input of o_proj (its dW)
    if dropout:
        out["attn_dropout_mask"] = mr * h * MASK
    out.update(norm("mlp_norm"))                # its input is the residual stream after attention
    if spec.moe is not None:
        out.update(_moe_saved_tensors(spec, m, tp, expert_rows))
    elif spec.mlp == "swiglu":
        out.update({
            "gate": m * f * FP16,               # SwiGLU backward needs gate and up
            "up": m * f * FP16,
            "swiglu_output": m * f * FP16,      # input of down_proj (its dW)
        })
    else:
        out["fc1_output"] = m * f * FP16        # GeLU's input (fc1 output + bias)
        out["gelu_output"] = m * f * FP16       # input of fc2 (its dW)
    if dropout:
        out["mlp_dropout_mask"] = mr * h * MASK
    return out


def _moe_saved_tensors(spec: ModelSpec, m: int, tp: int, expert_rows: int | None) -> dict[str, int]:
    """A MoE MLP's saved tensors on one device (see ``layer_saved_tensors``)."""
    moe = spec.moe
    rows = m * moe.experts_per_token if expert_rows is None else expert_rows
    fe, fs, h = moe.expert_ffn // tp, moe.shared_ffn // tp, spec.hidden
    out = {"router_probs": m * moe.experts * FP32,
           "expert_input": rows * h * FP16,            # input of the expert GEMMs (their dW)
           "expert_gate": rows * fe * FP16, "expert_up": rows * fe * FP16,
           "expert_swiglu_output": rows * fe * FP16,   # input of the expert down projection
           "expert_output": rows * h * FP16}           # the combine's weight gradient reads it
    if fs:
        out.update({"shared_gate": m * fs * FP16, "shared_up": m * fs * FP16, "shared_swiglu_output": m * fs * FP16})
    return out


def layer_checkpoint_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, *,
                           sequence_parallel: bool = False) -> int:
    """Layer-boundary checkpoint: the layer input, b*seq*hidden FP16 (1/T of the tokens on each
    TP rank under sequence parallelism)."""
    return _replicated_tokens(micro_batch, seq, tp, sequence_parallel) * spec.hidden * FP16


def layer_full_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, *,
                     sequence_parallel: bool = False, kv_seq: int | None = None, expert_rows: int | None = None) -> int:
    return sum(layer_saved_tensors(spec, micro_batch, seq, tp, sequence_parallel=sequence_parallel, kv_seq=kv_seq,
                                   expert_rows=expert_rows).values())


def attention_core_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1) -> int:
    """The attention core's seq x seq tensors of one layer (what selective recomputation drops)."""
    saved = layer_saved_tensors(spec, micro_batch, seq, tp)
    return sum(saved.get(name, 0) for name in ATTENTION_CORE_TENSORS)


def layer_selective_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, *,
                          sequence_parallel: bool = False) -> int:
    """Saved bytes per layer under Megatron's selective recomputation: the full set without the
    attention core's seq x seq tensors (Korthikanti et al.: sbh * 34 / t with sequence parallelism)."""
    return (layer_full_bytes(spec, micro_batch, seq, tp, sequence_parallel=sequence_parallel)
            - attention_core_bytes(spec, micro_batch, seq, tp))


def layer_activation_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, activation: str = "full", *,
                           sequence_parallel: bool = False) -> int:
    """Bytes one layer keeps per micro-batch in flight under an activation mode: the full set
    ('full'), the full set without the attention core ('selective'), the layer input ('ckpt',
    'fsr': each layer recomputed from its input)."""
    if activation == "full":
        return layer_full_bytes(spec, micro_batch, seq, tp, sequence_parallel=sequence_parallel)
    if activation == "selective":
        return layer_selective_bytes(spec, micro_batch, seq, tp, sequence_parallel=sequence_parallel)
    if activation in ("ckpt", "fsr"):
        return layer_checkpoint_bytes(spec, micro_batch, seq, tp, sequence_parallel=sequence_parallel)
    raise ConfigError(f"activation must be one of {', '.join(ACTIVATION_MODES)}, got {activation!r}")


def recovery_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, *,
                   sequence_parallel: bool = False) -> int:
    """M_rec: one layer's recomputed intermediates (everything but the checkpointed input)."""
    return (layer_full_bytes(spec, micro_batch, seq, tp, sequence_parallel=sequence_parallel)
            - layer_checkpoint_bytes(spec, micro_batch, seq, tp, sequence_parallel=sequence_parallel))


def layer_workspace_bytes(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1,
                          forward_transients: bool = True, *, kv_seq: int | None = None,
                          expert_rows: int | None = None) -> int:
    """Largest set of short-lived tensors alive inside one layer's forward or backward.

    Backward, MLP half: SwiGLU: dY, d(swiglu), d(gate), d(up)  -> h + 3f per token, then
                        dY, d(gate), d(up), d(norm out) -> 2h + 2f;
                        GeLU: dY, d(gelu out), d(fc1 out) -> h + 2f, then
                        dY, d(fc1 out), d(norm out) -> 2h + f.
    Backward, attention half (dP/dS tiles stay on chip, Algorithm 1):
                        dY, d(context), dQ, dK, dV -> h + 2q + 2kv, then
                        dY, dQ, dK, dV, d(norm out) -> 2h + q + 2kv.
    With attention dropout (Megatron's unfused core: the dropout needs the probabilities in
    memory) the backward also holds the gradients of the dropped and of the softmax
    probabilities, two b x heads x seq x seq FP16 tensors, next to dY, d(context) and dV.
    Forward without saving (ckpt/fsr) materializes the attention probabilities and the
    MLP intermediates transiently: norm out + q + k + v + P (+ mask + dropped P) + context, or
    residual + norm out + the MLP intermediates.  Under full-save those are the saved set.
    A MoE MLP holds the SwiGLU terms over its device's ``expert_rows`` rows (f the expert width)
    and, for the shared experts, over every token; ``kv_seq`` as in ``layer_saved_tensors``.
    """
    bwd, both = _workspace_pair(spec, micro_batch, seq, tp, kv_seq=kv_seq, expert_rows=expert_rows)
    return both if forward_transients else bwd


def _workspace_pair(spec: ModelSpec, micro_batch: int, seq: int, tp: int, *, kv_seq: int | None = None,
                    expert_rows: int | None = None) -> tuple[int, int]:
    """``layer_workspace_bytes`` without and with the forward transients, in one pass (the memory model
    reads both)."""
    m = micro_batch * seq
    h, d, f = spec.hidden, spec.head_dim, spec.ffn // tp
    q, kv = spec.heads // tp * d, spec.kv_heads // tp * d
    probs = micro_batch * (spec.heads // tp) * seq * (seq if kv_seq is None else kv_seq) * FP16
    mlp_bwd = (h + 3 * f, 2 * h + 2 * f) if spec.mlp == "swiglu" else (h + 2 * f, 2 * h + f)
    if spec.moe is not None:
        mlp_bwd = (0,)
    bwd = m * FP16 * max(*mlp_bwd, h + 2 * q + 2 * kv, 2 * h + q + 2 * kv)
    if spec.moe is not None:
        bwd = max(bwd, _moe_workspace_bytes(spec, m, tp, expert_rows))
    if spec.dropout > 0:
        bwd = max(bwd, m * FP16 * (h + q + kv) + 2 * probs)
    core = probs + (probs // FP16 * MASK + probs if spec.dropout > 0 else 0)
    mlp_fwd = 2 * h + (3 * f if spec.mlp == "swiglu" else 2 * f)
    fwd = max(m * FP16 * (h + 2 * q + 2 * kv) + core, m * FP16 * mlp_fwd)
    if spec.moe is not None:
        fwd = max(m * FP16 * (h + 2 * q + 2 * kv) + core, m * FP16 * 2 * h
                  + sum(_moe_saved_tensors(spec, m, tp, expert_rows).values()))
    return bwd, max(bwd, fwd)


def _moe_workspace_bytes(spec: ModelSpec, m: int, tp: int, expert_rows: int | None) -> int:
    """A MoE MLP's backward transients: the SwiGLU backward's over the device's rows (dY of the
    rows, d(swiglu), d(gate), d(up)), or the shared experts' over every token, whichever is larger."""
    moe = spec.moe
    rows = m * moe.experts_per_token if expert_rows is None else expert_rows
    h, fe, fs = spec.hidden, moe.expert_ffn // tp, moe.shared_ffn // tp
    return FP16 * max(rows * (h + 3 * fe), rows * (2 * h + 2 * fe), m * (h + 3 * fs), m * (2 * h + 2 * fs))


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
    """Per-(b, seq, tp, pp, sequence parallelism) sizes every stage of a configuration shares."""
    ckpt: int
    full: int
    workspace_fsr: int          # forward transients recomputed (ckpt / fsr)
    workspace_full: int
    head_workspace: int
    layer_params: int
    embedding_params: int
    head_params: int
    selective: int = 0          # saved under selective recomputation
    replicated_tokens: int = 0  # tokens of a TP-replicated tensor on one rank (1/T under SP)
    embedding_mask: int = 0     # stage 0: the embedding dropout's mask per micro-batch
    expert_params: int = 0      # MoE: the routed experts a device holds per layer (layer_params is the rest)
    expert_ranks: int = 1       # MoE: ranks holding the same experts (D x CP / EP), what ZeRO shards them over
    cp_kv_buffer: int = 0       # CP > 1: the ring's K/V chunks in flight (two of K and V)


@lru_cache(maxsize=4096)
def _layer_bytes(model: ModelSpec, b: int, s: int, t: int, pp: int, sequence_parallel: bool = False,
                 moe_cp: MoeCpLayout | None = None) -> _LayerBytes:
    """The layer sizes a stage of (b, seq, T, P) reads (memoised: frozen, and the planner reads the same
    ones for every configuration it checks and reports)."""
    emb, head = stage_edge_parameters(model, pp, t)
    sp = sequence_parallel
    if moe_cp is not None:
        return _moe_cp_layer_bytes(model, b, s, t, sp, moe_cp, emb, head)
    tokens = _replicated_tokens(b, s, t, sp)
    # layer_checkpoint_bytes, layer_full_bytes and layer_selective_bytes from one layer_saved_tensors (the
    # attention core's tensors do not depend on sequence parallelism)
    saved = layer_saved_tensors(model, b, s, t, sequence_parallel=sp)
    full = sum(saved.values())
    workspace_full, workspace_fsr = _workspace_pair(model, b, s, t)
    return _LayerBytes(tokens * model.hidden * FP16, full, workspace_fsr, workspace_full,
                       head_workspace_bytes(model, b, s, t), layer_tp_parameter_count(model, t), emb, head,
                       selective=full - sum(saved.get(name, 0) for name in ATTENTION_CORE_TENSORS),
                       replicated_tokens=tokens,
                       embedding_mask=tokens * model.hidden * MASK if model.dropout > 0 else 0)


@dataclass(frozen=True)
class MoeCpLayout:
    """What expert and context parallelism change in one configuration's layer sizes: CP devices per
    sequence, EP devices per expert group, the rows of the busiest device's experts per micro-batch
    (None: dense), and the data ranks D x CP."""
    cp: int = 1
    ep: int = 1
    expert_rows: int | None = None
    data_ranks: int = 1

    @classmethod
    def of(cls, model: ModelSpec, cfg: ParallelConfig) -> MoeCpLayout | None:
        """None for a dense model at EP = CP = 1 (today's sizes, the same code path)."""
        if model.moe is None:
            if cfg.ep > 1:
                raise ConfigError(f"expert parallelism EP={cfg.ep} needs a MoE model; {model.name} is dense")
            if cfg.cp == 1:
                return None
            return cls(cp=cfg.cp, data_ranks=cfg.data_ranks)
        local = cfg.micro_batch * (cfg.seq // cfg.cp)
        rows = route(model.moe, local * cfg.ep, cfg.ep, cfg.routing).busiest_device_rows
        return cls(cp=cfg.cp, ep=cfg.ep, expert_rows=rows, data_ranks=cfg.data_ranks)


def _moe_cp_layer_bytes(model: ModelSpec, b: int, s: int, t: int, sp: bool, lay: MoeCpLayout, emb: int,
                        head: int) -> _LayerBytes:
    """The sizes under CP (every per-token tensor holds s/CP tokens, the attention's queries against
    all s keys) and EP (the routed path's rows on the busiest device, E/EP experts' parameters)."""
    if s % lay.cp:
        raise ConfigError(f"context parallelism CP={lay.cp} must divide the sequence length {s}")
    sl, kv = s // lay.cp, (s if lay.cp > 1 else None)
    rows = lay.expert_rows
    tokens = _replicated_tokens(b, sl, t, sp)
    full = layer_full_bytes(model, b, sl, t, sequence_parallel=sp, kv_seq=kv, expert_rows=rows)
    core = sum(layer_saved_tensors(model, b, sl, t, kv_seq=kv, expert_rows=rows).get(name, 0)
               for name in ATTENTION_CORE_TENSORS)
    dense, experts = layer_device_parameter_count(model, t, lay.ep)
    ring = 2 * 2 * b * sl * (model.kv_heads // t) * model.head_dim * FP16 if lay.cp > 1 else 0
    return _LayerBytes(layer_checkpoint_bytes(model, b, sl, t, sequence_parallel=sp), full,
                       layer_workspace_bytes(model, b, sl, t, True, kv_seq=kv, expert_rows=rows),
                       layer_workspace_bytes(model, b, sl, t, False, kv_seq=kv, expert_rows=rows),
                       head_workspace_bytes(model, b, sl, t), dense, emb, head, selective=full - core,
                       replicated_tokens=tokens,
                       embedding_mask=tokens * model.hidden * MASK if model.dropout > 0 else 0,
                       expert_params=experts, expert_ranks=max(1, lay.data_ranks // lay.ep), cp_kv_buffer=ring)


def _stage_bytes(model: ModelSpec, sizes: _LayerBytes, *, first: bool, last: bool, n_layers: int, n_act: int,
                 dp: int, tp: int, zero: int, tokens_per_mb: int, activation: str, prefetch: str,
                 constants: MemoryConstants = DEFAULT_CONSTANTS, offload: Offload | None = None,
                 host_path_convert: bool = True) -> dict[str, int]:
    """Eq. 9's terms for one stage: the single home of the memory model (stage_memory and the
    planner's PeakMemory both call it). With ``offload``: the device terms, and the host terms
    under the key ``"host"`` (``ratrain.spec.offload``)."""
    d, z, m = dp, zero, tokens_per_mb
    layer_params, emb_params, head_params = sizes.layer_params, sizes.embedding_params, sizes.head_params
    rec = sizes.full - sizes.ckpt
    params = n_layers * layer_params + (emb_params if first else 0) + (head_params if last else 0)
    # Largest single weight object on the stage (what ZeRO-3 gathers at once).
    biggest = max([layer_params] + ([emb_params] if first else []) + ([head_params] if last else []))

    bd: dict[str, int] = {}
    bd["weights"] = constants.weight_bytes * (params if z < 3 else _shard(params, d))
    bd["gradients"] = constants.grad_bytes * (params if z < 2 else _shard(params, d))
    bd["optimizer"] = constants.optimizer_bytes * (params if z < 1 else _shard(params, d))
    if sizes.expert_params:
        # every expert's training state on the devices that hold it: E/EP experts, ZeRO over D x CP / EP
        experts, ed = n_layers * sizes.expert_params, sizes.expert_ranks
        biggest = max(biggest, layer_params + sizes.expert_params)
        bd["weights"] += constants.weight_bytes * (experts if z < 3 else _shard(experts, ed))
        bd["gradients"] += constants.grad_bytes * (experts if z < 2 else _shard(experts, ed))
        bd["optimizer"] += constants.optimizer_bytes * (experts if z < 1 else _shard(experts, ed))

    tokens = n_act * m * 4 * ((1 if first else 0) + (1 if last else 0))   # int32 ids / labels
    if first:
        tokens += n_act * sizes.embedding_mask      # the embedding output is never recomputed
    if activation in ("full", "selective"):
        per_layer = sizes.full if activation == "full" else sizes.selective
        bd["saved_activations"] = n_act * n_layers * per_layer + tokens
        bd["checkpoints"] = 0
        bd["recovery_buffer"] = 0
    else:
        bd["saved_activations"] = 0
        bd["checkpoints"] = n_act * n_layers * sizes.ckpt + tokens
        bd["recovery_buffer"] = min(constants.fsr_buffer_layers, n_layers) * rec if activation == "fsr" else 0

    # GradSync staging: the full gradient of the object being reduced.  The embedding
    # gradient is sparse (at most b*seq rows per micro-batch).
    grad_objects = [layer_params + sizes.expert_params]
    if first:
        grad_objects.append(min(m, model.vocab // tp) * model.hidden)
    if last:
        grad_objects.append(head_params)
    staged = d > 1 and constants.gradsync_staging
    bd["gradsync_staging"] = constants.grad_bytes * max(grad_objects) if staged else 0
    neighbours = (0 if first else 1) + (0 if last else 1)
    # the tensor sent between stages is a layer output: 1/T of the tokens under sequence parallelism
    bd["boundary_staging"] = neighbours * sizes.replicated_tokens * model.hidden * FP16
    bd["tp_staging"] = m * model.hidden * FP16 if tp > 1 else 0
    # Z=3: the gathered working weights of the object being computed (a medium-lived
    # buffer in the paper's lifetime tiers, so it sits in the buffer tier, not in state).
    bd["working_weights"] = constants.weight_bytes * biggest if (z == 3 and d > 1) else 0
    if z == 3 and d > 1:
        bd["prefetch_buffer"] = constants.weight_bytes * (biggest if prefetch == "layerwise" else params)
    else:
        bd["prefetch_buffer"] = 0      # Z < 3: updated shards are gathered in place
    if activation == "ckpt":
        bd["recompute_buffer"] = rec
    elif activation == "selective":
        # one layer's attention core recomputed in backward; its forward transients are the same tensors
        bd["recompute_buffer"] = sizes.full - sizes.selective
    else:
        bd["recompute_buffer"] = 0
    ws = sizes.workspace_full if activation in ("full", "selective") else sizes.workspace_fsr
    if last:
        ws = max(ws, sizes.head_workspace)
    bd["workspace"] = ws
    bd["runtime_reserve"] = constants.runtime_reserve_bytes
    if sizes.cp_kv_buffer:
        bd["cp_kv_buffer"] = sizes.cp_kv_buffer
    if offload is not None:
        per_layer = sizes.full if activation == "full" else sizes.selective if activation == "selective" else sizes.ckpt
        dev, host = offload_stage_terms(bd, offload, params=params, biggest=biggest, dp=d, zero=z, n_act=n_act,
                                        n_layers=n_layers, per_layer_act=per_layer, tokens=tokens,
                                        grad_bytes=constants.grad_bytes, host_path_convert=host_path_convert)
        return {**dev, "host": host}
    return bd


_STATE = ("weights", "gradients", "optimizer")
_ACTIVATION = ("saved_activations", "checkpoints", "recovery_buffer")
_BUFFER = ("working_weights", "gradsync_staging", "boundary_staging", "tp_staging", "prefetch_buffer",
           "recompute_buffer", "workspace", "runtime_reserve", "cp_kv_buffer", "host_state_buffer",
           "grad_convert_buffer")


def _check_vocab(model: ModelSpec, tp: int) -> None:
    check_tp(model, tp)
    if model.vocab % tp:
        raise ConfigError(f"model {model.name}: vocab={model.vocab} not divisible by tp={tp}")


def stage_memory(model: ModelSpec, cfg: ParallelConfig, platform: TrainingPlatform | None = None,
                 constants: MemoryConstants = DEFAULT_CONSTANTS, *,
                 sequence_parallel: bool = False, offload: Offload | None = None,
                 host_path_convert: bool = True) -> list[StageMemory]:
    """Eq. 9 for every pipeline stage of `cfg` (one cluster = one TP rank of one stage).

    `platform` is accepted for symmetry with `fits`; the bytes themselves do not depend on it.
    ``sequence_parallel``: Megatron's sequence parallelism (norm and dropout regions, layer
    inputs and stage boundaries hold 1/T of the tokens on each TP rank).
    ``offload``: state or activations in host memory (``ratrain.spec.offload``); each stage's
    ``host`` then holds the host-memory terms; ``host_path_convert``: a host-side update's gradients
    cross as 16-bit (``ratrain.sim.offload.conversion_choice`` says which path is faster).
    """
    _check_vocab(model, cfg.tp)
    parts = partition_model(model, cfg.pp, cfg.partition)
    layout = MoeCpLayout.of(model, cfg)
    sizes = _layer_bytes(model, cfg.micro_batch, cfg.seq, cfg.tp, cfg.pp, sequence_parallel, layout)
    result = []
    for p, layers in enumerate(parts):
        n_act = in_flight_microbatches(p, cfg.pp, cfg.accum)
        bd = _stage_bytes(model, sizes, first=p == 0, last=p == cfg.pp - 1, n_layers=len(layers), n_act=n_act,
                          dp=cfg.data_ranks, tp=cfg.tp, zero=cfg.zero,
                          tokens_per_mb=cfg.micro_batch * (cfg.seq // cfg.cp),
                          activation=cfg.activation, prefetch=cfg.prefetch, constants=constants,
                          offload=offload, host_path_convert=host_path_convert)
        host = bd.pop("host", {})
        state, act, buf = (sum(bd.get(k, 0) for k in keys) for keys in (_STATE, _ACTIVATION, _BUFFER))
        result.append(StageMemory(stage=p, layers=layers, n_act=n_act, state_bytes=state,
                                  activation_bytes=act, buffer_bytes=buf,
                                  peak_bytes=state + act + buf, breakdown=bd, host=host))
    return result


class PeakMemory:
    """``max_peak(stage_memory(model, cfg))`` for many configurations of one model: the same
    per-stage terms (``_stage_bytes``) with the partitions and layer sizes cached, and no
    StageMemory objects built. The planner's memory check."""

    def __init__(self, model: ModelSpec, partition: str, constants: MemoryConstants = DEFAULT_CONSTANTS):
        self.model, self.partition, self.constants = model, partition, constants
        self._parts: dict[int, list[int]] = {}
        self._sizes: dict[tuple[int, int, int, int, bool], _LayerBytes] = {}
        self._representatives: dict[int, list[tuple[int, int]]] = {}

    def counts(self, pp: int) -> list[int]:
        got = self._parts.get(pp)
        if got is None:
            got = self._parts[pp] = [len(r) for r in partition_model(self.model, pp, self.partition)]
        return got

    def representatives(self, pp: int) -> list[tuple[int, int]]:
        """(stage, layer count) of the stages whose peak can be the largest: a stage's bytes grow with
        the micro-batches it holds (N_act(p) = min(P - p, A) falls with p), everything else being equal,
        so of the stages alike in place (first, last) and layer count only the first counts."""
        got = self._representatives.get(pp)
        if got is None:
            seen: set[tuple[bool, bool, int]] = set()
            got = []
            for p, n in enumerate(self.counts(pp)):
                alike = (p == 0, p == pp - 1, n)
                if alike not in seen:
                    seen.add(alike)
                    got.append((p, n))
            self._representatives[pp] = got
        return got

    def sizes(self, b: int, seq: int, tp: int, pp: int) -> _LayerBytes:
        """The layer sizes of a dense configuration at EP = CP = 1 (cached): what ``peak`` reads."""
        key = (b, seq, tp, pp, False)
        sizes = self._sizes.get(key)
        if sizes is None:
            _check_vocab(self.model, tp)
            sizes = self._sizes[key] = _layer_bytes(self.model, b, seq, tp, pp)
        return sizes

    def peak(self, pp: int, dp: int, tp: int, zero: int, b: int, accum: int, seq: int,
             activation: str, prefetch: str, sequence_parallel: bool = False, *, moe_cp: dict | None = None) -> int:
        """``moe_cp``: the ParallelConfig fields of EP, CP and the routing (``ep``, ``cp``,
        ``capacity_factor``, ``hot_share``, ``hot_load``); None or a dense model at EP = CP = 1: today's sizes."""
        key = (b, seq, tp, pp, sequence_parallel)
        layout, cp = None, 1
        if moe_cp or self.model.moe is not None:
            cfg = ParallelConfig(pp=pp, dp=dp, tp=tp, zero=zero, micro_batch=b, accum=accum, seq=seq,
                                 activation=activation, prefetch=prefetch, partition=self.partition,
                                 **(moe_cp or {}))
            layout, cp = MoeCpLayout.of(self.model, cfg), cfg.cp
            if layout is not None:
                key += (layout,)
        sizes = self._sizes.get(key)
        if sizes is None:
            _check_vocab(self.model, tp)
            sizes = self._sizes[key] = _layer_bytes(self.model, b, seq, tp, pp, sequence_parallel, layout)
        best = 0
        for p, n in self.representatives(pp):
            bd = _stage_bytes(self.model, sizes, first=p == 0, last=p == pp - 1, n_layers=n,
                              n_act=in_flight_microbatches(p, pp, accum), dp=dp * cp, tp=tp, zero=zero,
                              tokens_per_mb=b * (seq // cp), activation=activation, prefetch=prefetch,
                              constants=self.constants)
            best = max(best, sum(bd.values()))
        return best


def stage_bytes_without_activations(model: ModelSpec, *, pp: int, dp: int, tp: int, zero: int, micro_batch: int,
                                    seq: int, activation: str, prefetch: str, first: bool, last: bool,
                                    n_layers: int, constants: MemoryConstants = DEFAULT_CONSTANTS,
                                    sequence_parallel: bool = False) -> int:
    """Eq. 9 for one stage holding ``n_layers`` layers with no micro-batch in flight: state, buffers and
    FSR's recovery buffer. A pipeline schedule's peak adds the activation sets its order keeps alive
    (``ratrain.plan.schedule_search``); under 1F1B that is N_act(p) sets and the sum is ``stage_memory``."""
    _check_vocab(model, tp)
    sizes = _layer_bytes(model, micro_batch, seq, tp, pp, sequence_parallel)
    bd = _stage_bytes(model, sizes, first=first, last=last, n_layers=n_layers, n_act=0, dp=dp, tp=tp, zero=zero,
                      tokens_per_mb=micro_batch * seq, activation=activation, prefetch=prefetch, constants=constants)
    return sum(bd.values())


def max_peak(stages: list[StageMemory]) -> int:
    """max_p M_p(c), the left side of Eq. 10."""
    return max(st.peak_bytes for st in stages)


def fits(model: ModelSpec, cfg: ParallelConfig, platform: TrainingPlatform | None = None,
         constants: MemoryConstants = DEFAULT_CONSTANTS, *, sequence_parallel: bool = False) -> bool:
    """Eq. 10: every stage within the platform's memory budget."""
    platform = platform or TrainingPlatform()
    stages = stage_memory(model, cfg, platform, constants, sequence_parallel=sequence_parallel)
    return max_peak(stages) <= platform.memory_budget_bytes


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

"""Dense decoder-only model specs, exact parameter counts and per-layer operator shapes.

A `ModelSpec` captures what the memory model and the profile builder need about a
decoder-only transformer of one of two families:

* LLaMA style (the defaults): RMSNorm, SwiGLU MLP, RoPE or ALiBi attention, optional GQA,
  packed QKV, QKV bias, q/k norm, no other biases, no dropout;
* GPT-2 as Megatron runs it: LayerNorm (weight and bias), GeLU MLP, learned position
  embedding, a bias on every projection, attention and hidden dropout, tied head
  (``gpt_model``; HF ``model_type: gpt2``).

Specs come from the built-in table (public HF config.json facts), from `gpt_model`, or from a
HuggingFace ``config.json`` via `from_hf_config`.

`layer_operators` lists one transformer layer's forward work with exact shapes:
GEMMs as (m, k, n) with m = micro_batch * seq tokens, the attention core, and the
bandwidth-bound elementwise operators with the bytes they move.  Activations are FP16
(2 bytes); a norm's per-token statistics are FP32; dropout masks are 1 byte per element.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, replace

from ratrain.errors import ConfigError
from ratrain.spec.moe import MoeSpec
from rtcommon.checks import checked_number, is_finite_number, is_integer, show_value
from rtcommon.jsonio import load_json_file

FP16 = 2   # bytes per FP16 element
FP32 = 4   # bytes per FP32 element
MASK = 1   # bytes per dropout-mask element (PyTorch keeps the mask as bool)

POSITIONS = ("rope", "alibi", "learned")
NORMS = ("rms", "layernorm")
MLPS = ("swiglu", "gelu")
# Megatron's --make-vocab-size-divisible-by default
MEGATRON_VOCAB_DIVISIBLE_BY = 128

# Largest accepted size of each integer field: far beyond any real model (the largest public
# vocabularies are ~256k, hidden sizes ~32k), small enough that every parameter and byte count
# stays exact in int64 and every float derived from it is finite.
SIZE_LIMITS = {"hidden": 2 ** 20, "ffn": 2 ** 22, "layers": 2 ** 20, "heads": 2 ** 16, "kv_heads": 2 ** 16,
               "head_dim": 2 ** 16, "vocab": 2 ** 31, "max_positions": 2 ** 31, "sliding_window": 2 ** 31}
# The HF config's names for them (both families)
_HF_SIZE_FIELD = {"hidden_size": "hidden", "n_embd": "hidden", "intermediate_size": "ffn", "n_inner": "ffn",
                  "num_hidden_layers": "layers", "n_layer": "layers", "num_attention_heads": "heads",
                  "n_head": "heads", "num_key_value_heads": "kv_heads", "head_dim": "head_dim",
                  "vocab_size": "vocab", "n_positions": "max_positions", "sliding_window": "sliding_window"}
# Accepted ranges of the float fields (exclusive of zero)
FLOAT_LIMITS = {"norm_eps": 1.0, "rope_theta": 1e15}
_HF_FLOAT_FIELD = {"rms_norm_eps": "norm_eps", "layer_norm_epsilon": "norm_eps", "rope_theta": "rope_theta"}

# Model names become parts of cache file names (ratrain.cost.profile): one plain component.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,79}")


def safe_model_name(text: str, fallback: str) -> str:
    """A file-name-safe model name from free text such as an HF ``_name_or_path``: its last path
    component ("meta-llama/Llama-2-7b-hf" -> "Llama-2-7b-hf", "/abs/models/x" -> "x", "../.."
    -> ``fallback``), other characters as '-', at most 80 characters."""
    parts = [p for p in re.split(r"[/\\]+", str(text)) if p not in ("", ".", "..")]
    name = re.sub(r"[^A-Za-z0-9._+-]+", "-", parts[-1] if parts else "").lstrip(".-_+")[:80]
    return name if _SAFE_NAME.fullmatch(name) else fallback


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    qkv_bias: bool = False
    tied_embeddings: bool = False
    position: str = "rope"          # 'rope' | 'alibi'
    packed_qkv: bool = False        # one W_pack GEMM instead of q/k/v projections
    qk_norm: bool = False           # per-head RMSNorm on q and k (Qwen3)
    norm_eps: float = 1e-5
    rope_theta: float | None = 10000.0
    sliding_window: int | None = None
    family: str = "llama"
    # GPT-family fields; their defaults are the LLaMA family's (see _GPT_FIELDS).
    norm: str = "rms"               # 'rms' (weight only) | 'layernorm' (weight and bias)
    mlp: str = "swiglu"             # 'swiglu' (gate, up, down) | 'gelu' (fc1, fc2)
    linear_bias: bool = False       # a bias on every projection (implies the q/k/v bias)
    max_positions: int | None = None    # rows of the learned position embedding
    dropout: float = 0.0            # attention and hidden dropout probability
    moe: MoeSpec | None = None      # mixture-of-experts MLP in every layer (ratrain.spec.moe); None: dense

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SAFE_NAME.fullmatch(self.name):
            raise ConfigError(f"model name {self.name!r} must be 1-80 letters, digits or . _ + - "
                              f"(it names cache files); ratrain.spec.models.safe_model_name makes one")
        for name in ("hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "vocab"):
            value = getattr(self, name)
            if not is_integer(value) or value <= 0:
                raise ConfigError(f"model {self.name}: field {name} must be a positive integer, "
                                  f"got {show_value(value)}")
            if value > SIZE_LIMITS[name]:
                raise ConfigError(f"model {self.name}: field {name} = {show_value(value)} is above "
                                  f"{SIZE_LIMITS[name]} (ratrain.spec.models.SIZE_LIMITS)")
        for name, value in (("max_positions", self.max_positions), ("sliding_window", self.sliding_window)):
            if value is not None and (not is_integer(value) or not 0 < value <= SIZE_LIMITS[name]):
                raise ConfigError(f"model {self.name}: field {name} must be a positive integer up to "
                                  f"{SIZE_LIMITS[name]}, got {show_value(value)}")
        for name, value in (("norm_eps", self.norm_eps), ("rope_theta", self.rope_theta)):
            if value is None and name == "rope_theta":
                continue
            if not is_finite_number(value) or not 0 < value <= FLOAT_LIMITS[name]:
                raise ConfigError(f"model {self.name}: field {name} must be a finite number in "
                                  f"(0, {FLOAT_LIMITS[name]:g}], got {show_value(value)}")
        if self.heads % self.kv_heads:
            raise ConfigError(f"model {self.name}: heads={self.heads} not divisible by kv_heads={self.kv_heads}")
        if self.position not in POSITIONS:
            raise ConfigError(f"model {self.name}: position must be one of {POSITIONS}, got {self.position!r}")
        if self.packed_qkv and self.kv_heads != self.heads:
            raise ConfigError(f"model {self.name}: packed_qkv requires kv_heads == heads")
        if self.norm not in NORMS:
            raise ConfigError(f"model {self.name}: norm must be one of {NORMS}, got {self.norm!r}")
        if self.mlp not in MLPS:
            raise ConfigError(f"model {self.name}: mlp must be one of {MLPS}, got {self.mlp!r}")
        if not isinstance(self.linear_bias, bool):
            raise ConfigError(f"model {self.name}: linear_bias must be true or false, got {self.linear_bias!r}")
        if self.position == "learned":
            value = self.max_positions
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model {self.name}: learned positions need max_positions, a positive integer, "
                                  f"got {value!r}")
        elif self.max_positions is not None:
            raise ConfigError(f"model {self.name}: max_positions is for position 'learned' only, "
                              f"got position {self.position!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model {self.name}: dropout must be a probability in [0, 1), got {self.dropout!r}")
        _check_moe(self)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def has_qkv_bias(self) -> bool:
        return self.qkv_bias or self.linear_bias

    @property
    def norm_parameters(self) -> int:
        """Parameters of one norm over the hidden size: RMSNorm a weight, LayerNorm weight and bias."""
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @property
    def position_parameters(self) -> int:
        """The learned position embedding (max_positions x hidden; 0 for RoPE / ALiBi)."""
        return self.max_positions * self.hidden if self.position == "learned" else 0

    def to_json(self) -> dict:
        out = asdict(self)
        for key, default in _GPT_FIELDS.items():
            if out[key] == default:
                del out[key]
        if self.moe is None:
            del out["moe"]          # a dense spec's JSON (and its profile cache names) as before
        return out


# The GPT-family fields and their (LLaMA) defaults. to_json leaves them out at these values, so a
# LLaMA-family spec's JSON, and the profile cache names hashed from it, are those of before.
_GPT_FIELDS = {"norm": "rms", "mlp": "swiglu", "linear_bias": False, "max_positions": None, "dropout": 0.0}


# ---------------------------------------------------------------- parameter counts

def _layer_split_and_replicated(spec: ModelSpec) -> tuple[int, int]:
    """One layer's parameters as (split over TP ranks, replicated on every rank).

    Megatron's split: q/k/v, gate/up and fc1 are column-parallel (weights and biases divide by
    T), o_proj, down and fc2 row-parallel (weights divide by T, the bias is added after the
    all-reduce and is replicated); norm weights and biases and q/k-norm weights are replicated.
    """
    h, f = spec.hidden, spec.ffn
    split = h * spec.q_dim + 2 * h * spec.kv_dim + spec.q_dim * h
    if spec.moe is None:
        split += (3 if spec.mlp == "swiglu" else 2) * h * f
    if spec.has_qkv_bias:
        split += spec.q_dim + 2 * spec.kv_dim
    replicated = 2 * spec.norm_parameters + (2 * spec.head_dim if spec.qk_norm else 0)
    if spec.linear_bias:
        split += (2 if spec.mlp == "swiglu" else 1) * f      # gate + up, or fc1
        replicated += 2 * h                                  # o_proj and down / fc2
    return split, replicated


def layer_parameter_count(spec: ModelSpec) -> int:
    """Parameters of one transformer block (attention + MLP + its two norms).

    LLaMA: 4 h^2 (MHA) + 3 h f + 2 h.  GPT: 4 h^2 + 4 h (q/k/v/proj weights and biases)
    + 2 h f + f + h (fc1, fc2 and their biases) + 4 h (two LayerNorms) = 12 h^2 + 13 h at f = 4 h.
    """
    split, replicated = _layer_split_and_replicated(spec)
    moe_split, moe_replicated = _moe_split_and_replicated(spec)
    return split + replicated + moe_split + moe_replicated


def embedding_parameter_count(spec: ModelSpec) -> int:
    """Token embedding (vocab x hidden) plus the learned position embedding, if any.

    ``spec.vocab`` is the size the embedding is allocated with: for a Megatron run the padded
    vocabulary (``megatron_padded_vocab``), as ``gpt_model`` sets it."""
    return spec.vocab * spec.hidden + spec.position_parameters


def head_parameter_count(spec: ModelSpec) -> int:
    """Final norm plus the LM head (zero extra weights when tied to the embedding)."""
    return spec.norm_parameters + (0 if spec.tied_embeddings else spec.vocab * spec.hidden)


def stage_edge_parameters(spec: ModelSpec, pp: int, tp: int = 1) -> tuple[int, int]:
    """Parameters per TP rank that the first and last pipeline stage hold besides their layers.

    The one home of the embedding/head split (memory, partition, cost terms and planner use it):
    stage 0 holds the vocab-parallel embedding and the replicated learned position embedding;
    the last stage holds the vocab-parallel LM head plus the replicated final norm. A tied LM
    head still needs its own copy of the token embedding matrix when the embedding lives on
    another stage (pp > 1), as Megatron keeps one.
    """
    embedding = spec.vocab * spec.hidden // tp + spec.position_parameters
    head_weights = spec.vocab * spec.hidden if (not spec.tied_embeddings or pp > 1) else 0
    return embedding, head_weights // tp + spec.norm_parameters


def parameter_count(spec: ModelSpec) -> int:
    """Exact trainable parameter count of the whole model."""
    return (spec.layers * layer_parameter_count(spec) + embedding_parameter_count(spec)
            + head_parameter_count(spec))


def layer_tp_parameter_count(spec: ModelSpec, tp: int = 1) -> int:
    """Parameters one tensor-parallel rank holds for one layer.

    Megatron-style split: q/k/v/gate/up/fc1 are column-parallel, o/down/fc2 row-parallel, so
    all projection weights and the column-parallel biases divide by T; norms, q/k-norm weights
    and the row-parallel biases are replicated on every rank.
    """
    check_tp(spec, tp)
    split, replicated = _layer_split_and_replicated(spec)
    moe_split, moe_replicated = _moe_split_and_replicated(spec)
    return (split + moe_split) // tp + replicated + moe_replicated


def check_tp(spec: ModelSpec, tp: int) -> None:
    if not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tp must be a positive integer, got {tp!r}")
    for name, value in (("heads", spec.heads), ("kv_heads", spec.kv_heads), ("ffn", spec.ffn)):
        if value % tp:
            raise ConfigError(f"model {spec.name}: {name}={value} not divisible by tp={tp}")
    if spec.moe is not None:
        _check_moe_tp(spec, tp)


# ---------------------------------------------------------------- mixture-of-experts layers

# Names of the routed experts' operators: the cost model scales them from the mean rows per device
# (tokens x k) to the busiest device's (ratrain.spec.moe.route).
EXPERT_OPERATORS = ("expert_gate_proj", "expert_up_proj", "expert_swiglu", "expert_down_proj")
# HF MoE model types and the dense family whose attention they share
_MOE_BASE_FAMILY = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}


def _check_moe(spec: ModelSpec) -> None:
    if spec.moe is None:
        return
    if not isinstance(spec.moe, MoeSpec):
        raise ConfigError(f"model {spec.name}: field moe must be a MoeSpec or None, got {type(spec.moe).__name__}")
    if spec.mlp != "swiglu":
        raise ConfigError(f"model {spec.name}: MoE experts are SwiGLU MLPs; mlp {spec.mlp!r} is not supported")
    for name in ("expert_ffn", "shared_ffn"):
        value = getattr(spec.moe, name)
        if value > SIZE_LIMITS["ffn"]:
            raise ConfigError(f"model {spec.name}: MoE field {name} = {value} is above {SIZE_LIMITS['ffn']}")


def _check_moe_tp(spec: ModelSpec, tp: int) -> None:
    for name in ("expert_ffn", "shared_ffn"):
        value = getattr(spec.moe, name)
        if value % tp:
            raise ConfigError(f"model {spec.name}: MoE {name}={value} not divisible by tp={tp}")


def _moe_split_and_replicated(spec: ModelSpec) -> tuple[int, int]:
    """A MoE layer's MLP parameters as (split over TP ranks, replicated): the E experts' and the shared
    experts' gate, up and down projections are split like the dense MLP's; the router (hidden x E) and
    the shared expert's gate (hidden x 1, Qwen2-MoE) are replicated. (0, 0) for a dense model."""
    moe = spec.moe
    if moe is None:
        return 0, 0
    h = spec.hidden
    split = 3 * h * (moe.experts * moe.expert_ffn + moe.shared_ffn)
    replicated = h * moe.experts + (h if spec.family == "qwen2_moe" and moe.shared_ffn else 0)
    return split, replicated


def layer_expert_parameter_count(spec: ModelSpec, tp: int = 1) -> int:
    """Parameters of one layer's E routed experts on one TP rank (what expert parallelism divides); 0 if dense."""
    if spec.moe is None:
        return 0
    check_tp(spec, tp)
    return 3 * spec.hidden * spec.moe.experts * spec.moe.expert_ffn // tp


def layer_device_parameter_count(spec: ModelSpec, tp: int = 1, ep: int = 1) -> tuple[int, int]:
    """One layer's parameters on one device as (dense: attention, norms, router, shared experts;
    routed experts: E/EP of them), per TP rank. A dense model's are (layer_tp_parameter_count, 0)."""
    total = layer_tp_parameter_count(spec, tp)
    experts = layer_expert_parameter_count(spec, tp)
    if spec.moe is not None and spec.moe.experts % ep:
        raise ConfigError(f"model {spec.name}: expert parallelism EP={ep} must divide the experts E={spec.moe.experts}")
    return total - experts, experts // ep


def moe_mlp_operators(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1) -> list[Operator]:
    """A MoE layer's MLP on one TP rank: the router (m x hidden x E, replicated), its softmax and
    top-k, the routed experts as one grouped GEMM per projection over the mean rows a device runs
    (tokens x k: with E/EP experts per device and the group's EP x tokens routed, the mean is the
    same at every EP), the weighted combine of the k outputs, and the shared experts (every token)."""
    moe = spec.moe
    m = micro_batch * seq
    h, E, k = spec.hidden, moe.experts, moe.experts_per_token
    rows, fe, fs = m * k, moe.expert_ffn // tp, moe.shared_ffn // tp
    ops = [Operator("router", "gemm", m=m, k=h, n=E),
           # softmax over E and top-k: read the FP32 logits, write the probabilities and the k indices
           Operator("router_topk", "elementwise", bytes_moved=2 * m * E * FP32 + m * k * (FP32 + 4)),
           Operator("expert_gate_proj", "gemm", m=rows, k=h, n=fe),
           Operator("expert_up_proj", "gemm", m=rows, k=h, n=fe),
           Operator("expert_swiglu", "elementwise", bytes_moved=3 * rows * fe * FP16),
           Operator("expert_down_proj", "gemm", m=rows, k=fe, n=h),
           # read the k expert outputs of every token and its k weights, write the sum
           Operator("expert_combine", "elementwise", bytes_moved=rows * h * FP16 + m * k * FP32 + m * h * FP16)]
    if fs:
        ops += [Operator("shared_gate_proj", "gemm", m=m, k=h, n=fs),
                Operator("shared_up_proj", "gemm", m=m, k=h, n=fs),
                Operator("shared_swiglu", "elementwise", bytes_moved=3 * m * fs * FP16),
                Operator("shared_down_proj", "gemm", m=m, k=fs, n=h)]
    return ops


def _moe_spec_from_dict(raw: dict, where: str, name: str | None, family: str) -> ModelSpec:
    """HF Mixtral (num_local_experts, num_experts_per_tok, intermediate_size = the expert's width) and
    Qwen2-MoE / Qwen3-MoE (num_experts, num_experts_per_tok, moe_intermediate_size,
    shared_expert_intermediate_size: one shared expert of that width, Qwen2-MoE only). The attention is
    the dense family's (mistral, qwen2, qwen3). Every layer must be a MoE layer (decoder_sparse_step 1,
    no mlp_only_layers)."""
    base = _MOE_BASE_FAMILY[family]
    k = _get_int(raw, "num_experts_per_tok", where)
    if family == "mixtral":
        experts = _get_int(raw, "num_local_experts", where)
        expert_ffn = _get_int(raw, "intermediate_size", where)
        shared = 0
    else:
        experts = _get_int(raw, "num_experts", where)
        expert_ffn = _get_int(raw, "moe_intermediate_size", where)
        shared = _get_int(raw, "shared_expert_intermediate_size", where, 0) if raw.get(
            "shared_expert_intermediate_size") else 0
        step = raw.get("decoder_sparse_step", 1)
        if step != 1 or raw.get("mlp_only_layers"):
            raise ConfigError(f"{where}: fields decoder_sparse_step={show_value(step)} / mlp_only_layers="
                              f"{show_value(raw.get('mlp_only_layers'))}: only models with a MoE MLP in every layer "
                              f"are supported (decoder_sparse_step 1, no mlp_only_layers)")
    if k > experts:
        raise ConfigError(f"{where}: field num_experts_per_tok={k} exceeds the experts ({experts})")
    dense = _spec_from_dict({**raw, "model_type": base, "intermediate_size": expert_ffn}, where, name)
    moe = MoeSpec(experts=experts, experts_per_token=k, expert_ffn=expert_ffn, shared_experts=1 if shared else 0,
                  shared_ffn=shared)
    return replace(dense, family=family, moe=moe)


# ---------------------------------------------------------------- built-in models

_BUILTIN: dict[str, ModelSpec] = {
    "llama2-7b": ModelSpec("llama2-7b", hidden=4096, ffn=11008, layers=32, heads=32, kv_heads=32,
                           head_dim=128, vocab=32000, norm_eps=1e-5),
    "llama2-13b": ModelSpec("llama2-13b", hidden=5120, ffn=13824, layers=40, heads=40, kv_heads=40,
                            head_dim=128, vocab=32000, norm_eps=1e-5),
    "llama2-70b": ModelSpec("llama2-70b", hidden=8192, ffn=28672, layers=80, heads=64, kv_heads=8,
                            head_dim=128, vocab=32000, norm_eps=1e-5),
    "baichuan2-13b": ModelSpec("baichuan2-13b", hidden=5120, ffn=13696, layers=40, heads=40, kv_heads=40,
                               head_dim=128, vocab=125696, position="alibi", packed_qkv=True,
                               norm_eps=1e-6, rope_theta=None, family="baichuan"),
    "qwen2.5-32b": ModelSpec("qwen2.5-32b", hidden=5120, ffn=27648, layers=64, heads=40, kv_heads=8,
                             head_dim=128, vocab=152064, qkv_bias=True, norm_eps=1e-5,
                             rope_theta=1000000.0, family="qwen2"),
}


def list_models() -> list[str]:
    return list(_BUILTIN)


def get_model(name: str) -> ModelSpec:
    """A built-in model, or a GPT model by the name ``gpt_model`` gives it (gpt-h1024-l24-a16...)."""
    key = name.strip().lower()
    if key in _BUILTIN:
        return _BUILTIN[key]
    gpt = _GPT_NAME.fullmatch(key)
    if gpt is not None:
        hidden, layers, heads, seq, tp, vocab = (int(g) if g else None for g in gpt.groups())
        return gpt_model(hidden, heads, layers, seq or GPT_DEFAULT_SEQ, vocab or GPT2_VOCAB, tp=tp or 1)
    raise ConfigError(f"unknown model {name!r}; built-in models: {', '.join(_BUILTIN)} "
                      f"(and GPT models named gpt-h<hidden>-l<layers>-a<heads>[-s<seq>][-tp<T>][-v<vocab>])")


# ---------------------------------------------------------------- GPT models as Megatron runs them

GPT2_VOCAB = 50257           # the GPT-2 BPE tokenizer
GPT_DEFAULT_SEQ = 1024
GPT_DROPOUT = 0.1            # Megatron's --attention-dropout and --hidden-dropout defaults
_GPT_NAME = re.compile(r"gpt-h(\d+)-l(\d+)-a(\d+)(?:-s(\d+))?(?:-tp(\d+))?(?:-v(\d+))?")


def megatron_padded_vocab(vocab: int, tp: int = 1, divisible_by: int = MEGATRON_VOCAB_DIVISIBLE_BY) -> int:
    """The vocabulary Megatron allocates: the smallest multiple of ``divisible_by * tp`` that is
    >= ``vocab`` (``--make-vocab-size-divisible-by``, default 128, times the TP size), so every
    TP rank holds an equal, aligned slice. 50257 -> 50304 (T=1), 50432 (T=2), 51200 (T=8)."""
    for label, value in (("vocab", vocab), ("tp", tp), ("divisible_by", divisible_by)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"megatron_padded_vocab: {label} must be a positive integer, got {value!r}")
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def gpt_model(hidden: int, heads: int, layers: int, seq: int = GPT_DEFAULT_SEQ, vocab: int = GPT2_VOCAB, *,
              tp: int = 1, divisible_by: int = MEGATRON_VOCAB_DIVISIBLE_BY,
              dropout: float = GPT_DROPOUT) -> ModelSpec:
    """Megatron's GPT (GPT-2 architecture) as its GPT pretraining script builds it for a run with TP size ``tp``.

    LayerNorm, GeLU MLP of 4 x hidden, a bias on every projection, learned position embedding of
    ``seq`` rows (--max-position-embeddings = --seq-length), tied input/output embedding, attention
    and hidden dropout ``dropout``. ``vocab`` is the tokenizer's size; the spec holds Megatron's
    padded vocabulary for ``tp`` (``megatron_padded_vocab``), and every parameter count uses that
    padded size, as Megatron allocates it. Named gpt-h<hidden>-l<layers>-a<heads>, plus -s<seq>,
    -tp<T>, -v<vocab> where those differ from 1024, 1 and 50257; ``get_model`` reads the name back.
    """
    for label, value in (("hidden", hidden), ("heads", heads), ("layers", layers), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"gpt_model: {label} must be a positive integer, got {value!r}")
    if hidden % heads:
        raise ConfigError(f"gpt_model: hidden={hidden} is not divisible by heads={heads}")
    name = f"gpt-h{hidden}-l{layers}-a{heads}"
    name += (f"-s{seq}" if seq != GPT_DEFAULT_SEQ else "") + (f"-tp{tp}" if tp != 1 else "")
    name += f"-v{vocab}" if vocab != GPT2_VOCAB else ""
    return ModelSpec(name, hidden=hidden, ffn=4 * hidden, layers=layers, heads=heads, kv_heads=heads,
                     head_dim=hidden // heads, vocab=megatron_padded_vocab(vocab, tp, divisible_by),
                     qkv_bias=True, tied_embeddings=True, position="learned", packed_qkv=True,
                     norm_eps=1e-5, rope_theta=None, family="gpt", norm="layernorm", mlp="gelu",
                     linear_bias=True, max_positions=seq, dropout=dropout)


# ---------------------------------------------------------------- HF config.json

_FAMILY_OF_TYPE = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
                   "baichuan": "baichuan", "gpt2": "gpt",
                   "mixtral": "mixtral", "qwen2_moe": "qwen2_moe", "qwen3_moe": "qwen3_moe"}
_FAMILY_OF_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                   "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                   "BaichuanForCausalLM": "baichuan", "BaiChuanForCausalLM": "baichuan",
                   "GPT2LMHeadModel": "gpt", "MixtralForCausalLM": "mixtral",
                   "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe"}
_GPT2_ACTIVATIONS = ("gelu", "gelu_new")     # exact and tanh GeLU: the same shapes and bytes


def from_hf_config(path: str | os.PathLike, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a HuggingFace config.json (llama, mistral, qwen2, qwen3, baichuan, gpt2; the MoE
    families mixtral, qwen2_moe, qwen3_moe).

    Raises ConfigError naming the file and the offending field.
    """
    where = os.fspath(path)
    raw = load_json_file(where, "HF config", ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: top level must be a JSON object")
    return _spec_from_dict(raw, where, name)


def _family(raw: dict, where: str) -> str:
    mtype = raw.get("model_type")
    if mtype is not None:
        if not isinstance(mtype, str):
            raise ConfigError(f"{where}: field model_type must be a string, got {show_value(mtype)}")
        if mtype not in _FAMILY_OF_TYPE:
            raise ConfigError(f"{where}: field model_type={mtype!r} is not supported "
                              f"(supported: {', '.join(_FAMILY_OF_TYPE)})")
        return _FAMILY_OF_TYPE[mtype]
    archs = raw.get("architectures")
    if isinstance(archs, list):
        for arch in archs:
            if isinstance(arch, str) and arch in _FAMILY_OF_ARCH:
                return _FAMILY_OF_ARCH[arch]
        raise ConfigError(f"{where}: field architectures={show_value(archs)} names no supported model "
                          f"and model_type is missing")
    raise ConfigError(f"{where}: missing field model_type (and no architectures list)")


def _get_int(raw: dict, key: str, where: str, default: int | None = None) -> int:
    if key not in raw or raw[key] is None:
        if default is None:
            raise ConfigError(f"{where}: missing field {key}")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: field {key} must be an integer, got {show_value(value)}")
    if value <= 0:
        raise ConfigError(f"{where}: field {key} must be positive, got {value}")
    return checked_number(value, f"{where}: field {key}", integer=True, lo=1,
                          hi=SIZE_LIMITS[_HF_SIZE_FIELD.get(key, "vocab")], error=ConfigError)


def _get_float(raw: dict, key: str, where: str, default: float | None) -> float | None:
    if key not in raw or raw[key] is None:
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: field {key} must be a number, got {show_value(value)}")
    # a JSON 1e400 arrives as inf
    high = FLOAT_LIMITS[_HF_FLOAT_FIELD[key]]
    checked = checked_number(value, f"{where}: field {key}", integer=False, lo=0, hi=high, error=ConfigError,
                             bounds=f"(0, {high:g}]")
    if checked <= 0:
        raise ConfigError(f"{where}: field {key} must be positive, got {show_value(value)}")
    return checked


def _get_bool(raw: dict, key: str, where: str, default: bool) -> bool:
    if key not in raw or raw[key] is None:
        return default
    value = raw[key]
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: field {key} must be true or false, got {value!r}")
    return value


def _get_probability(raw: dict, key: str, where: str, default: float) -> float:
    if key not in raw or raw[key] is None:
        return default
    value = raw[key]
    if not is_finite_number(value) or not 0 <= value < 1:
        raise ConfigError(f"{where}: field {key} must be a probability in [0, 1), got {show_value(value)}")
    return float(value)


def _model_name(raw: dict, where: str, name: str | None, family: str) -> str:
    if name is None:
        # _name_or_path if present, else the file name ("config.json" -> its folder's name)
        stem = os.path.splitext(os.path.basename(where))[0]
        if stem == "config":
            stem = os.path.basename(os.path.dirname(os.path.abspath(where)))
        return safe_model_name(raw.get("_name_or_path") or stem, family)
    if not _SAFE_NAME.fullmatch(str(name)):
        return safe_model_name(name, family)
    return name


def _gpt2_spec_from_dict(raw: dict, where: str, name: str | None) -> ModelSpec:
    """HF GPT-2: n_embd, n_head, n_layer, n_positions, n_inner (null: 4 x n_embd), vocab_size,
    layer_norm_epsilon, tie_word_embeddings (default true), activation_function, attn_pdrop and
    resid_pdrop (default 0.1 each, as HF's GPT2Config)."""
    hidden = _get_int(raw, "n_embd", where)
    heads = _get_int(raw, "n_head", where)
    layers = _get_int(raw, "n_layer", where)
    positions = _get_int(raw, "n_positions", where)
    vocab = _get_int(raw, "vocab_size", where)
    ffn = _get_int(raw, "n_inner", where, 4 * hidden)
    if hidden % heads:
        raise ConfigError(f"{where}: field n_embd={hidden} is not divisible by n_head={heads}")
    eps = _get_float(raw, "layer_norm_epsilon", where, 1e-5)
    tied = _get_bool(raw, "tie_word_embeddings", where, True)
    act = raw.get("activation_function", "gelu_new")
    if act not in _GPT2_ACTIVATIONS:
        raise ConfigError(f"{where}: field activation_function={act!r} is not supported "
                          f"(supported: {', '.join(_GPT2_ACTIVATIONS)})")
    attn_p = _get_probability(raw, "attn_pdrop", where, GPT_DROPOUT)
    resid_p = _get_probability(raw, "resid_pdrop", where, GPT_DROPOUT)
    if (attn_p > 0) != (resid_p > 0):
        # one dropout field: the masks exist for both kinds or for neither
        raise ConfigError(f"{where}: field resid_pdrop={resid_p} and attn_pdrop={attn_p} must be both zero "
                          f"or both positive (one dropout probability per model)")
    return ModelSpec(name=_model_name(raw, where, name, "gpt"), hidden=hidden, ffn=ffn, layers=layers,
                     heads=heads, kv_heads=heads, head_dim=hidden // heads, vocab=vocab, qkv_bias=True,
                     tied_embeddings=tied, position="learned", packed_qkv=True, norm_eps=eps, rope_theta=None,
                     family="gpt", norm="layernorm", mlp="gelu", linear_bias=True, max_positions=positions,
                     dropout=max(attn_p, resid_p))


def _spec_from_dict(raw: dict, where: str, name: str | None) -> ModelSpec:
    family = _family(raw, where)
    if family == "gpt":
        return _gpt2_spec_from_dict(raw, where, name)
    if family in _MOE_BASE_FAMILY:
        return _moe_spec_from_dict(raw, where, name, family)
    hidden = _get_int(raw, "hidden_size", where)
    ffn = _get_int(raw, "intermediate_size", where)
    layers = _get_int(raw, "num_hidden_layers", where)
    heads = _get_int(raw, "num_attention_heads", where)
    vocab = _get_int(raw, "vocab_size", where)
    kv_heads = heads if family == "baichuan" else _get_int(raw, "num_key_value_heads", where, heads)
    if heads % kv_heads:
        raise ConfigError(f"{where}: field num_key_value_heads={kv_heads} does not divide "
                          f"num_attention_heads={heads}")
    if "head_dim" in raw and raw["head_dim"] is not None:
        head_dim = _get_int(raw, "head_dim", where)
    else:
        if hidden % heads:
            raise ConfigError(f"{where}: field hidden_size={hidden} is not divisible by "
                              f"num_attention_heads={heads} and head_dim is absent")
        head_dim = hidden // heads
    eps = _get_float(raw, "rms_norm_eps", where, 1e-6 if family in ("baichuan", "qwen2", "qwen3") else 1e-5)
    tied = _get_bool(raw, "tie_word_embeddings", where, False)
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"{where}: field hidden_act={act!r} is not supported (SwiGLU/silu only)")

    position, packed, qkv_bias, qk_norm, theta, window = "rope", False, False, False, None, None
    if family == "baichuan":
        # Baichuan(2)-7B configs carry max_position_embeddings and use RoPE; the 13B code
        # uses ALiBi and its config only has model_max_length.  W_pack = packed QKV.
        packed = True
        position = "rope" if "max_position_embeddings" in raw else "alibi"
    else:
        qkv_bias = _get_bool(raw, "attention_bias", where, family == "qwen2")
        if family == "qwen2":
            qkv_bias = True       # Qwen2 q/k/v projections always carry a bias
        qk_norm = family == "qwen3"
        if family in ("mistral", "qwen2", "qwen3") and raw.get("sliding_window") is not None \
                and raw.get("use_sliding_window", family == "mistral"):
            window = _get_int(raw, "sliding_window", where)
    if position == "rope":
        theta = _get_float(raw, "rope_theta", where, 10000.0)
    return ModelSpec(name=_model_name(raw, where, name, family), hidden=hidden, ffn=ffn, layers=layers,
                     heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab, qkv_bias=qkv_bias,
                     tied_embeddings=tied, position=position, packed_qkv=packed, qk_norm=qk_norm, norm_eps=eps,
                     rope_theta=theta, sliding_window=window, family=family)


# ---------------------------------------------------------------- operators

OPERATOR_KINDS = ("gemm", "attention", "elementwise", "embedding", "loss", "allreduce")


@dataclass(frozen=True)
class Operator:
    """One forward operator of a layer on one tensor-parallel rank.

    gemm:        C[m, n] = A[m, k] @ W[k, n]   (A = activations, W = weights)
    attention:   softmax(Q K^T / sqrt(d) [+ mask/ALiBi]) V over `batch` sequences,
                 `heads` query heads sharing `kv_heads` K/V heads, seq x seq, head_dim d
    elementwise/embedding/loss: bandwidth-bound, `bytes_moved` = bytes read + written
    allreduce:   tensor-parallel all-reduce of `bytes_moved` bytes per rank (T > 1 only)
    """
    name: str
    kind: str
    m: int | None = None
    k: int | None = None
    n: int | None = None
    bias: bool = False
    batch: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    seq: int | None = None
    head_dim: int | None = None
    causal: bool = False
    alibi: bool = False
    window: int | None = None
    bytes_moved: int = 0

    @property
    def macs(self) -> int:
        """Forward multiply-accumulates (dense; causal skipping is a kernel choice)."""
        if self.kind == "gemm":
            return self.m * self.k * self.n
        if self.kind == "attention":
            return 2 * self.batch * self.heads * self.seq * self.seq * self.head_dim
        return 0

    @property
    def useful_macs(self) -> int:
        """Forward multiply-accumulates the result needs: a causal attention's QK^T and PV over the
        lower triangle with its diagonal only (``macs`` counts it dense)."""
        if self.kind == "attention" and self.causal:
            return 2 * self.batch * self.heads * (self.seq * (self.seq + 1) // 2) * self.head_dim
        return self.macs

    def to_json(self) -> dict:
        out = {key: value for key, value in asdict(self).items() if value not in (None, False, 0)}
        out["name"], out["kind"] = self.name, self.kind
        out["macs"] = self.macs
        return out


def _check_shape(micro_batch: int, seq: int) -> None:
    for label, value in (("micro_batch", micro_batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{label} must be a positive integer, got {value!r}")


def _norm_bytes(spec: ModelSpec, tokens: int) -> int:
    """A norm over the hidden size: read x and the parameters, write y and the per-token FP32
    statistics (RMSNorm: rstd; LayerNorm: mean and rstd, as apex's fused kernel saves them)."""
    stats = 2 if spec.norm == "layernorm" else 1
    return 2 * tokens * spec.hidden * FP16 + spec.norm_parameters * FP16 + stats * tokens * FP32


def _dropout_bytes(elements: int) -> int:
    """Dropout in training: read x, write y and its 1-byte mask."""
    return elements * (2 * FP16 + MASK)


def layer_operators(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1) -> list[Operator]:
    """Forward operators of one transformer layer, in execution order, on one TP rank.

    LLaMA family: norm, q/k/v (or packed qkv), [q/k norm], [rotary], attention, o_proj,
    [all-reduce], residual, norm, gate, up, SwiGLU, down, [all-reduce], residual.
    GPT as Megatron runs it (dropout > 0): LayerNorm, fused qkv (bias), attention, the
    attention-probability dropout (b x heads/T x seq x seq; inside the core, between the softmax
    and the product with V), o_proj (row-parallel, bias), [all-reduce], hidden dropout, residual,
    LayerNorm, fc1 (bias), GeLU, fc2 (row-parallel, bias), [all-reduce], hidden dropout, residual.
    The all-reduces sit where Megatron's row-parallel layers reduce (after o_proj and after the
    MLP's down projection), before the bias, dropout and residual.
    """
    _check_shape(micro_batch, seq)
    check_tp(spec, tp)
    m = micro_batch * seq
    h = spec.hidden
    hq, hkv, d = spec.heads // tp, spec.kv_heads // tp, spec.head_dim
    f = spec.ffn // tp
    norm_bytes = _norm_bytes(spec, m)
    residual_bytes = 3 * m * h * FP16                         # read two streams, write one
    bias, qkv_bias = spec.linear_bias, spec.has_qkv_bias
    ops: list[Operator] = [Operator("attn_norm", "elementwise", bytes_moved=norm_bytes)]
    if spec.packed_qkv:
        ops.append(Operator("qkv_proj", "gemm", m=m, k=h, n=(hq + 2 * hkv) * d, bias=qkv_bias))
    else:
        ops += [Operator("q_proj", "gemm", m=m, k=h, n=hq * d, bias=qkv_bias),
                Operator("k_proj", "gemm", m=m, k=h, n=hkv * d, bias=qkv_bias),
                Operator("v_proj", "gemm", m=m, k=h, n=hkv * d, bias=qkv_bias)]
    if spec.qk_norm:
        qk = m * (hq + hkv) * d
        ops.append(Operator("qk_norm", "elementwise", bytes_moved=2 * qk * FP16 + 2 * d * FP16 + m * (hq + hkv) * FP32))
    if spec.position == "rope":
        # read and write q and k, read the cos and sin tables (seq x head_dim each)
        ops.append(Operator("rotary", "elementwise",
                            bytes_moved=2 * m * (hq + hkv) * d * FP16 + 2 * seq * d * FP16))
    ops.append(Operator("attention", "attention", batch=micro_batch, heads=hq, kv_heads=hkv, seq=seq,
                        head_dim=d, causal=True, alibi=spec.position == "alibi",
                        window=spec.sliding_window))
    if spec.dropout > 0:
        ops.append(Operator("attn_probs_dropout", "elementwise",
                            bytes_moved=_dropout_bytes(micro_batch * hq * seq * seq)))
    ops.append(Operator("o_proj", "gemm", m=m, k=hq * d, n=h, bias=bias))
    if tp > 1:
        ops.append(Operator("attn_allreduce", "allreduce", bytes_moved=m * h * FP16))
    if spec.dropout > 0:
        ops.append(Operator("attn_dropout", "elementwise", bytes_moved=_dropout_bytes(m * h)))
    ops += [Operator("attn_residual", "elementwise", bytes_moved=residual_bytes),
            Operator("mlp_norm", "elementwise", bytes_moved=norm_bytes)]
    if spec.moe is not None:
        ops += moe_mlp_operators(spec, micro_batch, seq, tp)
    elif spec.mlp == "swiglu":
        ops += [Operator("gate_proj", "gemm", m=m, k=h, n=f, bias=bias),
                Operator("up_proj", "gemm", m=m, k=h, n=f, bias=bias),
                Operator("swiglu", "elementwise", bytes_moved=3 * m * f * FP16),
                Operator("down_proj", "gemm", m=m, k=f, n=h, bias=bias)]
    else:
        ops += [Operator("fc1", "gemm", m=m, k=h, n=f, bias=bias),
                Operator("gelu", "elementwise", bytes_moved=2 * m * f * FP16),     # read, write
                Operator("fc2", "gemm", m=m, k=f, n=h, bias=bias)]
    if tp > 1:
        ops.append(Operator("mlp_allreduce", "allreduce", bytes_moved=m * h * FP16))
    if spec.dropout > 0:
        ops.append(Operator("mlp_dropout", "elementwise", bytes_moved=_dropout_bytes(m * h)))
    ops.append(Operator("mlp_residual", "elementwise", bytes_moved=residual_bytes))
    return ops


def embedding_and_head_operators(spec: ModelSpec, micro_batch: int, seq: int,
                                 tp: int = 1) -> dict[str, list[Operator]]:
    """Extra forward work of the first stage ('first') and of the last stage ('last').

    The embedding and LM head are vocab-parallel under TP (each rank holds vocab/T rows); the
    token embedding's all-reduce comes before a learned position embedding is added (Megatron's
    VocabParallelEmbedding reduces inside its forward; the position table is replicated), then
    the embedding dropout. The loss reads the FP16 logits and writes their FP16 gradient
    (softmax - onehot).
    """
    _check_shape(micro_batch, seq)
    check_tp(spec, tp)
    if spec.vocab % tp:
        raise ConfigError(f"model {spec.name}: vocab={spec.vocab} not divisible by tp={tp}")
    if spec.position == "learned" and seq > spec.max_positions:
        raise ConfigError(f"model {spec.name}: seq={seq} exceeds its {spec.max_positions} learned positions")
    m = micro_batch * seq
    h, v = spec.hidden, spec.vocab // tp
    first = [Operator("embedding", "embedding", bytes_moved=2 * m * h * FP16 + m * 4)]
    if tp > 1:
        first.append(Operator("embedding_allreduce", "allreduce", bytes_moved=m * h * FP16))
    if spec.position == "learned":
        # gather one position row per token, read the token embedding, write the sum; position ids
        first.append(Operator("position_embedding", "embedding", bytes_moved=3 * m * h * FP16 + m * 4))
    if spec.dropout > 0:
        first.append(Operator("embedding_dropout", "elementwise", bytes_moved=_dropout_bytes(m * h)))
    last = [Operator("final_norm", "elementwise", bytes_moved=_norm_bytes(spec, m)),
            Operator("lm_head", "gemm", m=m, k=h, n=v),
            Operator("loss", "loss", bytes_moved=2 * m * v * FP16 + m * 4)]
    return {"first": first, "last": last}


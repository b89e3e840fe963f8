"""Dense decoder-only model specs, exact parameter counts and per-layer operator shapes.

A `ModelSpec` captures what the memory model and the profile builder need about a
LLaMA-style transformer (RMSNorm, SwiGLU MLP, RoPE or ALiBi attention, optional GQA,
packed QKV, QKV bias, q/k norm).  Specs come from the built-in table (public HF
config.json facts) or from a HuggingFace ``config.json`` via `from_hf_config`.

`layer_operators` lists one transformer layer's forward work with exact shapes:
GEMMs as (m, k, n) with m = micro_batch * seq tokens, the attention core, and the
bandwidth-bound elementwise operators with the bytes they move.  Everything is FP16
(2 bytes) except RMSNorm's per-token reciprocal RMS, which is FP32.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

from ratrain.errors import ConfigError
from rtcommon.jsonio import load_json_file

FP16 = 2   # bytes per FP16 element
FP32 = 4   # bytes per FP32 element

POSITIONS = ("rope", "alibi")

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

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SAFE_NAME.fullmatch(self.name):
            raise ConfigError(f"model name {self.name!r} must be 1-80 letters, digits or . _ + - "
                              f"(it names cache files); ratrain.spec.models.safe_model_name makes one")
        for name in ("hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model {self.name}: field {name} must be a positive integer, got {value!r}")
        if self.heads % self.kv_heads:
            raise ConfigError(f"model {self.name}: heads={self.heads} not divisible by kv_heads={self.kv_heads}")
        if self.position not in POSITIONS:
            raise ConfigError(f"model {self.name}: position must be one of {POSITIONS}, got {self.position!r}")
        if self.packed_qkv and self.kv_heads != self.heads:
            raise ConfigError(f"model {self.name}: packed_qkv requires kv_heads == heads")

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def to_json(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- parameter counts

def layer_parameter_count(spec: ModelSpec) -> int:
    """Parameters of one transformer block (attention + MLP + its two RMSNorm weights)."""
    h = spec.hidden
    attn = h * spec.q_dim + 2 * h * spec.kv_dim + spec.q_dim * h
    if spec.qkv_bias:
        attn += spec.q_dim + 2 * spec.kv_dim
    if spec.qk_norm:
        attn += 2 * spec.head_dim
    mlp = 3 * h * spec.ffn
    norms = 2 * h
    return attn + mlp + norms


def embedding_parameter_count(spec: ModelSpec) -> int:
    return spec.vocab * spec.hidden


def head_parameter_count(spec: ModelSpec) -> int:
    """Final RMSNorm plus the LM head (zero extra weights when tied to the embedding)."""
    return spec.hidden + (0 if spec.tied_embeddings else spec.vocab * spec.hidden)


def stage_edge_parameters(spec: ModelSpec, pp: int, tp: int = 1) -> tuple[int, int]:
    """Parameters per TP rank that the first and last pipeline stage hold besides their layers.

    The one home of the embedding/head split (memory, partition, cost terms and planner use it):
    stage 0 holds the vocab-parallel embedding; the last stage holds the vocab-parallel LM head
    plus the replicated final norm. A tied LM head still needs its own copy of the embedding
    matrix when the embedding lives on another stage (pp > 1).
    """
    embedding = embedding_parameter_count(spec) // tp
    head_weights = spec.vocab * spec.hidden if (not spec.tied_embeddings or pp > 1) else 0
    return embedding, head_weights // tp + spec.hidden


def parameter_count(spec: ModelSpec) -> int:
    """Exact trainable parameter count of the whole model."""
    return (spec.layers * layer_parameter_count(spec) + embedding_parameter_count(spec)
            + head_parameter_count(spec))


def layer_tp_parameter_count(spec: ModelSpec, tp: int = 1) -> int:
    """Parameters one tensor-parallel rank holds for one layer.

    Megatron-style split: q/k/v/gate/up are column-parallel, o/down row-parallel, so all
    projection weights and the q/k/v biases divide by T; RMSNorm and q/k-norm weights are
    replicated on every rank.
    """
    check_tp(spec, tp)
    h = spec.hidden
    split = h * spec.q_dim + 2 * h * spec.kv_dim + spec.q_dim * h + 3 * h * spec.ffn
    if spec.qkv_bias:
        split += spec.q_dim + 2 * spec.kv_dim
    replicated = 2 * h + (2 * spec.head_dim if spec.qk_norm else 0)
    return split // tp + replicated


def check_tp(spec: ModelSpec, tp: int) -> None:
    if not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tp must be a positive integer, got {tp!r}")
    for name, value in (("heads", spec.heads), ("kv_heads", spec.kv_heads), ("ffn", spec.ffn)):
        if value % tp:
            raise ConfigError(f"model {spec.name}: {name}={value} not divisible by tp={tp}")


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
    key = name.strip().lower()
    if key not in _BUILTIN:
        raise ConfigError(f"unknown model {name!r}; built-in models: {', '.join(_BUILTIN)}")
    return _BUILTIN[key]


# ---------------------------------------------------------------- HF config.json

_FAMILY_OF_TYPE = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
                   "baichuan": "baichuan"}
_FAMILY_OF_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                   "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                   "BaichuanForCausalLM": "baichuan", "BaiChuanForCausalLM": "baichuan"}


def from_hf_config(path: str | os.PathLike, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a HuggingFace config.json (llama, mistral, qwen2, qwen3, baichuan).

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
            raise ConfigError(f"{where}: field model_type must be a string, got {mtype!r}")
        if mtype not in _FAMILY_OF_TYPE:
            raise ConfigError(f"{where}: field model_type={mtype!r} is not supported "
                              f"(supported: {', '.join(_FAMILY_OF_TYPE)})")
        return _FAMILY_OF_TYPE[mtype]
    archs = raw.get("architectures")
    if isinstance(archs, list):
        for arch in archs:
            if arch in _FAMILY_OF_ARCH:
                return _FAMILY_OF_ARCH[arch]
        raise ConfigError(f"{where}: field architectures={archs!r} names no supported model "
                          f"and model_type is missing")
    raise ConfigError(f"{where}: missing field model_type (and no architectures list)")


def _get_int(raw: dict, key: str, where: str, default: int | None = None) -> int:
    if key not in raw or raw[key] is None:
        if default is None:
            raise ConfigError(f"{where}: missing field {key}")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: field {key} must be an integer, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{where}: field {key} must be positive, got {value}")
    return value


def _get_float(raw: dict, key: str, where: str, default: float | None) -> float | None:
    if key not in raw or raw[key] is None:
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: field {key} must be a number, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{where}: field {key} must be positive, got {value}")
    return float(value)


def _get_bool(raw: dict, key: str, where: str, default: bool) -> bool:
    if key not in raw or raw[key] is None:
        return default
    value = raw[key]
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: field {key} must be true or false, got {value!r}")
    return value


def _spec_from_dict(raw: dict, where: str, name: str | None) -> ModelSpec:
    family = _family(raw, where)
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
    if name is None:
        # _name_or_path if present, else the file name ("config.json" -> its folder's name)
        stem = os.path.splitext(os.path.basename(where))[0]
        if stem == "config":
            stem = os.path.basename(os.path.dirname(os.path.abspath(where)))
        name = safe_model_name(raw.get("_name_or_path") or stem, family)
    elif not _SAFE_NAME.fullmatch(str(name)):
        name = safe_model_name(name, family)
    return ModelSpec(name=name, hidden=hidden, ffn=ffn, layers=layers, heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, vocab=vocab, qkv_bias=qkv_bias, tied_embeddings=tied,
                     position=position, packed_qkv=packed, qk_norm=qk_norm, norm_eps=eps,
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


def layer_operators(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1) -> list[Operator]:
    """Forward operators of one transformer layer, in execution order, on one TP rank."""
    _check_shape(micro_batch, seq)
    check_tp(spec, tp)
    m = micro_batch * seq
    h = spec.hidden
    hq, hkv, d = spec.heads // tp, spec.kv_heads // tp, spec.head_dim
    f = spec.ffn // tp
    norm_bytes = 2 * m * h * FP16 + h * FP16 + m * FP32      # read x + weight, write y + rstd
    residual_bytes = 3 * m * h * FP16                         # read two streams, write one
    ops: list[Operator] = [Operator("attn_norm", "elementwise", bytes_moved=norm_bytes)]
    if spec.packed_qkv:
        ops.append(Operator("qkv_proj", "gemm", m=m, k=h, n=(hq + 2 * hkv) * d, bias=spec.qkv_bias))
    else:
        ops += [Operator("q_proj", "gemm", m=m, k=h, n=hq * d, bias=spec.qkv_bias),
                Operator("k_proj", "gemm", m=m, k=h, n=hkv * d, bias=spec.qkv_bias),
                Operator("v_proj", "gemm", m=m, k=h, n=hkv * d, bias=spec.qkv_bias)]
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
    ops.append(Operator("o_proj", "gemm", m=m, k=hq * d, n=h))
    if tp > 1:
        ops.append(Operator("attn_allreduce", "allreduce", bytes_moved=m * h * FP16))
    ops += [Operator("attn_residual", "elementwise", bytes_moved=residual_bytes),
            Operator("mlp_norm", "elementwise", bytes_moved=norm_bytes),
            Operator("gate_proj", "gemm", m=m, k=h, n=f),
            Operator("up_proj", "gemm", m=m, k=h, n=f),
            Operator("swiglu", "elementwise", bytes_moved=3 * m * f * FP16),
            Operator("down_proj", "gemm", m=m, k=f, n=h)]
    if tp > 1:
        ops.append(Operator("mlp_allreduce", "allreduce", bytes_moved=m * h * FP16))
    ops.append(Operator("mlp_residual", "elementwise", bytes_moved=residual_bytes))
    return ops


def embedding_and_head_operators(spec: ModelSpec, micro_batch: int, seq: int,
                                 tp: int = 1) -> dict[str, list[Operator]]:
    """Extra forward work of the first stage ('first') and of the last stage ('last').

    The embedding and LM head are vocab-parallel under TP (each rank holds vocab/T rows).
    The loss reads the FP16 logits and writes their FP16 gradient (softmax - onehot).
    """
    _check_shape(micro_batch, seq)
    check_tp(spec, tp)
    if spec.vocab % tp:
        raise ConfigError(f"model {spec.name}: vocab={spec.vocab} not divisible by tp={tp}")
    m = micro_batch * seq
    h, v = spec.hidden, spec.vocab // tp
    first = [Operator("embedding", "embedding", bytes_moved=2 * m * h * FP16 + m * 4)]
    if tp > 1:
        first.append(Operator("embedding_allreduce", "allreduce", bytes_moved=m * h * FP16))
    last = [Operator("final_norm", "elementwise", bytes_moved=2 * m * h * FP16 + h * FP16 + m * FP32),
            Operator("lm_head", "gemm", m=m, k=h, n=v),
            Operator("loss", "loss", bytes_moved=2 * m * v * FP16 + m * 4)]
    return {"first": first, "last": last}

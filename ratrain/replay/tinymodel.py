"""A tiny LLaMA-style decoder in NumPy with explicit per-layer forward/backward.

The correctness run (paper Fig. 7) needs a model whose training step can be
cut into the same per-layer, per-micro-batch pieces the simulator schedules:
F(l, m), B(l, m), R(l, m) and the per-layer state chain GradSync -> UpdateShard
-> PrefetchW. So every "layer" here is one unit with its own parameters and
its own forward/backward functions:

* layer 0 also owns the token embedding (its checkpoint is the token ids);
* every layer owns one decoder block: RMSNorm -> rotary causal attention ->
  residual, RMSNorm -> SwiGLU MLP -> residual;
* the last layer also owns the final RMSNorm, the untied LM head and the
  cross-entropy loss (its "output" is the micro-batch loss).

Mixed precision follows the paper's setting: FP32 master weights and FP32
Adam moments; the forward/backward use an FP16 working view of the weights
(``np.float16``), upcast exactly to float32 for the arithmetic (NumPy has no
fast fp16 GEMM; the values are still the fp16-rounded weights). Gradients are
computed and accumulated in float32 (like an fp32 "main_grad" buffer). A
static loss scale multiplies the loss gradient and is divided out before Adam.
``dtype="float64"`` switches views, compute and master to float64 so the
gradient check against finite differences is exact to ~1e-8.

Activation policy per call: ``save="full"`` keeps every intermediate backward
needs; ``save="ckpt"`` keeps only the layer input and ``recompute`` rebuilds
the internals from it (activation recovery). Recompute runs the very same
forward code on the very same inputs, so recovered internals are bit-identical
to saved ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ratrain.errors import ConfigError

_DTYPES = {"float32": (np.float16, np.float32), "float64": (np.float64, np.float64)}


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 96
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    ffn: int = 0                 # 0 -> round(8/3 * hidden) to a multiple of 8, as in LLaMA
    seq: int = 32
    dtype: str = "float32"       # "float32": fp16 views + fp32 compute; "float64": grad check
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab", "layers", "hidden", "heads", "seq"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TinyConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ConfigError(f"TinyConfig.hidden={self.hidden} must split into {self.heads} heads "
                              f"of even size (rotary pairs)")
        if self.dtype not in _DTYPES:
            raise ConfigError(f"TinyConfig.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def ffn_dim(self) -> int:
        if self.ffn:
            return self.ffn
        return max(8, int(round(8 * self.hidden / 3 / 8)) * 8)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def view_dtype(self):
        return _DTYPES[self.dtype][0]

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype][1]


@dataclass(frozen=True)
class AdamConfig:
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0    # decoupled (AdamW); per-element, so it shards freely
    loss_scale: float = 1.0      # static; a power of two keeps scaling exact


# ---------------------------------------------------------------- parameters

def layer_param_shapes(cfg: TinyConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of layer ``layer``'s parameters (embedding / head on the end layers)."""
    h, f = cfg.hidden, cfg.ffn_dim
    shapes: dict[str, tuple[int, ...]] = {}
    if layer == 0:
        shapes["embed"] = (cfg.vocab, h)
    shapes.update(attn_norm=(h,), wq=(h, h), wk=(h, h), wv=(h, h), wo=(h, h),
                  mlp_norm=(h,), w_gate=(h, f), w_up=(h, f), w_down=(f, h))
    if layer == cfg.layers - 1:
        shapes["final_norm"] = (h,)
        shapes["lm_head"] = (h, cfg.vocab)
    return shapes


def init_params(cfg: TinyConfig, seed: int) -> list[dict[str, np.ndarray]]:
    """Master weights (float32, or float64 in check mode) for every layer, from one seed."""
    rng = np.random.default_rng(seed)
    master_dtype = cfg.compute_dtype
    out_scale = cfg.init_std / np.sqrt(2.0 * cfg.layers)   # GPT-2 style residual-branch scaling
    params = []
    for layer in range(cfg.layers):
        p: dict[str, np.ndarray] = {}
        for name, shape in layer_param_shapes(cfg, layer).items():
            if name.endswith("norm"):
                p[name] = np.ones(shape, dtype=master_dtype)
            else:
                std = out_scale if name in ("wo", "w_down") else cfg.init_std
                p[name] = (rng.standard_normal(shape) * std).astype(master_dtype)
        params.append(p)
    return params


def make_view(master: dict[str, np.ndarray], cfg: TinyConfig) -> dict[str, np.ndarray]:
    """The working view used by forward/backward: master rounded to fp16, upcast for compute.

    The upcast is exact, so the arithmetic sees exactly the fp16 weight values.
    """
    return {k: v.astype(cfg.view_dtype).astype(cfg.compute_dtype) for k, v in master.items()}


# ---------------------------------------------------------------- primitives

def _rms_fwd(x, g, eps):
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r * g, r


def _rms_bwd(dy, x, r, g):
    u = dy * g
    dx = r * u - x * (r ** 3) * np.mean(u * x, axis=-1, keepdims=True)
    dg = np.sum(dy * x * r, axis=tuple(range(dy.ndim - 1)))
    return dx, dg


def _rope_tables(cfg: TinyConfig, seq: int):
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_base ** (np.arange(half, dtype=np.float64) / half))
    ang = np.arange(seq, dtype=np.float64)[:, None] * inv[None, :]
    dt = cfg.compute_dtype
    return np.cos(ang).astype(dt), np.sin(ang).astype(dt)


def _rope(x, cos, sin, inverse=False):
    # x: (B, nh, S, hd); rotate pairs (first half, second half) by angle, or by -angle.
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    if inverse:
        sin = -sin
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def _split_heads(x, nh):
    b, s, h = x.shape
    return x.reshape(b, s, nh, h // nh).transpose(0, 2, 1, 3)


def _merge_heads(x):
    b, nh, s, hd = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, nh * hd)


def _silu_parts(a):
    sig = 1.0 / (1.0 + np.exp(-a))
    return a * sig, sig


# ---------------------------------------------------------------- one layer

@dataclass
class LayerCache:
    """What backward of one layer needs. ``full=False`` means only the checkpoint is held."""
    layer: int
    inp: np.ndarray                       # token ids (layer 0) or the layer's input hidden state
    targets: np.ndarray | None = None     # last layer only
    full: bool = False
    saved: dict[str, np.ndarray] = field(default_factory=dict)


def _block_forward(p, x, cfg: TinyConfig):
    """One decoder block. Returns (y, saved internals)."""
    nh, hd = cfg.heads, cfg.head_dim
    s = x.shape[1]
    cos, sin = _rope_tables(cfg, s)
    xn1, r1 = _rms_fwd(x, p["attn_norm"], cfg.norm_eps)
    q = _rope(_split_heads(xn1 @ p["wq"], nh), cos, sin)
    k = _rope(_split_heads(xn1 @ p["wk"], nh), cos, sin)
    v = _split_heads(xn1 @ p["wv"], nh)
    scale = 1.0 / math.sqrt(hd)
    scores = (q @ k.transpose(0, 1, 3, 2)) * scale
    mask = np.triu(np.ones((s, s), dtype=bool), k=1)
    scores = np.where(mask, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    prob = e / e.sum(axis=-1, keepdims=True)
    o = _merge_heads(prob @ v)
    h1 = x + o @ p["wo"]
    xn2, r2 = _rms_fwd(h1, p["mlp_norm"], cfg.norm_eps)
    a = xn2 @ p["w_gate"]
    bu = xn2 @ p["w_up"]
    sa, sig = _silu_parts(a)
    hm = sa * bu
    y = h1 + hm @ p["w_down"]
    saved = dict(x=x, xn1=xn1, r1=r1, q=q, k=k, v=v, prob=prob, o=o, h1=h1, xn2=xn2, r2=r2,
                 a=a, bu=bu, sa=sa, sig=sig, hm=hm)
    return y, saved


def _block_backward(p, s, dy, cfg: TinyConfig, grads):
    nh, hd = cfg.heads, cfg.head_dim
    seq = dy.shape[1]
    cos, sin = _rope_tables(cfg, seq)
    h = cfg.hidden
    f = cfg.ffn_dim
    # MLP branch
    grads["w_down"] = s["hm"].reshape(-1, f).T @ dy.reshape(-1, h)
    dhm = dy @ p["w_down"].T
    dsa = dhm * s["bu"]
    dbu = dhm * s["sa"]
    sig, a = s["sig"], s["a"]
    da = dsa * sig * (1.0 + a * (1.0 - sig))
    xn2 = s["xn2"].reshape(-1, h)
    grads["w_gate"] = xn2.T @ da.reshape(-1, f)
    grads["w_up"] = xn2.T @ dbu.reshape(-1, f)
    dxn2 = da @ p["w_gate"].T + dbu @ p["w_up"].T
    dh1_norm, grads["mlp_norm"] = _rms_bwd(dxn2, s["h1"], s["r2"], p["mlp_norm"])
    dh1 = dy + dh1_norm
    # attention branch
    grads["wo"] = s["o"].reshape(-1, h).T @ dh1.reshape(-1, h)
    do = _split_heads(dh1 @ p["wo"].T, nh)
    prob = s["prob"]
    dprob = do @ s["v"].transpose(0, 1, 3, 2)
    dv = prob.transpose(0, 1, 3, 2) @ do
    dscores = prob * (dprob - np.sum(dprob * prob, axis=-1, keepdims=True))
    scale = 1.0 / math.sqrt(hd)
    dq = (dscores @ s["k"]) * scale
    dk = (dscores.transpose(0, 1, 3, 2) @ s["q"]) * scale
    dq = _merge_heads(_rope(dq, cos, sin, inverse=True))
    dk = _merge_heads(_rope(dk, cos, sin, inverse=True))
    dv = _merge_heads(dv)
    xn1 = s["xn1"].reshape(-1, h)
    grads["wq"] = xn1.T @ dq.reshape(-1, h)
    grads["wk"] = xn1.T @ dk.reshape(-1, h)
    grads["wv"] = xn1.T @ dv.reshape(-1, h)
    dxn1 = dq @ p["wq"].T + dk @ p["wk"].T + dv @ p["wv"].T
    dx_norm, grads["attn_norm"] = _rms_bwd(dxn1, s["x"], s["r1"], p["attn_norm"])
    return dh1 + dx_norm


def _full_forward(view, cfg: TinyConfig, layer: int, inp, targets):
    saved: dict[str, np.ndarray] = {}
    if layer == 0:
        x = view["embed"][inp]
    else:
        x = inp
    y, saved = _block_forward(view, x, cfg)
    if layer != cfg.layers - 1:
        return y, saved
    yn, rf = _rms_fwd(y, view["final_norm"], cfg.norm_eps)
    logits = yn @ view["lm_head"]
    logits = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(logits)
    probs = e / e.sum(axis=-1, keepdims=True)
    picked = np.take_along_axis(probs, targets[..., None], axis=-1)[..., 0]
    loss = -np.mean(np.log(picked))
    saved.update(y=y, yn=yn, rf=rf, probs=probs)
    return loss, saved


def layer_forward(view: dict[str, np.ndarray], cfg: TinyConfig, layer: int, inp: np.ndarray,
                  targets: np.ndarray | None = None, save: str = "full"):
    """Forward of one layer for one micro-batch.

    ``inp`` is the token ids (layer 0) or the previous layer's output; the last
    layer needs ``targets`` and returns the mean cross-entropy as a Python float.
    Returns ``(output, cache)``; with ``save="ckpt"`` the cache holds only the input.
    """
    if save not in ("full", "ckpt"):
        raise ConfigError(f"layer_forward save must be 'full' or 'ckpt', got {save!r}")
    if layer == cfg.layers - 1 and targets is None:
        raise ConfigError(f"layer {layer} is the last layer and needs targets")
    out, saved = _full_forward(view, cfg, layer, inp, targets)
    cache = LayerCache(layer=layer, inp=inp, targets=targets, full=save == "full",
                       saved=saved if save == "full" else {})
    if layer == cfg.layers - 1:
        out = float(out)
    return out, cache


def recompute(view: dict[str, np.ndarray], cfg: TinyConfig, cache: LayerCache) -> LayerCache:
    """Activation recovery: rebuild a full cache from a checkpoint (same code, same inputs)."""
    _, saved = _full_forward(view, cfg, cache.layer, cache.inp, cache.targets)
    return LayerCache(layer=cache.layer, inp=cache.inp, targets=cache.targets, full=True, saved=saved)


def layer_backward(view: dict[str, np.ndarray], cfg: TinyConfig, cache: LayerCache,
                   dout: np.ndarray | float) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
    """Backward of one layer for one micro-batch.

    ``dout`` is d(objective)/d(output); for the last layer it is the scalar
    d(objective)/d(loss). A checkpoint-only cache is recomputed first (this is
    backward-time recovery). Returns ``(d input, parameter grads)``; d input is
    None for layer 0 (token ids have no gradient).
    """
    if not cache.full:
        cache = recompute(view, cfg, cache)
    s = cache.saved
    grads: dict[str, np.ndarray] = {}
    layer = cache.layer
    if layer == cfg.layers - 1:
        probs = s["probs"]
        n = probs.shape[0] * probs.shape[1]
        dlogits = probs.copy()
        np.put_along_axis(dlogits, cache.targets[..., None],
                          np.take_along_axis(dlogits, cache.targets[..., None], axis=-1) - 1.0, axis=-1)
        dlogits *= np.asarray(dout, dtype=cfg.compute_dtype) / n
        h, v = cfg.hidden, cfg.vocab
        grads["lm_head"] = s["yn"].reshape(-1, h).T @ dlogits.reshape(-1, v)
        dyn = dlogits @ view["lm_head"].T
        dy, grads["final_norm"] = _rms_bwd(dyn, s["y"], s["rf"], view["final_norm"])
    else:
        dy = dout
    dx = _block_backward(view, s, dy, cfg, grads)
    if layer == 0:
        g = np.zeros_like(view["embed"])
        np.add.at(g, cache.inp.reshape(-1), dx.reshape(-1, cfg.hidden))
        grads["embed"] = g
        return None, grads
    return dx, grads


# ---------------------------------------------------------------- optimizer

@dataclass
class LayerOptState:
    m: dict[str, np.ndarray]
    v: dict[str, np.ndarray]
    t: int = 0


def new_opt_state(master: dict[str, np.ndarray]) -> LayerOptState:
    return LayerOptState(m={k: np.zeros(v.shape, dtype=v.dtype) for k, v in master.items()},
                         v={k: np.zeros(v.shape, dtype=v.dtype) for k, v in master.items()})


def adam_update(master: dict[str, np.ndarray], grads: dict[str, np.ndarray], state: LayerOptState,
                opt: AdamConfig) -> None:
    """In-place Adam(W) step of one layer's master shard; grads still carry the loss scale.

    Every operation is element-wise, so splitting a layer into D shards and
    updating them separately gives the same bits as one call.
    """
    state.t += 1
    bc1 = 1.0 - opt.beta1 ** state.t
    bc2 = 1.0 - opt.beta2 ** state.t
    for name, p in master.items():
        g = grads[name] / opt.loss_scale
        m = state.m[name]
        v = state.v[name]
        m *= opt.beta1
        m += (1.0 - opt.beta1) * g
        v *= opt.beta2
        v += (1.0 - opt.beta2) * (g * g)
        step = (m / bc1) / (np.sqrt(v / bc2) + opt.eps)
        if opt.weight_decay:
            p -= opt.lr * opt.weight_decay * p
        p -= (opt.lr * step).astype(p.dtype)


# ---------------------------------------------------------------- reference loop

def microbatch_loss_and_grads(views: list[dict[str, np.ndarray]], cfg: TinyConfig, tokens: np.ndarray,
                              targets: np.ndarray, dloss: float = 1.0, save: str = "full"):
    """Whole-model forward + backward of one micro-batch, layer by layer.

    Returns (loss, per-layer grads). Used by the single-stage reference loop and
    the gradient check.
    """
    caches = []
    h = tokens
    for layer in range(cfg.layers):
        h, c = layer_forward(views[layer], cfg, layer, h, targets if layer == cfg.layers - 1 else None,
                             save=save)
        caches.append(c)
    loss = h
    grads: list[dict[str, np.ndarray]] = [None] * cfg.layers  # type: ignore[list-item]
    d: np.ndarray | float = dloss
    for layer in reversed(range(cfg.layers)):
        d, grads[layer] = layer_backward(views[layer], cfg, caches[layer], d)
    return loss, grads

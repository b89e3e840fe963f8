"""NumPy references for the attention math the emulated Algorithm-1 kernels reproduce.

Shapes: ``q``, ``o``, ``do`` are (heads, seq, d); ``k``, ``v`` are (kv_heads, seq, d) with
``kv_heads`` dividing ``heads`` (grouped-query attention: query head h reads kv head
``h // (heads // kv_heads)``). Inputs are ``np.float16`` arrays (FP16 data held as uint16 bit
patterns can be passed as ``bits.view(np.float16)``, which is exact). Softmax scale is 1/sqrt(d);
``causal`` masks key j > query i (queries and keys share positions).

* :func:`attention_forward_ref` - exact float64 math rounded once: O and the saved P in FP16
  (round to nearest even), the row logsumexp in FP32.
* :func:`attention_backward_f64` / :func:`attention_backward_ref` - the float64 gradient of
  ``sum(do * O)``; by default P and O are recomputed in float64 (the exact gradient at the FP16
  inputs), with ``use_saved=True`` the saved FP16 P and the given O are used instead (the same
  inputs the tiled kernel sees, so only its FP32 rounding remains).
* :func:`attention_backward_tiled` - Algorithm 1 in FP32 with a fixed, documented operation
  order; the bit-level reference for the emulated kernel (see its docstring).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import MtemuError


@dataclass(frozen=True)
class AttentionSaved:
    """Forward state kept for backward: probabilities P (FP16, heads x seq x seq; exactly zero
    where masked) and row logsumexp of the scaled scores (FP32, heads x seq)."""

    p: np.ndarray
    lse: np.ndarray


# ------------------------------------------------------------------------------------------
# input checks
# ------------------------------------------------------------------------------------------
def _check_array(name: str, x, dtype=np.float16, ndim: int = 3) -> None:
    if not isinstance(x, np.ndarray):
        raise MtemuError(f"argument '{name}' must be a NumPy array, got {type(x).__name__}")
    if x.dtype != dtype:
        hint = " (FP16 bit patterns: pass x.view(np.float16))" if x.dtype == np.uint16 else ""
        raise MtemuError(f"argument '{name}' must have dtype {np.dtype(dtype).name}, got {x.dtype}{hint}")
    if x.ndim != ndim:
        raise MtemuError(f"argument '{name}' must be {ndim}-D, got shape {x.shape}")


def _check_qkv(q, k, v) -> tuple[int, int, int, int]:
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_array(name, x)
    heads, seq, d = q.shape
    if heads == 0 or seq == 0 or d == 0:
        raise MtemuError(f"argument 'q' must have non-empty dimensions, got shape {q.shape}")
    if k.shape != v.shape:
        raise MtemuError(f"arguments 'k' and 'v' must have the same shape, got {k.shape} and {v.shape}")
    kv_heads = k.shape[0]
    if k.shape[1:] != (seq, d):
        raise MtemuError(f"argument 'k' must be (kv_heads, {seq}, {d}) to match 'q' {q.shape}, got {k.shape}")
    if kv_heads == 0 or heads % kv_heads:
        raise MtemuError(f"argument 'k': kv_heads={kv_heads} must divide the {heads} query heads")
    return heads, kv_heads, seq, d


def _check_backward_args(q, k, v, o, do, saved) -> tuple[int, int, int, int]:
    heads, kv_heads, seq, d = _check_qkv(q, k, v)
    for name, x in (("o", o), ("do", do)):
        _check_array(name, x)
        if x.shape != q.shape:
            raise MtemuError(f"argument '{name}' must have the shape of 'q' {q.shape}, got {x.shape}")
    if not isinstance(saved, AttentionSaved):
        raise MtemuError(f"argument 'saved' must be an AttentionSaved, got {type(saved).__name__}")
    _check_array("saved.p", saved.p)
    if saved.p.shape != (heads, seq, seq):
        raise MtemuError(f"argument 'saved.p' must be ({heads}, {seq}, {seq}), got {saved.p.shape}")
    _check_array("saved.lse", saved.lse, np.float32, 2)
    if saved.lse.shape != (heads, seq):
        raise MtemuError(f"argument 'saved.lse' must be ({heads}, {seq}), got {saved.lse.shape}")
    return heads, kv_heads, seq, d


def _check_flag(name: str, x) -> None:
    if not isinstance(x, (bool, np.bool_)):
        raise MtemuError(f"argument '{name}' must be True or False, got {x!r}")


def _kv_index(heads: int, kv_heads: int) -> np.ndarray:
    return np.arange(heads) // (heads // kv_heads)


# ------------------------------------------------------------------------------------------
# float64 math (also used by the tests on unrounded inputs)
# ------------------------------------------------------------------------------------------
def _probs_f64(q: np.ndarray, k: np.ndarray, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Softmax probabilities (heads, seq, seq) and row logsumexp, float64."""
    heads, seq, d = q.shape
    kx = k[_kv_index(heads, k.shape[0])]
    s = np.einsum("hid,hjd->hij", q, kx) / math.sqrt(d)
    if causal:
        s = np.where(np.tril(np.ones((seq, seq), dtype=bool)), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
    return np.exp(s - lse), lse[..., 0]


def attention_forward_f64(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True) -> np.ndarray:
    """O = softmax(Q K^T / sqrt(d)) V in float64 on float64 arrays (no checks, no rounding)."""
    p, _ = _probs_f64(q, k, causal)
    return np.einsum("hij,hjd->hid", p, v[_kv_index(q.shape[0], k.shape[0])])


def attention_backward_f64(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, causal: bool = True,
                           p: np.ndarray | None = None, o: np.ndarray | None = None
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of sum(do * O) w.r.t. q, k, v in float64 on float64 arrays.

    ``p``/``o`` default to the exact float64 values; passing them substitutes given ones."""
    heads, seq, d = q.shape
    kv_heads = k.shape[0]
    idx = _kv_index(heads, kv_heads)
    if p is None:
        p, _ = _probs_f64(q, k, causal)
    if o is None:
        o = np.einsum("hij,hjd->hid", p, v[idx])
    scale = 1.0 / math.sqrt(d)
    dv_h = np.einsum("hij,hid->hjd", p, do)                  # P^T dO per query head
    dp = np.einsum("hid,hjd->hij", do, v[idx])               # dO V^T
    delta = np.sum(do * o, axis=-1, keepdims=True)           # rowsum(dO * O)
    ds = p * (dp - delta)                                    # softmax backward
    dq = np.einsum("hij,hjd->hid", ds, k[idx]) * scale
    dk_h = np.einsum("hij,hid->hjd", ds, q) * scale
    dk = np.zeros(k.shape)
    dv = np.zeros(v.shape)
    np.add.at(dk, idx, dk_h)                                 # GQA: sum over the group's heads
    np.add.at(dv, idx, dv_h)
    return dq, dk, dv


# ------------------------------------------------------------------------------------------
# public FP16 references
# ------------------------------------------------------------------------------------------
def attention_forward_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True
                          ) -> tuple[np.ndarray, AttentionSaved]:
    """Forward attention on FP16 inputs: float64 math, O and P rounded once to FP16, lse to FP32."""
    _check_qkv(q, k, v)
    _check_flag("causal", causal)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    p, lse = _probs_f64(q64, k64, bool(causal))
    o = np.einsum("hij,hjd->hid", p, v64[_kv_index(q.shape[0], k.shape[0])])
    return o.astype(np.float16), AttentionSaved(p.astype(np.float16), lse.astype(np.float32))


def attention_backward_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, do: np.ndarray,
                           saved: AttentionSaved, causal: bool = True, use_saved: bool = False
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) in float64. ``use_saved=False``: exact gradient at the FP16 inputs (P and O
    recomputed in float64; ``o``/``saved`` are only checked). ``use_saved=True``: uses the FP16
    saved P and the given O, as the tiled kernel does."""
    _check_backward_args(q, k, v, o, do, saved)
    _check_flag("causal", causal)
    _check_flag("use_saved", use_saved)
    q64, k64, v64, do64 = (x.astype(np.float64) for x in (q, k, v, do))
    if use_saved:
        return attention_backward_f64(q64, k64, v64, do64, bool(causal),
                                      p=saved.p.astype(np.float64), o=o.astype(np.float64))
    return attention_backward_f64(q64, k64, v64, do64, bool(causal))


# ------------------------------------------------------------------------------------------
# Algorithm 1, FP32, fixed operation order
# ------------------------------------------------------------------------------------------
def _mm_seq(a: np.ndarray, b: np.ndarray, acc: np.ndarray | None = None) -> np.ndarray:
    """acc (+)= a @ b in FP32, sequential over the inner index: acc = fl(acc + fl(a[:, t] b[t, :]))
    for t = 0, 1, ... (the emulator's non-fused VFMA order). A fresh acc starts at +0."""
    if acc is None:
        acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for t in range(a.shape[1]):
        acc += a[:, t:t + 1] * b[t:t + 1, :]
    return acc


def attention_backward_tiled(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, do: np.ndarray,
                             saved: AttentionSaved, br: int, bc: int, causal: bool = True,
                             gs_staging: str = "fp16") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Algorithm 1 in FP32; returns FP32 (dq, dk, dv) accumulators (an FP16 write-back is
    ``.astype(np.float16)``, round to nearest even like the machine's VSTH).

    Operation order (every step FP32, each multiply and add rounded separately):

    for each query head h (increasing), kv head g = h // (heads // kv_heads):
      for each query tile i (rows i*br ..., the last one may be short):
        Q_i, GO_i, O_i widened from FP16 (exact); GQ_i = 0
        Delta_i[r] = sum_e GO_i[r, e] * O_i[r, e]            sequential in e
        for each key/value tile j (increasing); causal: tiles whose first key lies after the
        tile's last query are skipped (their saved P is exactly zero):
          P_ij from the saved FP16 P (exact)
          GP_ij = GO_i V_j^T                                  sequential in e (= d)
          GS_ij = P_ij * (GP_ij - Delta_i)                    SoftmaxBackward, two roundings
          GS~_ij = GS_ij rounded to FP16 if gs_staging == "fp16" (SM left operands are FP16
                   on the current ISA), else kept FP32
          GV_j^part = P_ij^T GO_i        from +0, sequential in the tile's query rows
          GV[g, j] += GV_j^part                               (ReduceAddGSM)
          GQ_i      = GQ_i + GS~_ij K_j  continues the same accumulator, sequential in keys
          GK_j^part = GS~_ij^T Q_i       from +0, sequential in the tile's query rows
          GK[g, j] += GK_j^part                               (ReduceAddGSM)
        dq[h, i] = GQ_i * fl32(1/sqrt(d))
      dk, dv accumulate over (h, i) in loop order; at the end dk *= fl32(1/sqrt(d)).

    The GEMM products are exact in FP32 whenever both operands are FP16 values, so only the
    accumulation order matters there; with ``gs_staging="fp32"`` the GS*K and GS*Q products are
    rounded too.
    """
    heads, kv_heads, seq, d = _check_backward_args(q, k, v, o, do, saved)
    _check_flag("causal", causal)
    for name, x in (("br", br), ("bc", bc)):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x <= 0:
            raise MtemuError(f"argument '{name}' must be a positive integer, got {x!r}")
    if gs_staging not in ("fp16", "fp32"):
        raise MtemuError(f"argument 'gs_staging' must be 'fp16' or 'fp32', got {gs_staging!r}")
    q32, k32, v32, o32, do32 = (x.astype(np.float32) for x in (q, k, v, o, do))
    p32 = saved.p.astype(np.float32)
    scale = np.float32(1.0 / math.sqrt(d))
    group = heads // kv_heads
    dq = np.zeros((heads, seq, d), dtype=np.float32)
    dk = np.zeros((kv_heads, seq, d), dtype=np.float32)
    dv = np.zeros((kv_heads, seq, d), dtype=np.float32)
    for h in range(heads):
        g = h // group
        for i0 in range(0, seq, br):
            i1 = min(i0 + br, seq)
            q_i, go_i, o_i = q32[h, i0:i1], do32[h, i0:i1], o32[h, i0:i1]
            gq_i = np.zeros((i1 - i0, d), dtype=np.float32)
            delta = np.zeros((i1 - i0, 1), dtype=np.float32)
            for e in range(d):
                delta += go_i[:, e:e + 1] * o_i[:, e:e + 1]
            for j0 in range(0, seq, bc):
                if causal and j0 > i1 - 1:
                    break                        # this and all later key tiles are fully masked
                j1 = min(j0 + bc, seq)
                k_j, v_j = k32[g, j0:j1], v32[g, j0:j1]
                p_ij = p32[h, i0:i1, j0:j1]
                gp = _mm_seq(go_i, v_j.T)
                gs = p_ij * (gp - delta)
                if gs_staging == "fp16":
                    gs = gs.astype(np.float16).astype(np.float32)
                dv[g, j0:j1] += _mm_seq(p_ij.T, go_i)
                _mm_seq(gs, k_j, gq_i)
                dk[g, j0:j1] += _mm_seq(gs.T, q_i)
            dq[h, i0:i1] = gq_i * scale
    dk *= scale
    return dq, dk, dv

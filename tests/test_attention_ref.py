import math

import numpy as np
import pytest

from mtemu.errors import MtemuError
from mtemu.kernels.attention_ref import (
    AttentionSaved,
    attention_backward_f64,
    attention_backward_ref,
    attention_backward_tiled,
    attention_forward_f64,
    attention_forward_ref,
)


def _inputs(heads, kv_heads, seq, d, seed, causal=True):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, seq, d)).astype(np.float16)
    k = rng.standard_normal((kv_heads, seq, d)).astype(np.float16)
    v = rng.standard_normal((kv_heads, seq, d)).astype(np.float16)
    do = rng.standard_normal((heads, seq, d)).astype(np.float16)
    o, saved = attention_forward_ref(q, k, v, causal)
    return q, k, v, o, do, saved


def _rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


# ------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
def test_forward_saved_state(causal):
    q, k, v, o, do, saved = _inputs(4, 2, 9, 8, 1, causal)
    assert o.dtype == np.float16 and o.shape == q.shape
    assert saved.p.dtype == np.float16 and saved.p.shape == (4, 9, 9)
    assert saved.lse.dtype == np.float32 and saved.lse.shape == (4, 9)
    p = saved.p.astype(np.float64)
    assert np.allclose(p.sum(-1), 1.0, atol=9 * 2.0 ** -11)
    if causal:
        assert np.all(saved.p[:, np.triu_indices(9, 1)[0], np.triu_indices(9, 1)[1]] == 0)
        assert np.all(saved.p[:, 0, 0] == 1.0)            # first query sees only itself
    # lse reproduces P, and head h uses kv head h // 2
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    for h in range(4):
        s = q64[h] @ k64[h // 2].T / math.sqrt(8)
        if causal:
            s = np.where(np.tril(np.ones((9, 9), bool)), s, -np.inf)
        assert np.allclose(np.exp(s - saved.lse[h, :, None].astype(np.float64)), p[h], atol=1e-3)
    exact = attention_forward_f64(q64, k64, v.astype(np.float64), causal)
    assert np.array_equal(o, exact.astype(np.float16))


def test_gqa_equals_mha_with_repeated_kv():
    q, k, v, o, do, saved = _inputs(4, 1, 6, 4, 2)
    kr, vr = np.repeat(k, 4, axis=0), np.repeat(v, 4, axis=0)
    o2, saved2 = attention_forward_ref(q, kr, vr)
    assert np.array_equal(o, o2) and np.array_equal(saved.p, saved2.p)
    dq, dk, dv = attention_backward_ref(q, k, v, o, do, saved)
    dq2, dk2, dv2 = attention_backward_ref(q, kr, vr, o2, do, saved2)
    assert np.allclose(dq, dq2, rtol=1e-12, atol=1e-12)
    assert np.allclose(dk[0], dk2.sum(0), rtol=1e-12, atol=1e-12)
    assert np.allclose(dv[0], dv2.sum(0), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------
# float64 backward against finite differences and an explicit Jacobian
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal,heads,kv_heads", [(True, 2, 1), (False, 2, 2), (True, 3, 3)])
def test_backward_f64_matches_finite_differences(causal, heads, kv_heads):
    rng = np.random.default_rng(3)
    seq, d = 4, 3
    q = rng.standard_normal((heads, seq, d))
    k = rng.standard_normal((kv_heads, seq, d))
    v = rng.standard_normal((kv_heads, seq, d))
    do = rng.standard_normal((heads, seq, d))
    grads = attention_backward_f64(q, k, v, do, causal)

    def loss(qq, kk, vv):
        return float(np.sum(do * attention_forward_f64(qq, kk, vv, causal)))

    eps = 1e-6
    for which, g in enumerate(grads):
        args = [q, k, v]
        fd = np.zeros_like(args[which])
        for idx in np.ndindex(fd.shape):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            fd[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        assert np.allclose(g, fd, rtol=1e-6, atol=1e-8), which


def test_backward_f64_matches_explicit_softmax_jacobian():
    rng = np.random.default_rng(4)
    heads, kv_heads, seq, d = 4, 2, 5, 3
    q, do = rng.standard_normal((2, heads, seq, d))
    k, v = rng.standard_normal((2, kv_heads, seq, d))
    dq, dk, dv = attention_backward_f64(q, k, v, do, True)
    scale = 1 / math.sqrt(d)
    eq, ek, ev = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(heads):
        g = h // 2
        s = q[h] @ k[g].T * scale
        s[np.triu_indices(seq, 1)] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        dp = do[h] @ v[g].T
        ds = np.stack([(np.diag(p[r]) - np.outer(p[r], p[r])) @ dp[r] for r in range(seq)])
        ev[g] += p.T @ do[h]
        eq[h] = ds @ k[g] * scale
        ek[g] += ds.T @ q[h] * scale
    for a, b in ((dq, eq), (dk, ek), (dv, ev)):
        assert np.allclose(a, b, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------
# tiled FP32 Algorithm 1
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("gs_staging", ["fp16", "fp32"])
def test_tiled_matches_float64(causal, heads, kv_heads, gs_staging):
    q, k, v, o, do, saved = _inputs(heads, kv_heads, 37, 16, 5, causal)    # 37 = 4*8+5 = 2*16+5
    tiled = attention_backward_tiled(q, k, v, o, do, saved, 8, 16, causal, gs_staging=gs_staging)
    exact = attention_backward_ref(q, k, v, o, do, saved, causal)
    same_inputs = attention_backward_ref(q, k, v, o, do, saved, causal, use_saved=True)
    for t, e, s in zip(tiled, exact, same_inputs, strict=False):
        assert t.dtype == np.float32 and t.shape == e.shape
        # FP16 saved P and O: a few FP16 ulps of the gradient's scale
        assert _rel(t, e) < 4e-3
        # with the kernel's own inputs only FP32 rounding (and FP16 GS staging) remains
        assert _rel(t, s) < (2e-3 if gs_staging == "fp16" else 2e-6)


@pytest.mark.parametrize("br,bc", [(1, 1), (3, 5), (64, 64), (5, 64), (13, 2)])
def test_tiled_any_tile_shape(br, bc):
    q, k, v, o, do, saved = _inputs(2, 1, 13, 8, 6)
    s = attention_backward_ref(q, k, v, o, do, saved, use_saved=True)
    for t, e in zip(attention_backward_tiled(q, k, v, o, do, saved, br, bc, gs_staging="fp32"), s, strict=False):
        assert _rel(t, e) < 2e-6


def test_tiled_detects_wrong_inputs():
    # the tolerance is tight enough to catch a missing rowsum(GO*O) term or a wrong kv head
    q, k, v, o, do, saved = _inputs(4, 2, 20, 8, 7)
    exact = attention_backward_ref(q, k, v, o, do, saved)
    bad = attention_backward_tiled(q, k, v, np.zeros_like(o), do, saved, 8, 8)
    assert _rel(bad[0], exact[0]) > 0.05
    swapped = np.ascontiguousarray(k[::-1])
    o2, saved2 = attention_forward_ref(q, swapped, v)
    bad = attention_backward_tiled(q, k, v, o2, do, saved2, 8, 8)
    assert _rel(bad[1], exact[1]) > 0.05


def _scalar_algorithm1(q, k, v, o, do, p, br, bc, causal, fp16_gs):
    """Literal transcription of the documented order with np.float32 scalars, no tile skipping."""
    f = np.float32
    heads, seq, d = q.shape
    group = heads // k.shape[0]
    q, k, v, o, do, p = (x.astype(np.float32) for x in (q, k, v, o, do, p))
    dq = np.zeros(q.shape, np.float32)
    dk = np.zeros(k.shape, np.float32)
    dv = np.zeros(v.shape, np.float32)
    scale = f(1 / math.sqrt(d))
    for h in range(heads):
        g = h // group
        for i0 in range(0, seq, br):
            rows = range(i0, min(i0 + br, seq))
            gq = {(r, e): f(0) for r in rows for e in range(d)}
            delta = {}
            for r in rows:
                acc = f(0)
                for e in range(d):
                    acc = f(acc + f(do[h, r, e] * o[h, r, e]))
                delta[r] = acc
            for j0 in range(0, seq, bc):
                cols = range(j0, min(j0 + bc, seq))
                gs = {}
                for r in rows:
                    for c in cols:
                        gp = f(0)
                        for e in range(d):
                            gp = f(gp + f(do[h, r, e] * v[g, c, e]))
                        x = f(p[h, r, c] * f(gp - delta[r]))
                        gs[r, c] = f(np.float16(x)) if fp16_gs else x
                for c in cols:
                    for e in range(d):
                        part_v, part_k = f(0), f(0)
                        for r in rows:
                            part_v = f(part_v + f(p[h, r, c] * do[h, r, e]))
                            part_k = f(part_k + f(gs[r, c] * q[h, r, e]))
                        dv[g, c, e] = f(dv[g, c, e] + part_v)
                        dk[g, c, e] = f(dk[g, c, e] + part_k)
                for r in rows:
                    for e in range(d):
                        for c in cols:
                            gq[r, e] = f(gq[r, e] + f(gs[r, c] * k[g, c, e]))
            for (r, e), x in gq.items():
                dq[h, r, e] = f(x * scale)
    return dq, dk * scale, dv


@pytest.mark.parametrize("causal,fp16_gs", [(True, True), (False, True), (True, False)])
def test_tiled_bitwise_equals_documented_order(causal, fp16_gs):
    q, k, v, o, do, saved = _inputs(2, 1, 7, 3, 8, causal)
    tiled = attention_backward_tiled(q, k, v, o, do, saved, 3, 2, causal,
                                     gs_staging="fp16" if fp16_gs else "fp32")
    lit = _scalar_algorithm1(q, k, v, o, do, saved.p, 3, 2, causal, fp16_gs)
    for a, b in zip(tiled, lit, strict=False):
        # equal values; skipped causal tiles only ever add zeros (the sign of a zero may differ)
        assert np.array_equal(a, b)


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_argument():
    q, k, v, o, do, saved = _inputs(4, 2, 6, 4, 9)
    with pytest.raises(MtemuError, match="'q'.*float16.*float32"):
        attention_forward_ref(q.astype(np.float32), k, v)
    with pytest.raises(MtemuError, match=r"'k'.*view\(np.float16\)"):
        attention_forward_ref(q, k.view(np.uint16), v)
    with pytest.raises(MtemuError, match="'v'.*3-D"):
        attention_forward_ref(q, k, v[0])
    with pytest.raises(MtemuError, match="'k' and 'v'"):
        attention_forward_ref(q, k, v[:1])
    with pytest.raises(MtemuError, match="'k'.*match 'q'"):
        attention_forward_ref(q, k[:, :5], v[:, :5])
    with pytest.raises(MtemuError, match="kv_heads=3 must divide the 4"):
        attention_forward_ref(q, np.concatenate([k, k[:1]]), np.concatenate([v, v[:1]]))
    with pytest.raises(MtemuError, match="'causal'"):
        attention_forward_ref(q, k, v, causal=1)
    with pytest.raises(MtemuError, match="'o'"):
        attention_backward_ref(q, k, v, o[:, :5], do, saved)
    with pytest.raises(MtemuError, match="'do'.*float16"):
        attention_backward_ref(q, k, v, o, do.astype(np.float64), saved)
    with pytest.raises(MtemuError, match="'saved'"):
        attention_backward_ref(q, k, v, o, do, (saved.p, saved.lse))
    with pytest.raises(MtemuError, match="'saved.p'"):
        attention_backward_ref(q, k, v, o, do, AttentionSaved(saved.p[:, :5], saved.lse))
    with pytest.raises(MtemuError, match="'saved.lse'.*float32"):
        attention_backward_tiled(q, k, v, o, do, AttentionSaved(saved.p, saved.lse.astype(np.float16)), 2, 2)
    with pytest.raises(MtemuError, match="'br'"):
        attention_backward_tiled(q, k, v, o, do, saved, 0, 2)
    with pytest.raises(MtemuError, match="'bc'"):
        attention_backward_tiled(q, k, v, o, do, saved, 2, True)
    with pytest.raises(MtemuError, match="'gs_staging'"):
        attention_backward_tiled(q, k, v, o, do, saved, 2, 2, gs_staging="bf16")
    with pytest.raises(MtemuError, match="'use_saved'"):
        attention_backward_ref(q, k, v, o, do, saved, use_saved="yes")

"""Tiny LLaMA-style model: exact gradients, checkpoint recovery, mixed precision; shipped text data."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ratrain.errors import ConfigError, RatrainError
from ratrain.replay.textdata import (
    ALPHABET,
    CORPUS_PATH,
    VOCAB_SIZE,
    BatchProvider,
    corpus_batches,
    corpus_sha256,
    decode,
    encode,
    load_corpus,
)
from ratrain.replay.tinymodel import (
    AdamConfig,
    TinyConfig,
    _rope,
    adam_update,
    init_params,
    layer_backward,
    layer_forward,
    make_view,
    microbatch_loss_and_grads,
    new_opt_state,
    recompute,
)

CHECK = TinyConfig(vocab=11, layers=2, hidden=8, heads=2, seq=5, dtype="float64")


def _perturbed_views(cfg, seed=1):
    # Larger-than-init weights so every path (softmax, SiLU, norms) is exercised non-linearly.
    rng = np.random.default_rng(seed)
    master = init_params(cfg, 0)
    for p in master:
        for k in p:
            p[k] = p[k] + 0.3 * rng.standard_normal(p[k].shape)
    return [make_view(m, cfg) for m in master], rng


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("save", ["full", "ckpt"])
def test_gradients_match_finite_differences_float64(save):
    views, rng = _perturbed_views(CHECK)
    tokens = rng.integers(0, CHECK.vocab, (2, CHECK.seq))
    targets = rng.integers(0, CHECK.vocab, (2, CHECK.seq))
    _, grads = microbatch_loss_and_grads(views, CHECK, tokens, targets, save=save)
    eps = 1e-6
    checked = 0
    for layer, view in enumerate(views):
        for name, p in view.items():
            flat = p.reshape(-1)
            picks = rng.choice(flat.size, size=min(5, flat.size), replace=False)
            if name == "embed":   # make sure rows that are actually used get checked
                picks = np.concatenate([picks, tokens[0, :2] * CHECK.hidden])
            for i in picks:
                old = flat[i]
                flat[i] = old + eps
                lp, _ = microbatch_loss_and_grads(views, CHECK, tokens, targets)
                flat[i] = old - eps
                lm, _ = microbatch_loss_and_grads(views, CHECK, tokens, targets)
                flat[i] = old
                num = (lp - lm) / (2 * eps)
                ana = grads[layer][name].reshape(-1)[i]
                assert abs(num - ana) <= 1e-6 * max(1.0, abs(num)), (layer, name, i, num, ana)
                checked += 1
    assert checked > 90
    # every parameter has a gradient of the right shape
    for layer, view in enumerate(views):
        assert set(grads[layer]) == set(view)
        for k in view:
            assert grads[layer][k].shape == view[k].shape


def test_checkpoint_recovery_is_bit_identical_float32():
    cfg = TinyConfig(vocab=VOCAB_SIZE, layers=3, hidden=16, heads=2, seq=8)
    views = [make_view(m, cfg) for m in init_params(cfg, 7)]
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab, (2, cfg.seq))
    targets = rng.integers(0, cfg.vocab, (2, cfg.seq))
    l_full, g_full = microbatch_loss_and_grads(views, cfg, tokens, targets, dloss=0.25, save="full")
    l_ckpt, g_ckpt = microbatch_loss_and_grads(views, cfg, tokens, targets, dloss=0.25, save="ckpt")
    assert l_full == l_ckpt
    for a, b in zip(g_full, g_ckpt, strict=False):
        for k in a:
            assert a[k].dtype == np.float32
            assert np.array_equal(a[k], b[k]), k
    # a checkpoint holds only the layer input; recompute restores exactly the saved internals
    h, full = layer_forward(views[0], cfg, 0, tokens, save="full")
    _, ckpt = layer_forward(views[0], cfg, 0, tokens, save="ckpt")
    assert not ckpt.full and ckpt.saved == {}
    rec = recompute(views[0], cfg, ckpt)
    assert rec.full and set(rec.saved) == set(full.saved)
    for k in full.saved:
        assert np.array_equal(rec.saved[k], full.saved[k])
    dx1, g1 = layer_backward(views[1], cfg, layer_forward(views[1], cfg, 1, h, save="ckpt")[1], np.ones_like(h))
    dx2, g2 = layer_backward(views[1], cfg, layer_forward(views[1], cfg, 1, h, save="full")[1], np.ones_like(h))
    assert np.array_equal(dx1, dx2)


def test_causal_mask_and_initial_loss():
    cfg = TinyConfig(vocab=VOCAB_SIZE, layers=2, hidden=16, heads=2, seq=8)
    views = [make_view(m, cfg) for m in init_params(cfg, 0)]
    tokens = np.arange(16).reshape(2, 8) % cfg.vocab
    y1, _ = layer_forward(views[0], cfg, 0, tokens)
    changed = tokens.copy()
    changed[:, 5] = 50
    y2, _ = layer_forward(views[0], cfg, 0, changed)
    assert np.array_equal(y1[:, :5], y2[:, :5])      # the future does not leak backwards
    assert not np.array_equal(y1[:, 5:], y2[:, 5:])
    # small init -> near-uniform prediction: loss ~ ln(vocab)
    loss, _ = microbatch_loss_and_grads(views, cfg, tokens, (tokens + 1) % cfg.vocab)
    assert abs(loss - math.log(cfg.vocab)) < 0.05


def test_rope_inverse_and_norm_preserving():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 6, 4))
    ang = rng.standard_normal((6, 2))
    cos, sin = np.cos(ang), np.sin(ang)
    y = _rope(x, cos, sin)
    assert np.allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))
    assert np.allclose(_rope(y, cos, sin, inverse=True), x)


def test_mixed_precision_views_and_fp32_master():
    cfg = TinyConfig(vocab=VOCAB_SIZE, layers=2, hidden=16, heads=2, seq=8)
    master = init_params(cfg, 0)
    assert all(v.dtype == np.float32 for p in master for v in p.values())
    view = make_view(master[0], cfg)
    for v in view.values():
        assert v.dtype == np.float32
        assert np.array_equal(v.astype(np.float16).astype(np.float32), v)   # fp16 values
    # An update far below fp16 resolution moves the FP32 master but not the FP16 view:
    # the reason the optimizer keeps FP32 masters.
    opt = AdamConfig(lr=1e-7)
    before = {k: v.copy() for k, v in master[0].items()}
    grads = {k: np.ones_like(v) for k, v in master[0].items()}
    adam_update(master[0], grads, new_opt_state(master[0]), opt)
    assert not np.array_equal(master[0]["wq"], before["wq"])
    assert np.array_equal(make_view(master[0], cfg)["attn_norm"], make_view(before, cfg)["attn_norm"])
    assert TinyConfig(dtype="float64").view_dtype == np.float64
    with pytest.raises(ConfigError, match="dtype"):
        TinyConfig(dtype="float16")
    with pytest.raises(ConfigError, match="heads"):
        TinyConfig(hidden=10, heads=4)


def test_adam_first_step_closed_form_and_exact_loss_scale():
    rng = np.random.default_rng(0)
    p0 = {"w": rng.standard_normal((4, 3)).astype(np.float32)}
    g = {"w": rng.standard_normal((4, 3)).astype(np.float32)}
    opt = AdamConfig(lr=0.01, eps=1e-8)
    p = {"w": p0["w"].copy()}
    st = new_opt_state(p)
    adam_update(p, g, st, opt)
    # first bias-corrected Adam step: lr * g / (|g| + eps)
    assert np.allclose(p["w"], p0["w"] - 0.01 * g["w"] / (np.abs(g["w"]) + 1e-8), rtol=0, atol=1e-7)
    assert st.t == 1
    # a power-of-two static loss scale is divided out exactly
    q = {"w": p0["w"].copy()}
    adam_update(q, {"w": g["w"] * 1024.0}, new_opt_state(q), AdamConfig(lr=0.01, eps=1e-8, loss_scale=1024.0))
    assert np.array_equal(p["w"], q["w"])


# ------------------------------------------------------------ text data

def test_shipped_corpus_is_the_documented_file():
    raw = CORPUS_PATH.read_bytes()
    assert 200_000 <= len(raw) <= 500_000
    assert corpus_sha256().startswith("dd2ce270")
    ids = load_corpus()
    assert ids.dtype == np.int32 and len(ids) == len(raw)
    assert ids.min() >= 0 and ids.max() < VOCAB_SIZE == 96
    assert decode(ids[:40]) == raw[:40].decode("ascii")


def test_tokenizer_roundtrip_and_errors():
    text = "def f(x):\n    return x ** 2  # ~"
    assert decode(encode(text)) == text
    assert encode("\n A~")[0] == 0 and ALPHABET[encode("A")[0]] == "A"
    with pytest.raises(RatrainError, match="offset 3"):
        encode("abc\u00e9")
    with pytest.raises(RatrainError, match="not found"):
        load_corpus("/nonexistent/corpus.txt")


def test_batches_are_addressed_deterministically():
    b = corpus_batches(seq=16, micro_batch_size=3, seed=5)
    t1, y1 = b(2, 1, 0)
    b(0, 0, 0)                                   # call order does not matter
    t2, y2 = corpus_batches(seq=16, micro_batch_size=3, seed=5)(2, 1, 0)
    assert np.array_equal(t1, t2) and np.array_equal(y1, y2)
    assert t1.shape == y1.shape == (3, 16)
    assert np.array_equal(t1[:, 1:], y1[:, :-1])   # targets are the next tokens
    assert not np.array_equal(b(2, 1, 1)[0], t1)
    assert not np.array_equal(b(2, 0, 0)[0], t1)
    assert not np.array_equal(corpus_batches(16, 3, seed=6)(2, 1, 0)[0], t1)
    with pytest.raises(ConfigError):
        BatchProvider(np.arange(5, dtype=np.int32), seq=16, micro_batch_size=1)

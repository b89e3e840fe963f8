"""Fig. 9 (sequence length): the definitions on hand-computed cases, the caption's shape checks on
made-up series, the shipped profiles the study needs, and one small run of the real study."""
import pytest

from ratrain.cost import profile
from ratrain.errors import ConfigError
from ratrain.repro import targets as paper
from ratrain.repro.experiment import DEFAULT_SETTINGS
from ratrain.repro.fig9 import (
    fig9_rows,
    figure,
    mac_utilization,
    sequence_macs,
    shape_checks,
    step_macs,
    training_steps,
    training_time_s,
)
from ratrain.spec.models import ModelSpec, Operator, get_model

TINY = ModelSpec(name="tiny-fig9", hidden=192, ffn=384, layers=2, heads=3, kv_heads=3, head_dim=64, vocab=384)


def test_forward_macs_by_hand():
    assert Operator("g", "gemm", m=2, k=3, n=4).useful_macs == 24
    # causal: 4 x 5 / 2 = 10 query-key pairs per head, QK^T and PV, 3 heads of 64
    causal = Operator("a", "attention", batch=1, heads=3, kv_heads=3, seq=4, head_dim=64, causal=True)
    assert causal.useful_macs == 2 * 3 * 10 * 64
    dense = Operator("a", "attention", batch=2, heads=3, kv_heads=1, seq=4, head_dim=64)
    assert dense.useful_macs == 2 * 2 * 3 * 16 * 64
    assert Operator("n", "elementwise", bytes_moved=100).useful_macs == 0


def test_sequence_macs_by_hand():
    # per layer at seq 4: q, k, v, o 4 x 192 x 192 each; gate, up, down 4 x 192 x 384 each; attention 3840
    gemms = 4 * (4 * 192 * 192) + 3 * (4 * 192 * 384)
    attention = 2 * 3 * 10 * 64
    head = 4 * 192 * 384
    total, attn = sequence_macs(TINY, 4)
    assert total == 3 * (2 * (gemms + attention) + head) == 9_755_136
    assert attn == 3 * 2 * attention
    assert step_macs(TINY, 4, 8) == 8 * total


def test_utilization_formula():
    # 4 clusters at 1e11 MAC/s for 2 s could do 8e11 MACs; 4e11 useful ones is 50 %
    assert mac_utilization(4e11, 2.0, 4, 1e11) == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="positive"):
        mac_utilization(1.0, 0.0, 4, 1e11)


def test_training_time_is_a_fixed_token_budget():
    budget, gb = DEFAULT_SETTINGS.fig9_token_budget, paper.FIG9_GLOBAL_BATCH
    # the default budget is whole steps at every length of the figure
    assert {n: training_steps(budget, gb, n) for n in paper.FIG9_SEQS} == {512: 480, 1024: 240, 2048: 120,
                                                                           3072: 80, 4096: 60}
    assert all(training_steps(budget, gb, n) * gb * n == budget for n in paper.FIG9_SEQS)
    # same tokens: a step 3.5x as long at 4x the length trains faster
    assert training_time_s(35.0, budget, gb, 2048) < training_time_s(10.0, budget, gb, 512)
    assert training_time_s(10.0, 1000, 10, 30) == 4 * 10.0      # 1000 / 300 -> 4 whole steps
    with pytest.raises(ConfigError, match="fig9_token_budget"):
        training_steps(0, gb, 512)


def _rows(util: dict[int, float], hours: dict[int, float], model: str) -> list[dict]:
    return [{"model": model, "seq": n, "mac_utilization": util[n], "train_time_s": hours[n] * 3600}
            for n in paper.FIG9_SEQS]


def test_shape_checks_accept_the_caption_and_refuse_the_opposite():
    seqs = paper.FIG9_SEQS
    caption_u = dict(zip(seqs, (0.40, 0.45, 0.50, 0.49, 0.48), strict=True))
    valley_t = dict(zip(seqs, (9.0, 8.0, 7.0, 7.5, 8.0), strict=True))
    assert all(c.ok for c in shape_checks(_rows(caption_u, valley_t, "qwen2.5-32b")))
    falling_u = dict(zip(seqs, (0.55, 0.52, 0.50, 0.40, 0.30), strict=True))
    rising_t = dict(zip(seqs, (5.0, 6.0, 7.0, 8.0, 9.0), strict=True))
    got = {c.name.split(": ", 1)[1]: c.ok for c in shape_checks(_rows(falling_u, rising_t, "qwen2.5-32b"))}
    assert got == {"utilization rises 512 -> 1024 -> 2048": False, "utilization at 3072, 4096 <= 2048": True,
                   "the dip is slight": False, "training time falls to 2048, then rises": False}
    best = [c for c in shape_checks(_rows(caption_u, rising_t, "llama2-7b")) if "best training time" in c.name]
    assert [(c.ours, c.ok) for c in best] == [(512, False)]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_figure_draws_missing_points_and_the_other_recovery(tmp_path):
    rows = _rows(dict(zip(paper.FIG9_SEQS, (0.4, 0.45, 0.5, 0.49, 0.48), strict=True)),
                 dict(zip(paper.FIG9_SEQS, (9.0, 8.0, 7.0, 7.5, 8.0), strict=True)), "qwen2.5-32b")
    for r in rows:
        r.update(config="P=8,D=32,Z=2,FSR", activation="fsr", alt_recovery="ddr", alt_train_time_s=3600.0,
                 alt_mac_utilization=0.5)
    rows[-1].update(config=None, train_time_s=None, mac_utilization=None, alt_mac_utilization=None)  # nothing fits
    path = tmp_path / "fig9.png"
    figure(rows, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_profile_the_study_needs_is_shipped_and_current():
    """A fresh checkout runs Fig. 9 without emulating: each (model, seq) has a current b=1, T=1 profile."""
    key = profile.platform_key(DEFAULT_SETTINGS.platform)
    version = profile.emulator_version()
    missing = []
    for name in paper.FIG9_MODELS:
        for seq in paper.FIG9_SEQS:
            path = profile.SHIPPED_DIR / profile._profile_name(get_model(name), 1, seq, 1, key)
            if profile._load_if_current(path, version, key) is None:
                missing.append(path.name)
    assert not missing, f"missing or stale shipped profiles {missing}: run scripts/ship_profiles.py"


def test_rows_follow_the_definitions():
    s = DEFAULT_SETTINGS
    rows = fig9_rows(s, models=("llama2-7b",), seqs=(512, 2048))
    peak = s.platform.peak_mac_per_s
    for r in rows:
        assert r["config"] and r["peak_gb"] <= s.platform.memory_budget_bytes / 2**30
        assert r["train_time_s"] == pytest.approx(r["steps"] * r["step_s"])
        macs = step_macs(get_model("llama2-7b"), r["seq"], paper.FIG9_GLOBAL_BATCH)
        assert r["mac_utilization"] == pytest.approx(macs / (r["step_s"] * paper.FIG9_CLUSTERS * peak))
        assert r["activation"] != "full" or r["recompute_fraction"] == 0
        # the step cannot use the MACs better than its kernels alone
        assert 0 < r["mac_utilization"] < r["kernel_mac_utilization"] < 1
    assert rows[0]["attention_mac_share"] < rows[1]["attention_mac_share"]

"""The straggler study (ratrain.repro.stragglers): the fit, its held-out predictions, and the spreads."""
import math

import pytest

from ratrain.errors import ConfigError
from ratrain.plan.time_to_train import expected_max_normal, sd_max_normal
from ratrain.repro.experiment import Settings
from ratrain.repro.stragglers import fit_cv, straggler_efficiency, straggler_rows, straggler_spread
from ratrain.spec.parallel import ParallelConfig


def _cfg(pp=8, dp=32, tp=1, accum=64):
    return ParallelConfig(pp=pp, dp=dp, tp=tp, zero=2, micro_batch=1, accum=accum, seq=2048, activation="fsr")


def test_max_normal_moments_hand_cases():
    # max of 2 standard normals: mean 1/sqrt(pi), variance 1 - 1/pi
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)
    assert sd_max_normal(2) == pytest.approx(math.sqrt(1 - 1 / math.pi), abs=1e-9)
    assert sd_max_normal(1) == pytest.approx(1.0, abs=1e-9)
    # the max concentrates as n grows
    assert sd_max_normal(1024) < sd_max_normal(256) < sd_max_normal(8) < 1.0


@pytest.mark.parametrize("eff0,g0,gn", [(1.0, 2.8, 3.25), (0.9997, 1.0, 2.0), (0.995, 0.5, 3.0)])
def test_fit_inverts_the_prediction(eff0, g0, gn):
    cv = fit_cv(eff0, 0.97, g0, gn)
    assert cv is not None and cv > 0
    assert straggler_efficiency(eff0, g0, gn, cv) == pytest.approx(0.97, abs=1e-12)


def test_fit_edge_cases():
    assert fit_cv(0.96, 0.97, 2.0, 3.0) == 0.0          # already below the target: no spread needed
    assert fit_cv(1.0, 0.97, 2.0, 2.0) is None          # the spread does not grow with N: nothing to fit
    with pytest.raises(ConfigError):
        fit_cv(0.0, 0.97, 2.0, 3.0)


def test_held_out_prediction_hand_case():
    # 'step' model from 256 to 1024 clusters, perfect scaling without stragglers: a hand-computed cv,
    # then the 512-cluster efficiency follows from E[max of N] alone
    m = {n: expected_max_normal(n) for n in (256, 512, 1024)}
    cv = (1 - 0.97) / (0.97 * m[1024] - m[256])
    assert fit_cv(1.0, 0.97, m[256], m[1024]) == pytest.approx(cv, rel=1e-12)
    eff512 = (1 + cv * m[256]) / (1 + cv * m[512])
    assert straggler_efficiency(1.0, m[256], m[512], cv) == pytest.approx(eff512, rel=1e-12)
    # max-of-N is concave in N: the 512 loss is more than a third of the 1024 loss (paper: exactly a third)
    assert (1 - eff512) / 0.03 > 0.45


def test_spreads():
    # 'step': the slowest of all P*D*T clusters
    assert straggler_spread("step", _cfg(pp=8, dp=32)) == pytest.approx(expected_max_normal(256))
    # 'slot': stage waits over P*T, replicas' wait averaged over A slots
    g = straggler_spread("slot", _cfg(pp=2, dp=128, tp=2, accum=16))
    assert g == pytest.approx(expected_max_normal(4) + sd_max_normal(4) * expected_max_normal(128) / 4)
    # more micro-batches average the replicas' noise out
    assert straggler_spread("slot", _cfg(accum=256)) < straggler_spread("slot", _cfg(accum=16))
    with pytest.raises(ConfigError):
        straggler_spread("gamma", _cfg())


@pytest.mark.slow
def test_study_fits_the_largest_count_on_the_roofline_profile():
    rows, t2, fits = straggler_rows(Settings(profile_source="roofline"))
    step = [r for r in rows if r["model"] == "step"]
    assert fits["step"]["cv"] > 0
    assert step[-1]["efficiency"] == pytest.approx(0.97, abs=1e-9)
    # every Table 2 layout runs on 256 clusters: the 'step' model leaves the slowdowns where they were
    for r in t2:
        if r["model"] == "step":
            assert r["slowdown"] == pytest.approx(r["slowdown_without"], rel=1e-12)

"""Cost terms (ratrain.cost.terms) from a profile, and the analytic step time (ratrain.plan.estimator)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from ratrain.cost.terms import (
    ADAM_BYTES_PER_PARAM,
    LayerKind,
    all_gather_ms,
    allreduce_ms,
    cost_terms,
    p2p_ms,
    pipeline_costs,
    reduce_scatter_ms,
)
from ratrain.errors import ConfigError
from ratrain.plan.estimator import step_breakdown
from ratrain.sim.simulator import Mechanisms, simulate
from ratrain.spec.models import embedding_parameter_count, get_model, layer_tp_parameter_count
from ratrain.spec.parallel import ParallelConfig, partition_model
from ratrain.spec.platform import TrainingPlatform

PLAT = TrainingPlatform()


@dataclass(frozen=True)
class FakeProfile:
    """Hand-set profile (seconds) so every expected cost is a closed form."""
    forward_s: float = 0.100
    backward_s: float = 0.200
    first_forward_s: float = 0.002
    first_backward_s: float = 0.004
    last_forward_s: float = 0.050
    last_backward_s: float = 0.100

    def ddr_rate(self, term: str) -> float:
        """Every bandwidth-bound term at 30 GB/s, so the closed forms below read plainly."""
        return 30e9


def roofline(model, b, seq, tp):
    try:
        from ratrain.cost.profile import layer_profile
    except ImportError:                                  # pragma: no cover
        pytest.skip("ratrain.cost.profile not available")
    return layer_profile(model, b, seq, tp, source="roofline")


# ---------------------------------------------------------------- collectives

def test_collectives_closed_forms():
    nbytes = 37e6
    assert allreduce_ms(nbytes, 1, PLAT) == 0.0 and reduce_scatter_ms(nbytes, 1, PLAT) == 0.0
    # ring over 2: one exchange of half the data each way, two steps
    assert allreduce_ms(nbytes, 2, PLAT) == pytest.approx(1e3 * (nbytes / 3.7e9 + 2 * 20e-6))
    assert reduce_scatter_ms(nbytes, 4, PLAT) == pytest.approx(1e3 * (0.75 * nbytes / 3.7e9 + 3 * 20e-6))
    assert all_gather_ms(nbytes, 4, PLAT) == reduce_scatter_ms(nbytes, 4, PLAT)
    assert p2p_ms(nbytes, PLAT) == pytest.approx(1e3 * (nbytes / 3.7e9 + 20e-6))


# ---------------------------------------------------------------- per-layer costs

def test_pipeline_costs_terms_zero2():
    m = get_model("llama2-7b")
    cfg = ParallelConfig(pp=4, dp=8, zero=2, accum=8)
    costs = pipeline_costs(m, cfg, FakeProfile(), PLAT)
    parts = partition_model(m, 4)
    assert [len(s) for s in costs.stages] == [len(r) for r in parts]
    assert costs.microbatches == 8 and costs.dp == 8
    assert (costs.recovery_resource, costs.update_resource, costs.prefetch_resource) == ("compute", "ddr", "link")
    mid = costs.stages[1][0]
    lp = layer_tp_parameter_count(m, 1)
    assert mid.forward_ms == pytest.approx(100.0) and mid.backward_ms == pytest.approx(200.0)
    assert mid.recompute_ms == pytest.approx(100.0)
    # GradSync: the gradients' reduce-scatter only; PrefetchW: the updated shards' all-gather on the
    # link (the DDR write of the gathered weights streams under it)
    assert mid.gradsync_ms == pytest.approx(reduce_scatter_ms(2 * lp, 8, PLAT))
    assert ADAM_BYTES_PER_PARAM == 28    # FP32 master, m, v read + written; FP16 grad read; FP16 weight written
    assert mid.update_ms == pytest.approx(1e3 * math.ceil(lp / 8) * 28 / 30e9)
    assert mid.prefetch_ms == pytest.approx(all_gather_ms(2 * lp, 8, PLAT))
    assert all_gather_ms(2 * lp, 8, PLAT) > 1e3 * 2 * lp / 30e9
    first, last = costs.stages[0][0], costs.stages[-1][-1]
    assert first.forward_ms == pytest.approx(102.0) and first.backward_ms == pytest.approx(204.0)
    assert last.forward_ms == pytest.approx(150.0) and last.backward_ms == pytest.approx(300.0)
    assert first.recompute_ms == last.recompute_ms == pytest.approx(100.0)   # embedding/head not recomputed
    assert first.gradsync_ms > mid.gradsync_ms                              # embedding gradients too
    assert costs.transfer_ms == pytest.approx(p2p_ms(2048 * 4096 * 2, PLAT))


def test_no_data_parallel_means_no_sync_or_gather():
    m = get_model("llama2-7b")
    layer = pipeline_costs(m, ParallelConfig(pp=2, dp=1, zero=2, accum=4), FakeProfile(), PLAT).stages[0][1]
    assert layer.gradsync_ms == 0.0 and layer.prefetch_ms == 0.0
    lp = layer_tp_parameter_count(m, 1)
    assert layer.update_ms == pytest.approx(1e3 * lp * ADAM_BYTES_PER_PARAM / 30e9)


def test_zero_stages():
    m = get_model("llama2-13b")
    lp = layer_tp_parameter_count(m, 1)
    k0 = cost_terms(m, ParallelConfig(pp=2, dp=4, zero=0), FakeProfile(), PLAT).mid
    assert k0.gradsync == pytest.approx(allreduce_ms(2 * lp, 4, PLAT))
    assert k0.update == pytest.approx(1e3 * lp * ADAM_BYTES_PER_PARAM / 30e9) and k0.prefetch == 0.0
    k1 = cost_terms(m, ParallelConfig(pp=2, dp=4, zero=1), FakeProfile(), PLAT).mid
    assert k1.gradsync == pytest.approx(allreduce_ms(2 * lp, 4, PLAT))
    assert k1.prefetch == pytest.approx(all_gather_ms(2 * lp, 4, PLAT))
    # ZeRO-3, layer-wise: per-use gathers overlap compute (max), no PrefetchW; the gather's link time
    # also holds GradSync's link
    g = all_gather_ms(2 * lp, 4, PLAT)
    k3 = cost_terms(m, ParallelConfig(pp=2, dp=4, zero=3, activation="fsr"), FakeProfile(), PLAT).mid
    assert k3.forward == pytest.approx(max(100.0, g)) and k3.backward == pytest.approx(max(200.0, g))
    assert k3.recompute == pytest.approx(max(100.0, g)) and k3.prefetch == 0.0
    assert k3.gradsync == pytest.approx(reduce_scatter_ms(2 * lp, 4, PLAT) + g)
    k3c = cost_terms(m, ParallelConfig(pp=2, dp=4, zero=3, activation="ckpt"), FakeProfile(), PLAT).mid
    assert k3c.backward + k3c.recompute == pytest.approx(max(300.0, g))
    # ZeRO-3 with bulk prefetch: no per-use gathers, one all-gather per step like Z=2
    k3b = cost_terms(m, ParallelConfig(pp=2, dp=4, zero=3, prefetch="bulk"), FakeProfile(), PLAT).mid
    assert k3b.forward == pytest.approx(100.0) and k3b.prefetch == pytest.approx(g)
    assert k3b.gradsync == pytest.approx(reduce_scatter_ms(2 * lp, 4, PLAT))


def test_tensor_parallel_adds_link_comm():
    m = get_model("llama2-13b")
    prof = roofline(m, 1, 2048, 2)
    k = cost_terms(m, ParallelConfig(pp=2, dp=4, tp=2), prof, PLAT)
    ar = allreduce_ms(2048 * 5120 * 2, 2, PLAT)
    assert ar > 0
    assert k.mid.forward == pytest.approx(1e3 * prof.forward_s + 2 * ar)
    assert k.mid.backward == pytest.approx(1e3 * prof.backward_s + 2 * ar)
    k1 = cost_terms(m, ParallelConfig(pp=2, dp=4, tp=1), roofline(m, 1, 2048, 1), PLAT)
    assert k1.mid.forward == pytest.approx(1e3 * roofline(m, 1, 2048, 1).forward_s)


def test_full_activation_has_no_recompute():
    m = get_model("llama2-7b")
    costs = pipeline_costs(m, ParallelConfig(pp=2, dp=2, activation="full", accum=2), FakeProfile(), PLAT)
    assert all(layer_index.recompute_ms == 0.0 for s in costs.stages for layer_index in s)
    assert costs.stages[0][0].act_full_bytes > costs.stages[0][0].act_ckpt_bytes > 0


# ---------------------------------------------------------------- analytic step time

def _uniform(P, n, F, B, R=0.0, G=0.0, U=0.0, W=0.0):
    k = LayerKind(F / n, B / n, R / n, G / n, U / n, W / n)
    return [[k] * n for _ in range(P)]


@pytest.mark.parametrize("P,A", [(1, 4), (4, 8), (4, 2), (8, 16)])
def test_step_breakdown_uniform_closed_forms(P, A):
    F, B, R = 3.0, 6.0, 3.0
    full = step_breakdown(_uniform(P, 2, F, B, R), 0.0, A, activation="full")
    assert full.step_ms == pytest.approx((A + P - 1) * (F + B))
    ckpt = step_breakdown(_uniform(P, 2, F, B, R), 0.0, A, activation="ckpt")
    assert ckpt.step_ms == pytest.approx((A + P - 1) * (F + B + R))
    assert ckpt.e_rec_ms == pytest.approx((A + P - 1) * R)
    # compute-resident FSR: only the pipeline bubbles hide recovery; the last stage exposes it
    fsr = step_breakdown(_uniform(P, 2, F, B, R), 0.0, A, activation="fsr", fsr_buffer_layers=None)
    assert fsr.step_ms == pytest.approx(P * (F + B) + R + (A - 1) * (F + B + R))
    assert full.step_ms <= fsr.step_ms <= ckpt.step_ms
    # Eq. 6's single recovery buffer (the default): of each stage's two layers only the first in
    # backward order is recovered in the bubble, the other (R / 2) waits for its slot on the path
    single = step_breakdown(_uniform(P, 2, F, B, R), 0.0, A, activation="fsr")
    assert single.step_ms == pytest.approx(P * (F + B) + R + (P - 1) * R / 2 + (A - 1) * (F + B + R))
    double = step_breakdown(_uniform(P, 2, F, B, R), 0.0, A, activation="fsr", fsr_buffer_layers=2)
    assert double.step_ms == pytest.approx(fsr.step_ms)


def test_step_breakdown_sums_eq12_and_bulk_tail():
    kinds = _uniform(4, 4, 4.0, 8.0, 4.0, G=2.0, U=1.0, W=1.0)
    for lw, up in ((True, True), (True, False), (False, False)):
        bd = step_breakdown(kinds, 0.1, 8, activation="fsr", layerwise=lw, update_prefetch=up)
        assert bd.step_ms == pytest.approx(bd.t_1f1b_ms + bd.e_comm_ms + bd.e_upd_ms + bd.e_pref_ms + bd.e_rec_ms)
        assert min(bd.e_comm_ms, bd.e_upd_ms, bd.e_pref_ms, bd.e_rec_ms) >= 0
    tails = [step_breakdown(kinds, 0.1, 8, layerwise=lw, update_prefetch=up).exposed_tail_ms
             for lw, up in ((True, True), (True, False), (False, False))]
    assert tails[0] < tails[1] < tails[2]
    # per-layer G/U/W keep up with the per-layer backward: exposed tail (G+U+W)/L, G/L+U+W, G+U+W
    assert tails == pytest.approx([1.0, 0.5 + 2.0, 4.0], abs=0.11)


CHECKS = [
    ("llama2-7b", ParallelConfig(pp=4, dp=8, accum=8, activation="fsr"), Mechanisms()),
    ("llama2-7b", ParallelConfig(pp=4, dp=8, accum=8, activation="ckpt"), Mechanisms.all_off()),
    ("llama2-13b", ParallelConfig(pp=2, dp=64, tp=2, accum=8, activation="fsr"), Mechanisms()),
    ("llama2-13b", ParallelConfig(pp=2, dp=128, zero=3, accum=8, activation="ckpt"), Mechanisms(activation="ckpt")),
    ("qwen2.5-32b", ParallelConfig(pp=8, dp=32, accum=8, activation="fsr"), Mechanisms()),
    ("qwen2.5-32b", ParallelConfig(pp=8, dp=32, accum=8, activation="fsr", prefetch="bulk"),
     Mechanisms(update_prefetch=False)),
    # PrefetchW = the updated shards' all-gather on the link, for every ablation mode
    ("qwen2.5-32b", ParallelConfig(pp=8, dp=32, zero=2, accum=8, activation="fsr"), Mechanisms.variant("no-layerwise")),
    ("baichuan2-13b", ParallelConfig(pp=4, dp=8, zero=1, accum=8, activation="fsr"), Mechanisms()),
    # short sequences: GradSync + all-gather outrun the backward, the port falls behind (EDF)
    ("llama2-13b", ParallelConfig(pp=4, dp=8, zero=1, seq=512, accum=8, activation="fsr"), Mechanisms()),
    ("llama2-13b", ParallelConfig(pp=4, dp=8, zero=2, seq=512, accum=8, activation="fsr"),
     Mechanisms(update_prefetch=False)),
    # Z=3 bulk: the stage's gather is PrefetchW's; Adam outruns the backward on DDR (EDF there)
    ("qwen2.5-32b", ParallelConfig(pp=1, dp=2, tp=2, zero=3, seq=512, accum=16, activation="fsr", prefetch="bulk"),
     Mechanisms()),
]


def _ablation_tails(model, cfg, prof, rec="compute"):
    from ratrain.cost.terms import stage_kinds
    terms = cost_terms(model, cfg, prof, PLAT)
    kinds = stage_kinds(terms, partition_model(model, cfg.pp))
    costs = pipeline_costs(model, cfg, prof, PLAT, recovery_resource=rec)
    out = {}
    for v in ("full", "no-update-prefetch", "no-layerwise"):
        mech = Mechanisms.variant(v)
        bd = step_breakdown(kinds, terms.transfer, cfg.accum, layerwise=mech.layerwise,
                            update_prefetch=mech.update_prefetch, recovery_resource=rec)
        sim = simulate(costs, mechanisms=mech)
        assert bd.exposed_tail_ms == pytest.approx(sim.exposed_tail_ms, rel=1e-9), v
        assert abs(bd.step_ms / sim.step_time_ms - 1) < 0.03, v
        out[v] = sim
    return costs, out


@pytest.mark.parametrize("rec", ["compute", "ddr"])
def test_ablation_tails_with_link_prefetch_closed_forms(rec):
    """The paper's ablation layout (Qwen P=8, D=32, Z=2; A=8 here). The backward per layer (600 ms)
    outlasts GradSync + UpdateShard + all-gather (526 ms), so every chain keeps up and the tail is
    stage 0's: layer 0's chain (deadline-aware), G(0) + all updates + all gathers (bulk update
    phase), everything (bulk step end)."""
    m = get_model("qwen2.5-32b")
    prof = FakeProfile(forward_s=0.3, backward_s=0.6)
    cfg = ParallelConfig(pp=8, dp=32, zero=2, accum=8, activation="fsr")
    costs, sims = _ablation_tails(m, cfg, prof, rec)
    s0 = costs.stages[0]
    assert costs.prefetch_resource == "link" and s0[1].prefetch_ms == pytest.approx(s0[1].gradsync_ms)
    chain = [layer_index.gradsync_ms + layer_index.update_ms + layer_index.prefetch_ms for layer_index in s0]
    assert s0[1].backward_ms > chain[1]
    assert sims["full"].exposed_tail_ms == pytest.approx(chain[0])
    assert sims["no-update-prefetch"].exposed_tail_ms == pytest.approx(
        s0[0].gradsync_ms + sum(layer_index.update_ms + layer_index.prefetch_ms for layer_index in s0))
    assert sims["no-layerwise"].exposed_tail_ms == pytest.approx(sum(chain))
    # the main path is the same in all three: step differences are the tails
    base = sims["full"].last_backward_end_ms
    assert all(s.last_backward_end_ms == pytest.approx(base) for s in sims.values())


def test_step_breakdown_link_prefetch_closed_forms():
    """Per layer g = 0.3, w = 0.4 against a 0.5 backward: on the link the port falls behind and the
    estimate follows the simulator's earliest-deadline-first order exactly (zero transfer)."""
    from ratrain.cost.tasks import PipelineCosts
    kinds = _uniform(3, 4, 1.0, 2.0, G=1.2, W=1.6)
    want = {("link", True, True): 0.9, ("ddr", True, True): 0.7, ("link", True, False): 1.9,
            ("ddr", True, False): 1.9, ("link", False, False): 2.8, ("ddr", False, False): 2.8}
    for (res, lw, up), tail in want.items():
        bd = step_breakdown(kinds, 0.0, 6, activation="full", layerwise=lw, update_prefetch=up,
                            prefetch_resource=res)
        sim = simulate(PipelineCosts.uniform(3, 6, t_forward=1.0, t_backward=2.0, t_gradsync=1.2, t_prefetch=1.6,
                                             layers_per_stage=4, prefetch_resource=res),
                       mechanisms=Mechanisms(activation="full", layerwise=lw, update_prefetch=up))
        assert bd.exposed_tail_ms == pytest.approx(tail), (res, lw, up)
        assert bd.step_ms == pytest.approx(sim.step_time_ms), (res, lw, up)
        assert bd.step_ms == pytest.approx(bd.t_1f1b_ms + bd.e_comm_ms + bd.e_upd_ms + bd.e_pref_ms + bd.e_rec_ms)
    with pytest.raises(ConfigError, match="prefetch_resource"):
        step_breakdown(kinds, 0.0, 6, prefetch_resource="compute")


@pytest.mark.parametrize("name,cfg,mech", CHECKS)
def test_analytic_estimate_within_3pct_of_simulator(name, cfg, mech):
    from ratrain.cost.terms import stage_kinds
    m = get_model(name)
    prof = roofline(m, cfg.micro_batch, cfg.seq, cfg.tp)
    terms = cost_terms(m, cfg, prof, PLAT)
    bd = step_breakdown(stage_kinds(terms, partition_model(m, cfg.pp)), terms.transfer, cfg.accum,
                        activation=mech.activation, layerwise=mech.layerwise,
                        update_prefetch=mech.update_prefetch, fsr=mech.fsr)
    sim = simulate(pipeline_costs(m, cfg, prof, PLAT), mechanisms=mech)
    assert abs(bd.step_ms / sim.step_time_ms - 1) < 0.03
    assert bd.exposed_tail_ms == pytest.approx(sim.exposed_tail_ms, rel=0.05, abs=1.0)


def test_more_link_bandwidth_never_slows_a_config():
    from ratrain.cost.terms import stage_kinds
    for name, cfg, mech in CHECKS:
        m = get_model(name)
        prof = roofline(m, cfg.micro_batch, cfg.seq, cfg.tp)
        steps = []
        for bw in (1.85e9, 3.7e9, 7.4e9, 37e9):
            plat = PLAT.with_overrides(link_bandwidth=bw)
            terms = cost_terms(m, cfg, prof, plat)
            steps.append(step_breakdown(stage_kinds(terms, partition_model(m, cfg.pp)), terms.transfer,
                                        cfg.accum, activation=mech.activation, layerwise=mech.layerwise,
                                        update_prefetch=mech.update_prefetch, fsr=mech.fsr).step_ms)
        assert steps == sorted(steps, reverse=True), (name, cfg.describe(), steps)


def test_embedding_sync_counts_embedding_parameters():
    m = get_model("llama2-7b")
    t = cost_terms(m, ParallelConfig(pp=2, dp=8, zero=2), FakeProfile(), PLAT)
    emb = embedding_parameter_count(m)
    nbytes = 2 * (layer_tp_parameter_count(m) + emb)
    assert t.first.gradsync == pytest.approx(reduce_scatter_ms(nbytes, 8, PLAT))
    assert t.first.prefetch == pytest.approx(all_gather_ms(nbytes, 8, PLAT))


@pytest.mark.parametrize("name,cfg", [
    ("llama2-13b", ParallelConfig(pp=2, dp=128, accum=8, activation="fsr")),
    ("llama2-7b", ParallelConfig(pp=16, dp=1, tp=4, micro_batch=8, accum=16, activation="fsr")),
])
def test_ddr_resident_recovery_estimate(name, cfg):
    """What-if: recovery that overlaps compute (on DDR) into a double buffer (one layer consumed by
    its backward while the next is recovered). The last stage can only overlap a layer's recovery
    with the forwards of the layers after it, so at least its last layer is exposed. With the
    default single buffer most recovery waits on the backward path and DDR gains far less."""
    from ratrain.cost.terms import stage_kinds
    m = get_model(name)
    prof = roofline(m, cfg.micro_batch, cfg.seq, cfg.tp)
    terms = cost_terms(m, cfg, prof, PLAT)
    kinds = stage_kinds(terms, partition_model(m, cfg.pp))
    ddr = step_breakdown(kinds, terms.transfer, cfg.accum, recovery_resource="ddr", fsr_buffer_layers=2)
    comp = step_breakdown(kinds, terms.transfer, cfg.accum, recovery_resource="compute", fsr_buffer_layers=2)
    single = step_breakdown(kinds, terms.transfer, cfg.accum, recovery_resource="ddr")
    assert ddr.step_ms < single.step_ms and ddr.step_ms < comp.step_ms and ddr.e_rec_ms > 0
    for cap, est in ((2, ddr), (1, single)):
        sim = simulate(pipeline_costs(m, cfg, prof, PLAT, recovery_resource="ddr"),
                       mechanisms=Mechanisms(fsr_buffer_layers=cap))
        assert abs(est.step_ms / sim.step_time_ms - 1) < 0.03, cap


@pytest.mark.parametrize("P,A", [(2, 4), (3, 6), (4, 2), (4, 8)])
def test_uniform_pipelines_match_the_simulator(P, A):
    """Zero transfer: the estimate equals the simulator exactly; with transfers it is conservative by
    at most 2X per extra micro-batch (the gradient's round trip it charges to every slot)."""
    from ratrain.cost.tasks import PipelineCosts
    k = LayerKind(0.5, 1.0, 0.5, 0.0, 0.0, 0.0)
    kinds = [[k, k] for _ in range(P)]
    for X in (0.0, 0.5):
        pc = PipelineCosts.uniform(P, A, t_forward=1, t_backward=2, t_transfer=X, t_recompute=1, layers_per_stage=2)
        for act in (("full", "ckpt", "fsr") if X == 0 else ("full", "ckpt")):
            est = step_breakdown(kinds, X, A, activation=act).step_ms
            sim = simulate(pc, mechanisms=Mechanisms(activation=act)).step_time_ms
            if X == 0:
                assert est == pytest.approx(sim), (act, est, sim)
            else:
                assert sim - 1e-9 <= est <= sim + 2 * X * (A - 1) + 1e-9, (act, est, sim)

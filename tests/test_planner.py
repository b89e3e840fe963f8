"""Planner (ratrain.plan.planner, Algorithm 2) and `ratrain plan`."""
from __future__ import annotations

import gc
import json
import random

import pytest

from ratrain.errors import ConfigError
from ratrain.plan.planner import METHODS, Planner, mechanisms_for, search_space, simulate_config
from ratrain.spec.memory import DEFAULT_CONSTANTS, PeakMemory, max_peak, stage_memory
from ratrain.spec.models import get_model
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import TrainingPlatform

BUDGET = TrainingPlatform().memory_budget_bytes


def roofline_fn(calls=None):
    from ratrain.cost.profile import layer_profile

    def fn(model, b, seq, tp, *, source):
        assert source == "roofline"
        if calls is not None:
            calls.append((b, seq, tp))
        return layer_profile(model, b, seq, tp, source="roofline")
    return fn


def planner(name, **kw):
    return Planner(get_model(name), profile_source="roofline", profile_fn=roofline_fn(), **kw)


def test_fast_memory_model_equals_stage_memory():
    rng = random.Random(3)
    for name, n, g in (("llama2-7b", 64, 256), ("llama2-70b", 96, 32), ("qwen2.5-32b", 256, 512),
                       ("baichuan2-13b", 32, 128)):
        m = get_model(name)
        mm = PeakMemory(m, "balanced", DEFAULT_CONSTANTS)
        space = list(search_space(m, n, g))
        for p, d, t, z, b, a, act, pref in rng.sample(space, 40):
            cfg = ParallelConfig(pp=p, dp=d, tp=t, zero=z, micro_batch=b, accum=a, activation=act, prefetch=pref)
            assert mm.peak(p, d, t, z, b, a, 2048, act, pref) == max_peak(stage_memory(m, cfg)), cfg


def test_infeasible_grid_is_pruned_before_any_timing():
    calls = []
    pl = Planner(get_model("llama2-70b"), profile_source="roofline", profile_fn=roofline_fn(calls))
    pl.estimate = lambda *a, **k: pytest.fail("estimate called for a pruned configuration")
    r = pl.plan(4, 32)                      # 70B on 4 clusters: nothing fits 20 GB
    assert r.enumerated > 0 and r.pruned_by_memory == r.enumerated and r.timed == 0
    assert r.best is None and r.ranked == [] and calls == []
    assert r.to_json()["oom"] is True


def test_only_feasible_configs_are_timed_and_profiled():
    calls = []
    pl = Planner(get_model("llama2-7b"), profile_source="roofline", profile_fn=roofline_fn(calls))
    r = pl.plan(8, 64, top=50)
    feasible = []
    for p, d, t, z, b, a, act, pref in search_space(pl.model, 8, 64):
        cfg = ParallelConfig(pp=p, dp=d, tp=t, zero=z, micro_batch=b, accum=a, activation=act, prefetch=pref)
        if max_peak(stage_memory(pl.model, cfg)) <= BUDGET:
            feasible.append(cfg)
    assert 0 < r.timed < r.enumerated and r.timed + r.pruned_by_memory == r.enumerated
    assert r.timed == len(feasible)
    assert len(calls) == len(set(calls))                 # one profile per (b, seq, T)
    assert set(calls) == {(c.micro_batch, c.seq, c.tp) for c in feasible}
    # the scalar loop (other schedules, MoE, CP) estimates exactly the feasible candidates too
    seen = []
    real = Planner.bounded

    def checked(self, cfg, method="ratrain", source=None, *schedule):
        seen.append(cfg)
        return real(self, cfg, method, source, *schedule)
    scalar = Planner(get_model("llama2-7b"), profile_source="roofline", profile_fn=roofline_fn())
    scalar._vectorisable = lambda choices: False
    scalar.bounded = checked.__get__(scalar)
    assert scalar.plan(8, 64, top=50).timed == len(seen) == len(feasible)
    assert {c.describe() + str((c.micro_batch, c.zero, c.activation, c.prefetch)) for c in seen} == \
        {c.describe() + str((c.micro_batch, c.zero, c.activation, c.prefetch)) for c in feasible}


def _every_candidate_ranked(pl: Planner, clusters: int, global_batch: int, method: str, top: int):
    """The reference search: every memory-feasible configuration estimated in full, one at a time."""
    rows = []
    for c in search_space(pl.model, clusters, global_batch, method):
        p, d, t, z, b, a, act, pref = c
        peak = max_peak(stage_memory(pl.model, ParallelConfig(pp=p, dp=d, tp=t, zero=z, micro_batch=b, accum=a,
                                                              activation=act, prefetch=pref)))
        if peak > BUDGET:
            continue
        cfg = ParallelConfig(pp=p, dp=d, tp=t, zero=z, micro_batch=b, accum=a, seq=2048, activation=act,
                             prefetch=pref, partition=pl.partition)
        bd = pl.estimate(cfg, method)
        rows.append((bd.step_ms, peak, c, cfg, bd))
    rows.sort(key=lambda x: x[:3])
    return rows[:top], len(rows)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("name, clusters, global_batch, method, top", [
    ("llama2-7b", 8, 512, "ratrain", 10), ("baichuan2-13b", 16, 256, "ratrain", 10),
    ("llama2-70b", 96, 32, "ratrain", 10), ("llama2-7b", 64, 256, "tuned", 3), ("qwen2.5-32b", 64, 512, "ratrain", 1),
    ("llama2-13b", 32, 128, "zero3-heavy", 25)])
def test_the_bounded_search_ranks_as_estimating_every_candidate(name, clusters, global_batch, method, top):
    """The planner runs the lifecycle chains only for candidates whose main path (a lower bound of the
    step) can still enter the top; its ranking equals the reference's, every number bit for bit."""
    pl = planner(name)
    want, feasible = _every_candidate_ranked(pl, clusters, global_batch, method, top)
    got = planner(name).plan(clusters, global_batch, method=method, top=top)
    assert got.timed == feasible
    assert [(c.config, c.step_ms, c.peak_bytes, c.breakdown) for c in got.ranked] == \
        [(cfg, step, peak, bd) for step, peak, _, cfg, bd in want]
    for step, _, _, cfg, bd in want:
        bound, finish = pl.bounded(cfg, method)
        assert bound <= step and finish() == bd


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("name, clusters, global_batch, top", [("llama2-7b", 8, 8, 10), ("llama2-13b", 16, 64, 4)])
def test_the_bounded_search_over_schedules_ranks_as_estimating_every_candidate(name, clusters, global_batch, top):
    from ratrain.plan.schedule_search import check_schedules, runnable
    pl = planner(name)
    names = ("1f1b", "gpipe", "interleaved", "zb-h1")
    choices = check_schedules(names)
    rows = []
    for c in search_space(pl.model, clusters, global_batch):
        p, d, t, z, b, a, act, pref = c
        cfg = ParallelConfig(pp=p, dp=d, tp=t, zero=z, micro_batch=b, accum=a, seq=2048, activation=act,
                             prefetch=pref, partition=pl.partition)
        for si, choice in enumerate(choices):
            if choice.name != "1f1b" and (p == 1 or not runnable(choice, pl.model.layers, p, a)):
                continue
            peak = pl.schedule_peak(cfg, choice)
            if peak <= BUDGET:
                rows.append((pl.estimate(cfg, schedule=choice), peak, c, si, cfg))
    rows.sort(key=lambda x: (x[0].step_ms, *x[1:4]))
    got = planner(name).plan(clusters, global_batch, top=top, schedules=names, confirm=0)
    assert got.timed == len(rows)
    assert [(c.config, c.schedule, c.breakdown) for c in got.ranked] == \
        [(cfg, choices[si], bd) for bd, _, _, si, cfg in rows[:top]]


def test_returned_configs_fit_and_are_ranked():
    r = planner("llama2-13b").plan(64, 256, top=20)
    assert r.best is r.ranked[0]
    steps = [c.step_ms for c in r.ranked]
    assert steps == sorted(steps)
    for c in r.ranked:
        cfg = c.config
        assert cfg.pp * cfg.dp * cfg.tp == 64 and cfg.dp * cfg.micro_batch * cfg.accum == 256
        assert c.peak_bytes == max_peak(stage_memory(get_model("llama2-13b"), cfg)) <= BUDGET
        assert c.stages is not None and len(c.stages) == cfg.pp
        bd = c.breakdown
        assert c.step_ms == pytest.approx(bd.t_1f1b_ms + bd.e_comm_ms + bd.e_upd_ms + bd.e_pref_ms + bd.e_rec_ms)
    payload = r.to_json()
    assert payload["counts"] == {"enumerated": r.enumerated, "pruned_by_memory": r.pruned_by_memory,
                                 "timed": r.timed}
    assert payload["best"]["memory"][0]["peak_bytes"] > 0


def test_baselines_have_their_structure():
    pl = planner("llama2-13b")
    for method, check in (("tp-heavy", lambda c: c.tp == 2), ("zero3-heavy", lambda c: c.zero == 3),
                          ("backward-ckpt", lambda c: c.activation == "ckpt"),
                          ("tuned", lambda c: c.activation in ("full", "ckpt"))):
        r = pl.plan(64, 256, method=method, top=5)
        assert r.ranked and all(check(c.config) for c in r.ranked), method
    # full-save for 13B at P=2, D=128 (Table 2's layout) does not fit
    c = pl.evaluate(ParallelConfig(pp=2, dp=128, accum=32, activation="full"), "full-save")
    assert c.peak_bytes > BUDGET and c.step_ms == float("inf")
    assert c.to_json()["oom"] is True and c.to_json()["step_s"] is None
    with pytest.raises(ConfigError, match="recovery_resource"):
        Planner(get_model("llama2-13b"), recovery_resource="gpu")
    # the same layout with FSR fits, and is faster than backward checkpointing: the pipeline
    # bubbles hide recovery that ckpt puts on every backward
    fsr = pl.evaluate(ParallelConfig(pp=2, dp=128, accum=32, activation="fsr"))
    ckpt = pl.evaluate(ParallelConfig(pp=2, dp=128, accum=32, activation="ckpt"), "backward-ckpt")
    assert fsr.peak_bytes <= BUDGET and fsr.step_ms < ckpt.step_ms
    # mechanisms off never helps the same configuration
    cfg = ParallelConfig(pp=4, dp=16, accum=8, activation="ckpt")
    assert pl.estimate(cfg, "tuned").step_ms >= pl.estimate(cfg, "backward-ckpt").step_ms
    assert pl.estimate(cfg, "tuned").exposed_tail_ms > pl.estimate(cfg, "backward-ckpt").exposed_tail_ms


def test_tensor_parallel_adds_communication():
    pl = planner("llama2-13b")
    t1 = pl.terms(ParallelConfig(pp=2, dp=4, tp=1))
    t2 = pl.terms(ParallelConfig(pp=2, dp=2, tp=2))
    assert t1.parts["tp_allreduce_ms"] == 0 and t2.parts["tp_allreduce_ms"] > 0
    prof = pl.profile(1, 2048, 2)
    assert t2.mid.forward - 1e3 * prof.forward_s == pytest.approx(2 * t2.parts["tp_allreduce_ms"])


def test_more_link_bandwidth_never_slows_the_plan():
    fast = TrainingPlatform().with_overrides(link_bandwidth=7.4e9)
    slow = planner("llama2-7b").plan(32, 128, top=1)
    quick = Planner(get_model("llama2-7b"), fast, profile_source="roofline", profile_fn=roofline_fn()).plan(
        32, 128, top=1)
    assert quick.best.step_ms <= slow.best.step_ms
    cfg = slow.best.config
    assert Planner(get_model("llama2-7b"), fast, profile_source="roofline",
                   profile_fn=roofline_fn()).estimate(cfg).step_ms <= slow.best.step_ms


@pytest.mark.parametrize("cfg,method", [
    (ParallelConfig(pp=4, dp=8, accum=8, activation="fsr"), "ratrain"),
    (ParallelConfig(pp=4, dp=8, accum=8, activation="ckpt"), "tuned"),
    (ParallelConfig(pp=2, dp=16, zero=3, accum=8, activation="fsr"), "zero3-heavy"),
])
def test_simulate_config_agrees_with_planner(cfg, method):
    chk = simulate_config(get_model("llama2-7b"), cfg, method=method, profile_source="roofline",
                          profile_fn=roofline_fn())
    assert abs(chk.error) < 0.03
    assert chk.result.mechanisms == mechanisms_for(method, cfg.activation, cfg.prefetch)
    assert chk.to_json()["simulated_s"] == pytest.approx(chk.simulated_ms / 1e3)


def test_bad_inputs():
    pl = planner("llama2-7b")
    with pytest.raises(ConfigError, match="method"):
        pl.plan(8, 64, method="magic")
    with pytest.raises(ConfigError, match="clusters"):
        pl.plan(0, 64)
    assert set(METHODS) == {"ratrain", "tp-heavy", "zero3-heavy", "backward-ckpt", "full-save", "tuned"}


# ---------------------------------------------------------------- CLI

def test_cli_plan_json(capsys):
    from ratrain.cli import main
    rc = main(["plan", "--model", "llama2-7b", "--clusters", "8", "--global-batch", "64", "--profile", "roofline",
               "--top", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["counts"]) == {"enumerated", "pruned_by_memory", "timed"}
    assert len(out["ranked"]) == 3 and out["best"] == out["ranked"][0]
    assert out["best"]["peak_bytes"] <= BUDGET and out["best"]["step_s"] > 0


def _plan_json(capsys, *argv):
    from ratrain.cli import main
    assert main(["plan", *map(str, argv), "--profile", "roofline", "--confirm", "0", "--top", "1", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("model", ["llama2-7b", "llama2-70b"])
def test_cli_plan_paper_space_reproduces_table3_layouts(model, capsys):
    """--space paper is the space the reproduction's Tables 3, 4 and 6 search (T=1, ZeRO <= 2, b=1): at
    Table 3's cluster counts it finds the paper's P and D; the default (wide) space says it is wider."""
    from ratrain.plan.space import PAPER_SPACE
    from ratrain.repro.experiment import Settings
    from ratrain.repro.targets import TABLE3
    _, clusters, pp, dp, accum, _, _, batch = next(row for row in TABLE3 if row[0] == model)
    s = Settings()
    assert (PAPER_SPACE.tp_degrees, PAPER_SPACE.zero_stages, PAPER_SPACE.micro_batches) == (
        s.ratrain_tp_degrees, s.ratrain_zero_stages, (s.micro_batch,))
    out = _plan_json(capsys, "--model", model, "--clusters", clusters, "--global-batch", batch, "--space", "paper")
    cfg = out["best"]["config"]
    assert (cfg["pp"], cfg["dp"], cfg["tp"], cfg["accum"]) == (pp, dp, 1, accum) and cfg["zero"] <= 2
    assert out["search_space"]["name"] == "paper" and out["search_space"]["zero_stages"] == [0, 1, 2]
    wide = _plan_json(capsys, "--model", model, "--clusters", clusters, "--global-batch", batch)
    assert wide["search_space"]["name"] == "wide" and wide["search_space"]["tp_degrees"] is None
    assert wide["counts"]["enumerated"] > out["counts"]["enumerated"]


def test_cli_plan_text_names_the_space(capsys):
    from ratrain.cli import main
    assert main(["plan", "--model", "llama2-7b", "--clusters", "8", "--global-batch", "64", "--profile", "roofline",
                 "--confirm", "0", "--top", "1", "--space", "paper", "--zero-stages", "2"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line == "search space: paper (the paper's Algorithm 2: T=1, ZeRO 0-2, b=1), replaced by Z 2"


@pytest.mark.parametrize("argv", [
    ["plan", "--model", "nope", "--clusters", "8", "--global-batch", "64", "--profile", "roofline"],
    ["plan", "--model", "llama2-7b", "--clusters", "0", "--global-batch", "64", "--profile", "roofline"],
    ["plan", "--hf-config", "/nonexistent/config.json", "--clusters", "8", "--global-batch", "64"],
])
def test_cli_plan_bad_input_exits_2(argv, capsys):
    from ratrain.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err


def test_cli_plan_bad_flag_exits_2(capsys):
    from ratrain.cli import main
    assert main(["plan", "--model", "llama2-7b", "--clusters", "8", "--global-batch", "64", "--method", "magic"]) == 2
    assert capsys.readouterr().err.count("\n") == 1          # one line, no usage block


def test_cached_terms_do_not_leak_between_pipeline_depths():
    pl = planner("llama2-7b")
    one = pl.estimate(ParallelConfig(pp=1, dp=8, accum=8))          # fills the cache with a P=1 entry
    two = pl.estimate(ParallelConfig(pp=2, dp=8, accum=8))
    fresh = planner("llama2-7b").estimate(ParallelConfig(pp=2, dp=8, accum=8))
    assert two.step_ms == fresh.step_ms and one.step_ms != two.step_ms


def test_grid_restrictions():
    r = planner("llama2-7b").plan(16, 64, top=100, micro_batches=(1,), tp_degrees=(1,), zero_stages=(2,))
    assert r.ranked and all((c.config.micro_batch, c.config.tp, c.config.zero) == (1, 1, 2) for c in r.ranked)
    assert r.enumerated == sum(1 for _ in search_space(get_model("llama2-7b"), 16, 64, micro_batches=(1,),
                                                       tp_degrees=(1,), zero_stages=(2,)))


# the README's plan examples and Table 3's cases, as `ratrain plan` runs them (default space, --confirm 3)
SHIPPED_PLANS = [("llama2-70b", 96, 32, {}), ("llama2-70b", 96, 32, {"tp_degrees": (1,), "zero_stages": (0, 1, 2),
                                                                    "micro_batches": (1,)}),
                 ("llama2-7b", 8, 512, {}), ("llama2-7b", 64, 512, {}), ("baichuan2-13b", 16, 256, {}),
                 ("qwen2.5-32b", 64, 512, {})]


@pytest.mark.slow
@pytest.mark.parametrize("name, clusters, global_batch, space", SHIPPED_PLANS)
def test_the_readme_and_table3_plans_emulate_nothing_on_a_fresh_install(name, clusters, global_batch, space,
                                                                       monkeypatch, tmp_path):
    """Every profile their finalists are confirmed on ships (scripts/ship_profiles.py, PLAN_FINALISTS)."""
    from ratrain.cost import profile

    monkeypatch.setenv("RATRAIN_CACHE_DIR", str(tmp_path))       # nothing cached: the shipped data alone
    built = profile.build_profile

    def build(spec, micro_batch, seq, tp, *, source="emulated", **kw):
        assert source != "emulated", f"{spec.name} b={micro_batch} seq={seq} T={tp} is not shipped"
        return built(spec, micro_batch, seq, tp, source=source, **kw)

    monkeypatch.setattr(profile, "build_profile", build)
    monkeypatch.setattr(profile, "_MEMO", {})
    result = Planner(get_model(name), progress=False).plan(clusters, global_batch, confirm=3, **space)
    assert result.confirmed == 3


def test_the_fast_models_ddr_rates_are_its_shipped_references_and_the_probes():
    """The bound profile takes its DDR rates from its emulated micro-batch-1 reference (so a shipped or cached
    reference spares emulating the probe); the shipped reference's are what the probe measures now."""
    from ratrain.cost import profile

    platform = TrainingPlatform()
    spec = get_model("llama2-7b")
    reference = profile.layer_profile(spec, 1, 2048, 1, platform=platform, progress=False)
    fast = profile.layer_profile(spec, 2, 2048, 2, source="bound", platform=platform, progress=False)
    assert fast.ddr_rates == reference.ddr_rates
    assert reference.ddr_rates == profile.ddr_rates(platform, "emulated")


def test_the_analytic_pass_is_timed_within_the_search():
    for schedules in (("1f1b",), ("1f1b", "gpipe")):
        r = planner("llama2-7b").plan(8, 64, schedules=schedules)
        assert 0 < r.analytic_s <= r.elapsed_s - r.profile_s
        body = r.to_json()
        assert body["analytic_configs_per_s"] == r.enumerated / r.analytic_s >= body["configs_per_s"]
    assert gc.isenabled()           # the collector paused for the search is back on

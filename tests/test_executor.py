"""The executor replays timelines exactly and refuses lifecycle violations.

Timelines come from ratrain.sim.simulator when it exists; a small 1F1B generator
in this file is kept as a second, independent source (it also covers
per-layer R tasks and zero-length lifecycle chains).
"""
from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from ratrain.errors import ConfigError
from ratrain.replay.correctness import (
    TARGET_MAX_REL_DEV,
    CorrectnessConfig,
    Schedule,
    relative_deviation,
    run_correctness,
    simulated_schedule,
    simulator_available,
    train_schedule,
    train_single_stage,
)
from ratrain.replay.executor import (
    FAULTS,
    ExecPlan,
    LifecycleError,
    ModelState,
    execute_step,
    inject_fault,
    order_tasks,
)
from ratrain.sim.pipeline_order import PipelineSchedule
from ratrain.sim.timeline import Task

CFG = CorrectnessConfig(steps=3, stages=2, dp=2, microbatches=3, layers=4, hidden=16, heads=2, seq=8,
                        micro_batch_size=2, lr=1e-2, seed=3)


# ------------------------------------------------------------ independent toy 1F1B generator

def toy_1f1b(stages: int, microbatches: int, layers_per_stage: int, *, layerwise: bool,
             fsr: bool, tf: float = 1.0, tb: float = 2.0) -> list[Task]:
    """1F1B with per-layer F/B tasks; lifecycle either per layer or bulk at stage end."""
    order = []
    for p in range(stages):
        warm = min(stages - p - 1, microbatches)
        ops = [("F", m) for m in range(warm)]
        nf = warm
        for m in range(microbatches):
            if nf < microbatches:
                ops.append(("F", nf))
                nf += 1
            ops.append(("B", m))
        order.append(ops)
    end: dict = {}
    free = [0.0] * stages
    pos = [0] * stages
    tasks: list[Task] = []
    while any(pos[p] < len(order[p]) for p in range(stages)):
        progressed = False
        for p in range(stages):
            if pos[p] >= len(order[p]):
                continue
            kind, m = order[p][pos[p]]
            dep = ("F", p - 1, m) if kind == "F" and p > 0 else (
                ("B", p + 1, m) if kind == "B" and p < stages - 1 else (
                    ("F", p, m) if kind == "B" else None))
            if dep is not None and dep not in end:
                continue
            t = max(free[p], end.get(dep, 0.0))
            layers = [p * layers_per_stage + i for i in range(layers_per_stage)]
            if kind == "B":
                layers = layers[::-1]
            dt = tf if kind == "F" else tb
            for layer in layers:
                if kind == "B" and fsr:   # zero-length R right before its B (tie-break test)
                    tasks.append(Task(p, "R", m, layer, "compute", t, t))
                tasks.append(Task(p, kind, m, layer, "compute", t, t + dt))
                t += dt
                if kind == "B" and m == microbatches - 1 and layerwise:
                    tasks += [Task(p, "GradSync", None, layer, "link", t, t),
                              Task(p, "UpdateShard", None, layer, "ddr", t, t),
                              Task(p, "PrefetchW", None, layer, "ddr", t, t)]
            if kind == "F" and p < stages - 1:
                tasks += [Task(p, "Send", m, None, "link", t, t), Task(p + 1, "Recv", m, None, "link", t, t)]
            end[(kind, p, m)] = t
            free[p] = t
            pos[p] += 1
            progressed = True
        assert progressed, "toy generator deadlocked"
    if not layerwise:
        for p in range(stages):
            t = free[p]
            tasks += [Task(p, "GradSync", None, None, "link", t, t + 1.0),
                      Task(p, "Update", None, None, "ddr", t + 1.0, t + 2.0)]
    return tasks


def toy_schedules(cfg: CorrectnessConfig) -> tuple[Schedule, Schedule]:
    lps = cfg.layers // cfg.stages
    plan = ExecPlan(cfg.stages, cfg.dp, cfg.microbatches, cfg.layers, activation="ckpt")
    tb = toy_1f1b(cfg.stages, cfg.microbatches, lps, layerwise=False, fsr=False)
    tr = toy_1f1b(cfg.stages, cfg.microbatches, lps, layerwise=True, fsr=True)
    base = Schedule("Baseline-1F1B", tb, plan, max(t.end_ms for t in tb), source="toy")
    rat = Schedule("RATrain", tr, replace(plan, activation="fsr"), max(t.end_ms for t in tr), source="toy")
    return base, rat


def sources():
    out = [("toy", toy_schedules)]
    if simulator_available():
        out.append(("simulator", lambda c: (simulated_schedule(c, False), simulated_schedule(c, True))))
    return out


@pytest.fixture(scope="module")
def reference_losses():
    return train_single_stage(CFG)


# ------------------------------------------------------------ exactness

@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("name,make", sources())
def test_baseline_ratrain_and_single_stage_are_bit_identical(name, make, reference_losses):
    res = run_correctness(CFG, schedules=make(CFG))
    assert res.baseline_loss == res.ratrain_loss == reference_losses
    assert res.max_rel_dev == 0.0
    assert res.passed
    # training actually moved: the loss changes from step to step
    assert len(set(res.baseline_loss)) == CFG.steps
    # FSR recovered every (replica, layer, micro-batch) in R slots; the baseline recomputed at backward
    n = CFG.dp * CFG.layers * CFG.microbatches
    assert res.ratrain_stats["recovered_by_r_per_step"] == n
    assert res.ratrain_stats["recomputed_at_backward_per_step"] == 0
    assert res.baseline_stats["recomputed_at_backward_per_step"] == n
    assert res.baseline_stats["recovered_by_r_per_step"] == 0


def _after_two_steps(cfg, schedules) -> list:
    """The model state after two steps under each schedule, from the same seed."""
    states = []
    for sched in schedules:
        state = ModelState.create(cfg.model(), cfg.adam(), cfg.seed, cfg.dp)
        for _ in range(2):
            execute_step(state, sched.tasks, sched.plan, cfg.batches())
        states.append(state)
    return states


@pytest.mark.parametrize("name,make", sources())
def test_final_weights_identical(name, make):
    states = _after_two_steps(CFG, make(CFG))
    for a, b in zip(states[0].master, states[1].master, strict=False):
        for k in a:
            assert np.array_equal(a[k], b[k]), k
    assert states[0].master_version == states[1].master_version == [2] * CFG.layers
    assert all(v.dtype == np.float32 for p in states[1].master for v in p.values())
    assert all(v.dtype == np.float32 for o in states[1].opt_state for v in o.m.values())


def test_full_save_policy_same_losses_and_more_live_activations(reference_losses):
    base, rat = toy_schedules(CFG)
    full = replace(base, plan=replace(base.plan, activation="full"))
    losses, stats = train_schedule(CFG, full)
    assert losses == reference_losses
    assert stats[0].recomputed_at_backward == 0
    _, rat_stats = train_schedule(replace(CFG, steps=1), rat)
    # 1F1B holds min(P - p, A) full sets per layer at stage p under full-save;
    # FSR holds only checkpoints plus short-lived recovery buffers.
    lps = CFG.layers // CFG.stages
    want = [lps * min(CFG.stages - p, CFG.microbatches) for p in range(CFG.stages)]
    assert stats[0].peak_live_full == want
    assert all(r < f for r, f in zip(rat_stats[0].peak_live_full, want, strict=False))


def test_task_list_order_does_not_matter(reference_losses):
    base, rat = toy_schedules(CFG)
    shuffled = list(rat.tasks)
    random.Random(0).shuffle(shuffled)
    losses, _ = train_schedule(CFG, replace(rat, tasks=shuffled))
    assert losses == reference_losses
    assert order_tasks(shuffled) == order_tasks(rat.tasks)


def test_stage_level_tasks_equal_per_layer_tasks(reference_losses):
    """F/B with layer=None cover the whole stage (forward order / reverse order)."""
    base, _ = toy_schedules(CFG)
    lps = CFG.layers // CFG.stages
    coarse = [t for t in base.tasks if t.kind not in ("F", "B") or t.layer % lps == 0]
    coarse = [replace(t, layer=None) if t.kind in ("F", "B") else t for t in coarse]
    losses, _ = train_schedule(CFG, replace(base, tasks=coarse))
    assert losses == reference_losses


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("name,make", sources())
def test_overlapped_replay_at_the_step_period(name, make, reference_losses):
    """Steps replayed on one time axis at the step period give the same bits; a period
    too short for the lifecycle makes the next step's forward use old weights: refused."""
    for sched in make(CFG):
        assert sched.step_time_ms > 0
        over, _ = train_schedule(CFG, sched, overlap=True)
        b2b, _ = train_schedule(CFG, sched, overlap=False)
        assert over == b2b == reference_losses
        with pytest.raises(LifecycleError, match=r"step 1: F\(layer 0, mb 0\) ran before UpdateShard\(0\)"):
            train_schedule(CFG, replace(sched, step_time_ms=0.3 * sched.step_time_ms))


@pytest.mark.skipif(not simulator_available(), reason="needs ratrain.sim.simulator")
def test_spilled_prefetch_replays_at_the_simulated_period_and_not_shorter():
    """The simulator lets PrefetchW(2) end after the step boundary, exactly at the next
    step's F(2). Replaying steps on one time axis at that period is exact; 0.01 ms less
    and the next forward would start before its view is ready."""
    from ratrain.cost.tasks import PipelineCosts
    from ratrain.sim.simulator import simulate

    res = simulate(PipelineCosts.uniform(2, 4, t_forward=1.0, t_backward=2.0, t_prefetch=8.0,
                                         layers_per_stage=4))
    period = res.step_time_ms
    assert max(t.end_ms for t in res.tasks if t.kind == "PrefetchW") > period   # it does spill
    cfg = replace(CFG, steps=3, dp=1, microbatches=4, layers=8)
    sched = Schedule("RATrain", list(res.tasks), ExecPlan(2, 1, 4, 8, activation="fsr"), period)
    losses, _ = train_schedule(cfg, sched, overlap=True)
    assert losses == train_single_stage(cfg)
    with pytest.raises(LifecycleError, match=r"step 1: F\(layer 2, mb 0\) starts at .* PrefetchW\(2\)"):
        train_schedule(cfg, replace(sched, step_time_ms=period - 0.01))


def test_task_reading_an_unfinished_output_is_refused():
    """Effects are published at a task's end: a B that starts while the B above it
    (same micro-batch) is still running reads a gradient that does not exist yet."""
    base, _ = toy_schedules(CFG)
    b3 = next(t for t in base.tasks if t.kind == "B" and t.layer == 3 and t.microbatch == 0)
    bad = [replace(t, start_ms=b3.start_ms + 0.5) if (t.kind == "B" and t.layer == 2 and t.microbatch == 0)
           else t for t in base.tasks]
    with pytest.raises(LifecycleError, match=r"B\(layer 2, mb 0\) starts at .* but B\(layer 3, mb 0\)"):
        _run(base, bad, steps=1)
    with pytest.raises(ConfigError, match="ends"):
        _run(base, base.tasks + [Task(0, "Send", 0, None, "link", 5.0, 4.0)], steps=1)


def test_reordered_yardstick_stays_close_over_a_few_steps(reference_losses):
    rev = train_single_stage(CFG, reverse_accumulation=True)
    dev = relative_deviation(reference_losses, rev)
    assert dev[0] == 0.0                 # same initial weights and data
    assert dev.max() < 1e-4              # same maths: FP32 rounding only, over 3 steps


def test_contiguous_split():
    plan = ExecPlan(stages=3, dp=1, microbatches=1, layers=7)
    assert [list(plan.stage_layers(s)) for s in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert plan.stage_of(4) == 1
    with pytest.raises(ConfigError):
        ExecPlan(stages=4, dp=1, microbatches=1, layers=3)
    with pytest.raises(ConfigError):
        ExecPlan(stages=1, dp=1, microbatches=1, layers=2, activation="lazy")


# ------------------------------------------------------------ interleaved and ZB-H1 timelines

SCFG = replace(CFG, microbatches=4)          # interleaved needs A a multiple of P = 2
PIPELINES = [PipelineSchedule("interleaved", 2), PipelineSchedule("zb-h1", weight_fraction=0.4)]


@pytest.fixture(scope="module")
def baseline_1f1b_losses():
    losses, _ = train_schedule(SCFG, simulated_schedule(SCFG, False))
    assert losses == train_single_stage(SCFG)
    return losses


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda s: s.name)
@pytest.mark.parametrize("ratrain", [False, True], ids=["all-off", "ratrain"])
def test_interleaved_and_zb_h1_replay_bit_identical_to_baseline_1f1b(pipeline, ratrain, baseline_1f1b_losses):
    sched = simulated_schedule(SCFG, ratrain, pipeline)
    kinds = {t.kind for t in sched.tasks}
    assert ("W" in kinds) == (pipeline.name == "zb-h1")
    if pipeline.name == "interleaved":
        assert [list(sched.plan.stage_layers(p)) for p in range(2)] == [[0, 2], [1, 3]]
        # four chunk boundaries per micro-batch and direction instead of one: 3 x 2 x 4 transfers
        assert sum(t.kind == "Send" for t in sched.tasks) == 3 * 2 * SCFG.microbatches
    for overlap in (True, False):
        losses, stats = train_schedule(SCFG, sched, overlap=overlap)
        assert losses == baseline_1f1b_losses
    if pipeline.name == "zb-h1":
        assert stats[0].tasks["W"] == SCFG.layers * SCFG.microbatches


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda s: s.name)
def test_final_weights_identical_to_baseline_1f1b(pipeline):
    states = _after_two_steps(SCFG, (simulated_schedule(SCFG, False), simulated_schedule(SCFG, True, pipeline)))
    for a, b in zip(states[0].master, states[1].master, strict=True):
        for k in a:
            assert np.array_equal(a[k], b[k]), k


def test_zb_h1_keeps_activations_until_w():
    """Full-save ZB-H1: every stage holds min(P, A) micro-batches' activations (1F1B: min(P - p, A))."""
    zb = simulated_schedule(SCFG, False, "zb-h1")
    full = replace(zb, plan=replace(zb.plan, activation="full"))
    base = simulated_schedule(SCFG, False)
    _, zstats = train_schedule(replace(SCFG, steps=1), full)
    _, bstats = train_schedule(replace(SCFG, steps=1), replace(base, plan=replace(base.plan, activation="full")))
    lps = SCFG.layers // SCFG.stages
    assert zstats[0].peak_live_full == [lps * min(SCFG.stages, SCFG.microbatches)] * SCFG.stages
    assert bstats[0].peak_live_full == [lps * min(SCFG.stages - p, SCFG.microbatches) for p in range(SCFG.stages)]


def test_split_backward_checks():
    zb = simulated_schedule(SCFG, True, "zb-h1")
    w = next(t for t in zb.tasks if t.kind == "W" and t.layer == 1 and t.microbatch == 0)
    b = next(t for t in zb.tasks if t.kind == "B" and t.layer == 1 and t.microbatch == 0)
    early = [replace(t, start_ms=b.start_ms - 1.0, end_ms=b.start_ms - 0.5) if t == w else t for t in zb.tasks]
    with pytest.raises(LifecycleError, match=r"W\(layer 1, mb 0\) ran before B\(layer 1, mb 0\)"):
        _run(zb, early, steps=1)
    overlapping = [replace(t, start_ms=b.end_ms - 0.01) if t == w else t for t in zb.tasks]
    with pytest.raises(LifecycleError, match=r"W\(layer 1, mb 0\) starts at .* but B\(layer 1, mb 0\)"):
        _run(zb, overlapping, steps=1)
    # GradSync must wait for the last W, not the last B
    last_w = max((t for t in zb.tasks if t.kind == "W" and t.layer == 1), key=lambda t: t.end_ms)
    gs = next(t for t in zb.tasks if t.kind == "GradSync" and t.layer == 1)
    hurried = [replace(t, start_ms=last_w.start_ms - 0.02, end_ms=last_w.start_ms - 0.01) if t == gs else t
               for t in zb.tasks]
    with pytest.raises(LifecycleError, match=r"GradSync\(1\) before the weight gradient of micro-batches \[3\]"):
        _run(zb, hurried, steps=1)
    missing = [t for t in zb.tasks if t != w]
    with pytest.raises(LifecycleError, match=r"GradSync\(1\) before the weight gradient|W never ran"):
        _run(zb, missing, steps=1)
    bad = inject_fault(zb.tasks, zb.plan, "early-update", layer=1)
    with pytest.raises(LifecycleError, match=r"GradSync\(1\)"):
        _run(zb, bad, steps=1)


def test_interleaved_plan_placement():
    plan = ExecPlan(stages=2, dp=1, microbatches=2, layers=6, virtual_stages=2)
    # chunks [0, 1] [2, 3] [4] [5]: chunk c on stage c mod 2
    assert [list(plan.stage_layers(p)) for p in range(2)] == [[0, 1, 4], [2, 3, 5]]
    assert plan.stage_of(4) == 0 and plan.stage_of(5) == 1
    with pytest.raises(ConfigError, match="does not divide the layers"):
        ExecPlan(stages=2, dp=1, microbatches=2, layers=4, virtual_stages=3)


# ------------------------------------------------------------ lifecycle checks and teeth

def _run(sched: Schedule, tasks, steps=2, fault=False):
    state = ModelState.create(CFG.model(), CFG.adam(), CFG.seed, CFG.dp)
    return [execute_step(state, tasks, sched.plan, CFG.batches(), fault_injection=fault)
            for _ in range(steps)], state


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@pytest.mark.parametrize("name,make", sources())
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_raises_then_is_caught_by_correctness_check(fault, name, make):
    """Teeth: one layer's lifecycle bug is refused; forced through, it moves the loss curve.

    A one-layer bug perturbs the loss by only ~0.01-0.1% per step at first (layer 1
    of this config: 0.003% at step 2), so the run is 5 steps long; the deviation
    then exceeds the paper's 0.081% bound. Bit-identity catches it from step 2.
    """
    cfg = replace(CFG, steps=5)
    reference = train_single_stage(cfg)
    _, rat = make(cfg)
    bad = inject_fault(rat.tasks, rat.plan, fault, layer=1)
    with pytest.raises(LifecycleError, match=r"UpdateShard\(1\)|GradSync\(1\)|PrefetchW\(1\)"):
        _run(rat, bad)
    losses, stats = train_schedule(cfg, replace(rat, tasks=bad), fault_injection=True)
    assert stats[0].violations
    dev = relative_deviation(reference, losses)
    assert dev[0] == 0.0            # the step-0 loss is computed before any update
    assert np.all(dev[1:] > 0.0)
    assert dev.max() > TARGET_MAX_REL_DEV, dev


def test_missing_prefetch_is_a_stale_view():
    _, rat = toy_schedules(CFG)
    bad = [t for t in rat.tasks if not (t.kind == "PrefetchW" and t.layer == 2)]
    with pytest.raises(LifecycleError, match=r"stale weight view.*PrefetchW\(2\)"):
        _run(rat, bad)


def test_missing_gradsync_with_data_parallel():
    _, rat = toy_schedules(CFG)
    bad = [t for t in rat.tasks if not (t.kind == "GradSync" and t.layer == 0)]
    with pytest.raises(LifecycleError, match=r"UpdateShard\(0\) before GradSync\(0\)"):
        _run(rat, bad, steps=1)


def test_missing_update_is_reported():
    _, rat = toy_schedules(CFG)
    bad = [t for t in rat.tasks if not (t.kind in ("UpdateShard", "PrefetchW") and t.layer == 3)]
    with pytest.raises(LifecycleError, match=r"never updated"):
        _run(rat, bad, steps=1)


def test_backward_before_forward_is_refused():
    base, _ = toy_schedules(CFG)
    last = CFG.layers - 1
    bad = [replace(t, start_ms=-5.0, end_ms=-4.0) if (t.kind == "B" and t.layer == last and t.microbatch == 0)
           else t for t in base.tasks]
    with pytest.raises(LifecycleError, match=r"B\(layer 3, mb 0\) before its forward"):
        _run(base, bad, steps=1)


def test_recovery_only_under_fsr_and_after_checkpoint():
    base, rat = toy_schedules(CFG)
    with pytest.raises(LifecycleError, match="activation policy 'ckpt'"):
        _run(base, rat.tasks, steps=1)
    bad = [replace(t, start_ms=-1.0, end_ms=-1.0) if (t.kind == "R" and t.layer == 0 and t.microbatch == 1)
           else t for t in rat.tasks]
    with pytest.raises(LifecycleError, match=r"R\(layer 0, mb 1\) has no checkpoint"):
        _run(rat, bad, steps=1)


def test_malformed_tasks():
    base, _ = toy_schedules(CFG)
    with pytest.raises(ConfigError, match="lives on stage 1"):
        _run(base, base.tasks + [Task(0, "GradSync", None, 3, "link", 99.0, 99.0)], steps=1)
    with pytest.raises(ConfigError, match="microbatch 7"):
        _run(base, base.tasks + [Task(0, "F", 7, 0, "compute", 99.0, 99.0)], steps=1)
    with pytest.raises(ConfigError, match="kind 'Z'"):
        _run(base, base.tasks + [Task(0, "Z", None, None, "compute", 99.0, 99.0)], steps=1)


# ------------------------------------------------------------ command line

@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_cli_correctness_json_and_files(tmp_path, capsys, monkeypatch):
    import json

    import ratrain.replay.correctness as corr
    from ratrain.cli import main

    if not simulator_available():   # exercise the command's plumbing on the toy timelines
        monkeypatch.setattr(corr, "simulated_schedule",
                            lambda c, ratrain: toy_schedules(c)[1 if ratrain else 0])
    rc = main(["correctness", "--steps", "2", "--layers", "2", "--hidden", "16", "--heads", "2",
               "--seq", "8", "--microbatches", "2", "--micro-batch-size", "2", "--out", str(tmp_path),
               "--json"])
    assert rc == 0
    payload = json.loads(capsys.readouterr().out)
    for key in ("steps", "baseline_loss", "ratrain_loss", "single_stage_loss", "max_rel_dev",
                "mean_rel_dev", "final_rel_dev", "target_max_rel_dev", "plot"):
        assert key in payload
    assert payload["steps"] == 2 and len(payload["ratrain_loss"]) == 2
    assert payload["target_max_rel_dev"] == 0.00081
    assert payload["max_rel_dev"] == 0.0 and payload["bit_identical"]
    assert (tmp_path / "correctness.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "correctness.json").read_text())["max_rel_dev"] == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["correctness.json", "correctness.png"]


def test_cli_correctness_bad_input_is_one_line_error(tmp_path, capsys):
    from ratrain.cli import main

    rc = main(["correctness", "--steps", "1", "--layers", "3", "--stages", "2", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ratrain correctness: error:") and "layers=3" in err and "\n" not in err
    assert not any(tmp_path.iterdir())

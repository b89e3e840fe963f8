"""The second-platform study: the what-if platform files, what each changes, the
infeasible-platform error, and the study's row builders on small cases."""
from pathlib import Path

import pytest

from mtemu.platform import Platform
from ratrain.cost.profile import layer_profile, platform_key
from ratrain.cost.terms import allreduce_ms, cost_terms, p2p_ms
from ratrain.errors import ConfigError
from ratrain.plan.planner import Planner
from ratrain.repro.experiment import Settings
from ratrain.repro.platforms import (
    PLATFORMS_DIR,
    WHAT_IF_FILES,
    _checks,
    payoff_rows,
    planner_rows,
    platforms_rows,
    require_feasible,
    run_platforms,
    what_if_platforms,
)
from ratrain.spec.models import get_model
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import GIB, TrainingPlatform

MT3000 = TrainingPlatform()
ROOF = Settings(profile_source="roofline")


@pytest.fixture(scope="module")
def what_ifs():
    return {p.name: p for p in what_if_platforms()}


def test_the_what_if_files_load_with_both_readers(what_ifs):
    assert set(what_ifs) == {"bandwidth-rich", "more-memory", "bandwidth-rich-more-memory"}
    for f in WHAT_IF_FILES:
        text = (PLATFORMS_DIR / f).read_text()
        assert "SIMULATED what-if, not a real chip" in text        # labelled in the file itself
        assert Platform.from_file(PLATFORMS_DIR / f).name == TrainingPlatform.from_file(PLATFORMS_DIR / f).name
    rich, mem, both = what_ifs["bandwidth-rich"], what_ifs["more-memory"], what_ifs["bandwidth-rich-more-memory"]
    # 10x on the two slow paths, nothing else
    assert rich.ddr_bandwidth == 10 * MT3000.ddr_bandwidth and rich.link_bandwidth == 10 * MT3000.link_bandwidth
    assert rich.peak_mac_per_s == MT3000.peak_mac_per_s and rich.memory_budget_bytes == MT3000.memory_budget_bytes
    assert mem.memory_budget_bytes == 40 * GIB == both.memory_budget_bytes
    # capacity is not in the timing: more-memory reuses MT-3000's profiles, the combined one bandwidth-rich's
    assert platform_key(mem) == platform_key(MT3000) and platform_key(both) == platform_key(rich)
    assert platform_key(rich) != platform_key(MT3000)


def test_the_bandwidth_rich_platform_shrinks_link_and_ddr_bound_terms(what_ifs):
    rich = what_ifs["bandwidth-rich"]
    mib = 2 ** 20
    # hand-computed: 1 MiB point to point is 1 MiB / 3.7 GB/s + 20 us vs 1 MiB / 37 GB/s + 5 us
    assert p2p_ms(mib, MT3000) == pytest.approx(1e3 * (mib / 3.7e9 + 20e-6))
    assert p2p_ms(mib, rich) == pytest.approx(1e3 * (mib / 37e9 + 5e-6))
    # a 128-rank ring all-reduce of 64 MiB: 2 x 127 / 128 of the bytes plus 254 hop latencies; the
    # latencies shrink only 4x, so the whole is about 8.4x faster, not 10x
    ring = [1e3 * (2 * 127 / 128 * 64 * mib / bw + 254 * lat) for bw, lat in ((3.7e9, 20e-6), (37e9, 5e-6))]
    assert [allreduce_ms(64 * mib, 128, p) for p in (MT3000, rich)] == pytest.approx(ring)
    assert 8 < ring[0] / ring[1] < 9
    # cost terms of a Table 2 layout: gradient sync and the stage transfer shrink about 10x, the
    # DDR-bound update too; the forward GEMMs (compute-bound on the roofline source) do not change
    model = get_model("llama2-13b")
    cfg = ParallelConfig(pp=2, dp=128, zero=2, micro_batch=1, accum=32, seq=2048, activation="fsr")
    t0, t1 = (cost_terms(model, cfg, layer_profile(model, 1, 2048, 1, source="roofline", platform=p), p)
              for p in (MT3000, rich))
    assert t1.mid.gradsync < t0.mid.gradsync / 8 and t1.transfer < t0.transfer / 8
    assert t1.mid.update < t0.mid.update / 8
    gemms = [o for o in layer_profile(model, 1, 2048, 1, source="roofline", platform=rich).ops if o.kind == "gemm"]
    ref = [o for o in layer_profile(model, 1, 2048, 1, source="roofline").ops if o.kind == "gemm"]
    assert [o.forward_s for o in gemms] == [o.forward_s for o in ref]


def test_more_memory_admits_layouts_that_do_not_fit_twenty_gb(what_ifs):
    mem = what_ifs["more-memory"]
    planner = Planner(get_model("llama2-13b"), profile_source="roofline", progress=False)
    full_save = planner.memory.peak(2, 128, 1, 2, 1, 32, 2048, "full", "layerwise")   # Table 2's full-save
    assert 20 * GIB < full_save <= 40 * GIB
    for plat, fits in ((MT3000, False), (mem, True)):
        best = Planner(get_model("llama2-13b"), plat, profile_source="roofline", progress=False).plan(
            256, 4096, 2048, "full-save", top=1, micro_batches=(1,), tp_degrees=(1,), zero_stages=(2,),
            confirm=0).best
        assert (best is not None) == fits


def test_a_platform_where_nothing_fits_is_one_clear_error(tmp_path):
    tiny = MT3000.with_overrides(name="tiny", memory_budget_bytes=GIB // 4)
    with pytest.raises(ConfigError, match=r"platform 'tiny': no configuration of llama2-13b fits its 0\.25 GB"
                                          r".*smallest worst-stage peak is ([0-9.]+) GB \(P=\d+,D=\d+,T=\d+") as err:
        require_feasible(tiny, ROOF)
    need = float(err.value.args[0].split("peak is ")[1].split(" GB")[0])
    # the reported need is the real threshold: a budget just above it is feasible, just below is not
    llama = ("llama2-13b",)
    require_feasible(MT3000.with_overrides(name="enough", memory_budget_bytes=int((need + 0.01) * GIB)), ROOF,
                     models=llama)
    with pytest.raises(ConfigError):
        require_feasible(MT3000.with_overrides(name="short", memory_budget_bytes=int((need - 0.01) * GIB)), ROOF,
                         models=llama)
    require_feasible(MT3000, ROOF)                     # the default fits
    # the study refuses before simulating anything, and writes nothing (no half-written output)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="no configuration"):
        run_platforms(out, lambda msg: None, Settings(profile_source="roofline", platform=tiny))
    assert not out.exists() or not any(out.iterdir())
    with pytest.raises(ConfigError, match="names must differ"):
        platforms_rows(ROOF, platforms=[MT3000, MT3000])


def test_a_missing_platform_file_is_named():
    with pytest.raises(ConfigError, match="nowhere.toml not found"):
        what_if_platforms(("nowhere.toml",))


def test_planner_rows_on_more_memory_are_never_slower(what_ifs):
    rows = []
    for plat in (MT3000, what_ifs["more-memory"]):
        rows += planner_rows(plat, ROOF, models=("llama2-13b",))
    assert {r["method"] for r in rows} == {"ratrain", "tp-heavy", "zero3-heavy", "backward-ckpt", "full-save",
                                           "tuned", "ratrain-no-fsr"}
    for r in rows:
        if r["method"] == "ratrain":
            assert r["slowdown_vs_ratrain"] == 1.0 and "T=" not in r["config"]      # RATrain's own space: T=1
    checks = _checks(rows, "mt3000", None, "more-memory", None)
    picks = next(c for c in checks if c.name.endswith("no planner pick slower"))
    assert picks.ok and picks.ours == "none"
    # at 40 GB full activations fit Table 2's own layout, so the full-save pick exists
    assert next(r for r in rows if r["platform"] == "more-memory" and r["method"] == "full-save")["fits"]


def _row(kind, plat, method, step, act=None):
    return {"kind": kind, "platform": plat, "model": "m", "method": method, "step_s": step, "activation": act,
            "slowdown_vs_ratrain": None}


def test_payoff_rows_hand_computed():
    rows = [_row("table2", "p", "ratrain", 100.0), _row("table2", "p", "backward-ckpt", 110.0),
            _row("table2", "p", "full-save", 80.0), _row("table2", "p", "tuned", 121.0),
            _row("planner", "p", "ratrain", 90.0, "full"), _row("planner", "p", "ratrain-no-fsr", 90.0, "full")]
    (pay,) = payoff_rows(rows)
    assert pay["fsr_vs_ckpt"] == pytest.approx(1.1) and pay["fsr_vs_full"] == pytest.approx(0.8)
    assert pay["fsr_gain"] == pytest.approx(0.8)          # full activations fit: FSR costs 20 %
    assert pay["lifecycle_gain"] == pytest.approx(1.1)
    assert pay["planner_fsr_gain"] == 1.0 and pay["planner_pick_activation"] == "full"
    # full-save OOM (no step): FSR is priced against checkpointing only
    rows[2]["step_s"] = None
    assert payoff_rows(rows)[0]["fsr_gain"] == pytest.approx(1.1)


def test_checks_catch_a_slower_pick_and_a_changed_step():
    rows = [_row("planner", "a", "ratrain", 100.0), _row("planner", "b", "ratrain", 101.0),
            _row("table2", "a", "ratrain", 50.0), _row("table2", "b", "ratrain", 50.5)]
    by = {c.name: c for c in _checks(rows, "a", None, "b", None)}
    assert not by["b vs a: no planner pick slower"].ok and by["b vs a: no planner pick slower"].ours == "m/ratrain"
    assert not by["b vs a: fixed layouts' steps equal"].ok
    assert by["b vs a: fixed layouts' steps equal"].ours == pytest.approx(0.01)


def test_platform_files_are_in_the_checkout():
    assert Path(PLATFORMS_DIR).is_dir() and all((PLATFORMS_DIR / f).is_file() for f in WHAT_IF_FILES)


@pytest.mark.slow
def test_the_whole_study(tmp_path):
    """The study as `ratrain reproduce platforms` runs it (about a minute with the shipped profiles)."""
    exp = run_platforms(tmp_path, lambda msg: None, Settings())
    assert exp.passed == len(exp.checks) and len(exp.checks) >= 5
    assert all(Path(f).is_file() for f in exp.figures)
    platforms = {r["platform"] for r in exp.rows}
    assert platforms == {"mt3000", "bandwidth-rich", "more-memory", "bandwidth-rich-more-memory"}
    for r in exp.rows:
        if r["kind"] != "payoff":
            assert set(r) >= {"platform", "model", "method", "step_s", "slowdown_vs_ratrain"}

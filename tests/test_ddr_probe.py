"""The emulated DDR probe: closed form on one transfer, bounds, monotonicity, determinism, CLI."""
import argparse
import json
from pathlib import Path

import pytest

from mtemu import ddr_probe
from mtemu.cli import probe as cli_probe
from mtemu.ddr_probe import (
    PATTERNS,
    PATTERNS_BY_NAME,
    ProbePattern,
    Stream,
    closed_form_single_transfer_cycles,
    contiguous,
    format_probe,
    pattern_bandwidth,
    probe,
    run_pattern,
)
from mtemu.errors import CapacityError, MtemuError
from mtemu.platform import DEFAULT, load_platform
from ratrain.cost.ddr_terms import TERM_PATTERNS, term_pattern
from ratrain.cost.profile import DDR_TERMS
from ratrain.errors import ConfigError

RAW = Path(__file__).resolve().parents[1] / "platforms" / "mt3000-raw-ddr.toml"
BULK = ("bulk_read", "bulk_write", "read_write", "param_copy", "adam")


@pytest.mark.parametrize("platform", [DEFAULT, load_platform(RAW)], ids=["default", "raw"])
@pytest.mark.parametrize("rows,row_bytes,pitch", [(1, 512 * 1024, 512 * 1024), (64, 2048, 16384), (300, 256, 4096)])
def test_one_transfer_on_one_dsp_is_the_closed_form(platform, rows, row_bytes, pitch):
    one = ProbePattern("one", "single transfer", (Stream("x", rows, row_bytes, pitch),), (), chunks=1, buffers=1)
    r = run_pattern(one, platform, dsps=1)
    # bundles: dma (cycle 0), dmawait (releases at completion), halt (+1 cycle)
    bpc = platform.ddr_bandwidth / platform.clock_hz
    expected = platform.dma_latency_cycles + rows * row_bytes / bpc + rows * platform.dma_row_overhead_cycles
    assert r.cycles == closed_form_single_transfer_cycles(rows * row_bytes, rows, platform) + 1
    assert r.cycles == int(-(-expected // 1)) + 1
    assert r.bytes == rows * row_bytes and r.bytes_written == 0


@pytest.mark.parametrize("platform", [DEFAULT, load_platform(RAW)], ids=["default", "raw"])
def test_effective_bandwidth_never_exceeds_nominal(platform):
    for dsps in (platform.dsps, 1):
        for r in probe(platform, dsps=dsps):
            assert 0 < r.effective_bandwidth <= platform.ddr_bandwidth, r.pattern
            assert r.ratio_to_nominal <= 1.0


def test_halving_ddr_bandwidth_lowers_bulk_effective_bandwidth():
    raw = load_platform(RAW)
    half = raw.with_overrides(ddr_bandwidth=raw.ddr_bandwidth / 2)
    for name in BULK:
        full_bw = run_pattern(PATTERNS_BY_NAME[name], raw).effective_bandwidth
        half_bw = run_pattern(PATTERNS_BY_NAME[name], half).effective_bandwidth
        assert half_bw < full_bw
        # bandwidth-bound: halving the server rate about halves the measured rate
        assert half_bw == pytest.approx(full_bw / 2, rel=0.02)


def test_latency_bound_small_transfers_and_row_overhead():
    raw = load_platform(RAW)
    # with no row overhead, strided and contiguous bulk reads of the same bytes take the same time
    strided = run_pattern(PATTERNS_BY_NAME["strided_256"], raw)
    assert strided.cycles == run_pattern(PATTERNS_BY_NAME["bulk_read"], raw).cycles
    # a per-row overhead (the 30 GB/s platform's fitted 2.1 cycles) costs the short rows more
    fitted = DEFAULT.with_overrides(ddr_bandwidth=30e9, dma_row_overhead_cycles=2.1)
    s256 = run_pattern(PATTERNS_BY_NAME["strided_256"], fitted).effective_bandwidth
    s2k = run_pattern(PATTERNS_BY_NAME["strided_2k"], fitted).effective_bandwidth
    assert s256 < s2k < run_pattern(PATTERNS_BY_NAME["bulk_read"], fitted).effective_bandwidth
    # 256 B transfers cannot cover the DMA latency; double buffering doubles what is in flight
    sync = run_pattern(PATTERNS_BY_NAME["small_256_sync"], raw).effective_bandwidth
    double = run_pattern(PATTERNS_BY_NAME["small_256"], raw).effective_bandwidth
    assert sync < double < 0.8 * raw.ddr_bandwidth


def test_deterministic():
    raw = load_platform(RAW)
    a = [r.to_json() for r in probe(raw)]
    b = [r.to_json() for r in probe(raw)]
    assert json.dumps(a) == json.dumps(b)
    assert format_probe(probe(raw, dsps=1)) == format_probe(probe(raw, dsps=1))


def test_pattern_bandwidth_is_the_probe_and_is_cached():
    raw = load_platform(RAW)
    bw = pattern_bandwidth(raw, "adam")
    assert bw == run_pattern(PATTERNS_BY_NAME["adam"], raw).effective_bandwidth
    assert pattern_bandwidth(raw, "adam") == bw
    # an equal platform built separately hits the same cache entry; a changed field does not
    hits = ddr_probe._pattern_bandwidth.cache_info().hits
    assert pattern_bandwidth(load_platform(RAW), "adam") == bw
    assert ddr_probe._pattern_bandwidth.cache_info().hits == hits + 1
    assert pattern_bandwidth(raw.with_overrides(ddr_bandwidth=20e9), "adam") < bw
    # the emulator knows patterns only, not training's terms (ratrain.cost.ddr_terms maps those)
    with pytest.raises(MtemuError, match="unknown DDR probe pattern 'optimizer_update'"):
        pattern_bandwidth(raw, "optimizer_update")


def test_training_terms_name_probe_patterns():
    assert set(TERM_PATTERNS.values()) <= {p.name for p in PATTERNS}
    assert set(DDR_TERMS) <= set(TERM_PATTERNS)
    assert term_pattern("optimizer_update") == "adam" and term_pattern("gradient_accumulate") == "grad_accumulate"
    with pytest.raises(ConfigError, match="unknown training term 'adam_update'"):
        term_pattern("adam_update")


def test_adam_moves_28_bytes_per_parameter():
    p = PATTERNS_BY_NAME["adam"]
    per_param = (p.read_bytes_per_chunk + p.write_bytes_per_chunk) / 8192
    assert per_param == 28 and p.read_bytes_per_chunk == p.write_bytes_per_chunk


def test_bad_input_names_the_field():
    with pytest.raises(MtemuError, match="dsps must be an integer in 1..24"):
        run_pattern(PATTERNS[0], DEFAULT, dsps=0)
    with pytest.raises(CapacityError, match="AM: probe pattern 'huge'"):
        run_pattern(ProbePattern("huge", "", (contiguous("x", 512 * 1024),), (), chunks=2), DEFAULT)
    with pytest.raises(MtemuError, match="am_source 'nope'"):
        run_pattern(ProbePattern("bad", "", (contiguous("x", 1024),), (contiguous("y", 1024, am_source="nope"),),
                                 chunks=2), DEFAULT)
    with pytest.raises(MtemuError, match="buffers must be 1..4"):
        run_pattern(ProbePattern("bad", "", (contiguous("x", 1024),), (), chunks=2, buffers=5), DEFAULT)


def _parse(argv):
    parser = argparse.ArgumentParser(prog="mtemu")
    cli_probe.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_handler_text_and_json():
    args = _parse(["probe", "--platform", str(RAW), "--dsps", "24", "1", "--json"])
    assert args.json
    payload, text = args.handler(args)
    json.loads(json.dumps(payload, allow_nan=False))
    assert payload["nominal_ddr_bandwidth"] == 51e9
    assert len(payload["results"]) == 2 * len(PATTERNS)
    assert {r["dsps"] for r in payload["results"]} == {24, 1}
    assert "30 GB/s" in text and "adam" in text
    assert "training_patterns" not in payload          # the emulator's payload names patterns only
    with pytest.raises(MtemuError, match="--dsps 25"):
        args = _parse(["probe", "--dsps", "25"])
        args.handler(args)

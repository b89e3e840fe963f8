"""mtemu.explain: bounds against the closed form, the binding resource, tile moves, roofline."""
import json

import pytest

from mtemu.assembler import parse
from mtemu.explain import explain, explain_gemm, gemm_tile_moves, plot_roofline
from mtemu.kernels.gemm import GemmTiles
from mtemu.kernels.gemm_bound import gemm_bound
from mtemu.machine import Cluster
from mtemu.platform import DEFAULT
from mtemu.trace import TraceOptions

P2 = DEFAULT.with_overrides(dsps=2)
TILES = GemmTiles(mg=256, k2=128, n2=384)


def run_text(text, platform=P2):
    return Cluster(platform, ddr_bytes=4096, functional=False).run([parse(text, platform)])


def test_gemm_bounds_equal_the_closed_form():
    m, k, n = 256, 512, 768
    ex, stats = explain_gemm(m, k, n, TILES, DEFAULT)
    closed = gemm_bound(m, k, n, TILES, DEFAULT)
    bounds = {b.resource: b for b in ex.bounds}
    # the machine's DDR server time is the closed form's sum, transfer by transfer
    assert bounds["DDR"].cycles == pytest.approx(closed.ddr_cycles, rel=1e-9)
    assert ex.ddr_bytes == closed.ddr_bytes and bounds["VMAC issue"].cycles == closed.compute_cycles
    assert bounds["DDR"].share == pytest.approx(closed.ddr_cycles / stats.cycles)
    assert ex.binding == "DDR" and ex.gemm["bound_by"] == "ddr"
    assert ex.utilization == pytest.approx(m * k * n / (DEFAULT.peak_macs_per_cycle * stats.cycles))
    assert sum(ex.stall_share.values()) == pytest.approx(1.0)
    assert ex.timeline is None
    json.dumps(ex.to_json(), allow_nan=False)
    assert "bound by DDR" in ex.text() and "closed form" in ex.text()


def test_tile_moves_follow_the_closed_form():
    moves = {(mv["field"], mv["to"]): mv for mv in gemm_tile_moves(256, 512, 1536, TILES, DEFAULT)["moves"]}
    base = gemm_bound(256, 512, 1536, TILES, DEFAULT)
    half_n2 = moves[("n2", 192)]
    # narrower B panels: A is re-read for more panels, so more DDR bytes per MAC
    assert half_n2["fits"] and half_n2["ddr_bytes_per_mac"] > base.ddr_bytes / base.macs
    assert moves[("mg", 512)]["unchanged"]            # m = 256: mg is clipped to the shape
    big = gemm_tile_moves(256, 512, 1536, GemmTiles(mg=256, k2=128, n2=768), DEFAULT)["moves"]
    assert any(not mv["fits"] and "does not fit: AM" in mv["reason"] for mv in big)


def test_binding_resource_of_simple_programs():
    lanes_fma = "\n".join(f"{{ vfma v{i % 6}, v10, v11 }}" for i in range(300))
    assert explain(run_text(lanes_fma + "\n" + "{ nop }\n" * 5 + "{ halt }")).binding == "VMAC issue"
    assert explain(run_text("{ nop }\n" * 50 + "{ halt }")).binding == "pipeline latency"
    waits = (".desc d src=DDR dst=AM rows=1 row_bytes=64 src_stride=64 dst_stride=64 mode=copy\n"
             "{ dma 0, d, [s0+0], [s0+0] }\n{ dmawait 0 }\n{ halt }")
    ex = explain(run_text(waits))
    assert ex.binding == "DMA latency" and "double buffering" in ex.verdict
    # DSP 1 skips the work: it waits at the barrier for DSP 0
    skew = parse("{ bnz s3, out }\n" + "{ smovi s1, 1 }\n" * 40 + "out:\n{ barrier }\n{ halt }", P2)
    stats = Cluster(P2, ddr_bytes=0, functional=False).run([skew], init_sregs={1: {3: 1}})
    assert explain(stats).binding == "barriers"


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_trace_adds_a_timeline_and_roofline_is_written(tmp_path):
    ex, _ = explain_gemm(256, 512, 768, TILES, DEFAULT, TraceOptions())
    t = ex.timeline
    assert len(t["ddr_busy_by_tenth"]) == 10 and all(0 <= x <= 1 + 1e-9 for x in t["ddr_busy_by_tenth"])
    assert t["barriers"] > 0 and t["dropped"]["dma"] == 0
    path = tmp_path / "roof.png"
    plot_roofline(ex, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a run with no memory traffic and no MACs still plots
    plot_roofline(explain(run_text("{ halt }")), tmp_path / "empty.png")
    assert (tmp_path / "empty.png").exists()


def test_tiles_print_one_way():
    """Every view writes tiles through format_tiles: loop order first, the effective values."""
    from mtemu.kernels.gemm import plan_gemm
    from mtemu.kernels.gemm_a_resident import AResidentGemmTiles, plan_a_resident
    from mtemu.kernels.names import format_tiles
    eff = plan_a_resident(2048, 4096, 4096, AResidentGemmTiles(), DEFAULT).tiles
    assert eff.describe() == format_tiles(eff.__dict__) == "a-resident mg=512 kg=768 k2=256 n2=384 mr=6 nv=2"
    c = plan_gemm(2048, 4096, 4096, GemmTiles(pipelined=False), DEFAULT).tiles
    assert c.describe() == "c-stationary mg=1024 k2=128 n2=768 mr=6 nv=4 (no software pipeline)"
    assert format_tiles(AResidentGemmTiles(b_slots=2)).endswith("nv=4 b_slots=2")

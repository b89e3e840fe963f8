"""Paper Table 5 (FP16 GEMM MAC utilization, M = 2048) from emulated cycles only."""
from __future__ import annotations

import sys
from dataclasses import dataclass

from ..kernels.gemm import DEFAULT_TILES, GemmResult, GemmTiles, gemm_timing
from ..kernels.gemm_a_resident import AResidentGemmTiles
from ..kernels.registry import DEFAULT_GEMM, gemm_variant, variant_of
from ..paper_targets import TABLE5, TABLE5_M
from ..platform import DEFAULT, Platform

TABLE5_TOLERANCE_PP = 1.5


@dataclass
class Table5Row:
    m: int
    k: int
    n: int
    utilization: float
    paper_utilization: float
    latency_ms: float
    paper_latency_ms: float
    tmac_per_s: float
    paper_tmac_per_s: float
    cycles: int
    stalls: dict[str, int]
    fit: bool                  # this row was used to fit a platform constant (others are held out)

    @property
    def delta_pp(self) -> float:
        return 100 * (self.utilization - self.paper_utilization)

    @property
    def ok(self) -> bool:
        return abs(self.delta_pp) <= TABLE5_TOLERANCE_PP

    def to_json(self) -> dict:
        return {"m": self.m, "k": self.k, "n": self.n, "utilization": self.utilization,
                "paper_utilization": self.paper_utilization, "latency_ms": self.latency_ms,
                "paper_latency_ms": self.paper_latency_ms, "tmac_per_s": self.tmac_per_s,
                "paper_tmac_per_s": self.paper_tmac_per_s, "cycles": self.cycles,
                "delta_pp": self.delta_pp, "within_tolerance": self.ok, "fit": self.fit,
                "stalls": self.stalls}


# Rows whose utilization was used to fit platform constants (see docs/CHOICES.md).
FIT_ROWS = {(4096, 4096), (8192, 8192)}


def table5(platform: Platform = DEFAULT, tiles: GemmTiles | AResidentGemmTiles | None = None,
           progress: bool = False) -> list[Table5Row]:
    """The five shapes on the default GEMM (Fig. 4's loop order with its default tiles), or on the
    loop order whose tiles are given."""
    variant = variant_of(tiles) if tiles is not None else gemm_variant(DEFAULT_GEMM)
    tiles = tiles if tiles is not None else variant.default_tiles
    run = variant.timing
    rows = []
    for i, (k, n, util, tmacs, lat) in enumerate(TABLE5):
        if progress:
            print(f"[table5 {i + 1}/{len(TABLE5)}] emulating {TABLE5_M}x{k}x{n} ...", file=sys.stderr, flush=True)
        r: GemmResult = run(TABLE5_M, k, n, tiles=tiles, platform=platform)
        rows.append(Table5Row(TABLE5_M, k, n, r.utilization, util / 100, r.latency_ms, lat, r.tmac_per_s, tmacs,
                              r.cycles, r.stalls, (k, n) in FIT_ROWS))
    return rows


# Variants that show what the software pipeline and the tiles buy (Table 5 is explained, not only matched).
# They are of the c-stationary loop order, the one whose pipeline can be switched off; the default
# (a-resident, always pipelined) kernel's own row at the same shape leads the block.
VARIANT_SHAPE = (2048, 4096, 4096)
VARIANT_LOOP_ORDER = "c-stationary"
NAIVE_TILES = GemmTiles(mg=2048, k2=32, n2=192, mr=1, nv=1)


def table5_tiles(platform: Platform = DEFAULT, tiles: GemmTiles | AResidentGemmTiles | None = None
                 ) -> list[GemmTiles | AResidentGemmTiles]:
    """The effective tiles (clipped to each shape) Table 5's rows run, one per row."""
    variant = variant_of(tiles) if tiles is not None else gemm_variant(DEFAULT_GEMM)
    tiles = tiles if tiles is not None else variant.default_tiles
    return [variant.plan(TABLE5_M, k, n, tiles, platform).tiles for k, n, *_ in TABLE5]


def format_table5_tiles(platform: Platform = DEFAULT, tiles: GemmTiles | AResidentGemmTiles | None = None) -> str:
    """``tiles: LOOP-ORDER mg=..`` once when every row runs the same effective tiles, else per shape."""
    effective = table5_tiles(platform, tiles)
    if len(set(effective)) == 1:
        return f"tiles: {effective[0].describe()}"
    return "tiles: " + "; ".join(f"{k}x{n} {t.describe()}" for (k, n, *_), t in zip(TABLE5, effective, strict=True))


def table5_variants(platform: Platform = DEFAULT, tiles: GemmTiles = DEFAULT_TILES) -> list[dict]:
    """The c-stationary kernel's default tiles vs no software pipeline vs naive tiles on one Table 5 shape."""
    out = []
    no_pipeline = GemmTiles(**{**tiles.__dict__, "pipelined": False})
    for name, t in (("c-stationary, pipelined", tiles), ("c-stationary, no software pipeline", no_pipeline),
                    ("c-stationary, naive tiles", NAIVE_TILES)):
        r = gemm_timing(*VARIANT_SHAPE, tiles=t, platform=platform)
        out.append({"variant": name, "loop_order": VARIANT_LOOP_ORDER, "tiles": r.tiles.describe(),
                    "utilization": r.utilization, "latency_ms": r.latency_ms, "stalls": r.stalls,
                    "ddr_bytes": r.ddr_bytes})
    return out


def default_variant(rows: list[Table5Row], platform: Platform = DEFAULT) -> dict | None:
    """The default loop order's Table 5 row at VARIANT_SHAPE in the variants' form (``ddr_bytes``
    None: a Table 5 row does not keep it); None when the rows do not hold that shape."""
    m, k, n = VARIANT_SHAPE
    row = next((r for r in rows if (r.m, r.k, r.n) == (m, k, n)), None)
    if row is None:
        return None
    variant = gemm_variant(DEFAULT_GEMM)
    tiles = variant.plan(m, k, n, variant.default_tiles, platform).tiles
    return {"variant": f"{DEFAULT_GEMM} (default)", "loop_order": DEFAULT_GEMM, "tiles": tiles.describe(),
            "utilization": row.utilization, "latency_ms": row.latency_ms, "stalls": row.stalls, "ddr_bytes": None}


def format_variants(variants: list[dict]) -> str:
    m, k, n = VARIANT_SHAPE
    lines = [f"Why ({m}x{k}x{n}; stalls in DSP-cycles, summed over DSPs; the pipeline and tile variants are of "
             f"the {VARIANT_LOOP_ORDER} loop order):"]
    for v in variants:
        s = v["stalls"]
        ddr = "-" if v.get("ddr_bytes") is None else f"{v['ddr_bytes'] / 1e6:7.1f} MB"
        lines.append(f"  {v['variant']:34s} util {100 * v['utilization']:6.2f}%  dma_wait {s['dma_wait']:>11,}  "
                     f"barrier {s['barrier']:>11,}  latency {s['latency']:>9,}  DDR {ddr:>10}")
        lines.append(f"  {'':34s} tiles {v['tiles']}")
    return "\n".join(lines)


def format_table5(rows: list[Table5Row]) -> str:
    lines = ["GEMM (M x K x N)        util    paper   delta   lat ms  paper   T MAC/s  status",
             "-" * 82]
    for r in rows:
        mark = "ok" if r.ok else "MISS"
        role = "fit" if r.fit else "held out"
        lines.append(f"{r.m}x{r.k}x{r.n:<10} {100 * r.utilization:6.2f}% {100 * r.paper_utilization:6.2f}% "
                     f"{r.delta_pp:+6.2f}  {r.latency_ms:7.2f} {r.paper_latency_ms:6.2f}  {r.tmac_per_s:6.2f}   "
                     f"{mark} ({role})")
    return "\n".join(lines)


def format_table5_summary(rows: list[Table5Row]) -> str:
    """How many rows meet the tolerance, and which rows were fitted."""
    ok = sum(r.ok for r in rows)
    fit = ", ".join(f"{k}x{n}" for k, n in sorted(FIT_ROWS))
    return (f"{ok}/{len(rows)} rows within {TABLE5_TOLERANCE_PP} pp of the paper (fit rows: {fit}; "
            f"the others are held out)")

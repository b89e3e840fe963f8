"""`mtemu probe`: emulated effective DDR bandwidth of streaming access patterns (mtemu.ddr_probe)."""
from __future__ import annotations

import argparse

from ..errors import MtemuError
from ..platform import load_platform


def run_probe_command(args: argparse.Namespace) -> tuple[dict, str]:
    """Handler: probe every pattern on each requested DSP count; returns (payload, text)."""
    from ..ddr_probe import PAPER_EFFECTIVE_DDR, format_probe, probe
    plat = load_platform(args.platform)
    counts = args.dsps or [plat.dsps]
    for n in counts:
        if not 1 <= n <= plat.dsps:
            raise MtemuError(f"--dsps {n}: must be in 1..{plat.dsps} (the platform's DSP count)")
    results = [r for n in counts for r in probe(plat, dsps=n)]
    payload = {"platform": plat.name, "platform_hash": plat.digest(), "platform_file": args.platform,
               "nominal_ddr_bandwidth": plat.ddr_bandwidth, "dma_latency_cycles": plat.dma_latency_cycles,
               "dma_row_overhead_cycles": plat.dma_row_overhead_cycles,
               "paper_effective_ddr_bandwidth": PAPER_EFFECTIVE_DDR,
               "results": [r.to_json() for r in results]}
    source = args.platform or "default platform"
    text = (f"{source}: DMA latency {plat.dma_latency_cycles} cycles, row overhead "
            f"{plat.dma_row_overhead_cycles:g} cycles, clock {plat.clock_hz / 1e9:g} GHz\n" + format_probe(results))
    return payload, text


def register(subparsers) -> None:
    p = subparsers.add_parser("probe", help="measure the emulated effective DDR bandwidth of training access patterns")
    p.add_argument("--platform", metavar="FILE", help="TOML or JSON file of platform fields (default: built-in)")
    p.add_argument("--dsps", type=int, nargs="+", metavar="N",
                   help="active DSP counts to probe (default: all of the platform's; e.g. --dsps 24 1)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(handler=run_probe_command)

"""Where the cycles went: which resource bounds a run, with the numbers.

From a run's counters (:class:`~mtemu.machine.RunStats`, and its trace if it has one):

- *throughput bounds*, each a lower bound on the makespan from one resource alone: VMAC issue
  (the busiest DSP's VMAC instructions, one per cycle), DDR, GSM and the busiest local SM<->AM
  engine (the cycles the machine held each DMA server: bytes / (bandwidth / clock) + rows x row
  overhead). ``share`` = bound / emulated cycles: 1.0 means that resource was busy the whole run;
- *stall shares*: the fraction of all DSP-cycles spent issuing, padding for latency or a branch
  (``latency``), waiting for a DMA (``dma_wait``), at a barrier, or idle after halting
  (``imbalance``).

The binding resource is the largest of: the throughput shares, the pipeline-latency share
(latency + branch), the DMA-latency share (``dma_wait``) and the barrier share (barrier +
imbalance). A DDR-bound kernel shows DDR near 1.0 and its DSPs waiting; a kernel whose DMAs are
too small or too serial shows no busy server and a large ``dma_wait`` share.

For a GEMM the closed form (:mod:`mtemu.kernels.gemm_bound`) adds what a tile change would move:
DDR bytes per MAC, DDR and VMAC cycles and the bound's utilization with ``mg``, ``k2`` or ``n2``
halved or doubled. :func:`plot_roofline` draws the run against the platform's compute, DDR and
GSM ceilings.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from rtcommon.fileio import atomic_write_figure

from . import isa
from .errors import AssemblyError, CapacityError
from .kernels.gemm import DEFAULT_TILES, GemmTiles, build_gemm, plan_gemm
from .kernels.gemm_a_resident import AResidentGemmTiles, a_resident_timing, plan_a_resident
from .kernels.gemm_bound import a_resident_bound, gemm_bound
from .machine import S_BUSY0, Cluster, RunStats
from .platform import DEFAULT, Platform
from .trace import Trace, TraceOptions

THROUGHPUT = ("VMAC issue", "DDR", "GSM", "local DMA")
STALL_GROUPS = {"pipeline latency": ("latency", "branch"), "DMA latency": ("dma_wait",),
                "barriers": ("barrier", "imbalance")}
TILE_FIELDS = ("mg", "k2", "n2")


@dataclass
class Bound:
    resource: str
    cycles: float           # lower bound on the makespan from this resource alone
    share: float            # cycles / emulated cycles
    detail: str


@dataclass
class Explanation:
    """Why a run took the cycles it took (all figures from the emulated run and the platform)."""

    cycles: int
    dsps: int
    clock_hz: float
    bounds: list[Bound]
    stall_share: dict[str, float]         # fraction of DSP-cycles per state
    group_share: dict[str, float]         # pipeline latency, DMA latency, barriers
    server_busy: dict[str, float]         # busy fraction of each DMA server
    binding: str
    verdict: str
    macs: int
    mac_per_s: float
    peak_mac_per_s: float
    ddr_bytes: int
    gsm_bytes: int
    ddr_bandwidth: float
    gsm_bandwidth: float
    gemm: dict | None = None              # closed form and tile moves (GEMM only)
    timeline: dict | None = None          # from the trace, if recorded
    notes: list[str] = field(default_factory=list)

    @property
    def utilization(self) -> float:
        return self.mac_per_s / self.peak_mac_per_s

    def intensity(self, memory: str) -> float | None:
        """MACs per byte through DDR or GSM (None when nothing moved)."""
        nbytes = self.ddr_bytes if memory == "ddr" else self.gsm_bytes
        return self.macs / nbytes if nbytes else None

    def to_json(self) -> dict:
        d = asdict(self)
        d["utilization"] = self.utilization
        d["intensity"] = {"ddr": self.intensity("ddr"), "gsm": self.intensity("gsm")}
        return d

    def text(self) -> str:
        lines = [f"bound by {self.binding}: {self.verdict}",
                 f"  {self.cycles} cycles, {100 * self.utilization:.2f}% of peak "
                 f"({self.mac_per_s / 1e12:.3f} of {self.peak_mac_per_s / 1e12:.3f} T MAC/s)",
                 "  resource      bound cycles   share of run"]
        for b in self.bounds:
            lines.append(f"  {b.resource:12s} {b.cycles:14.0f}   {100 * b.share:6.1f}%   {b.detail}")
        lines.append("  DSP time: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in self.stall_share.items()))
        lines.append("  DMA busy: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in self.server_busy.items()))
        for memory in ("ddr", "gsm"):
            x = self.intensity(memory)
            if x is not None:
                lines.append(f"  {memory.upper()} intensity {x:.2f} MAC/byte "
                             f"(ridge {self.peak_mac_per_s / getattr(self, memory + '_bandwidth'):.2f})")
        if self.gemm:
            g = self.gemm
            lines.append(f"  closed form: DDR {g['ddr_cycles']:.0f} / VMAC {g['compute_cycles']} cycles, "
                         f"{g['ddr_bytes_per_mac']:.4f} DDR bytes per MAC, at most {100 * g['utilization']:.2f}%")
            for mv in g["moves"]:
                if mv["fits"] and mv["unchanged"]:
                    lines.append(f"    {mv['field']} {mv['from']} -> {mv['to']}: no change (clipped to the shape)")
                elif mv["fits"]:
                    lines.append(f"    {mv['field']} {mv['from']} -> {mv['to']}: {mv['ddr_bytes_per_mac']:.4f} B/MAC, "
                                 f"DDR {mv['ddr_cycles']:.0f} cycles, bound {100 * mv['utilization']:.2f}%")
                else:
                    lines.append(f"    {mv['field']} {mv['from']} -> {mv['to']}: {mv['reason']}")
        if self.timeline:
            t = self.timeline
            tenths = " ".join(f"{100 * x:.0f}%" for x in t["ddr_busy_by_tenth"])
            lines.append(f"  DDR busy by tenth of the run: {tenths}")
            lines.append(f"  barriers: {t['barriers']}, mean span {t['barrier_mean_cycles']:.0f} cycles")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _busy_by_bins(start: np.ndarray, end: np.ndarray, horizon: float, bins: int) -> list[float]:
    """Busy fraction of a server in ``bins`` equal slices of [0, horizon)."""
    edges = np.linspace(0.0, horizon, bins + 1)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        overlap = np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0.0, None).sum()
        out.append(float(overlap / (hi - lo)) if hi > lo else 0.0)
    return out


def _timeline(trace: Trace) -> dict:
    ints, times = trace.transfers()
    horizon = max(trace.cycles, 1)
    out = {}
    for name, srv in (("ddr", 0), ("gsm", 1)):
        sel = ints[:, 1] == srv
        out[f"{name}_busy_by_tenth"] = _busy_by_bins(times[sel, 0], times[sel, 1], horizon, 10)
    bars = trace.barrier_spans()
    out["barriers"] = trace.barrier_total
    out["barrier_mean_cycles"] = float((bars[:, 1] - bars[:, 0]).mean()) if len(bars) else 0.0
    out["dropped"] = trace.dropped
    return out


def explain(stats: RunStats, *, useful_macs: int | None = None, gemm: dict | None = None) -> Explanation:
    """Explain one run. ``useful_macs`` defaults to VFMA issues x lanes; ``gemm`` is closed-form detail."""
    p = stats.platform
    cycles = max(stats.cycles, 1)
    vmac = stats.per_dsp[:, S_BUSY0 + isa.VMAC]
    busiest = int(vmac.max()) if vmac.size else 0
    local = {k: v for k, v in stats.server_busy.items() if k.startswith("local")}
    # the busiest engine; ties go to the lowest DSP
    local_name, local_busy = max(local.items(), key=lambda kv: (kv[1], -int(kv[0][5:])), default=("local0", 0.0))
    bpc = {name: bw / p.clock_hz for name, bw in (("ddr", p.ddr_bandwidth), ("gsm", p.gsm_bandwidth))}
    bounds = [
        Bound("VMAC issue", float(busiest), busiest / cycles,
              f"busiest DSP issues {busiest} VMAC (mean {vmac.mean():.0f})"),
        Bound("DDR", stats.server_busy.get("ddr", 0.0), stats.server_busy.get("ddr", 0.0) / cycles,
              f"{stats.server_bytes['ddr']} bytes at {bpc['ddr']:.2f} B/cycle + row overhead"),
        Bound("GSM", stats.server_busy.get("gsm", 0.0), stats.server_busy.get("gsm", 0.0) / cycles,
              f"{stats.server_bytes['gsm']} bytes at {bpc['gsm']:.2f} B/cycle + row overhead"),
        Bound("local DMA", local_busy, local_busy / cycles,
              f"busiest engine {local_name.replace('local', 'DSP ')}"),
    ]
    dsp_cycles = p.dsps * cycles
    stalls = stats.stall_cycles()
    issuing = dsp_cycles - sum(stalls.values())
    stall_share = {"issuing": issuing / dsp_cycles, **{k: v / dsp_cycles for k, v in stalls.items()}}
    group_share = {g: sum(stall_share[k] for k in keys) for g, keys in STALL_GROUPS.items()}
    candidates = {b.resource: b.share for b in bounds} | group_share
    binding = max(candidates, key=lambda k: (candidates[k], k))
    candidates |= {k: stall_share[k] for k in ("barrier", "imbalance")}
    macs = int(useful_macs) if useful_macs is not None else stats.vfma * stats.lanes
    server_busy = {"ddr": stats.server_busy.get("ddr", 0.0) / cycles, "gsm": stats.server_busy.get("gsm", 0.0) / cycles,
                   "local_max": local_busy / cycles}
    ex = Explanation(stats.cycles, p.dsps, p.clock_hz, bounds, stall_share, group_share, server_busy, binding,
                     _verdict(binding, candidates), macs, macs / (cycles / p.clock_hz), p.peak_mac_per_s,
                     stats.server_bytes["ddr"], stats.server_bytes["gsm"], p.ddr_bandwidth, p.gsm_bandwidth, gemm)
    if stats.trace is not None:
        ex.timeline = _timeline(stats.trace)
        if stats.trace.truncated:
            ex.notes.append(f"trace truncated: dropped {stats.trace.dropped}")
    return ex


def _verdict(binding: str, shares: dict[str, float]) -> str:
    s = shares[binding]
    if binding == "VMAC issue":
        return f"the busiest DSP issues a VMAC in {100 * s:.0f}% of the cycles; more MACs per cycle need fewer stalls"
    if binding in ("DDR", "GSM", "local DMA"):
        return (f"the {binding} server is busy {100 * s:.0f}% of the run; fewer bytes through it "
                f"(larger tiles, reuse) or a faster server would shorten it")
    if binding == "DMA latency":
        return (f"DSPs spend {100 * s:.0f}% of their time waiting on DMAs while no server is saturated: "
                f"issue transfers earlier (double buffering) or fewer, larger ones")
    if binding == "barriers":
        return (f"DSPs spend {100 * s:.0f}% of their time at barriers ({100 * shares['barrier']:.0f}%) or halted "
                f"while others still run ({100 * shares['imbalance']:.0f}%): balance the work or shorten the "
                f"serial part")
    return f"DSPs spend {100 * s:.0f}% of their time padding for latency or branches: software-pipeline the loop"


# --------------------------------------------------------------------------------------------
# GEMM: the run, the closed form and the tile moves
# --------------------------------------------------------------------------------------------
def gemm_tile_moves(m: int, k: int, n: int, tiles: GemmTiles = DEFAULT_TILES,
                    platform: Platform = DEFAULT) -> dict:
    """Closed-form DDR traffic of the GEMM and how it moves when mg, k2 or n2 halve or double."""
    base = gemm_bound(m, k, n, tiles, platform)
    out = {"ddr_bytes": base.ddr_bytes, "ddr_bytes_per_mac": base.ddr_bytes / base.macs,
           "ddr_cycles": base.ddr_cycles, "compute_cycles": base.compute_cycles, "utilization": base.utilization,
           "bound_by": base.bound, "tiles": asdict(tiles), "moves": []}
    now_eff = plan_gemm(m, k, n, tiles, platform).tiles
    for name in TILE_FIELDS:
        now = getattr(tiles, name)
        for factor in (0.5, 2):
            to = max(1, int(now * factor))
            move = {"field": name, "from": now, "to": to}
            moved = replace(tiles, **{name: to})
            try:
                b = gemm_bound(m, k, n, moved, platform)
            except (CapacityError, AssemblyError) as exc:
                move.update(fits=False, reason=f"does not fit: {exc}")
            else:
                # tiles are clipped to the shape: a move may change nothing
                same = plan_gemm(m, k, n, moved, platform).tiles == now_eff
                move.update(fits=True, unchanged=same, ddr_bytes_per_mac=b.ddr_bytes / b.macs,
                            ddr_cycles=b.ddr_cycles, compute_cycles=b.compute_cycles, utilization=b.utilization)
            out["moves"].append(move)
    return out


def run_gemm_stats(m: int, k: int, n: int, tiles: GemmTiles = DEFAULT_TILES, platform: Platform = DEFAULT,
                   trace: TraceOptions | None = None) -> RunStats:
    """The emulated GEMM in timing mode (the program ``mtemu gemm`` runs), optionally traced."""
    gp = build_gemm(m, k, n, tiles, platform)
    cluster = Cluster(platform, ddr_bytes=gp.plan.ddr_bytes, functional=False)
    return cluster.run([gp.program], init_sregs=gp.init_sregs, dsp_descriptors=gp.dsp_descriptors, trace=trace)


def explain_gemm(m: int, k: int, n: int, tiles: GemmTiles | AResidentGemmTiles = DEFAULT_TILES,
                 platform: Platform = DEFAULT, trace: TraceOptions | None = None) -> tuple[Explanation, RunStats]:
    """Explain the GEMM of ``tiles``' loop order. The closed form's tile moves are the c-stationary
    kernel's (its bound is the one :func:`gemm_tile_moves` moves); an a-resident run names its bound."""
    if isinstance(tiles, AResidentGemmTiles):
        stats = a_resident_timing(m, k, n, tiles=tiles, platform=platform, trace=trace).stats
        ex = explain(stats, useful_macs=m * k * n)
        eff = plan_a_resident(m, k, n, tiles, platform).tiles
        ex.notes.append(f"closed-form bound of this loop order: at most "
                        f"{100 * a_resident_bound(m, k, n, eff.mg, eff.kg, eff.n2, platform):.2f}% "
                        "(tile moves: --loop-order c-stationary)")
        return ex, stats
    stats = run_gemm_stats(m, k, n, tiles, platform, trace)
    return explain(stats, useful_macs=m * k * n, gemm=gemm_tile_moves(m, k, n, tiles, platform)), stats


# --------------------------------------------------------------------------------------------
# roofline
# --------------------------------------------------------------------------------------------
def plot_roofline(ex: Explanation, path: str | Path, title: str | None = None) -> None:
    """PNG: achieved MAC/s against MACs per byte, under the compute, DDR and GSM ceilings."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = {m: ex.intensity(m) for m in ("ddr", "gsm")}
    xs = [x for x in points.values() if x]
    ridge = [ex.peak_mac_per_s / ex.ddr_bandwidth, ex.peak_mac_per_s / ex.gsm_bandwidth]
    lo = min(xs + ridge) / 8
    hi = max(xs + ridge) * 8
    x = np.geomspace(lo, hi, 200)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(x, np.full_like(x, ex.peak_mac_per_s), color="black", lw=1.5,
            label=f"compute peak {ex.peak_mac_per_s / 1e12:.2f} T MAC/s")
    for memory, color in (("ddr", "tab:red"), ("gsm", "tab:blue")):
        bw = getattr(ex, memory + "_bandwidth")
        ax.plot(x, np.minimum(bw * x, ex.peak_mac_per_s), color=color, lw=1.2, ls="--",
                label=f"{memory.upper()} {bw / 1e9:.0f} GB/s")
        if points[memory] and ex.mac_per_s > 0:
            ax.plot([points[memory]], [ex.mac_per_s], "o", color=color, ms=7,
                    label=f"run vs {memory.upper()}: {points[memory]:.2f} MAC/B")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("MACs per byte moved through the memory")
    ax.set_ylabel("MAC/s")
    floor = ex.mac_per_s if ex.mac_per_s > 0 else ex.peak_mac_per_s / 1e4
    ax.set_ylim(min(floor, ex.peak_mac_per_s) / 20, ex.peak_mac_per_s * 3)
    ax.set_title(title or f"bound by {ex.binding}: {100 * ex.utilization:.1f}% of peak")
    ax.grid(True, which="both", alpha=0.3)
    # below the axes: a run of low MAC/s at a high intensity is plotted where "lower right" would sit
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    atomic_write_figure(path, fig)

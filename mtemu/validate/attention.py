"""Paper Fig. 10: the resident Algorithm-1 attention backward over its DDR-staged baseline, from
emulated cycles only."""
from __future__ import annotations

import hashlib
import json

from rtcommon import caches
from rtcommon.cache import check_fields, read_json_cache, write_json_cache
from rtcommon.progress import Progress

from ..kernels.attention import attention_backward_timing
from ..platform import DEFAULT, Platform, as_platform
from ..version import emulator_version

PAPER_SPEEDUP = (1.24, 1.54)     # Fig. 10 range; a target only
VALIDATE_SEQS = (512, 1024, 2048, 4096)


def validate_heads(seq: int, platform: Platform = DEFAULT) -> int:
    """Query heads (one shared KV head) giving about two full rounds of work items: enough to
    show the steady state while every sequence length emulates in seconds."""
    n_qt = -(-seq // platform.vector_lanes)
    return max(1, round(2 * platform.dsps / n_qt))


# what a row reads of one emulated backward (an entry of the ``fig10`` cache)
RUN_FIELDS = ("schedule", "cycles", "latency_ms", "utilization", "ddr_bytes")


def _valid_run(data: dict) -> str | None:
    """None if a cached run is possible: whole positive cycles, positive latency, utilization in (0, 1]."""
    if data.get("schedule") not in ("gsm", "broadcast", "own"):
        return "field 'schedule' is not a K/V schedule"
    return check_fields(data, {"cycles": (1, 2 ** 62, True), "latency_ms": (1e-15, 1e15),
                               "utilization": (1e-12, 1.0), "ddr_bytes": (0, 2 ** 62, True)})


def _backward_run(heads: int, seq: int, head_dim: int, causal: bool, variant: str, platform: Platform,
                  cache: bool) -> dict:
    """One timing-mode backward's ``RUN_FIELDS``, from the ``fig10`` cache when it holds this run
    (keyed by the shape, the variant, the platform digest and the attention kernels' emulator version)."""
    raw = json.dumps(["attention-bwd", variant, heads, 1, seq, head_dim, causal, platform.digest(),
                      emulator_version("attention")])
    path = caches.path("fig10") / f"{hashlib.sha256(raw.encode()).hexdigest()[:24]}.json"
    hit = read_json_cache(path, _valid_run) if cache else None
    if hit is not None:
        return {k: hit[k] for k in RUN_FIELDS}
    r = attention_backward_timing(heads, 1, seq, head_dim, causal=causal, variant=variant, platform=platform)
    run = {k: getattr(r, k) for k in RUN_FIELDS}
    if cache:
        write_json_cache(path, run)       # an unwritable folder costs the emulation next time, nothing else
    return run


def validate_attention(platform: Platform | None = None, seqs: tuple[int, ...] = VALIDATE_SEQS,
                       head_dim: int = 128, causal: bool = True, progress: bool = False,
                       cache: bool = True) -> list[dict]:
    """Resident (Algorithm 1) vs DDR-staged backward in timing mode, one row per sequence length
    (``progress``: a line on stderr before each emulation, the longest take about a minute).
    ``cache``: each emulated run's numbers are kept (the ``fig10`` cache) and read back on later calls."""
    platform = as_platform(platform)
    say = Progress(progress)
    rows = []
    for i, seq in enumerate(seqs):
        heads = validate_heads(seq, platform)
        say(f"attention {i + 1}/{len(seqs)}: seq {seq}, {heads} heads, resident backward ...")
        res = _backward_run(heads, seq, head_dim, causal, "resident", platform, cache)
        say(f"attention {i + 1}/{len(seqs)}: seq {seq}, {heads} heads, DDR-staged backward ...")
        stg = _backward_run(heads, seq, head_dim, causal, "ddr-staged", platform, cache)
        rows.append({"seq": seq, "heads": heads, "kv_heads": 1, "head_dim": head_dim, "causal": causal,
                     "schedule": res["schedule"], "speedup": stg["cycles"] / res["cycles"],
                     "resident_ms": res["latency_ms"], "staged_ms": stg["latency_ms"],
                     "resident_utilization": res["utilization"], "staged_utilization": stg["utilization"],
                     "resident_ddr_bytes": res["ddr_bytes"], "staged_ddr_bytes": stg["ddr_bytes"],
                     "paper_speedup_range": list(PAPER_SPEEDUP)})
    return rows


def format_attention(rows: list[dict]) -> str:
    """The rows of ``validate_attention`` as a table, headed by the paper's range."""
    lo, hi = PAPER_SPEEDUP
    lines = [f"attention backward, resident (Algorithm 1) over DDR-staged; paper Fig. 10: {lo}x-{hi}x",
             f"{'seq':>6} {'heads':>5} {'resident ms':>12} {'staged ms':>10} {'speedup':>8} "
             f"{'util res':>9} {'util stg':>9} {'DDR MB res':>11} {'DDR MB stg':>11}"]
    for r in rows:
        lines.append(f"{r['seq']:>6} {r['heads']:>5} {r['resident_ms']:>12.3f} {r['staged_ms']:>10.3f} "
                     f"{r['speedup']:>7.2f}x {100 * r['resident_utilization']:>8.1f}% "
                     f"{100 * r['staged_utilization']:>8.1f}% {r['resident_ddr_bytes'] / 1e6:>11.1f} "
                     f"{r['staged_ddr_bytes'] / 1e6:>11.1f}")
    return "\n".join(lines)

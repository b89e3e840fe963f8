"""Emulated DDR probe: what bandwidth do memory-bound access patterns actually get?

RATrain quotes "about 30 GB/s effective DDR bandwidth" per cluster. On the emulator that figure
must be a measurement, not a constant: each :class:`ProbePattern` here is a small DMA-only
program (built with :class:`~mtemu.assembler.ProgramBuilder`, run in timing mode on every DSP of
the cluster, or on fewer) whose bytes and emulated cycles give an effective rate,
bytes / (cycles / clock), to set beside the platform's nominal ``ddr_bandwidth``.

Program shape (one per DSP, each DSP on its own DDR region): the chunk loop of a streaming
kernel. A pattern reads some DDR arrays into AM and writes some back per chunk. With
``buffers=2`` (double buffering, every pattern except ``small_256_sync``) chunk i+2's reads are
issued as soon as chunk i's AM slot is free, so one chunk's reads are in flight while the other
slot is used; ``buffers=1`` issues, waits, uses, issues. Writes that leave from a read buffer
(in-place updates: Adam's master/m/v, a copy) make the slot's next read wait for them, as it
must on the real machine. No arithmetic is emulated: it would hide under the DMA anyway
(Adam is ~12 FP32 operations per 28 bytes; the cluster's FP32 vector rate is ~190x the DDR's
byte rate for that mix), so the rates are the DMA-side ceiling of each pattern.

What the machine's DMA model (``mtemu.machine``) can and cannot produce: every DDR transfer of
the cluster queues first-come first-served on one DDR server, starts no earlier than
``dma_latency_cycles`` after issue and holds the server for
``bytes / (ddr_bandwidth / clock) + rows * dma_row_overhead_cycles`` cycles. So an effective rate
below nominal can come only from (a) latency not covered by enough transfers in flight,
(b) per-row overhead of strided transfers, (c) the start-up latency and tail of the run.
Reads and writes share the one server at the same rate (no read/write turnaround, no DRAM
page or refresh model), and one DSP alone can fill the server (no per-engine cap).

Units: bandwidths in bytes/s; "GB/s" in reports is 1e9 bytes/s (the unit of the paper's 30).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from . import isa
from .assembler import Program, ProgramBuilder, ins
from .errors import CapacityError, MtemuError
from .machine import Cluster
from .platform import Platform

KIB = 1024
PAPER_EFFECTIVE_DDR = 30e9      # bytes/s, RATrain's measured effective DDR rate per cluster
R_BASE = 1                      # scalar register holding this DSP's DDR region base


@dataclass(frozen=True)
class Stream:
    """One DDR array a pattern reads or writes: per chunk ``rows`` rows of ``row_bytes`` bytes,
    ``ddr_pitch`` bytes apart in DDR (``== row_bytes``: contiguous). Chunk i starts
    ``rows * ddr_pitch`` bytes after chunk i-1. A write with ``am_source`` leaves from that read
    stream's AM buffer (in place); otherwise from its own buffer."""

    name: str
    rows: int
    row_bytes: int
    ddr_pitch: int
    am_source: str | None = None

    @property
    def bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def ddr_span(self) -> int:
        return self.rows * self.ddr_pitch


def contiguous(name: str, nbytes: int, am_source: str | None = None) -> Stream:
    """A single-row stream of ``nbytes`` contiguous bytes per chunk."""
    return Stream(name, 1, nbytes, nbytes, am_source)


@dataclass(frozen=True)
class ProbePattern:
    """A named DDR access pattern: ``chunks`` chunks per DSP, each reading ``reads`` and writing
    ``writes``, with ``buffers`` AM slots (2: double-buffered; 1: issue, wait, use)."""

    name: str
    description: str
    reads: tuple[Stream, ...]
    writes: tuple[Stream, ...]
    chunks: int
    buffers: int = 2

    @property
    def in_place(self) -> bool:
        return any(w.am_source is not None for w in self.writes)

    @property
    def read_bytes_per_chunk(self) -> int:
        return sum(s.bytes for s in self.reads)

    @property
    def write_bytes_per_chunk(self) -> int:
        return sum(s.bytes for s in self.writes)


# Mixed-precision Adam per chunk of P parameters (ratrain.cost.terms.ADAM_BYTES_PER_PARAM = 28):
# reads FP32 master, m, v and the FP16 gradient (the project keeps gradients in FP16,
# ratrain.spec.memory.GRAD_BYTES); writes FP32 master, m, v in place and the FP16 working weights.
ADAM_PARAMS_PER_CHUNK = 8192
_P = ADAM_PARAMS_PER_CHUNK
MATRIX_PITCH = 16 * KIB          # a row-major FP16 matrix 8192 columns wide

PATTERNS: tuple[ProbePattern, ...] = (
    ProbePattern("bulk_read", "contiguous DDR->AM, 256 KiB blocks",
                 (contiguous("x", 256 * KIB),), (), chunks=8),
    ProbePattern("bulk_write", "contiguous AM->DDR, 256 KiB blocks",
                 (), (contiguous("y", 256 * KIB),), chunks=8),
    ProbePattern("strided_2k", "64 rows x 2 KiB of a row-major tile (pitch 16 KiB) DDR->AM",
                 (Stream("tile", 64, 2 * KIB, MATRIX_PITCH),), (), chunks=16),
    ProbePattern("strided_256", "256 rows x 256 B of a row-major tile (pitch 16 KiB) DDR->AM",
                 (Stream("tile", 256, 256, MATRIX_PITCH),), (), chunks=32),
    ProbePattern("small_256", "256 B transfers back to back, double-buffered",
                 (contiguous("x", 256),), (), chunks=256),
    ProbePattern("small_1k", "1 KiB transfers back to back, double-buffered",
                 (contiguous("x", KIB),), (), chunks=128),
    ProbePattern("small_4k", "4 KiB transfers back to back, double-buffered",
                 (contiguous("x", 4 * KIB),), (), chunks=64),
    ProbePattern("small_256_sync", "256 B transfers, single-buffered (issue, wait, issue)",
                 (contiguous("x", 256),), (), chunks=128, buffers=1),
    ProbePattern("read_write", "stream in, stream out 1:1 (64 KiB each, separate out buffer)",
                 (contiguous("x", 64 * KIB),), (contiguous("y", 64 * KIB),), chunks=16),
    ProbePattern("param_copy", "DDR->DDR copy through AM (128 KiB chunks, written from the read buffer)",
                 (contiguous("src", 128 * KIB),), (contiguous("dst", 128 * KIB, am_source="src"),), chunks=8),
    ProbePattern("adam", f"mixed-precision Adam, {_P} params/chunk: read FP32 master,m,v + FP16 grad; "
                 "write FP32 master,m,v (in place) + FP16 weights",
                 (contiguous("master", 4 * _P), contiguous("m", 4 * _P), contiguous("v", 4 * _P),
                  contiguous("grad", 2 * _P)),
                 (contiguous("master_out", 4 * _P, am_source="master"), contiguous("m_out", 4 * _P, am_source="m"),
                  contiguous("v_out", 4 * _P, am_source="v"), contiguous("weight16", 2 * _P)), chunks=8),
    ProbePattern("grad_accumulate", "FP16 gradient accumulation: read acc + new (64 KiB each), write acc in place",
                 (contiguous("acc", 64 * KIB), contiguous("new", 64 * KIB)),
                 (contiguous("acc_out", 64 * KIB, am_source="acc"),), chunks=16),
)
PATTERNS_BY_NAME = {p.name: p for p in PATTERNS}

@dataclass(frozen=True)
class ProbeResult:
    pattern: str
    description: str
    dsps: int
    bytes_read: int
    bytes_written: int
    cycles: int
    clock_hz: float
    nominal_bandwidth: float     # the platform's ddr_bandwidth, bytes/s

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def seconds(self) -> float:
        return self.cycles / self.clock_hz

    @property
    def effective_bandwidth(self) -> float:
        """Bytes moved over emulated wall time, bytes/s."""
        return self.bytes / self.seconds

    @property
    def ratio_to_nominal(self) -> float:
        return self.effective_bandwidth / self.nominal_bandwidth

    @property
    def ratio_to_paper(self) -> float:
        return self.effective_bandwidth / PAPER_EFFECTIVE_DDR

    def to_json(self) -> dict:
        return {"pattern": self.pattern, "description": self.description, "dsps": self.dsps,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written, "bytes": self.bytes,
                "cycles": self.cycles, "seconds": self.seconds, "effective_bandwidth": self.effective_bandwidth,
                "nominal_bandwidth": self.nominal_bandwidth, "ratio_to_nominal": self.ratio_to_nominal,
                "paper_effective_bandwidth": PAPER_EFFECTIVE_DDR, "ratio_to_paper": self.ratio_to_paper}


# --- program construction ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """Where each stream lives: DDR offset within the DSP's region, AM offset per slot."""

    ddr: dict[str, int]
    am: dict[str, tuple[int, ...]]
    region_bytes: int
    am_bytes: int


def _align(x: int, a: int = 64) -> int:
    return (x + a - 1) // a * a


def _layout(pattern: ProbePattern) -> _Layout:
    ddr, off = {}, 0
    for s in (*pattern.reads, *pattern.writes):
        ddr[s.name] = off
        off += _align(pattern.chunks * s.ddr_span)
    am: dict[str, list[int]] = {}
    am_off = 0
    for _ in range(pattern.buffers):
        for s in pattern.reads:
            am.setdefault(s.name, []).append(am_off)
            am_off += _align(s.bytes)
        for s in pattern.writes:
            if s.am_source is None:
                am.setdefault(s.name, []).append(am_off)
                am_off += _align(s.bytes)
    return _Layout(ddr, {k: tuple(v) for k, v in am.items()}, off, am_off)


def _check_pattern(pattern: ProbePattern, platform: Platform) -> None:
    if not pattern.reads and not pattern.writes:
        raise MtemuError(f"probe pattern '{pattern.name}': no streams")
    if pattern.chunks <= 0:
        raise MtemuError(f"probe pattern '{pattern.name}': chunks must be positive, got {pattern.chunks}")
    if not 1 <= pattern.buffers <= platform.dma_channels // 2:
        raise MtemuError(f"probe pattern '{pattern.name}': buffers must be 1..{platform.dma_channels // 2} "
                         f"(two DMA channels per buffer), got {pattern.buffers}")
    names = [s.name for s in (*pattern.reads, *pattern.writes)]
    if len(set(names)) != len(names):
        raise MtemuError(f"probe pattern '{pattern.name}': stream names repeat: {names}")
    reads = {s.name: s for s in pattern.reads}
    for s in (*pattern.reads, *pattern.writes):
        if s.rows <= 0 or s.row_bytes <= 0 or s.row_bytes % 4 or s.ddr_pitch < s.row_bytes:
            raise MtemuError(f"probe pattern '{pattern.name}', stream '{s.name}': need rows > 0, row_bytes a "
                             f"positive multiple of 4 and ddr_pitch >= row_bytes (got {s.rows}, {s.row_bytes}, "
                             f"{s.ddr_pitch})")
    for w in pattern.writes:
        if w.am_source is not None and (w.am_source not in reads or reads[w.am_source].bytes != w.bytes):
            raise MtemuError(f"probe pattern '{pattern.name}', stream '{w.name}': am_source '{w.am_source}' "
                             "must name a read stream of the same size")


def build_probe_program(pattern: ProbePattern, platform: Platform) -> tuple[Program, _Layout]:
    """The chunk loop of ``pattern`` for one DSP (unrolled; DDR addresses relative to ``s1``)."""
    _check_pattern(pattern, platform)
    lay = _layout(pattern)
    if lay.am_bytes > platform.am_bytes:
        raise CapacityError(f"AM: probe pattern '{pattern.name}' needs {lay.am_bytes} bytes of buffers, "
                            f"{lay.am_bytes - platform.am_bytes} more than the {platform.am_bytes}-byte AM")
    b = ProgramBuilder(platform)
    nbuf, n = pattern.buffers, pattern.chunks
    ch_read = list(range(nbuf))                  # one channel per slot for its reads ...
    ch_write = [nbuf + s for s in range(nbuf)]   # ... and one for its writes (waits are per slot)
    rdesc = {s.name: b.descriptor("DDR", "AM", s.rows, s.row_bytes, s.ddr_pitch, s.row_bytes) for s in pattern.reads}
    wdesc = {s.name: b.descriptor("AM", "DDR", s.rows, s.row_bytes, s.row_bytes, s.ddr_pitch) for s in pattern.writes}

    def issue_reads(i: int) -> None:
        for s in pattern.reads:
            b.bundle(ins("dma", ch_read[i % nbuf], rdesc[s.name], (R_BASE, lay.ddr[s.name] + i * s.ddr_span),
                         (isa.ZERO_REG, lay.am[s.name][i % nbuf])))

    def issue_writes(i: int) -> None:
        for s in pattern.writes:
            am = lay.am[s.am_source or s.name][i % nbuf]
            b.bundle(ins("dma", ch_write[i % nbuf], wdesc[s.name], (isa.ZERO_REG, am),
                         (R_BASE, lay.ddr[s.name] + i * s.ddr_span)))

    if pattern.reads:
        for j in range(min(nbuf, n)):
            issue_reads(j)
    for i in range(n):
        slot = i % nbuf
        if pattern.reads:
            b.bundle(ins("dmawait", ch_read[slot]))
        if pattern.writes:
            if not pattern.in_place and i >= nbuf:
                b.bundle(ins("dmawait", ch_write[slot]))     # the slot's out buffer is refilled by chunk i
            issue_writes(i)
        if pattern.reads and i + nbuf < n:
            if pattern.in_place:
                b.bundle(ins("dmawait", ch_write[slot]))     # the next read overwrites what these writes read
            issue_reads(i + nbuf)
    if pattern.writes:
        for ch in ch_write[:min(nbuf, n)]:
            b.bundle(ins("dmawait", ch))
    b.bundle(ins("halt"))
    return b.assemble(), lay


def _idle_program(platform: Platform) -> Program:
    b = ProgramBuilder(platform)
    b.bundle(ins("halt"))
    return b.assemble()


def run_pattern(pattern: ProbePattern, platform: Platform, dsps: int | None = None) -> ProbeResult:
    """Run ``pattern`` on the first ``dsps`` DSPs (default all; the rest halt at once) in timing mode."""
    dsps = platform.dsps if dsps is None else dsps
    if isinstance(dsps, bool) or not isinstance(dsps, int) or not 1 <= dsps <= platform.dsps:
        raise MtemuError(f"probe: dsps must be an integer in 1..{platform.dsps}, got {dsps!r}")
    program, lay = build_probe_program(pattern, platform)
    ddr = dsps * lay.region_bytes
    if ddr > platform.ddr_bytes:
        raise CapacityError(f"DDR: probe pattern '{pattern.name}' on {dsps} DSPs needs {ddr} bytes, "
                            f"more than the platform's {platform.ddr_bytes}")
    cluster = Cluster(platform, ddr_bytes=ddr, functional=False)
    which = [0 if d < dsps else 1 for d in range(platform.dsps)]
    stats = cluster.run([program, _idle_program(platform)], dsp_program=which,
                        init_sregs={d: {R_BASE: d * lay.region_bytes} for d in range(dsps)})
    read = dsps * pattern.chunks * pattern.read_bytes_per_chunk
    written = dsps * pattern.chunks * pattern.write_bytes_per_chunk
    if stats.server_bytes["ddr"] != read + written:       # the program moves exactly the pattern's bytes
        raise MtemuError(f"probe pattern '{pattern.name}': machine moved {stats.server_bytes['ddr']} DDR bytes, "
                         f"expected {read + written}")
    return ProbeResult(pattern.name, pattern.description, dsps, read, written, stats.cycles, platform.clock_hz,
                       platform.ddr_bandwidth)


def probe(platform: Platform, dsps: int = 24, patterns: tuple[ProbePattern, ...] = PATTERNS) -> list[ProbeResult]:
    """Every pattern on ``dsps`` DSPs of ``platform`` (capped at the platform's DSP count)."""
    return [run_pattern(p, platform, min(dsps, platform.dsps)) for p in patterns]


@functools.lru_cache(maxsize=256)
def _pattern_bandwidth(platform: Platform, pattern: str) -> float:
    # Platform is a frozen dataclass: its hash and equality are those of its fields, so the
    # cache is keyed on every field (a changed ddr_bandwidth or latency is a different key).
    return run_pattern(PATTERNS_BY_NAME[pattern], platform).effective_bandwidth


def pattern_bandwidth(platform: Platform, pattern: str) -> float:
    """Emulated effective DDR rate (bytes/s) of the probe pattern named ``pattern`` (``PATTERNS``) on
    all DSPs of ``platform``; cached per (platform, pattern). Which pattern models which part of a
    training step is the caller's business (ratrain: ``ratrain.cost.ddr_terms``)."""
    if pattern not in PATTERNS_BY_NAME:
        raise MtemuError(f"unknown DDR probe pattern {pattern!r} (known: {', '.join(PATTERNS_BY_NAME)})")
    return _pattern_bandwidth(platform, pattern)


def format_probe(results: list[ProbeResult]) -> str:
    """A table of effective rates beside the nominal rate and the paper's 30 GB/s (GB = 1e9 bytes)."""
    if not results:
        return "(no probe results)"
    nominal = {r.nominal_bandwidth for r in results}
    head = (f"DDR probe: nominal {', '.join(f'{x / 1e9:g}' for x in sorted(nominal))} GB/s, "
            f"paper's effective {PAPER_EFFECTIVE_DDR / 1e9:g} GB/s (GB = 1e9 bytes)")
    lines = [head, f"{'pattern':16s} {'DSPs':>4s} {'MiB moved':>10s} {'cycles':>11s} {'GB/s':>7s} "
             f"{'/nominal':>8s} {'/30 GB/s':>8s}  description", "-" * 100]
    for r in results:
        lines.append(f"{r.pattern:16s} {r.dsps:4d} {r.bytes / 2**20:10.2f} {r.cycles:11,d} "
                     f"{r.effective_bandwidth / 1e9:7.2f} {r.ratio_to_nominal:8.3f} {r.ratio_to_paper:8.3f}  "
                     f"{r.description}")
    near = [r.pattern for r in results if abs(r.ratio_to_paper - 1) <= 0.1]
    lines.append(f"within 10% of 30 GB/s: {', '.join(near) if near else 'none'}")
    return "\n".join(lines)


def closed_form_single_transfer_cycles(nbytes: int, rows: int, platform: Platform) -> int:
    """Completion cycle of one DDR transfer issued at cycle 0 on an idle server (the machine's model)."""
    return math.ceil(platform.dma_latency_cycles + nbytes / (platform.ddr_bandwidth / platform.clock_hz)
                     + rows * platform.dma_row_overhead_cycles)


__all__ = ["ADAM_PARAMS_PER_CHUNK", "PAPER_EFFECTIVE_DDR", "PATTERNS", "PATTERNS_BY_NAME", "ProbePattern",
           "ProbeResult", "Stream", "build_probe_program", "closed_form_single_transfer_cycles",
           "contiguous", "format_probe", "pattern_bandwidth", "probe", "run_pattern"]

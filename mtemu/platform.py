"""Platform spec of one MT-3000 acceleration cluster.

Defaults come from docs/reference/mt3000-facts.md and the RATrain paper; every field can be
overridden from a TOML/JSON file or keyword arguments ("what if AM were 1 MB").

Peak derivation (docs/CHOICES.md, "mtemu platform"): the paper's Table 5 implies 8.1 T MAC/s per
cluster. One VMAC issue slot in RATrain's 8-lane abstraction stands for the DSP's three hardware
FP16 MAC pipes of 64 lanes each, so a VMAC instruction performs ``vector_lanes`` = 192 MACs.
24 DSPs x 192 MAC/cycle x f = 8.1e12 gives f = 1.7578125 GHz, inside the 1.65-1.8 GHz that
deployed parts reach in open GEMM code.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from rtcommon.checks import checked_number
from rtcommon.jsonio import load_table_file

from .errors import PlatformError

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class Latencies:
    """Result latencies in cycles (exposed pipeline: software must wait this long)."""

    scalar_load: int = 7
    broadcast: int = 4
    vmac: int = 6
    vector_load: int = 9
    vector_store: int = 4
    scalar_alu: int = 1
    branch_delay: int = 6   # cycles lost on a taken branch (delay slots are not filled)


@dataclass(frozen=True)
class Platform:
    name: str = "mt3000"
    dsps: int = 24
    sm_bytes: int = 64 * KIB
    am_bytes: int = 768 * KIB
    gsm_bytes: int = 6 * MIB
    ddr_bytes: int = 20 * 1024 * MIB          # usable DDR per cluster for training
    clock_hz: float = 1.7578125e9
    vector_lanes: int = 192                    # MACs per VMAC instruction (3 pipes x 64 FP16)
    scalar_registers: int = 64
    vector_registers: int = 64
    ddr_bandwidth: float = 51e9                # B/s, the chip's raw DDR rate per cluster (204 GB/s over 4)
    gsm_bandwidth: float = 120e9               # B/s, GSM port shared by the cluster's DMA
    local_bandwidth: float = 60e9              # B/s, per-DSP SM<->AM DMA
    dma_channels: int = 8                      # channels per DSP visible to a program
    dma_latency_cycles: int = 600              # issue-to-first-byte latency of a DMA transfer (assumed)
    dma_row_overhead_cycles: float = 0.0       # server cycles per row of a strided transfer (none fitted)
    latencies: Latencies = field(default_factory=Latencies)
    # --- the DSP family's vector data types (docs/DSP-FAMILY.md) ---------------------------
    # One VMAC issue drives ``fma_units`` FMA units, each as wide as one hardware vector of
    # ``vector_bits``; a data type's lanes per issue are fma_units x vector_bits / its width. FP16
    # lanes are ``vector_lanes`` (192 = 3 x 1024 / 16 on MT-3000); FP32 vector ops work on the same
    # lanes (the FP16 kernels' FP32 partial sums). ``fp64_lanes`` = 0: no FP64 vector unit modelled.
    vector_bits: int = 1024
    fma_units: int = 3
    fp64_lanes: int = 0
    dma_issue_cycles: int = 0                  # cycles the issuing DSP spends launching one DMA

    # --- derived figures -------------------------------------------------------------------
    @property
    def peak_macs_per_cycle(self) -> int:
        return self.dsps * self.vector_lanes

    @property
    def peak_mac_per_s(self) -> float:
        return self.peak_macs_per_cycle * self.clock_hz

    @property
    def peak_fp64_flops_per_s(self) -> float:
        """Per DSP: two flops per FP64 lane per cycle (0 without FP64 lanes)."""
        return 2.0 * self.fp64_lanes * self.clock_hz

    def bytes_per_cycle(self, bandwidth: float) -> float:
        return bandwidth / self.clock_hz

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["peak_mac_per_s"] = self.peak_mac_per_s
        d["hash"] = self.digest()
        return d

    def _hashed(self) -> dict[str, Any]:
        """The fields as hashed: the family fields only where they differ from their defaults, so that
        every platform written before they existed keeps its digest (and its caches and profiles)."""
        d = asdict(self)
        for name, default in FAMILY_DEFAULTS.items():
            if d[name] == default:
                d.pop(name)
        return d

    def digest(self) -> str:
        """Stable short hash of every field: keys caches and profiles."""
        raw = json.dumps(self._hashed(), sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:16]

    def timing_digest(self) -> str:
        """Hash of the fields a kernel's emulated cycles can depend on: all but the name and the
        DDR capacity (which only bounds where operands may be placed). Keys latency profiles, so a
        memory-budget study re-uses them."""
        d = self._hashed()
        d.pop("name")
        d.pop("ddr_bytes")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    # --- construction ----------------------------------------------------------------------
    def with_overrides(self, source: str = "overrides", **values: Any) -> "Platform":
        """Return a copy with fields replaced; ``latencies`` may be a dict of latency fields."""
        return _apply(self, values, source)

    @classmethod
    def from_file(cls, path: str | Path) -> "Platform":
        p = Path(path)
        data = load_table_file(p, "platform file", PlatformError)
        return cls.from_dict(data, str(p))

    @classmethod
    def from_dict(cls, data: Any, source: str = "platform") -> "Platform":
        """The cluster part of a platform description: either flat cluster fields, or a combined
        description whose ``[cluster]`` table holds them (its training-side tables are ignored)."""
        if not isinstance(data, dict):
            raise PlatformError(f"{source}: top level must be a table of platform fields")
        data = dict(data)
        # ratrain's platform files name their kind; the emulator is an MT-3000 cluster only
        kind = data.pop("kind", "mt3000")
        if kind != "mt3000":
            what = "is a GPU-cluster platform" if kind == "gpu-cluster" else f"has kind {kind!r}"
            raise PlatformError(f"{source} {what}; the emulator needs an MT-3000 platform (kind 'mt3000' or none)")
        if "cluster" in data:
            foreign = sorted(set(data) - {"cluster", *COMBINED_SECTIONS})
            if foreign:
                raise PlatformError(f"{source}: unknown top-level field(s) {', '.join(foreign)} beside [cluster] "
                                    f"(a combined platform file has: cluster, {', '.join(COMBINED_SECTIONS)})")
            data = data["cluster"]
            if not isinstance(data, dict):
                raise PlatformError(f"{source}: [cluster] must be a table of cluster fields")
            source = f"{source} [cluster]"
            data = dict(data)
        data.pop("hash", None)
        data.pop("peak_mac_per_s", None)
        return _apply(cls(), data, source)


# Top-level entries of a combined platform file that belong to the training side (ratrain reads
# them; the emulator only checks that nothing else sits beside [cluster]).
COMBINED_SECTIONS = ("name", "kind", "training", "kernels", "host", "derived")

_INT_FIELDS = {"dsps", "sm_bytes", "am_bytes", "gsm_bytes", "ddr_bytes", "vector_lanes",
               "scalar_registers", "vector_registers", "dma_channels", "dma_latency_cycles",
               "vector_bits", "fma_units", "fp64_lanes", "dma_issue_cycles"}
_FLOAT_FIELDS = {"clock_hz", "ddr_bandwidth", "gsm_bandwidth", "local_bandwidth",
                 "dma_row_overhead_cycles"}

# Sane range and unit of every numeric field. The bounds keep emulated time and addresses far
# from int64 overflow (sizes <= 2**44 bytes, latencies <= 1e9 cycles) and catch unit slips:
# a bandwidth of 30 is 30 B/s, not 30 GB/s, and would starve every kernel.
RANGES: dict[str, tuple[float, float, str]] = {
    "dsps": (1, 1024, "DSPs"),
    "sm_bytes": (64, 2 ** 32, "bytes"),
    "am_bytes": (64, 2 ** 32, "bytes"),
    "gsm_bytes": (64, 2 ** 40, "bytes"),
    "ddr_bytes": (64, 2 ** 44, "bytes"),
    "clock_hz": (1e6, 1e11, "Hz"),
    "vector_lanes": (2, 65536, "MACs per VMAC"),
    "scalar_registers": (16, 4096, "registers"),
    "vector_registers": (8, 4096, "registers"),
    "ddr_bandwidth": (1e6, 1e16, "bytes/s"),
    "gsm_bandwidth": (1e6, 1e16, "bytes/s"),
    "local_bandwidth": (1e6, 1e16, "bytes/s"),
    "dma_channels": (1, 64, "channels"),
    "dma_latency_cycles": (0, 10 ** 9, "cycles"),
    "dma_row_overhead_cycles": (0, 1e6, "cycles"),
    "vector_bits": (64, 65536, "bits per hardware vector"),
    "fma_units": (1, 64, "FMA units per VMAC issue"),
    "fp64_lanes": (0, 65536, "FP64 lanes per VMAC issue"),
    "dma_issue_cycles": (0, 10 ** 6, "cycles"),
}
LATENCY_RANGE = (0, 10 ** 6)


def _unit_hint(name: str, value: float) -> str:
    """What a too-small value probably meant: 30 for a bandwidth is 30 GB/s, 1.75 for a clock 1.75 GHz."""
    unit = RANGES[name][2]
    if unit in ("bytes/s", "Hz") and 0.01 <= value < 1e4:
        big = "GB/s" if unit == "bytes/s" else "GHz"
        return f" ({name} is in {unit}; for {value:g} {big} write {value:g}e9)"
    if unit == "bytes" and 0 < value < 64:
        return f" ({name} is in bytes; for {value:g} MiB write {int(value * MIB)})"
    return f" ({unit})"


def _check_number(source: str, name: str, value: Any, integer: bool, bounds: tuple[float, float]) -> Any:
    lo, hi = bounds
    hint = (lambda v: _unit_hint(name, v)) if name in RANGES else None
    return checked_number(value, f"{source}: field '{name}'", integer=integer, lo=lo, hi=hi, error=PlatformError,
                          hint=hint, bounds=f"{lo:g}..{hi:g}")


def validate_platform(plat: Any, source: str = "platform") -> "Platform":
    """Check every field of ``plat`` (type, finiteness, sane range, alignment); return it.

    Runs on every platform the CLIs or files build and on every :class:`~mtemu.machine.Cluster`,
    so a NaN clock or a bandwidth in the wrong unit is an error, never a wrong utilization."""
    if not isinstance(plat, Platform):
        raise PlatformError(f"{source}: expected an mtemu Platform, got {type(plat).__name__} "
                            f"(build one with mtemu.load_platform or Platform().with_overrides)")
    if not isinstance(plat.name, str) or not plat.name:
        raise PlatformError(f"{source}: field 'name' must be a non-empty string, got {plat.name!r}")
    for name, (lo, hi, _unit) in RANGES.items():
        _check_number(source, name, getattr(plat, name), name in _INT_FIELDS, (lo, hi))
    if not isinstance(plat.latencies, Latencies):
        raise PlatformError(f"{source}: field 'latencies' must be a Latencies table, got {plat.latencies!r}")
    for f in fields(Latencies):
        _check_number(source, f"latencies.{f.name}", getattr(plat.latencies, f.name), True, LATENCY_RANGE)
    for name in ("sm_bytes", "am_bytes", "gsm_bytes"):
        if getattr(plat, name) % 64:
            raise PlatformError(f"{source}: field '{name}' must be a multiple of 64 bytes")
    if plat.vector_lanes % 2:
        raise PlatformError(f"{source}: field 'vector_lanes' must be even")
    if plat.vector_bits % 64:
        raise PlatformError(f"{source}: field 'vector_bits' must be a multiple of 64 (whole FP64 elements)")
    width = plat.fma_units * plat.vector_bits
    if plat.fp64_lanes and width % (64 * plat.fp64_lanes):
        raise PlatformError(f"{source}: field 'fp64_lanes' = {plat.fp64_lanes} does not divide the vector width: "
                            f"{plat.fp64_lanes} x 64 bits into fma_units x vector_bits = {width} bits")
    return plat


def as_platform(value: Any, who: str = "platform") -> "Platform":
    """A library entry point's ``platform`` argument: None is the default, a Platform is checked,
    anything else (a dict, a file name) is refused with a named error."""
    if value is None:
        return DEFAULT
    return validate_platform(value, who)


def _apply(base: Platform, values: dict[str, Any], source: str) -> Platform:
    known = {f.name for f in fields(Platform)}
    changes: dict[str, Any] = {}
    for name, value in values.items():
        if name not in known:
            raise PlatformError(f"{source}: unknown platform field '{name}' (known: {', '.join(sorted(known))})")
        if name == "latencies":
            if isinstance(value, Latencies):
                changes[name] = value
                continue
            if not isinstance(value, dict):
                raise PlatformError(f"{source}: field 'latencies' must be a table")
            lat_known = {f.name for f in fields(Latencies)}
            lat = {}
            for lname, lval in value.items():
                if lname not in lat_known:
                    raise PlatformError(f"{source}: unknown latency field 'latencies.{lname}'")
                lat[lname] = _check_number(source, f"latencies.{lname}", lval, True, LATENCY_RANGE)
            changes[name] = replace(base.latencies, **lat)
        elif name == "name":
            if not isinstance(value, str) or not value:
                raise PlatformError(f"{source}: field 'name' must be a non-empty string")
            changes[name] = value
        elif name in RANGES:
            changes[name] = _check_number(source, name, value, name in _INT_FIELDS, RANGES[name][:2])
    return validate_platform(replace(base, **changes), source)


DEFAULT = Platform()
# The family fields and their MT-3000 values (left out of digests at these values).
FAMILY_DEFAULTS = {name: getattr(DEFAULT, name) for name in ("vector_bits", "fma_units", "fp64_lanes",
                                                              "dma_issue_cycles")}


def load_platform(path: str | Path | None = None, **overrides: Any) -> Platform:
    """The default platform, optionally from a file, then keyword overrides."""
    plat = Platform.from_file(path) if path else DEFAULT
    if overrides:
        plat = plat.with_overrides("command line", **overrides)
    return plat

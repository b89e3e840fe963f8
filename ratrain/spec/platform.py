"""The training platform: one MT-3000 acceleration cluster as the training side sees it.

One object, one file. A :class:`TrainingPlatform` holds the emulated cluster
(:class:`mtemu.platform.Platform`: memories, clock, DDR, DMA, latencies) and adds only what the
training side needs beyond it:

- ``training``: the inter-cluster link (3.7 GB/s point to point, measured by the paper) and its
  per-message latency (our assumption: the paper gives none; inter-cluster traffic goes through
  the CPU/GP zone and a memory bridge, so we take a software-mediated DMA round of 20
  microseconds, which only matters for small messages: 1 MiB takes about 280 us at 3.7 GB/s);
- ``kernels``: which GEMM loop order the kernel latencies come from, and whether its tiles are
  the defaults or the tuner's best per shape;
- ``host``: the cluster's host side (the chip's CPU side: the link to host memory, host memory
  bandwidth and cores, :class:`ratrain.spec.host.HostSide`), what offloading and a host-side
  optimizer use.

No field is defined twice: the memory budget is the cluster's usable DDR (``ddr_bytes``, 20 GB),
the FP16 peak and the nominal DDR rate are the cluster's, and every bandwidth-bound training term
uses the effective rate the emulator measures for its access pattern (``mtemu.ddr_probe``).
"GB" for the memory budget is 2**30 bytes (docs/CHOICES.md explains why).

File format (TOML or JSON; ``ratrain platform --json`` prints the default): top-level ``name``,
tables ``cluster``, ``training``, ``kernels`` and ``host`` (optional, every field defaulted).
Fields may also be given flat at the top level
(field names do not collide), so a cluster-only file such as ``platforms/mt3000-30gbps.toml``
works too. An unknown field is an error that names it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from mtemu.errors import PlatformError
from mtemu.kernels.names import DEFAULT_GEMM, GEMM_LOOP_ORDERS
from mtemu.platform import DEFAULT as DEFAULT_CLUSTER
from mtemu.platform import Platform
from ratrain.errors import ConfigError
from ratrain.spec.host import HostSide, host_from_table
from rtcommon.checks import is_finite_number, show_value
from rtcommon.jsonio import load_table_file

GIB = 2 ** 30
MT3000_KIND = "mt3000"         # a file's top-level ``kind``; "gpu-cluster" is ratrain.spec.gpu's
TILE_CHOICES = ("default", "tuned")
TRAINING_FIELDS = ("link_bandwidth", "link_latency_s")
KERNEL_FIELDS = ("gemm_loop_order", "tiles")
CLUSTER_FIELDS = tuple(f.name for f in fields(Platform))
# names that read like fields but are derived from others (accepted as overrides, never stored)
ALIASES = {"memory_budget_bytes": "ddr_bytes"}
# printed by `mtemu platform --json`: a file may carry them, but only with the value they derive to
DERIVED_CLUSTER = ("hash", "peak_mac_per_s")
LINK_BANDWIDTH_MAX = 1e16      # bytes/s: the cluster's own bandwidth fields stop there too


@dataclass(frozen=True)
class TrainingPlatform:
    name: str = "mt3000"
    cluster: Platform = field(default_factory=lambda: DEFAULT_CLUSTER)
    link_bandwidth: float = 3.7e9          # bytes/s, inter-cluster point-to-point (paper)
    link_latency_s: float = 20e-6          # per message; assumption, see module docstring
    gemm_loop_order: str = DEFAULT_GEMM    # GEMM variant the kernel latencies come from
    tiles: str = "default"                 # "default" tiles, or the tuner's best per GEMM shape
    host: HostSide = field(default_factory=HostSide)   # the CPU side: host link, memory, cores

    def __post_init__(self) -> None:
        _validate(self, "platform")

    @property
    def kind(self) -> str:
        """The platform kind (``ratrain.spec.platforms`` reads both kinds of file)."""
        return MT3000_KIND

    # --- the cluster's figures, read through -------------------------------------------------
    @property
    def memory_budget_bytes(self) -> int:
        """Usable DDR per cluster for training state (Eq. 10's M_budget)."""
        return self.cluster.ddr_bytes

    @property
    def ddr_bandwidth(self) -> float:
        """Nominal DDR rate (bytes/s); training terms use the measured rate of their pattern."""
        return self.cluster.ddr_bandwidth

    @property
    def peak_mac_per_s(self) -> float:
        return self.cluster.peak_mac_per_s

    # --- construction ------------------------------------------------------------------------
    def with_overrides(self, **overrides: Any) -> TrainingPlatform:
        """A copy with fields replaced: training, kernel or cluster fields by name (and
        ``memory_budget_bytes`` for the cluster's ``ddr_bytes``); unknown names raise ConfigError."""
        return _build(self, {}, overrides, "platform")

    @classmethod
    def from_dict(cls, data: Any, source: str = "platform") -> TrainingPlatform:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: top level must be a table/object of platform fields")
        kind = data.get("kind", MT3000_KIND)
        if kind != MT3000_KIND:
            what = "is a GPU-cluster platform" if kind == "gpu-cluster" else f"has kind {kind!r}"
            raise ConfigError(f"{source} {what}; an MT-3000 platform has kind {MT3000_KIND!r} or none "
                              "(ratrain.spec.platforms.load_platform reads every kind)")
        sections, flat = {}, {}
        for key, value in data.items():
            if key == "host":
                sections["host"] = value
            elif key in ("cluster", "training", "kernels"):
                if not isinstance(value, dict):
                    raise ConfigError(f"{source}: [{key}] must be a table of fields")
                sections[key] = value
            else:
                flat[key] = value
        return _build(cls(), sections, flat, source)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> TrainingPlatform:
        """Read a TOML (.toml) or JSON file in the format of ``ratrain platform --json``."""
        where = os.fspath(path)
        return cls.from_dict(load_table_file(where, "platform file", ConfigError), where)

    def to_json(self) -> dict:
        """The whole description in the file format; the ``derived`` block is ignored on read."""
        cluster = self.cluster.to_dict()
        for key in DERIVED_CLUSTER:
            cluster.pop(key, None)
        return {"name": self.name, "kind": MT3000_KIND, "cluster": cluster,
                "training": {k: getattr(self, k) for k in TRAINING_FIELDS},
                "kernels": {k: getattr(self, k) for k in KERNEL_FIELDS},
                "host": self.host.to_json(),
                "derived": {"note": "computed from the fields above; ignored when this file is read back",
                            "memory_budget_bytes": self.memory_budget_bytes,
                            "memory_budget_gib": self.memory_budget_bytes / GIB,
                            "peak_mac_per_s": self.peak_mac_per_s, "cluster_hash": self.cluster.digest()}}


def _build(base: TrainingPlatform, sections: dict[str, dict], flat: dict[str, Any], source: str) -> TrainingPlatform:
    """Sort fields into their parts, check every name, and build the platform."""
    parts: dict[str, dict[str, Any]] = {"cluster": {}, "training": {}, "kernels": {}}
    claims: dict[str, Any] = {}
    aliased = False
    host = host_from_table(sections.pop("host"), source) if "host" in sections else None
    if "host" in flat:          # an override with a whole HostSide
        host = flat.pop("host")
        if not isinstance(host, HostSide):
            raise ConfigError(f"{source}: field host must be a ratrain.spec.host.HostSide or a [host] table")
    own = {"training": TRAINING_FIELDS, "kernels": KERNEL_FIELDS, "cluster": CLUSTER_FIELDS}
    for part, values in sections.items():
        for key, value in values.items():
            if part == "cluster" and key in DERIVED_CLUSTER:
                claims[key] = value
                continue
            if part == "cluster" and key in ALIASES:
                aliased, key = True, ALIASES[key]
            if key not in own[part]:
                raise ConfigError(f"{source}: unknown field {key!r} in [{part}] (known: {', '.join(own[part])})")
            parts[part][key] = value
    top: dict[str, Any] = {}
    for key, value in flat.items():
        if key == "derived":                                  # printed by to_json, never read back
            continue
        if key in DERIVED_CLUSTER:
            claims[key] = value
            continue
        if key == "name":
            top["name"] = value
            continue
        if key == "kind":                                     # checked in from_dict
            continue
        if key in ALIASES:
            aliased, key = True, ALIASES[key]
        for part, names in own.items():
            if key in names:
                parts[part][key] = value
                break
        else:
            known = ("name", *TRAINING_FIELDS, *KERNEL_FIELDS, *ALIASES, *(f for f in CLUSTER_FIELDS if f != "name"))
            raise ConfigError(f"{source}: unknown field {key!r} (a platform has name, [cluster], [training], "
                              f"[kernels]; known fields: {', '.join(known)})")
    try:
        cluster = base.cluster.with_overrides(source, **parts["cluster"]) if parts["cluster"] else base.cluster
    except PlatformError as exc:
        msg = str(exc)
        if aliased:
            msg = msg.replace("field 'ddr_bytes'", "field memory_budget_bytes (the cluster's 'ddr_bytes')")
        raise ConfigError(msg) from None
    peak = claims.get("peak_mac_per_s")
    if peak is not None and not (is_finite_number(peak) and abs(peak) < 1e300
                                 and math.isclose(peak, cluster.peak_mac_per_s, rel_tol=1e-9)):
        raise ConfigError(f"{source}: field peak_mac_per_s={show_value(peak)} is derived "
                          f"(dsps x vector_lanes x clock_hz = {cluster.peak_mac_per_s:g}); change those fields instead")
    try:
        extra = {"host": host} if host is not None else {}
        return replace(base, cluster=cluster, **top, **parts["training"], **parts["kernels"], **extra)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {str(exc).removeprefix('platform: ')}") from None


def _validate(p: TrainingPlatform, where: str) -> None:
    if not isinstance(p.name, str) or not p.name:
        raise ConfigError(f"{where}: field name must be a non-empty string, got {p.name!r}")
    if not isinstance(p.cluster, Platform):
        raise ConfigError(f"{where}: field cluster must be an mtemu.platform.Platform, got {type(p.cluster).__name__}")
    bw = p.link_bandwidth
    if not is_finite_number(bw) or bw <= 0:
        raise ConfigError(f"{where}: field link_bandwidth must be a positive number of bytes/s, got {show_value(bw)}")
    if bw < 1e6:
        raise ConfigError(f"{where}: field link_bandwidth={bw!r} is below 1 MB/s: it is in bytes/s "
                          "(3.7 GB/s is 3.7e9)")
    if bw > LINK_BANDWIDTH_MAX:
        raise ConfigError(f"{where}: field link_bandwidth={show_value(bw)} is above {LINK_BANDWIDTH_MAX:g} bytes/s "
                          "(3.7 GB/s is 3.7e9)")
    lat = p.link_latency_s
    if not is_finite_number(lat) or lat < 0:
        raise ConfigError(f"{where}: field link_latency_s must be a non-negative number of seconds, "
                          f"got {show_value(lat)}")
    if lat > 10:
        raise ConfigError(f"{where}: field link_latency_s={show_value(lat)} is over 10 s: "
                          "it is in seconds (20 us is 2e-05)")
    if p.gemm_loop_order not in GEMM_LOOP_ORDERS:
        raise ConfigError(f"{where}: field gemm_loop_order must be one of {', '.join(GEMM_LOOP_ORDERS)}, "
                          f"got {p.gemm_loop_order!r}")
    if not isinstance(p.host, HostSide):
        raise ConfigError(f"{where}: field host must be a ratrain.spec.host.HostSide, got {type(p.host).__name__}")
    if p.tiles not in TILE_CHOICES:
        raise ConfigError(f"{where}: field tiles must be one of {', '.join(TILE_CHOICES)}, got {p.tiles!r}")


def describe(p: TrainingPlatform) -> str:
    """Short human summary of a training platform."""
    c = p.cluster
    return (f"{p.name}: {c.dsps} DSPs at {c.clock_hz / 1e9:.4g} GHz, peak {c.peak_mac_per_s / 1e12:.3g} T MAC/s, "
            f"DDR {c.ddr_bandwidth / 1e9:g} GB/s nominal, budget {p.memory_budget_bytes / GIB:g} GB, "
            f"link {p.link_bandwidth / 1e9:g} GB/s + {p.link_latency_s * 1e6:g} us, "
            f"GEMM {p.gemm_loop_order} ({p.tiles} tiles)")


__all__ = ["GIB", "MT3000_KIND", "TrainingPlatform", "TRAINING_FIELDS", "KERNEL_FIELDS", "CLUSTER_FIELDS",
           "TILE_CHOICES", "describe"]

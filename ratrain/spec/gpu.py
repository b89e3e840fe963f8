"""A GPU cluster as the training side sees it: device, node, network, collective and kernel models.

The second platform kind beside MT-3000 (:mod:`ratrain.spec.platform`). A :class:`GpuPlatform`
holds datasheet facts (the device, the node's GPU-to-GPU link, the NICs between nodes) and the
constants of the GPU cost model (``collectives``, ``kernels``), which are fitted or chosen, not
read off a datasheet. How many nodes a run uses is a run parameter, not part of the platform.

File format (TOML or JSON; ``ratrain platform --platform FILE --json`` prints it): top-level
``name`` and ``kind = "gpu-cluster"``, tables ``[device]``, ``[node]``, ``[network]``,
``[collectives]``, ``[kernels]`` and ``[host]`` (the node's host as one GPU's share: the link to
host memory, host memory bandwidth and cores, :class:`ratrain.spec.host.HostSide`; without the
table a PCIe 4.0 x16 share of a two-socket host, ``HostSide.pcie4_x16_share``).
A field may also be given flat at the top level, or dotted
(``device.hbm_bytes``) as an override, where its name is unambiguous (``launch_s`` is in both
``collectives`` and ``kernels``, so it always needs its table). Every number is checked against
:data:`RANGES` (sane bounds with units) on load and on override; an unknown field, a wrong type,
NaN/inf or an impossible combination is a one-line :class:`~ratrain.errors.ConfigError` that names
the file and the field.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ratrain.errors import ConfigError
from ratrain.spec.host import HostSide, host_from_table
from rtcommon.checks import checked_number
from rtcommon.checks import show_value as _show
from rtcommon.jsonio import load_table_file

GPU_KIND = "gpu-cluster"
GIB = 2 ** 30
TOPOLOGIES = ("nvswitch", "nvlink", "pcie-host")
ALGORITHMS = ("ring", "tree", "auto")
ATTENTIONS = ("unfused", "flash")

# Sane range and unit of every numeric field, by "table.field". The bounds catch unit slips (a
# bandwidth of 300 is 300 B/s, not 300 GB/s; a latency of 5 is five seconds, not 5 us) and keep
# every derived time finite. Efficiencies are fractions of a datasheet rate, so at most 1, except
# the collectives' bus efficiencies: in-switch reduction (NVLink SHARP, InfiniBand SHARP) halves
# the bytes each GPU sends in an all-reduce, so measured bus bandwidth may reach twice the link
# rate and a fit must not be clipped below that.
RANGES: dict[str, tuple[float, float, str]] = {
    "device.peak_fp16_flops": (1e9, 1e17, "FLOP/s"),
    "device.sm_count": (1, 100_000, "SMs"),
    "device.hbm_bytes": (2 ** 20, 2 ** 44, "bytes"),
    "device.usable_bytes": (2 ** 20, 2 ** 44, "bytes"),
    "device.hbm_bandwidth": (1e8, 1e15, "bytes/s"),
    "node.gpus_per_node": (1, 1024, "GPUs"),
    "node.intra_bandwidth": (1e8, 1e14, "bytes/s"),
    "node.intra_latency_s": (0.0, 0.1, "s"),
    "network.nic_bandwidth": (1e8, 1e14, "bytes/s"),
    "network.nics_per_node": (1, 1024, "NICs"),
    "network.latency_s": (0.0, 0.1, "s"),
    "collectives.intra_bus_efficiency": (0.01, 2.0, "fraction"),
    "collectives.inter_bus_efficiency": (0.01, 2.0, "fraction"),
    "collectives.step_latency_s": (0.0, 0.1, "s"),
    "collectives.launch_s": (0.0, 0.1, "s"),
    "kernels.gemm_tile_m": (1, 4096, "rows"),
    "kernels.gemm_tile_n": (1, 4096, "columns"),
    "kernels.gemm_efficiency": (0.01, 1.0, "fraction"),
    "kernels.hbm_efficiency": (0.01, 1.0, "fraction"),
    "kernels.launch_s": (0.0, 0.1, "s"),
    "kernels.flash_efficiency": (0.01, 1.0, "fraction"),
    "kernels.step_overhead_s": (0.0, 60.0, "s"),
}
INT_FIELDS = frozenset({"device.sm_count", "device.hbm_bytes", "device.usable_bytes", "node.gpus_per_node",
                        "network.nics_per_node", "kernels.gemm_tile_m", "kernels.gemm_tile_n"})
CHOICES: dict[str, tuple[str, ...]] = {
    "node.intra_topology": TOPOLOGIES, "collectives.algorithm": ALGORITHMS, "kernels.attention": ATTENTIONS}
STRING_FIELDS = frozenset({"device.model"})
BOOL_FIELDS = frozenset({"node.peer_to_peer"})

# the prefix of errors raised while a part is built; a loader puts the file name in its place
_WHERE = "gpu platform"


def _unit_hint(unit: str, value: float) -> str:
    """What a too-small or too-large value probably meant."""
    if unit == "bytes/s" and 0.01 <= value < 1e5:
        return f" (bytes/s; for {value:g} GB/s write {value:g}e9, and 200 Gbit/s is 25e9)"
    if unit == "s" and value > 0.1:
        return f" (seconds; for {value:g} us write {value:g}e-06)"
    if unit == "bytes" and 0 < value < 2 ** 20:
        return f" (bytes; for {value:g} GiB write {int(value * GIB)})"
    if unit == "fraction" and 1 < value <= 100:
        return f" (a fraction; for {value:g} % write {value / 100:g})"
    return f" ({unit})"


def check_value(source: str, name: str, value: Any) -> Any:
    """``value`` of field ``name`` ("table.field") checked and normalised, or a ConfigError."""
    if name in STRING_FIELDS:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{source}: field '{name}' must be a non-empty string, got {_show(value)}")
        return value
    if name in BOOL_FIELDS:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: field '{name}' must be true or false, got {_show(value)}")
        return value
    if name in CHOICES:
        if not isinstance(value, str) or value not in CHOICES[name]:
            raise ConfigError(f"{source}: field '{name}' must be one of {', '.join(CHOICES[name])}, "
                              f"got {_show(value)}")
        return value
    lo, hi, unit = RANGES[name]
    return checked_number(value, f"{source}: field '{name}'", integer=name in INT_FIELDS, lo=lo, hi=hi,
                          error=ConfigError, hint=lambda v: _unit_hint(unit, v))


def _check_part(part: Any, table: str) -> None:
    """Check and normalise every field of a frozen part in place (called from ``__post_init__``)."""
    for f in fields(part):
        value = check_value(_WHERE, f"{table}.{f.name}", getattr(part, f.name))
        object.__setattr__(part, f.name, value)


@dataclass(frozen=True)
class GpuDevice:
    model: str                    # e.g. "A100-SXM4-40GB"
    peak_fp16_flops: float        # dense tensor-core FP16/BF16 FLOP/s (datasheet)
    sm_count: int
    hbm_bytes: int                # capacity
    usable_bytes: int             # what training may use (capacity less runtime/context reserve)
    hbm_bandwidth: float          # bytes/s (datasheet)

    def __post_init__(self) -> None:
        _check_part(self, "device")
        if self.usable_bytes > self.hbm_bytes:
            raise ConfigError(f"{_WHERE}: field 'device.usable_bytes' = {self.usable_bytes} exceeds "
                              f"device.hbm_bytes = {self.hbm_bytes} (usable memory is part of the capacity)")


@dataclass(frozen=True)
class GpuNode:
    gpus_per_node: int
    intra_topology: str           # "nvswitch" | "nvlink" | "pcie-host"
    intra_bandwidth: float        # bytes/s per GPU per direction inside the node
    intra_latency_s: float        # per message
    peer_to_peer: bool            # False: GPU-to-GPU traffic is staged through host memory

    def __post_init__(self) -> None:
        _check_part(self, "node")
        # NVLink and NVSwitch are GPU-to-GPU links: there is no host memory on their path
        if not self.peer_to_peer and self.intra_topology != "pcie-host":
            raise ConfigError(f"{_WHERE}: field 'node.peer_to_peer' = false needs node.intra_topology = "
                              f"'pcie-host' ({self.intra_topology!r} links GPUs directly)")


@dataclass(frozen=True)
class GpuNetwork:
    nic_bandwidth: float          # bytes/s per NIC per direction
    nics_per_node: int
    latency_s: float              # per message between nodes

    def __post_init__(self) -> None:
        _check_part(self, "network")


@dataclass(frozen=True)
class CollectiveModel:
    algorithm: str = "ring"       # "ring" | "tree" | "auto" (the cheaper of the two per call)
    intra_bus_efficiency: float = 1.0   # achieved all-reduce bus bandwidth / intra_bandwidth
    inter_bus_efficiency: float = 1.0   # same, across nodes over the NICs
    step_latency_s: float = 5e-6        # per ring/tree step
    launch_s: float = 1e-5              # fixed cost of one collective call

    def __post_init__(self) -> None:
        _check_part(self, "collectives")


@dataclass(frozen=True)
class GpuKernelModel:
    gemm_tile_m: int = 128        # output tile of one thread block (wave/tile quantization)
    gemm_tile_n: int = 128
    gemm_efficiency: float = 0.8  # ceiling: fraction of peak a large GEMM reaches
    hbm_efficiency: float = 0.8   # fraction of HBM bandwidth elementwise kernels reach
    launch_s: float = 5e-6        # per kernel launch
    attention: str = "unfused"    # "unfused" (Megatron's batched GEMMs + softmax) | "flash"
    flash_efficiency: float = 0.6 # FlashAttention's fraction of peak
    step_overhead_s: float = 0.0  # fixed cost per training step (optimizer launch, framework)

    def __post_init__(self) -> None:
        _check_part(self, "kernels")


# the tables of the file format and the part class each one builds
TABLES: dict[str, type] = {"device": GpuDevice, "node": GpuNode, "network": GpuNetwork,
                           "collectives": CollectiveModel, "kernels": GpuKernelModel}
TOP_FIELDS = ("name", "kind")


def _flat_owners() -> dict[str, list[str]]:
    owners: dict[str, list[str]] = {}
    for table, cls in TABLES.items():
        for f in fields(cls):
            owners.setdefault(f.name, []).append(table)
    return owners


FLAT_OWNERS = _flat_owners()     # field name -> tables that hold it (two for launch_s)


@dataclass(frozen=True)
class GpuPlatform:
    name: str
    device: GpuDevice
    node: GpuNode
    network: GpuNetwork
    collectives: CollectiveModel = field(default_factory=CollectiveModel)
    kernels: GpuKernelModel = field(default_factory=GpuKernelModel)
    kind: str = GPU_KIND          # class constant in practice; printed in to_json
    host: HostSide | None = None  # None: a PCIe 4.0 x16 share of the node's host (HostSide.pcie4_x16_share)

    def __post_init__(self) -> None:
        if self.host is None and isinstance(self.node, GpuNode):
            object.__setattr__(self, "host", HostSide.pcie4_x16_share(self.node.gpus_per_node))
        if not isinstance(self.host, HostSide):
            raise ConfigError(f"{_WHERE}: field 'host' must be a HostSide, got {type(self.host).__name__}")
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"{_WHERE}: field 'name' must be a non-empty string, got {_show(self.name)}")
        if self.kind != GPU_KIND:
            raise ConfigError(f"{_WHERE}: field 'kind' must be {GPU_KIND!r} for a GPU platform, "
                              f"got {_show(self.kind)}")
        for table, cls in TABLES.items():
            if not isinstance(getattr(self, table), cls):
                raise ConfigError(f"{_WHERE}: field '{table}' must be a {cls.__name__}, "
                                  f"got {type(getattr(self, table)).__name__}")

    # --- derived figures ---------------------------------------------------------------------
    @property
    def memory_budget_bytes(self) -> int:
        """What training state may occupy on one GPU (the device's usable memory)."""
        return self.device.usable_bytes

    @property
    def peak_flops(self) -> float:
        """Dense FP16/BF16 tensor-core FLOP/s of one GPU."""
        return self.device.peak_fp16_flops

    # --- construction ------------------------------------------------------------------------
    def with_overrides(self, **overrides: Any) -> GpuPlatform:
        """A copy with fields replaced, named ``table.field`` (pass them as ``**{"device.model": ...}``)
        or flat where one table holds the name; unknown or ambiguous names raise ConfigError."""
        return _build(self, overrides, f"platform {self.name!r} override")

    @classmethod
    def from_dict(cls, data: Any, source: str = "gpu platform") -> GpuPlatform:
        """A platform from the file format: every table is required except collectives and kernels."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: top level must be a table/object of platform fields")
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key == "host":
                values["host"] = host_from_table(value, source)
            elif key in TABLES:
                if not isinstance(value, dict):
                    raise ConfigError(f"{source}: [{key}] must be a table of fields")
                for sub, subvalue in value.items():
                    names = [f.name for f in fields(TABLES[key])]
                    if sub not in names:
                        raise ConfigError(f"{source}: unknown field {sub!r} in [{key}] (known: {', '.join(names)})")
                    values[f"{key}.{sub}"] = subvalue
            elif key == "derived":                      # printed by to_json, never read back
                continue
            else:
                values[key] = value
        return _build(None, values, source)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> GpuPlatform:
        """Read a TOML (.toml) or JSON file in the format of ``ratrain platform --json``."""
        where = os.fspath(path)
        return cls.from_dict(load_table_file(where, "platform file", ConfigError), where)

    def to_json(self) -> dict:
        """The whole description in the file format; the ``derived`` block is ignored on read."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        for table in TABLES:
            part = getattr(self, table)
            out[table] = {f.name: getattr(part, f.name) for f in fields(part)}
        out["host"] = self.host.to_json()
        node_nic = self.network.nic_bandwidth * self.network.nics_per_node
        out["derived"] = {
            "note": "computed from the fields above; ignored when this file is read back",
            "memory_budget_bytes": self.memory_budget_bytes,
            "memory_budget_gib": self.memory_budget_bytes / GIB,
            "peak_flops": self.peak_flops,
            "node_peak_flops": self.peak_flops * self.node.gpus_per_node,
            "node_nic_bandwidth": node_nic,
            "nic_bandwidth_per_gpu": node_nic / self.node.gpus_per_node,
        }
        return out


def _resolve(key: Any, source: str) -> str:
    """The "table.field" a file key or override name stands for."""
    if not isinstance(key, str):
        raise ConfigError(f"{source}: field names must be strings, got {_show(key)}")
    if key in TOP_FIELDS or key == "host":
        return key
    table, dot, sub = key.partition(".")
    if dot:
        if table in TABLES and sub in FLAT_OWNERS and table in FLAT_OWNERS[sub]:
            return key
        raise ConfigError(f"{source}: unknown field {key!r} (a GPU platform has name, kind, "
                          f"[{'], ['.join(TABLES)}])")
    owners = FLAT_OWNERS.get(key, [])
    if len(owners) == 1:
        return f"{owners[0]}.{key}"
    if owners:
        raise ConfigError(f"{source}: field {key!r} is in {' and '.join(owners)}: name its table "
                          f"({' or '.join(f'{t}.{key}' for t in owners)})")
    raise ConfigError(f"{source}: unknown field {key!r} (a GPU platform has name, kind, "
                      f"[{'], ['.join(TABLES)}]; known fields: {', '.join(sorted(FLAT_OWNERS))})")


def _build(base: GpuPlatform | None, values: dict[str, Any], source: str) -> GpuPlatform:
    """Check every name and value, then build the platform (from ``base`` or from nothing)."""
    top: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {table: {} for table in TABLES}
    for key, value in values.items():
        name = _resolve(key, source)
        if name in TOP_FIELDS or name == "host":
            top[name] = value
            continue
        table, _, sub = name.partition(".")
        parts[table][sub] = check_value(source, name, value)
    try:
        if base is None:
            if "name" not in top:
                raise ConfigError(f"{_WHERE}: a GPU platform needs a top-level field 'name'")
            for table in ("device", "node", "network"):
                cls = TABLES[table]
                missing = [f.name for f in fields(cls) if f.name not in parts[table]]
                if missing:
                    raise ConfigError(f"{_WHERE}: [{table}] lacks field '{table}.{missing[0]}' "
                                      f"(needed: {', '.join(f.name for f in fields(cls))})")
            built = {table: TABLES[table](**parts[table]) for table in TABLES}
            return GpuPlatform(**top, **built)
        built = {table: replace(getattr(base, table), **parts[table]) for table in TABLES if parts[table]}
        return replace(base, **top, **built)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {str(exc).removeprefix(_WHERE + ': ')}") from None


def describe_gpu(p: GpuPlatform) -> str:
    """Short human summary of a GPU platform."""
    d, n, w = p.device, p.node, p.network
    link = f"{n.intra_topology} {n.intra_bandwidth / 1e9:g} GB/s per GPU per direction"
    if not n.peer_to_peer:
        link += " (no peer-to-peer: staged through host memory)"
    return (f"{p.name}: {n.gpus_per_node} x {d.model} per node ({d.sm_count} SMs, "
            f"{d.peak_fp16_flops / 1e12:.4g} TFLOP/s dense FP16, memory {d.hbm_bandwidth / 1e9:g} GB/s, "
            f"budget {p.memory_budget_bytes / GIB:.4g} of {d.hbm_bytes / GIB:.4g} GiB); {link}; "
            f"{w.nics_per_node} x {w.nic_bandwidth * 8 / 1e9:g} Gbit/s NICs per node")


__all__ = ["GPU_KIND", "GpuDevice", "GpuNode", "GpuNetwork", "CollectiveModel", "GpuKernelModel", "GpuPlatform",
           "RANGES", "TABLES", "TOPOLOGIES", "ALGORITHMS", "ATTENTIONS", "check_value", "describe_gpu"]

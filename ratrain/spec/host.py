"""The host side of one device: the link to host memory, the host's memory and its cores.

What offloading (``ratrain.sim.offload``) and a host-side optimizer need from a platform. Every
figure is the share of one device (one MT-3000 acceleration cluster, or one GPU), since all the
devices a host serves offload at the same time.

- ``link_bandwidth``: bytes/s per direction between device memory and host memory (full duplex:
  a transfer to the host and one from it run at once); ``link_latency_s``: per transfer.
- ``memory_bandwidth``: bytes/s of host memory the device's host-side work may stream.
- ``cores``: host cores that run that work; ``core_flops``: FP32 FLOP/s of one core (SIMD).

MT-3000: the host is the chip's CPU side (16 general-purpose cores beside four acceleration
clusters). The paper gives no host figures, so the defaults are choices: the link is the path the
inter-cluster traffic already takes through the CPU zone and its memory bridge (the paper's
3.7 GB/s, 20 us per transfer as for the inter-cluster link), the host memory one DDR4-3200 channel
(25.6 GB/s) shared by the four clusters (6.4 GB/s each), four of the sixteen cores per cluster, each
at 2 GHz with two 128-bit FMA pipes (16 FP32 FLOP/s per cycle: 32 GFLOP/s).

GPU clusters: ``HostSide.pcie4_x16_share(gpus_per_node)`` is a PCIe 4.0 x16 slot per GPU (31.5 GB/s
raw, about 25 GB/s achieved per direction, what pinned-memory copies measure) with a DGX A100-class
two-socket host (two 64-core AMD EPYC 7742: 8 DDR4-3200 channels per socket, 409.6 GB/s, and 128
cores at 2.25 GHz with two 256-bit FMA pipes, 72 GFLOP/s FP32 each) shared by the node's GPUs; these
are choices, and a GPU platform file may set its own ``[host]`` table.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ratrain.errors import ConfigError
from rtcommon.checks import checked_number

# sane range and unit of each field: a host link of 0 (or a unit slip) is refused
HOST_RANGES: dict[str, tuple[float, float, str]] = {
    "link_bandwidth": (1e6, 1e14, "bytes/s"),
    "link_latency_s": (0.0, 0.1, "s"),
    "memory_bandwidth": (1e6, 1e14, "bytes/s"),
    "cores": (1, 100_000, "cores"),
    "core_flops": (1e6, 1e14, "FLOP/s"),
}


@dataclass(frozen=True)
class HostSide:
    link_bandwidth: float = 3.7e9       # bytes/s per direction; MT-3000 choice (module docstring)
    link_latency_s: float = 20e-6       # per transfer
    memory_bandwidth: float = 6.4e9     # bytes/s: a quarter of one DDR4-3200 channel
    cores: int = 4                      # a quarter of the CPU side's 16 cores
    core_flops: float = 32e9            # FP32 FLOP/s per core: 2 GHz x 2 FMA pipes x 4 lanes x 2

    def __post_init__(self) -> None:
        for f in fields(self):
            lo, hi, unit = HOST_RANGES[f.name]
            value = checked_number(getattr(self, f.name), f"host field '{f.name}'", integer=f.name == "cores",
                                   lo=lo, hi=hi, error=ConfigError, hint=lambda v, unit=unit: f" ({unit})")
            object.__setattr__(self, f.name, value)

    @classmethod
    def pcie4_x16_share(cls, gpus_per_node: int) -> "HostSide":
        """A GPU's share of a two-socket PCIe 4.0 host (see the module docstring)."""
        n = max(1, gpus_per_node)
        return cls(link_bandwidth=25e9, link_latency_s=10e-6, memory_bandwidth=409.6e9 / n,
                   cores=max(1, 128 // n), core_flops=2.25e9 * 2 * 8 * 2)

    def transfer_ms(self, nbytes: float) -> float:
        """One transfer between device and host memory (0 bytes: nothing moves, no latency)."""
        if nbytes <= 0:
            return 0.0
        return 1e3 * (nbytes / self.link_bandwidth + self.link_latency_s)

    def stream_ms(self, nbytes: float, flops: float = 0.0) -> float:
        """Host-side work streaming ``nbytes`` through host memory and doing ``flops``: the slower of
        the memory and the cores (they overlap)."""
        return 1e3 * max(nbytes / self.memory_bandwidth, flops / (self.cores * self.core_flops))

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def host_from_table(table: dict, source: str) -> HostSide:
    """A ``[host]`` table of a platform file; an unknown field names itself."""
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [host] must be a table of fields")
    names = [f.name for f in fields(HostSide)]
    for key in table:
        if key not in names:
            raise ConfigError(f"{source}: unknown field {key!r} in [host] (known: {', '.join(names)})")
    try:
        return HostSide(**table)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def host_of(platform) -> HostSide:
    """The host side of either platform kind."""
    host = getattr(platform, "host", None)
    if not isinstance(host, HostSide):
        raise ConfigError(f"platform {getattr(platform, 'name', platform)!r} has no host side")
    return host


__all__ = ["HOST_RANGES", "HostSide", "host_from_table", "host_of"]

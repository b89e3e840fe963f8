"""The training platform as the planner sees one MT-3000 acceleration cluster.

Defaults are the paper's measured figures (see docs/reference/paper-targets.md):
20 GB usable DDR for training, about 30 GB/s effective DDR bandwidth, about 3.7 GB/s
inter-cluster point-to-point bandwidth, 8.1 T FP16 MAC/s.  "GB" for the memory budget is
2**30 bytes (docs/CHOICES.md explains why).  The link latency is our assumption: the paper
gives none; inter-cluster traffic goes through the CPU/GP zone and a memory bridge, so we
take a software-mediated DMA round of 20 microseconds, which only matters for small messages
(1 MiB takes about 280 microseconds at 3.7 GB/s).
"""
from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import asdict, dataclass, fields, replace

from ratrain.errors import ConfigError

GIB = 2 ** 30


@dataclass(frozen=True)
class TrainingPlatform:
    name: str = "mt3000-cluster"
    memory_budget_bytes: int = 20 * GIB   # usable DDR for training state per cluster
    ddr_bandwidth: float = 30e9           # bytes/s, effective per cluster
    link_bandwidth: float = 3.7e9         # bytes/s, inter-cluster point-to-point
    link_latency_s: float = 20e-6         # per message; assumption, see module docstring
    peak_mac_per_s: float = 8.1e12        # FP16 MAC/s per cluster

    def __post_init__(self) -> None:
        _validate(self, "platform")

    def with_overrides(self, **overrides) -> "TrainingPlatform":
        """A copy with some fields replaced; unknown fields or bad values raise ConfigError."""
        known = {f.name for f in fields(self)}
        for key in overrides:
            if key not in known:
                raise ConfigError(f"platform: unknown field {key!r} (known: {', '.join(sorted(known))})")
        return replace(self, **overrides)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "TrainingPlatform":
        """Read a TOML (.toml) or JSON file whose top-level keys are field names."""
        where = os.fspath(path)
        try:
            with open(where, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
        try:
            if where.endswith(".toml"):
                raw = tomllib.loads(data.decode("utf-8"))
            else:
                raw = json.loads(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:   # TOMLDecodeError, JSONDecodeError
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{where}: cannot parse ({exc})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: top level must be a table/object of platform fields")
        known = {f.name: f for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise ConfigError(f"{where}: unknown field {key!r} (known: {', '.join(sorted(known))})")
        try:
            return cls(**raw)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}".replace("platform: ", "")) from None

    def to_json(self) -> dict:
        return asdict(self)


def _validate(p: TrainingPlatform, where: str) -> None:
    if not isinstance(p.name, str) or not p.name:
        raise ConfigError(f"{where}: field name must be a non-empty string, got {p.name!r}")
    budget = p.memory_budget_bytes
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ConfigError(f"{where}: field memory_budget_bytes must be a positive integer, got {budget!r}")
    for key in ("ddr_bandwidth", "link_bandwidth", "peak_mac_per_s"):
        value = getattr(p, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{where}: field {key} must be a positive number, got {value!r}")
    lat = p.link_latency_s
    if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not math.isfinite(lat) or lat < 0:
        raise ConfigError(f"{where}: field link_latency_s must be a non-negative number, got {lat!r}")

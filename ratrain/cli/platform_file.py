"""The training platform file of `ratrain plan`, `memory` and `reproduce`, checked for what
``TrainingPlatform.from_file`` does not yet check: unreadable structure (deep nesting, huge
integers, NaN) and values outside a sane range, with the unit named (a DDR bandwidth of 30 is
30 bytes/s, which would report steps of years with exit 0)."""
from __future__ import annotations

import math

from ratrain.errors import ConfigError
from ratrain.spec.platform import TrainingPlatform
from rtcommon.jsonio import load_table_file

# field -> (low, high, unit)
RANGES = {
    "memory_budget_bytes": (2 ** 20, 2 ** 50, "bytes"),
    "ddr_bandwidth": (1e6, 1e16, "bytes/s"),
    "link_bandwidth": (1e6, 1e16, "bytes/s"),
    "link_latency_s": (0.0, 10.0, "s"),
    "peak_mac_per_s": (1e9, 1e18, "MAC/s"),
}
_SCALE = {"bytes": (2 ** 30, "GiB", " * 2**30"), "bytes/s": (1e9, "GB/s", "e9"), "MAC/s": (1e12, "T MAC/s", "e12")}


def check_ranges(platform: TrainingPlatform, where: str) -> TrainingPlatform:
    for name, (low, high, unit) in RANGES.items():
        value = getattr(platform, name)
        if not math.isfinite(value) or not low <= value <= high:
            hint = f" ({unit})"
            if unit in _SCALE and 0 < value < low:
                scale, big, suffix = _SCALE[unit]
                if value * scale >= low:
                    hint = f" ({name} is in {unit}; for {value:g} {big} write {value:g}{suffix})"
            raise ConfigError(f"{where}: field {name} = {value!r} is outside the sane range {low:g}..{high:g}{hint}")
    return platform


def load_training_platform(path: str | None) -> TrainingPlatform:
    """The default platform, or the file at ``path``, every field in its sane range."""
    if not path:
        return TrainingPlatform()
    load_table_file(path, "platform file", ConfigError)      # structure first: named errors
    return check_ranges(TrainingPlatform.from_file(path), path)

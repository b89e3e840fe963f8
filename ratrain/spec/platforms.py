"""One reader for both platform kinds: a file's top-level ``kind`` picks the class.

``kind = "gpu-cluster"`` is a :class:`~ratrain.spec.gpu.GpuPlatform`; no ``kind`` or
``kind = "mt3000"`` is an MT-3000 :class:`~ratrain.spec.platform.TrainingPlatform`, as before.
Commands that only make sense on one kind ask for it with :func:`require_mt3000`, which turns a
GPU platform into one line naming the file and the command.
"""
from __future__ import annotations

import os
from typing import Any, Union

from ratrain.errors import ConfigError
from ratrain.spec.gpu import GPU_KIND, GpuPlatform, describe_gpu
from ratrain.spec.platform import MT3000_KIND, TrainingPlatform, describe
from rtcommon.jsonio import load_table_file

PLATFORM_KINDS = (MT3000_KIND, GPU_KIND)
AnyPlatform = Union[TrainingPlatform, GpuPlatform]


def platform_kind(data: Any, source: str) -> str:
    """The kind a parsed platform file declares (``mt3000`` when it declares none)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a table/object of platform fields")
    kind = data.get("kind", MT3000_KIND)
    if kind not in PLATFORM_KINDS:
        raise ConfigError(f"{source}: field 'kind' must be one of {', '.join(PLATFORM_KINDS)}, got {kind!r}")
    return kind


def platform_from_dict(data: Any, source: str = "platform") -> AnyPlatform:
    """A platform of either kind from the file format."""
    if platform_kind(data, source) == GPU_KIND:
        return GpuPlatform.from_dict(data, source)
    return TrainingPlatform.from_dict(data, source)


def load_platform(path: str | os.PathLike | None = None) -> AnyPlatform:
    """The platform in ``path`` (TOML or JSON, either kind), or the default MT-3000 one."""
    if path is None:
        return TrainingPlatform()
    where = os.fspath(path)
    return platform_from_dict(load_table_file(where, "platform file", ConfigError), where)


def require_mt3000(platform: AnyPlatform, command: str, source: str | None = None) -> TrainingPlatform:
    """``platform`` if it is an MT-3000 one; a GPU platform is a ConfigError for ``command``."""
    if isinstance(platform, GpuPlatform):
        what = source or f"platform {platform.name!r}"
        raise ConfigError(f"{what} is a GPU-cluster platform; {command} needs an MT-3000 platform")
    return platform


def describe_platform(platform: AnyPlatform) -> str:
    """Short human summary of a platform of either kind."""
    return describe_gpu(platform) if isinstance(platform, GpuPlatform) else describe(platform)

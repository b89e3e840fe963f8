"""mtemu: an instruction-level emulator of one MT-3000 acceleration cluster.

The kernel entry points are loaded on first use (PEP 562), so ``import mtemu``, ``mtemu.errors``
and ``mtemu.platform`` stay free of numba and the kernel generators, and ``import mtemu`` changes no
process-wide setting: Numba's cache folder is set when the jitted machine is first imported
(:mod:`mtemu.jit`).
"""
from __future__ import annotations

import importlib

from ._version import __version__ as __version__
from .errors import AssemblyError, CapacityError, MachineError, MtemuError, PlatformError
from .platform import DEFAULT as DEFAULT_PLATFORM
from .platform import Platform, load_platform

# public name -> module that defines it, imported on first access
_LAZY = {
    "DEFAULT_TILES": "mtemu.kernels.gemm",
    "GemmResult": "mtemu.kernels.gemm",
    "GemmTiles": "mtemu.kernels.gemm",
    "gemm_timing": "mtemu.kernels.gemm",
    "reference_gemm": "mtemu.kernels.gemm",
    "run_gemm": "mtemu.kernels.gemm",
    "run_attention": "mtemu.kernels.attention",
    "run_attention_backward": "mtemu.kernels.attention",
    "attention_forward_timing": "mtemu.kernels.attention",
    "attention_backward_timing": "mtemu.kernels.attention",
    "GEMM_VARIANTS": "mtemu.kernels.registry",
    "gemm_variant": "mtemu.kernels.registry",
    "choose_tiles": "mtemu.kernels.registry",
    "pattern_bandwidth": "mtemu.ddr_probe",
    "emulator_version": "mtemu.version",
    "connect_scheduler": "mtemu.tune",
    "map_jobs": "mtemu.tune",
    "LocalPool": "mtemu.tune",
    "warm_numba_cache": "mtemu.tune",
    "JIT_STATE": "mtemu.jit",
}

__all__ = ["AssemblyError", "CapacityError", "MachineError", "MtemuError", "PlatformError",
           "DEFAULT_TILES", "GemmResult", "GemmTiles", "gemm_timing", "reference_gemm", "run_gemm",
           "DEFAULT_PLATFORM", "Platform", "load_platform", "run_attention", "run_attention_backward",
           "attention_forward_timing", "attention_backward_timing", "GEMM_VARIANTS", "gemm_variant", "choose_tiles",
           "pattern_bandwidth", "emulator_version", "connect_scheduler", "map_jobs", "LocalPool",
           "warm_numba_cache"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mtemu' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value          # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

"""mtemu: an instruction-level emulator of one MT-3000 acceleration cluster.

The kernel entry points are loaded on first use (PEP 562), so ``import mtemu``, ``mtemu.errors``
and ``mtemu.platform`` stay free of numba and the kernel generators.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import sys
from pathlib import Path

from ._version import __version__ as __version__
from .errors import AssemblyError, CapacityError, MachineError, MtemuError, PlatformError
from .platform import DEFAULT as DEFAULT_PLATFORM
from .platform import Platform, load_platform

# Numba keys a function's on-disk cache on its own file's timestamp only, so a compiled machine
# that inlines code from another file (blocks, isa, fp16) can go stale and crash. Every state of
# the jitted sources therefore gets its own cache folder (under NUMBA_CACHE_DIR if set).
_JIT_SOURCES = ("machine.py", "blocks.py", "fused.py", "simd.py", "dma.py", "fp16.py", "isa.py", "trace.py",
                "accuracy.py")


def _jit_state() -> str:
    h = hashlib.sha256(__version__.encode())
    for name in _JIT_SOURCES:
        path = Path(__file__).parent / name
        if path.exists():
            h.update(name.encode() + path.read_bytes())
    return f"mtemu-jit-{h.hexdigest()[:12]}"


# the state of the jitted sources, computed once: names Numba's cache folder and keys the machine's
# prepared tables on disk (mtemu.prepared)
JIT_STATE = _jit_state()


def _jit_cache_dir() -> str:
    base = os.environ.get("NUMBA_CACHE_DIR") or str(Path.home() / ".cache" / "mtemu" / "numba")
    return base if Path(base).name == JIT_STATE else str(Path(base) / JIT_STATE)


os.environ["NUMBA_CACHE_DIR"] = _jit_cache_dir()
if "numba" in sys.modules:
    # numba was imported first (a test module, a user's script): its config already read the
    # variable, but it picks the folder when each jitted function is defined, which is below
    sys.modules["numba"].config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]

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
    "effective_bandwidth": "mtemu.ddr_probe",
    "emulator_version": "mtemu.version",
    "connect_scheduler": "mtemu.tune",
    "map_jobs": "mtemu.tune",
    "warm_numba_cache": "mtemu.tune",
}

__all__ = ["AssemblyError", "CapacityError", "MachineError", "MtemuError", "PlatformError",
           "DEFAULT_TILES", "GemmResult", "GemmTiles", "gemm_timing", "reference_gemm", "run_gemm",
           "DEFAULT_PLATFORM", "Platform", "load_platform", "run_attention", "run_attention_backward",
           "attention_forward_timing", "attention_backward_timing", "GEMM_VARIANTS", "gemm_variant", "choose_tiles",
           "effective_bandwidth", "emulator_version", "connect_scheduler", "map_jobs", "warm_numba_cache"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mtemu' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value          # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

"""mtemu: an instruction-level emulator of one MT-3000 acceleration cluster."""
from .errors import AssemblyError, CapacityError, MachineError, MtemuError, PlatformError
from .kernels.gemm import DEFAULT_TILES, GemmResult, GemmTiles, gemm_timing, reference_gemm, run_gemm
from .kernels.attention import (attention_backward_timing, attention_forward_timing, run_attention,
                                run_attention_backward)
from .platform import DEFAULT as DEFAULT_PLATFORM
from .platform import Platform, load_platform

__version__ = "0.1.0"

__all__ = ["AssemblyError", "CapacityError", "MachineError", "MtemuError", "PlatformError",
           "DEFAULT_TILES", "GemmResult", "GemmTiles", "gemm_timing", "reference_gemm", "run_gemm",
           "DEFAULT_PLATFORM", "Platform", "load_platform", "run_attention", "run_attention_backward",
           "attention_forward_timing", "attention_backward_timing"]

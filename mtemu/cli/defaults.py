"""What the `mtemu` parsers show (choices, defaults, one-line descriptions) as plain constants, so that
``--help`` and an argument error load neither the kernel generators nor Numba. Each value has its home
in the library; tests/test_cli_startup.py checks every one against it."""
from __future__ import annotations

from ..kernels.names import DEFAULT_GEMM, GEMM_LOOP_ORDERS

# mtemu.kernels.registry.GEMM_VARIANTS: each loop order's description and default tiles (as printed)
GEMM_DESCRIPTIONS = {
    "a-resident": "Fig. 4's loop order: A_g resident in GSM, B broadcast per panel, FP16 C partial sums through "
                  "DDR between k-blocks",
    "c-stationary": "C accumulated in AM in FP32 over all of K; A and B tiles streamed from DDR",
}
GEMM_DEFAULT_TILES_TEXT = {
    "a-resident": "a-resident mg=512 kg=768 k2=256 n2=384 mr=6 nv=4",
    "c-stationary": "c-stationary mg=1024 k2=128 n2=768 mr=6 nv=4",
}
# mtemu.kernels.gemm.GemmTiles' integer fields (every one but ``pipelined``), in field order
GEMM_TILE_FIELDS = ("mg", "k2", "n2", "mr", "nv", "rotation")
# mtemu.kernels.attention.plan
ATTENTION_VARIANTS = ("resident", "ddr-staged")
ATTENTION_SCHEDULES = ("auto", "gsm", "broadcast", "own")
# mtemu.trace: DEFAULT_MAX_EVENTS, TraceOptions().capacity
TRACE_MAX_EVENTS = 250_000
TRACE_CAPACITY = 1 << 20
# mtemu.program_runner: DEFAULT_MAX_SECONDS, DEFAULT_BUILD_SECONDS
PROGRAM_MAX_SECONDS = 600.0
PROGRAM_BUILD_SECONDS = 60.0

__all__ = ["ATTENTION_SCHEDULES", "ATTENTION_VARIANTS", "DEFAULT_GEMM", "GEMM_DEFAULT_TILES_TEXT", "GEMM_DESCRIPTIONS",
           "GEMM_LOOP_ORDERS", "GEMM_TILE_FIELDS", "PROGRAM_BUILD_SECONDS", "PROGRAM_MAX_SECONDS", "TRACE_CAPACITY",
           "TRACE_MAX_EVENTS"]

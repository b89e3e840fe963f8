"""The paper's kernel figures the emulator is checked against (targets only, never results), importable
without the kernel generators or Numba: the benchmarks' parameters and the light views read them here;
:mod:`mtemu.validate.table5` compares the emulated cycles against them."""
from __future__ import annotations

# Paper Table 5 (M = 2048 tokens; shape column is the weight K x N)
TABLE5 = (
    # (k, n, utilization %, T MAC/s, latency ms)
    (4096, 4096, 64.96, 5.26, 6.53),
    (4096, 11008, 66.16, 5.36, 17.23),
    (11008, 4096, 65.13, 5.28, 17.50),
    (6656, 6656, 67.35, 5.46, 16.63),
    (8192, 8192, 68.13, 5.52, 24.90),
)
TABLE5_M = 2048

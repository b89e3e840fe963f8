"""Names of the registered GEMM loop orders, importable without the kernel generators (and so
without Numba): a training platform validates its ``gemm_loop_order`` against these.
``mtemu.kernels.registry`` holds the variants themselves and checks it has exactly these names."""

GEMM_LOOP_ORDERS = ("a-resident", "c-stationary")
DEFAULT_GEMM = "a-resident"

"""Names of the registered GEMM loop orders, importable without the kernel generators (and so
without Numba): a training platform validates its ``gemm_loop_order`` against these.
``mtemu.kernels.registry`` holds the variants themselves and checks it has exactly these names."""

GEMM_LOOP_ORDERS = ("a-resident", "c-stationary")
DEFAULT_GEMM = "a-resident"

# ``choose_tiles`` (training's ``tiles = "tuned"``) emulates, per GEMM shape, the best this many tile
# sets by the closed-form bound plus the default tiles. TILE_CHOICE_VERSION keys cached tuned
# latencies: bump it when the rule changes (2: the defaults compete; the a-resident bound counts VMACs).
CHOOSE_EMULATE_TOP = 2
TILE_CHOICE_VERSION = 2

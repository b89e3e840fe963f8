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

# The tile fields every GEMM view prints, in this order (``rotation`` stays out: no view varies it).
TILE_TEXT_FIELDS = ("mg", "kg", "k2", "n2", "mr", "nv")
DEFAULT_B_SLOTS = 3          # a-resident's default; other values are printed


def format_tiles(tiles, loop_order: str | None = None) -> str:
    """The one way GEMM tiles are written: ``LOOP-ORDER mg=.. [kg=..] k2=.. n2=.. mr=.. nv=..`` (a tiles
    dataclass or its dict). ``loop_order`` defaults to the one the fields imply (``kg``: a-resident).
    Views print the effective tiles (clipped to the shape: the default ``nv=4`` runs as ``nv=2`` on
    ``n2=384``), so the text says what ran."""
    values = tiles if isinstance(tiles, dict) else {name: getattr(tiles, name) for name in
                                                    (*TILE_TEXT_FIELDS, "b_slots", "pipelined") if hasattr(tiles, name)}
    order = loop_order or ("a-resident" if "kg" in values else "c-stationary")
    text = " ".join([order] + [f"{name}={values[name]}" for name in TILE_TEXT_FIELDS if name in values])
    if values.get("b_slots", DEFAULT_B_SLOTS) != DEFAULT_B_SLOTS:
        text += f" b_slots={values['b_slots']}"
    if values.get("pipelined", True) is False:
        text += " (no software pipeline)"
    return text

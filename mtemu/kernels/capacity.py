"""Eq. 1 of the RATrain paper: capacity constraints on the Algorithm-1 attention-backward tiles.

With ``D`` the byte size of one FP16 element (2), a tile choice (Br, Bc, d, Br', Bc') must satisfy

    AM :  D (Br Bc + 2 Br d + 2 Bc d) <= C_AM     P/GS tile, Q_i and GO_i, K_j and V_j
    SM :  D Bc' Br                    <= C_SM     P^T and GS^T staging sub-tile (Bc' rows of Br)
    SM :  D Br' Bc                    <= C_SM     GS staging sub-tile (Br' rows of Bc)
    GSM:  D Bc d                      <= C_GSM    one GV_j / GK_j reduction block

AM and SM capacities are per DSP, GSM is the cluster's shared memory (``Platform`` fields
``am_bytes``, ``sm_bytes``, ``gsm_bytes``). These are the paper's bounds, taken literally: they are
the necessary condition a tuner prunes with. A concrete kernel layout (FP32 accumulators, double
buffers, alignment) needs more room and checks its own plan on top of this.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CapacityError, MtemuError
from ..platform import Platform

D_SIZE = 2  # bytes of one FP16 element


@dataclass(frozen=True)
class AttentionTiles:
    """Algorithm-1 tile sizes: ``br`` query rows, ``bc`` key/value rows, ``d`` head dimension,
    ``br_prime``/``bc_prime`` the SM staging sub-tiles of ``br``/``bc`` rows."""

    br: int
    bc: int
    d: int
    br_prime: int
    bc_prime: int

    def describe(self) -> str:
        return f"Br={self.br} Bc={self.bc} d={self.d} Br'={self.br_prime} Bc'={self.bc_prime}"


# name, memory, formula, platform field
_INEQUALITIES = (
    ("AM", "AM", "D*(Br*Bc + 2*Br*d + 2*Bc*d)", "am_bytes"),
    ("SM_bc_prime", "SM", "D*Bc'*Br", "sm_bytes"),
    ("SM_br_prime", "SM", "D*Br'*Bc", "sm_bytes"),
    ("GSM", "GSM", "D*Bc*d", "gsm_bytes"),
)


def _validate(tiles: AttentionTiles) -> None:
    if not isinstance(tiles, AttentionTiles):
        raise MtemuError(f"tiles must be an AttentionTiles, got {type(tiles).__name__}")
    for name in ("br", "bc", "d", "br_prime", "bc_prime"):
        v = getattr(tiles, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise MtemuError(f"attention tile '{name}' must be a positive integer, got {v!r}")
    # the staging sub-tiles split their tile; a larger one would stage rows that do not exist
    if tiles.br_prime > tiles.br:
        raise MtemuError(f"attention tile 'br_prime' ({tiles.br_prime}) must not exceed 'br' ({tiles.br})")
    if tiles.bc_prime > tiles.bc:
        raise MtemuError(f"attention tile 'bc_prime' ({tiles.bc_prime}) must not exceed 'bc' ({tiles.bc})")


def _used_bytes(tiles: AttentionTiles) -> dict[str, int]:
    br, bc, d = int(tiles.br), int(tiles.bc), int(tiles.d)
    return {
        "AM": D_SIZE * (br * bc + 2 * br * d + 2 * bc * d),
        "SM_bc_prime": D_SIZE * int(tiles.bc_prime) * br,
        "SM_br_prime": D_SIZE * int(tiles.br_prime) * bc,
        "GSM": D_SIZE * bc * d,
    }


def attention_capacity_report(tiles: AttentionTiles, platform: Platform) -> list[dict]:
    """One dict per Eq. 1 inequality, in the paper's order: ``name``, ``memory``, ``formula``,
    ``used``, ``limit`` and ``slack`` bytes (``limit - used``; negative means it does not fit)
    and ``fits``."""
    _validate(tiles)
    used = _used_bytes(tiles)
    out = []
    for name, memory, formula, field in _INEQUALITIES:
        limit = int(getattr(platform, field))
        out.append({"name": name, "memory": memory, "formula": formula, "used": used[name],
                    "limit": limit, "slack": limit - used[name], "fits": used[name] <= limit})
    return out


def attention_tiles_fit(tiles: AttentionTiles, platform: Platform) -> bool:
    """True when all four inequalities hold (bad tile values still raise MtemuError)."""
    return all(r["fits"] for r in attention_capacity_report(tiles, platform))


def check_attention_tiles(tiles: AttentionTiles, platform: Platform) -> None:
    """Raise CapacityError naming every violated inequality and its byte excess."""
    failed = [r for r in attention_capacity_report(tiles, platform) if not r["fits"]]
    if not failed:
        return
    parts = [f"inequality {r['name']}: {r['formula']} = {r['used']} bytes exceeds the "
             f"{r['limit']}-byte {r['memory']} by {r['used'] - r['limit']} bytes" for r in failed]
    raise CapacityError(f"attention tiles {tiles.describe()} do not fit Eq. 1: " + "; ".join(parts))

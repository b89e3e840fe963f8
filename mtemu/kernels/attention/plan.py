"""What the attention kernels share before any code is emitted: default tiles, the plan (shape,
tiles, buffer offsets), the shape/tile checks, buffer layout, and how work items (query head,
query tile) are dealt to the DSPs.

Layout choice. Vector lanes run across the query rows of a tile (``br <= vector_lanes``), so
row-wise quantities are vectors and score-shaped tiles are held transposed, key-major
([keys, query lanes]); see the backward and forward modules for the products built on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import CapacityError, MtemuError
from ...platform import DEFAULT, Platform, validate_platform
from ..capacity import AttentionTiles, check_attention_tiles

ALIGN = 64
VARIANTS = ("resident", "ddr-staged")
SCHEDULES = ("auto", "gsm", "broadcast", "own")

# a work item: (query head, query tile)
Item = tuple[int, int]


def default_tiles(head_dim: int, platform: Platform = DEFAULT) -> AttentionTiles:
    """Br = Bc = one vector of query rows (192 on the default platform), Bc' = Br' = 32."""
    lanes = platform.vector_lanes
    sub = min(32, lanes)
    return AttentionTiles(br=lanes, bc=lanes, d=int(head_dim), br_prime=sub, bc_prime=sub)


def align_up(x: int, a: int = ALIGN) -> int:
    return (x + a - 1) // a * a


@dataclass(frozen=True)
class AttentionPlan:
    heads: int
    kv_heads: int
    seq: int
    d: int
    causal: bool
    variant: str
    tiles: AttentionTiles
    nvd: int                 # vectors per head_dim row
    conv_rows: int           # rows per GSM->FP16 conversion chunk
    am: dict = field(hash=False, compare=False)
    sm: dict = field(hash=False, compare=False)
    ddr: dict = field(hash=False, compare=False)
    gsm_used: int = 0
    am_used: int = 0
    sm_used: int = 0
    ddr_bytes: int = 0
    schedule: str = "auto"

    @property
    def n_qt(self) -> int:
        return -(-self.seq // self.tiles.br)

    @property
    def n_kt(self) -> int:
        return -(-self.seq // self.tiles.bc)

    def q_rows(self, i: int) -> int:
        return min(self.tiles.br, self.seq - i * self.tiles.br)

    def k_rows(self, j: int) -> int:
        return min(self.tiles.bc, self.seq - j * self.tiles.bc)

    def tiles_needed(self, i: int) -> int:
        """Key tiles a query tile visits (causal: those starting at or before its last query)."""
        if not self.causal:
            return self.n_kt
        last_q = i * self.tiles.br + self.q_rows(i) - 1
        return last_q // self.tiles.bc + 1


def layout(sizes: list[tuple[str, int]]) -> tuple[dict, int]:
    """Offsets of named buffers, each aligned to ALIGN bytes, and the total."""
    out, off = {}, 0
    for name, size in sizes:
        out[name] = off
        off += align_up(size)
    return out, off


def check_shape_and_tiles(heads: int, kv_heads: int, seq: int, d: int, tiles: AttentionTiles | None,
                          platform: Platform, *, schedule: str, variant: str | None = None,
                          schedule_first: bool = False) -> AttentionTiles:
    """Checks shared by the backward and forward plans; returns the tiles (default if None).

    Order of the errors: positive dims, kv_heads | heads, variant (backward only), schedule, then
    the tiles (Eq. 1, d == head_dim, br within one vector). The forward plan has always checked
    ``schedule`` before anything else; ``schedule_first`` keeps that order."""
    def check_schedule() -> None:
        if schedule not in SCHEDULES:
            raise MtemuError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")

    validate_platform(platform, "attention platform")
    if schedule_first:
        check_schedule()
    for name, v in (("heads", heads), ("kv_heads", kv_heads), ("seq", seq), ("head_dim", d)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise MtemuError(f"attention {name} must be a positive integer, got {v!r}")
    if heads % kv_heads:
        raise MtemuError(f"attention kv_heads={kv_heads} must divide heads={heads}")
    if variant is not None and variant not in VARIANTS:
        raise MtemuError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if not schedule_first:
        check_schedule()
    lanes = platform.vector_lanes
    t = tiles or default_tiles(d, platform)
    check_attention_tiles(t, platform)
    if t.d != d:
        raise MtemuError(f"attention tile 'd' ({t.d}) must equal head_dim ({d})")
    if t.br > lanes:
        raise CapacityError(f"attention tile br={t.br} exceeds one vector ({lanes} lanes): this kernel "
                            f"puts the query rows of a tile across the lanes")
    return t


def ddr_layout(sizes: list[tuple[str, int]], platform: Platform) -> tuple[dict, int]:
    """Lay out the DDR tensors of a plan; CapacityError if they exceed the platform's DDR."""
    ddr, ddr_bytes = layout(sizes)
    if ddr_bytes > platform.ddr_bytes:
        raise CapacityError(f"DDR: attention tensors need {ddr_bytes} bytes, {ddr_bytes - platform.ddr_bytes} "
                            f"more than the platform's {platform.ddr_bytes}")
    return ddr, ddr_bytes


def rounds(plan: AttentionPlan, dsps: int, heads: list[int] | None = None) -> list[tuple[int, list[Item | None]]]:
    """(kv head, items per DSP) per lock-step round; items (query head, query tile), longest first."""
    group = plan.heads // plan.kv_heads
    out = []
    for g in (range(plan.kv_heads) if heads is None else heads):
        items = [(h, i) for h in range(g * group, (g + 1) * group) for i in range(plan.n_qt)]
        items.sort(key=lambda it: (-plan.tiles_needed(it[1]), it[0], it[1]))
        for r0 in range(0, len(items), dsps):
            chunk = items[r0:r0 + dsps]
            out.append((g, chunk + [None] * (dsps - len(chunk))))
    return out


def assign(plan: AttentionPlan, dsps: int, heads: list[int]) -> list[list[Item]]:
    """Items of several KV heads dealt longest-first to the least-loaded DSP (no lock step)."""
    group = plan.heads // plan.kv_heads
    items = [(h, i) for g in heads for h in range(g * group, (g + 1) * group) for i in range(plan.n_qt)]
    items.sort(key=lambda it: (-plan.tiles_needed(it[1]), it[0], it[1]))
    load = [0] * dsps
    out: list[list[Item]] = [[] for _ in range(dsps)]
    for it in items:
        k = min(range(dsps), key=lambda x: (load[x], x))
        out[k].append(it)
        load[k] += plan.tiles_needed(it[1])
    return out


def split_rows(seq: int, dsps: int, dsp: int) -> tuple[int, int]:
    """First row and row count of this DSP's even share of ``seq`` rows (GSM loads, conversions)."""
    base, extra = divmod(seq, dsps)
    return dsp * base + min(dsp, extra), base + (1 if dsp < extra else 0)

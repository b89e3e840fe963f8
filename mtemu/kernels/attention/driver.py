"""Per-DSP driver programs of the attention kernels: straight-line DMAs, waits, barriers and calls
into one micro-kernel library appended after every DSP's driver code."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ... import isa
from ...assembler import Instr, Program, ProgramBuilder, ins, one
from ...platform import Platform
from .microkernels import mk_gemm, mk_round
from .plan import AttentionPlan

# Built attention programs kept in memory (the most recent, per direction): a caller that runs one shape
# twice (timing, then functional; the resident kernel beside its staged baseline) builds it once. Few,
# because they are large: every DSP's straight-line driver and its copy of the library, some 130 MB at
# seq 4096, so Fig. 10's eight shapes kept together held over 1 GB.
BUILT_KEPT = 2

# DMA channels
CH_KV, CH_PT, CH_SVK, CH_SP, CH_SG, CH_RED, CH_IN, CH_CONV = range(8)

# micro-kernel makers by call-key kind; a kernel adds its own (see Library). "gemm32" is mk_gemm
# with an FP32 right operand.
SHARED_KERNELS: dict[str, Callable[..., np.ndarray]] = {"gemm": mk_gemm, "round": mk_round}


class Library:
    """The micro-kernels the drivers call, assembled once in first-use order."""

    def __init__(self, platform: Platform, kernels: dict[str, Callable[..., np.ndarray]]):
        self.platform = platform
        self.kernels = {**SHARED_KERNELS, **kernels}
        self.keys: dict[tuple, None] = {}
        self.call_sites: dict[tuple, tuple] = {}      # Driver.call's bundles, by register setting

    def build(self) -> tuple[np.ndarray, dict]:
        parts, offsets, off = [], {}, 0
        for key in self.keys:
            kind, args = key[0], key[1:]
            if kind == "gemm32":
                code = mk_gemm(*args, self.platform, 2, True)
            else:
                code = self.kernels[kind](*args, self.platform)
            offsets[key] = off
            off += code.shape[0]
            parts.append(code)
        if not parts:
            return np.zeros((0, isa.N_UNITS, isa.N_FIELDS), np.int64), offsets
        return np.concatenate(parts), offsets


def call_bundles(regs: dict[int, int]) -> tuple[tuple[Instr, ...], ...]:
    """The bundles of a call with registers ``regs`` set first (three moves a bundle, the last ones
    beside the call, whose target the linker fills in)."""
    movs = [ins("smovi", r, v) for r, v in regs.items()]
    out = []
    while len(movs) > 2:
        out.append(tuple(movs[:3]))
        movs = movs[3:]
    out.append((*movs, ins("call", 0)))
    return tuple(out)


class Driver:
    """Straight-line driver of one DSP: DMAs, waits, barriers and calls into a shared library."""

    def __init__(self, platform: Platform, library: Library):
        self.b = ProgramBuilder(platform)
        self.lib = library
        self.call_pcs: list[int] = []          # the bundle of each call, and its library key
        self.call_keys: list[tuple] = []

    def dma(self, ch: int, src_sp: str, dst_sp: str, rows: int, row_bytes: int, sstr: int, dstr: int,
            src: int, dst: int, mode: str = "copy") -> None:
        if rows <= 0:
            return
        desc = self.b.descriptor(src_sp, dst_sp, rows, row_bytes, sstr, dstr, mode)
        self.b.bundle(ins("dma", ch, desc, (0, src), (0, dst)))

    def wait(self, ch: int) -> None:
        self.b.add(one("dmawait", ch))

    def barrier(self) -> None:
        self.b.add(one("barrier"))

    def call(self, key: tuple, regs: dict[int, int]) -> None:
        self.lib.keys.setdefault(key, None)           # the library's kernels, in first-use order
        # the drivers repeat few register settings (a backward's ~10**5 calls, ~10**2 settings): their
        # bundles are built once per library and appended again as the same objects, which the
        # assembler encodes once (call_bundles builds them)
        sites = self.lib.call_sites
        at = (*regs.items(), *map(type, regs.values()))     # the types too: True is refused, 1 is not
        got = sites.get(at)
        if got is None:
            got = sites[at] = call_bundles(regs)
        self.b.extend_tuples(got)
        self.call_pcs.append(self.b.pc - 1)
        self.call_keys.append(key)

    def finish(self, lib_code: np.ndarray, lib_offsets: dict) -> Program:
        self.b.add(one("halt"))
        prog = self.b.assemble()
        n = prog.bundles
        code = np.concatenate([prog.code, lib_code])
        # every call's target at once (a backward's driver makes ~10**5 calls)
        targets = np.fromiter(map(lib_offsets.__getitem__, self.call_keys), dtype=np.int64,
                              count=len(self.call_keys))
        code[np.asarray(self.call_pcs, dtype=np.intp), isa.SBR, isa.F_IMM0] = n + targets
        return Program(code, prog.descriptors, {"main": 0}, prog.descriptor_names)


def link(drivers: list[Driver], library: Library) -> list[Program]:
    """Every DSP's program: its driver code followed by the library its calls jump into."""
    lib_code, offsets = library.build()
    return [drv.finish(lib_code, offsets) for drv in drivers]


@dataclass
class AttentionProgram:
    plan: AttentionPlan
    programs: list[Program]
    useful_macs: int
    tile_pairs: int
    schedule: str = ""

"""Per-DSP driver programs of the attention kernels: straight-line DMAs, waits, barriers and calls
into one micro-kernel library appended after every DSP's driver code."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from ... import isa
from ...assembler import (
    MAX_PROGRAM_BUNDLES,
    Instr,
    Program,
    ProgramBuilder,
    check_dma_offset,
    check_hazards_indexed,
    hazard_free_by_parts,
    ins,
    one,
    program_too_long,
)
from ...errors import AssemblyError
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
    """The micro-kernels the drivers call, assembled once in first-use order; and the drivers' bundle
    templates (see :class:`Driver`), each encoded once through the assembler."""

    def __init__(self, platform: Platform, kernels: dict[str, Callable[..., np.ndarray]],
                 reference: bool = False):
        self.platform = platform
        self.kernels = {**SHARED_KERNELS, **kernels}
        self.reference = reference                    # drivers built bundle by bundle (ReferenceDriver)
        self.keys: dict[tuple, None] = {}
        self.call_sites: dict[tuple, tuple[int, ...]] = {}    # a call's templates, by register setting
        self.singles: dict[tuple, int] = {}                   # one-bundle templates, by instruction
        self.blocks: list[np.ndarray] = []                    # every template's encoded bundle
        self.on: dict[str, dict[int, int]] = {"dma": {}, "dmawait": {}}     # see on_channel

    def driver(self) -> Driver:
        """A new DSP's driver calling into this library."""
        return ReferenceDriver(self.platform, self) if self.reference else Driver(self.platform, self)

    def encode(self, bundles: tuple[tuple[Instr, ...], ...], at: int, descriptors: int = 0) -> tuple[int, ...]:
        """Template ids of ``bundles``, encoded by the assembler (in a program of ``descriptors``
        placeholder descriptors, for a DMA's: its real descriptor and addresses come later); a bundle
        it refuses is named as bundle ``at`` onwards of the driver that met it."""
        b = ProgramBuilder(self.platform)
        for _ in range(descriptors):
            b.descriptor("SM", "SM", 1, 2, 0, 0)
        b.extend(bundles)
        try:
            code = b.assemble(check_hazards=False).code
        except AssemblyError as err:
            where = re.match(r"bundle (\d+)", str(err))
            if where is None:
                raise
            raise AssemblyError(f"bundle {at + int(where.group(1))}{str(err)[where.end():]}") from None
        first = len(self.blocks)
        self.blocks.extend(code)
        return tuple(range(first, len(self.blocks)))

    def call_site(self, regs: dict[int, int], at: int) -> tuple[int, ...]:
        """The templates of a call with registers ``regs`` (:func:`call_bundles`), met first at bundle ``at``."""
        return self.encode(call_bundles(regs), at)

    def single(self, at: int, op: str, *args) -> int:
        """The template of a one-instruction bundle (a wait, a barrier, a halt, a DMA on a channel),
        met first at bundle ``at``."""
        key = (op, *args, *map(type, args))
        got = self.singles.get(key)
        if got is None:
            dma = op == "dma"
            instr = ins("dma", *args, 0, (0, 0), (0, 0)) if dma else ins(op, *args)
            got = self.singles[key] = self.encode(((instr,),), at, descriptors=int(dma))[0]
        return got

    def on_channel(self, at: int, op: str, ch: int) -> int:
        """:meth:`single` of a DMA (``op`` "dma") or a wait ("dmawait") on channel ``ch``, kept by channel
        in ``on[op]`` for the drivers' hot paths (an int channel only: True would match 1)."""
        got = self.single(at, op, ch)
        if type(ch) is int:
            self.on[op][ch] = got
        return got

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


# where a DMA's descriptor and addresses sit in its encoded row
_DMA_DESC, (_DMA_SRC, _DMA_DST) = isa.F_R1, (isa.F_IMM0, isa.F_IMM1)


class Driver:
    """Straight-line driver of one DSP: DMAs, waits, barriers and calls into a shared library.

    A driver's bundles are of few kinds, so it keeps each as the id of a template the library encodes
    once through the assembler (a wait on a channel, a barrier, a DMA on a channel, the bundles of a
    call with one register setting) and, for a DMA, its descriptor and addresses. :meth:`finish` writes
    the program with array operations and checks what the assembler would check per bundle: the DMA
    address offsets and the latency hazards. :class:`ReferenceDriver` builds the same program bundle
    by bundle through the assembler; a test holds the two equal, bit for bit."""

    def __init__(self, platform: Platform, library: Library):
        self.platform = platform
        self.lib = library
        self.descs = ProgramBuilder(platform)      # its descriptor table, kept as the assembler keeps one
        self.desc_ids: dict[tuple, int] = {}
        self.ids: list[int] = []                    # every bundle's template
        self.dmas: list[tuple[int, int, int, int]] = []    # (bundle, descriptor, source, destination)
        self.call_pcs: list[int] = []               # the bundle of each call, and its library key
        self.call_keys: list[tuple] = []

    def _room(self, adding: int) -> None:
        if len(self.ids) + adding > MAX_PROGRAM_BUNDLES:
            raise program_too_long(self.platform, len(self.ids) + adding)

    def dma(self, ch: int, src_sp: str, dst_sp: str, rows: int, row_bytes: int, sstr: int, dstr: int,
            src: int, dst: int, mode: str = "copy") -> None:
        if rows <= 0:
            return
        key = (src_sp, dst_sp, rows, row_bytes, sstr, dstr, mode)
        desc = self.desc_ids.get(key)
        if desc is None:
            desc = self.desc_ids[key] = self.descs.descriptor(*key)
        ids = self.ids
        if len(ids) >= MAX_PROGRAM_BUNDLES:
            self._room(1)
        self.dmas.append((len(ids), desc, src, dst))
        got = self.lib.on["dma"].get(ch) if type(ch) is int else None
        ids.append(self.lib.on_channel(len(ids), "dma", ch) if got is None else got)

    def wait(self, ch: int) -> None:
        ids = self.ids
        if len(ids) >= MAX_PROGRAM_BUNDLES:
            self._room(1)
        got = self.lib.on["dmawait"].get(ch) if type(ch) is int else None
        ids.append(self.lib.on_channel(len(ids), "dmawait", ch) if got is None else got)

    def barrier(self) -> None:
        self._room(1)
        self.ids.append(self.lib.single(len(self.ids), "barrier"))

    def call(self, key: tuple, regs: dict[int, int]) -> None:
        self.lib.keys.setdefault(key, None)           # the library's kernels, in first-use order
        # the drivers repeat few register settings (a backward's ~10**5 calls, ~10**2 settings). A setting
        # matches an earlier one by equality (True would match 1, which the assembler refuses): the
        # drivers set integers, and the reference path, which checks every bundle, is held equal to this
        sites = self.lib.call_sites
        at = tuple(regs.items())
        got = sites.get(at)
        ids = self.ids
        if got is None:
            got = sites[at] = self.lib.call_site(regs, len(ids))
        if len(ids) + len(got) > MAX_PROGRAM_BUNDLES:
            self._room(len(got))
        ids.extend(got)
        self.call_pcs.append(len(ids) - 1)
        self.call_keys.append(key)

    def halt(self) -> None:
        """End the driver (before :func:`link` stacks the templates)."""
        self._room(1)
        self.ids.append(self.lib.single(len(self.ids), "halt"))

    def finish(self, lib_offsets: dict, linked: Linked, code: np.ndarray) -> Program:
        """This DSP's program, written into ``code`` (:meth:`halt` bundles): its driver code, a halt, then
        the library (``linked``: see :func:`link`)."""
        descriptors, names = self.descs.descriptor_table()
        n = len(self.ids)
        ids = np.array(self.ids, dtype=np.intp)
        # the ids are in range by construction; mode "raise" would buffer the output to check them first
        np.take(linked.table, np.concatenate([ids, linked.library_rows]), axis=0, out=code, mode="clip")
        if self.dmas:
            dmas = np.array(self.dmas)
            if dmas.dtype != np.int64:          # an address that is not an integer (or beyond int64)
                for pc, _desc, *addresses in self.dmas:
                    for operand, value in enumerate(addresses, start=3):
                        check_dma_offset(value, pc, operand)
            for col, operand in ((2, 3), (3, 4)):
                bad = np.abs(dmas[:, col]) > isa.MAX_ADDRESS_IMM
                if bad.any():
                    at = int(np.argmax(bad))
                    check_dma_offset(int(dmas[at, col]), int(dmas[at, 0]), operand)
            at = dmas[:, 0]
            code[at, isa.SIEU, _DMA_DESC] = dmas[:, 1]
            code[at, isa.SIEU, _DMA_SRC] = dmas[:, 2]
            code[at, isa.SIEU, _DMA_DST] = dmas[:, 3]
        if not linked.hazard_free:         # the templates alone could not vouch for it: checked bundle by bundle
            used, inverse = np.unique(ids, return_inverse=True)
            check_hazards_indexed(Program(code[:n], descriptors, {}, names), self.platform, linked.table[used],
                                  inverse.ravel())
        # every call's target at once (a backward's driver makes ~10**5 calls)
        targets = np.fromiter(map(lib_offsets.__getitem__, self.call_keys), dtype=np.int64,
                              count=len(self.call_keys))
        code[np.asarray(self.call_pcs, dtype=np.intp), isa.SBR, isa.F_IMM0] = n + targets
        return Program(code, descriptors, {"main": 0}, names)


class ReferenceDriver(Driver):
    """:class:`Driver` built bundle by bundle through the assembler (the reference of its fast path)."""

    def __init__(self, platform: Platform, library: Library):
        super().__init__(platform, library)
        self.b = ProgramBuilder(platform)

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
        self.lib.keys.setdefault(key, None)
        self.b.extend(call_bundles(regs))
        self.call_pcs.append(self.b.pc - 1)
        self.call_keys.append(key)

    def halt(self) -> None:
        self.b.add(one("halt"))

    def finish(self, lib_offsets: dict, linked: Linked, code: np.ndarray | None = None) -> Program:
        prog = self.b.assemble()
        n = prog.bundles
        code = np.concatenate([prog.code, linked.table[linked.library_rows]])
        for pc, key in zip(self.call_pcs, self.call_keys, strict=True):
            code[pc, isa.SBR, isa.F_IMM0] = n + lib_offsets[key]
        return Program(code, prog.descriptors, {"main": 0}, prog.descriptor_names)


class Linked(NamedTuple):
    """What every driver's :meth:`~Driver.finish` shares: the templates then the library's bundles, the
    library's rows in it, and whether the templates vouch for every driver's latency hazards."""

    table: np.ndarray
    library_rows: np.ndarray
    hazard_free: bool


def link(drivers: list[Driver], library: Library) -> list[Program]:
    """Every DSP's program: its driver code followed by the library its calls jump into.

    A driver's bundles are templates, and its only register writes are its calls' (a DMA, a wait or a
    barrier writes none, and a call site ends in the call, a control transfer), so when each call site
    is free of hazards on its own every driver is (:func:`~mtemu.assembler.hazard_free_by_parts`);
    otherwise each driver is checked bundle by bundle, which names the fault."""
    lib_code, offsets = library.build()
    for drv in drivers:
        drv.halt()
    templates = np.stack(library.blocks) if library.blocks else np.zeros((0, isa.N_UNITS, isa.N_FIELDS), np.int64)
    fillers = templates[sorted(library.singles.values())]
    hazard_free = not library.reference and hazard_free_by_parts(
        [templates[list(site)] for site in library.call_sites.values()], fillers, library.platform)
    table = np.concatenate([templates, lib_code])
    linked = Linked(table, np.arange(len(templates), len(table), dtype=np.intp), hazard_free)
    if library.reference:
        return [drv.finish(offsets, linked) for drv in drivers]
    # every program in one array, back to back: the machine links them without a copy (machine._link)
    ends = np.cumsum([len(drv.ids) + len(lib_code) for drv in drivers])
    code = np.empty((int(ends[-1]) if len(ends) else 0, isa.N_UNITS, isa.N_FIELDS), dtype=np.int64)
    return [drv.finish(offsets, linked, code[end - len(drv.ids) - len(lib_code):end])
            for drv, end in zip(drivers, ends.tolist(), strict=True)]


@dataclass
class AttentionProgram:
    plan: AttentionPlan
    programs: list[Program]
    useful_macs: int
    tile_pairs: int
    schedule: str = ""

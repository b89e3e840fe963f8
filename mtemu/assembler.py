"""Assembler: a Python builder API and a readable text form for VLIW programs.

Both produce a :class:`Program` (int64 arrays the machine runs). The assembler refuses, naming
bundle, unit and operand: two instructions on one unit in a bundle, an unknown opcode, a
register or channel out of range, an address operand in the wrong memory space, a bad DMA
descriptor, an unknown label, and reading (or overwriting) a register before the latency of an
earlier write to it has elapsed. Hazards are tracked through straight-line code; at a control
transfer (branch, call, return, wait, barrier, halt) every write must have landed, so each
basic block can be checked on its own and the machine may write results at issue.

Text form, one bundle per line, instructions separated by ``|``::

    .desc a_tile src=DDR dst=GSM rows=4 row_bytes=256 src_stride=8192 dst_stride=256 mode=copy
    loop:
    { sldh s4, [s5+0] | vldh v1, [s6+384] | saddi@SIEU s7, s7, 2 }
    { vfma v8, v2, v1 | bdec s9, loop }
    { nop latency }                    # an empty bundle, counted as a latency stall
    { halt }

A unit may be pinned with ``op@UNIT``; otherwise the first free unit that can run it is used.
"""
from __future__ import annotations

import functools
import itertools
import marshal
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from . import isa
from .errors import AssemblyError
from .platform import DEFAULT, Platform


@dataclass(frozen=True)
class Instr:
    """One instruction before encoding. ``args`` follow the opcode's syntax string."""

    op: str
    args: tuple = ()
    unit: str | None = None

    def __repr__(self) -> str:
        pin = f"@{self.unit}" if self.unit else ""
        return f"{self.op}{pin} {', '.join(map(str, self.args))}"


def ins(op: str, *args, unit: str | None = None) -> Instr:
    return Instr(op, tuple(args), unit)


@functools.lru_cache(maxsize=1024, typed=True)     # typed: 1 and True are different operands
def one(op: str, *args) -> tuple[Instr]:
    """The bundle of one instruction, one object per instruction: a generator that appends it wherever
    its programs wait or synchronise (:meth:`ProgramBuilder.add`) has it encoded once per program."""
    return (ins(op, *args),)


@dataclass(frozen=True)
class Descriptor:
    src: str
    dst: str
    rows: int
    row_bytes: int
    src_stride: int
    dst_stride: int
    mode: str = "copy"


@dataclass
class Program:
    """An assembled program: ``code[bundle, unit, field]`` and the DMA descriptor table."""

    code: np.ndarray
    descriptors: np.ndarray
    labels: dict[str, int] = field(default_factory=dict)
    descriptor_names: list[str] = field(default_factory=list)
    # a name for exactly this content, given by whoever can vouch for it (the kernels' program cache:
    # its key's hash); the machine keys its prepared tables on disk on it, once the program is frozen
    origin: str = ""

    @property
    def bundles(self) -> int:
        return int(self.code.shape[0])

    def freeze(self) -> Program:
        """Make ``code`` and ``descriptors`` read-only (in place) and return self: the machine then keeps
        its linked, checked and decoded form between runs (kernels freeze the programs they build)."""
        self.code.flags.writeable = False
        self.descriptors.flags.writeable = False
        return self

    @property
    def frozen(self) -> bool:
        return not (self.code.flags.writeable or self.descriptors.flags.writeable)

    def disassemble(self) -> str:
        return disassemble(self)


# ------------------------------------------------------------------------------------------
# Builder
# ------------------------------------------------------------------------------------------
# Largest program a builder makes: the shipped kernels stay under 30,000 bundles; a platform latency
# of 10**6 cycles would pad a GEMM to ~10**9 bundles (hundreds of GB) before the run started.
MAX_PROGRAM_BUNDLES = 1_000_000


def program_too_long(platform: Platform, bundles: int) -> AssemblyError:
    """The error for a program of ``bundles`` bundles, beyond :data:`MAX_PROGRAM_BUNDLES`."""
    lat = platform.latencies
    name, cycles = max(((f, getattr(lat, f)) for f in lat.__dataclass_fields__), key=lambda fc: fc[1])
    return AssemblyError(f"program would pass {MAX_PROGRAM_BUNDLES:,} bundles (at {bundles:,}; "
                         f"mtemu.assembler.MAX_PROGRAM_BUNDLES): kernels pad each latency with idle bundles, "
                         f"and the platform's largest is latencies.{name} = {cycles} cycles")


class ProgramBuilder:
    """Collects bundles, labels and descriptors; ``assemble`` validates and encodes."""

    def __init__(self, platform: Platform = DEFAULT):
        self.platform = platform
        self._bundles: list[tuple[Instr, ...]] = []
        self._labels: dict[str, int] = {}
        self._descs: list[Descriptor] = []
        self._desc_names: list[str] = []
        self._desc_index: dict[tuple, int] = {}
        self._portable: list[tuple[int, np.ndarray]] = []      # (first bundle, code) of extend_portable's runs

    # structure --------------------------------------------------------------------------
    def label(self, name: str) -> None:
        if name in self._labels:
            raise AssemblyError(f"label '{name}' defined twice (bundles {self._labels[name]} and {len(self._bundles)})")
        self._labels[name] = len(self._bundles)

    def bundle(self, *instrs: Instr) -> int:
        if len(self._bundles) >= MAX_PROGRAM_BUNDLES:
            self._too_long(1)
        self._bundles.append(instrs)
        return len(self._bundles) - 1

    def add(self, bundle: tuple[Instr, ...]) -> int:
        """Append one bundle given as a tuple, kept as that object (see :meth:`extend`)."""
        if len(self._bundles) >= MAX_PROGRAM_BUNDLES:
            self._too_long(1)
        self._bundles.append(bundle if type(bundle) is tuple else tuple(bundle))
        return len(self._bundles) - 1

    def nops(self, count: int, reason: str = "latency") -> None:
        if len(self._bundles) + count > MAX_PROGRAM_BUNDLES:
            self._too_long(count)
        # one tuple for all of them: the encoder looks at a repeated bundle object once
        self._bundles.extend([(ins("nop", reason),)] * count)

    def _too_long(self, adding: int) -> None:
        raise program_too_long(self.platform, len(self._bundles) + adding)

    def descriptor(self, src: str, dst: str, rows: int, row_bytes: int, src_stride: int,
                   dst_stride: int, mode: str = "copy", name: str | None = None) -> int:
        # keyed by the fields as a plain tuple: what Descriptor's equality compares, hashed faster
        key = (src, dst, int(rows), int(row_bytes), int(src_stride), int(dst_stride), mode)
        if name is None:
            got = self._desc_index.get(key)
            if got is not None:
                return got
        self._descs.append(Descriptor(*key))
        self._desc_names.append(name or f"d{len(self._descs) - 1}")
        self._desc_index.setdefault(key, len(self._descs) - 1)
        return len(self._descs) - 1

    def extend(self, bundles: Iterable[Sequence[Instr]]) -> None:
        """Append bundles in order. A bundle given as a tuple is kept as that object: a generator that
        passes one tuple for a bundle it repeats (a call site, a memoised micro-kernel) has it checked
        and encoded once per program (:func:`_encode`)."""
        room = MAX_PROGRAM_BUNDLES - len(self._bundles)
        got = [b if type(b) is tuple else tuple(b) for b in itertools.islice(bundles, room + 1)]
        if len(got) > room:
            self._too_long(len(got))
        self._bundles.extend(got)

    def extend_tuples(self, bundles: tuple[tuple[Instr, ...], ...]) -> None:
        """Append a tuple of bundles that are tuples already (a memoised call site), kept as those
        objects: :meth:`extend` without its per-bundle conversion."""
        if len(self._bundles) + len(bundles) > MAX_PROGRAM_BUNDLES:
            self._too_long(len(bundles))
        self._bundles.extend(bundles)

    def extend_portable(self, bundles: tuple[tuple[Instr, ...], ...]) -> None:
        """:meth:`extend_tuples` for a tuple a cache keeps and never changes (a micro-kernel): its bundles
        are encoded once per platform and that tuple (:func:`portable_code`), and copied into every
        program that appends it, where they hold unchanged if no operand is a label or a DMA descriptor.
        One that has such an operand, or fails to encode on its own, is encoded bundle by bundle
        with the program, as :meth:`extend` would (the program is the same either way)."""
        code = portable_code(bundles, self.platform)
        if code is not None:
            self._portable.append((len(self._bundles), code))
        self.extend_tuples(bundles)

    @property
    def pc(self) -> int:
        return len(self._bundles)

    def assemble(self, check_hazards: bool = True) -> Program:
        return _encode(self.platform, self._bundles, self._labels, self._descs,
                       self._desc_names, check_hazards, self._portable)

    def descriptor_table(self) -> tuple[np.ndarray, list[str]]:
        """The descriptors so far, checked and encoded as :meth:`assemble` encodes them, and their names."""
        return _descriptor_array(self._descs, self._desc_names, self.platform), list(self._desc_names)


# ------------------------------------------------------------------------------------------
# Encoding and checks
# ------------------------------------------------------------------------------------------
_REG_RE = re.compile(r"^([sv])(\d+)$")


def _reg(kind: str, value, where: str, limit: int) -> int:
    if isinstance(value, str):
        m = _REG_RE.match(value.strip())
        if not m or m.group(1) != kind:
            raise AssemblyError(f"{where}: expected a {'scalar' if kind == 's' else 'vector'} register ({kind}N), "
                                f"got {value!r}")
        value = int(m.group(2))
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise AssemblyError(f"{where}: expected a register number, got {value!r}")
    if not 0 <= int(value) < limit:
        raise AssemblyError(f"{where}: {'scalar' if kind == 's' else 'vector'} register {kind}{value} out of "
                            f"range {kind}0..{kind}{limit - 1}")
    return int(value)


def _imm(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise AssemblyError(f"{where}: expected an integer immediate, got {value!r}")
    if not -(2**62) <= int(value) < 2**62:
        raise AssemblyError(f"{where}: immediate {value} out of range")
    return int(value)


def _addr(value, where: str, space: int, nsregs: int) -> tuple[int, int]:
    """Address operand: (sreg, imm) or (sreg, imm, 'SPACE')."""
    if not isinstance(value, tuple) or len(value) not in (2, 3):
        raise AssemblyError(f"{where}: expected an address (sreg, offset[, space]), got {value!r}")
    if len(value) == 3:
        sp = value[2]
        if sp not in isa.SPACES:
            raise AssemblyError(f"{where}: unknown memory space {sp!r} (known: {', '.join(isa.SPACES)})")
        if isa.SPACES.index(sp) != space:
            raise AssemblyError(f"{where}: operand in the wrong memory space: {sp} given, this unit addresses "
                                f"{isa.SPACES[space]}")
    return _reg("s", value[0], where, nsregs), _offset(value[1], where)


def _offset(value, where: str) -> int:
    off = _imm(value, where)
    if abs(off) > isa.MAX_ADDRESS_IMM:
        raise AssemblyError(f"{where}: address offset {off} is beyond any memory (|offset| <= {isa.MAX_ADDRESS_IMM})")
    return off


def _descriptor_array(descs: list[Descriptor], desc_names: list[str], platform: Platform) -> np.ndarray:
    desc_arr = np.zeros((len(descs), isa.N_DESC), dtype=np.int64)
    for k, d in enumerate(descs):
        desc_arr[k] = _check_descriptor(d, desc_names[k], platform)
    return desc_arr


def _encode(platform: Platform, bundles, labels, descs, desc_names, check_hazards,
            copied: list[tuple[int, np.ndarray]] = ()) -> Program:
    ns, nv = platform.scalar_registers, platform.vector_registers
    desc_arr = _descriptor_array(descs, desc_names, platform)
    # a kernel repeats the same bundles many times (unrolled loops): each distinct bundle is checked and
    # encoded once, keyed by its instructions with their operands' types (a bool or a float operand equal
    # to an accepted int is still refused); every check of the encoding depends only on the bundle
    encoded: dict[tuple, int] = {}
    blocks: list[np.ndarray] = []           # the distinct bundles' encodings; ids[b] is bundle b's
    # bundles that differ (in addresses, say) still share most instructions: each distinct instruction's
    # row is encoded once too. It depends on the instruction and the program alone, not on its unit or
    # bundle (a failing one raises at its first bundle, as before); one without a label operand depends
    # on the platform's register and channel counts only (a DMA's is valid where the program has its
    # descriptor), so its row is shared by every program (a backward's 24 per-DSP programs repeat each
    # other's); so is the whole block of a bundle without label or DMA operands (micro-kernels that
    # several programs call)
    rows: dict[bytes, np.ndarray] = {}
    context = (ns, nv, platform.dma_channels)
    shared = _shared_memo(_ROWS, context)
    shared_blocks = _shared_memo(_BLOCKS, context, _SHARED_BLOCKS_MAX)
    ndesc = len(descs)
    # a generator hands one tuple object for a bundle it repeats (a call site, a nop run): each distinct
    # object is looked at once, at its first position, so a failing one raises where a bundle-by-bundle
    # pass would (every bundle before it is a repeat of an object that passed)
    # (the bundles list holds every object, so no two of them share an id while this runs)
    # the runs :meth:`ProgramBuilder.extend_portable` encoded already are left out, and copied in at the end
    objects = np.fromiter(map(id, bundles), dtype=np.uint64, count=len(bundles))
    rest = None
    if copied:
        outside = np.ones(len(bundles), dtype=bool)
        for start, run in copied:
            outside[start:start + len(run)] = False
        rest = np.flatnonzero(outside)
        objects = objects[rest]
    _, first, order = np.unique(objects, return_index=True, return_inverse=True)
    order = order.ravel()
    block_of = np.empty(len(first), dtype=np.intp)
    first = np.sort(first)                  # each object's first position, in program order
    object_of = order[first]
    if rest is not None:
        first = rest[first]                 # positions in the program
    for b, j in zip(first.tolist(), object_of.tolist(), strict=True):
        instrs = bundles[b]
        keys = _instr_keys(instrs)
        known = encoded.get(keys)
        if known is not None:
            block_of[j] = known
            continue
        block = shared_blocks.get(keys) if keys is not None else None
        if block is None:
            block, portable = _encode_block(instrs, keys, b, rows, shared, ns, nv, labels, len(bundles), ndesc,
                                            platform)
            if portable and keys is not None:
                shared_blocks[keys] = block
        if keys is not None:
            encoded[keys] = len(blocks)
        block_of[j] = len(blocks)
        blocks.append(block)
    distinct = np.stack(blocks) if blocks else np.zeros((0, isa.N_UNITS, isa.N_FIELDS), dtype=np.int64)
    if rest is None:
        ids = block_of[order]
    else:                                   # each copied bundle a distinct one of its own
        ids = np.empty(len(bundles), dtype=np.intp)
        ids[rest] = block_of[order]
        parts, at = [distinct], len(distinct)
        for start, run in copied:
            ids[start:start + len(run)] = np.arange(at, at + len(run))
            parts.append(run)
            at += len(run)
        distinct = np.concatenate(parts)
    code = distinct[ids]
    prog = Program(code, desc_arr, dict(labels), list(desc_names))
    if check_hazards:
        check_hazards_indexed(prog, platform, distinct, ids)
    return prog


_PORTABLE: dict[tuple, dict[int, tuple[tuple, np.ndarray | None]]] = {}
_PORTABLE_MAX = 4096


def portable_code(bundles: tuple[tuple[Instr, ...], ...], platform: Platform) -> np.ndarray | None:
    """The encoding of ``bundles`` in any program on ``platform`` (:meth:`ProgramBuilder.extend_portable`),
    memoised by that tuple object (kept alive by the memo, so its id is not reused); None where it
    depends on the program (a label or a DMA descriptor operand) or does not encode on its own."""
    memo = _shared_memo(_PORTABLE, (platform.scalar_registers, platform.vector_registers, platform.dma_channels),
                        _PORTABLE_MAX)
    got = memo.get(id(bundles))
    if got is not None and got[0] is bundles:
        return got[1]
    b = ProgramBuilder(platform)
    b.extend_tuples(bundles)
    try:
        code = b.assemble(check_hazards=False).code
    except AssemblyError:
        code = None
    if code is not None and _PROGRAM_BOUND[code[:, :, isa.F_OP]].any():
        code = None
    if code is not None:
        code.flags.writeable = False
    memo[id(bundles)] = (bundles, code)
    return code


def _encode_block(instrs, keys, b: int, rows: dict, shared: dict, ns: int, nv: int, labels, n: int, ndesc: int,
                  platform: Platform) -> tuple[np.ndarray, bool]:
    """The encoded bundle ``b`` (its instructions checked in order, each on the unit it gets), its rows
    from the program's memo (``rows``: label operands) or the shared one (the others); and whether it
    holds in any program on the platform (no label or descriptor operand)."""
    block = np.zeros((isa.N_UNITS, isa.N_FIELDS), dtype=np.int64)
    used: dict[int, Instr] = {}
    portable = True
    for k, instr in enumerate(instrs):
        spec = isa.OP_BY_NAME.get(instr.op)
        if spec is None:
            raise AssemblyError(f"bundle {b}: unknown opcode '{instr.op}'")
        unit = _pick_unit(spec, instr, used, b)
        ikey = keys[k] if keys is not None else None
        code = spec.code
        memo = rows if _LABEL_BOUND_OPS[code] else shared
        one = memo.get(ikey) if ikey is not None else None
        if _LABEL_BOUND_OPS[code]:
            portable = False
        elif code in _DESC_FIELD:
            portable = False
            # a DMA's row met in another program holds only if this one has its descriptor
            if one is not None and one[_DESC_FIELD[code]] >= ndesc:
                one = None
        if one is None:
            where = f"bundle {b}, unit {isa.UNITS[unit]}, {spec.name}"
            one = _encode_one(spec, instr, where, ns, nv, labels, n, ndesc, platform)
            if ikey is not None:
                memo[ikey] = one
        block[unit] = one
        used[unit] = instr
    return block, portable


# Memos shared by every program a process assembles (rows, whole blocks, register effects, bundle
# hazards), by what they depend on; a memo past its entries starts again (rows and effects: a few hundred
# bytes an entry, blocks about a kilobyte)
_SHARED_MAX = 200_000
_SHARED_BLOCKS_MAX = 50_000
_ROWS: dict[tuple, dict] = {}
_BLOCKS: dict[tuple, dict] = {}
_ROW_EFFECTS: dict[bytes, tuple] = {}
_HAZARDS: dict[tuple, dict] = {}


def _shared_memo(memos: dict, context, entries: int = _SHARED_MAX) -> dict:
    got = memos.get(context)
    if got is None or len(got) > entries:
        got = memos[context] = {}
    return got


def _operand_kinds(spec: isa.OpSpec) -> set[str]:
    return set() if spec.syntax == "reason" else {kind for kind, _, _ in operand_layout(spec)}


def _instr_keys(instrs) -> tuple[bytes, ...] | None:
    """What a bundle's encoding depends on: per instruction, bytes that keep every operand's type
    (``marshal``: ``True``, ``1.0`` and ``1`` differ, as the checks treat them); None where an operand is
    of a type marshal does not write (such a bundle and its instructions are never memoised)."""
    try:
        return tuple([marshal.dumps((i.op, i.unit, i.args)) for i in instrs])
    except ValueError:
        return None


def _pick_unit(spec: isa.OpSpec, instr: Instr, used: dict[int, Instr], b: int) -> int:
    if instr.unit is not None:
        if instr.unit not in isa.UNITS:
            raise AssemblyError(f"bundle {b}: unknown unit '{instr.unit}' for {spec.name} (units: "
                                f"{', '.join(isa.UNITS)})")
        unit = isa.UNITS.index(instr.unit)
        if unit not in spec.units:
            raise AssemblyError(f"bundle {b}, unit {instr.unit}: {spec.name} cannot run on {instr.unit} "
                                f"(allowed: {', '.join(isa.UNITS[u] for u in spec.units)})")
        if unit in used:
            raise AssemblyError(f"bundle {b}, unit {instr.unit}: two instructions on one unit ({used[unit]!r} and "
                                f"{instr!r})")
        return unit
    for unit in spec.units:
        if unit not in used:
            return unit
    if len(spec.units) == 1:
        u = spec.units[0]
        raise AssemblyError(f"bundle {b}, unit {isa.UNITS[u]}: two instructions on one unit ({used[u]!r} and "
                            f"{instr!r})")
    raise AssemblyError(f"bundle {b}: no free unit for {instr!r} (all of "
                        f"{', '.join(isa.UNITS[u] for u in spec.units)} busy)")


def _label(value, where: str, labels: dict[str, int], n: int) -> int:
    if isinstance(value, str):
        if value not in labels:
            raise AssemblyError(f"{where}: unknown label '{value}'")
        return labels[value]
    pc = _imm(value, where)
    if not 0 <= pc < n:
        raise AssemblyError(f"{where}: branch target {pc} outside the program (0..{n - 1})")
    return pc


@functools.lru_cache(maxsize=None)
def operand_layout(spec: isa.OpSpec) -> tuple[tuple[str, int, int], ...]:
    """Per operand of ``spec.syntax``: (kind, register field, immediate field), -1 where none. Kinds:
    ``reg`` (a register of the field's kind), ``addr`` (a scalar register + offset), ``imm``, ``label``,
    ``reason``, ``ch``, ``desc``. Operands fill the register fields (r0..r3, the link register left to
    the assembler) and the immediates (imm0, imm1) in order."""
    regs = iter(f for f, tok in enumerate(spec.fields) if tok and tok[0] != "l")
    imms = iter((isa.F_IMM0, isa.F_IMM1))
    out = []
    for tok in (t.strip() for t in spec.syntax.split(",") if t.strip()):
        if tok.startswith("["):
            out.append(("addr", isa.F_R0 + next(regs), next(imms)))
        elif tok in ("imm", "label", "reason"):
            out.append((tok, -1, next(imms)))
        else:
            out.append(("reg" if tok[0] in "sv" else tok, isa.F_R0 + next(regs), -1))
    return tuple(out)


# opcodes whose encoding depends on the program's labels and size, or on its descriptor count
_LABEL_BOUND = isa.op_table(lambda spec: "label" in _operand_kinds(spec))
_LABEL_BOUND_OPS = _LABEL_BOUND.tolist()            # indexed in the encoder's loop: plain bools
# the field holding a DMA's descriptor, by opcode
_DESC_FIELD = {spec.code: slot for spec in isa.OPS for kind, slot, _imm in
               (operand_layout(spec) if spec.syntax != "reason" else ()) if kind == "desc"}
# opcodes whose encoding depends on the program: its labels and size, or its descriptors
_PROGRAM_BOUND = isa.op_table(lambda spec: spec.code in _DESC_FIELD or "label" in _operand_kinds(spec))


def _encode_one(spec, instr, where, ns, nv, labels, n, ndesc, platform) -> np.ndarray:
    """The encoded row of one instruction, its operands checked in order (:func:`operand_layout`)."""
    row = np.zeros(isa.N_FIELDS, dtype=np.int64)
    row[isa.F_OP] = spec.code
    a = instr.args
    layout = operand_layout(spec)
    for f, tok in enumerate(spec.fields):
        if tok[:1] == "l":                  # the link register: the platform's last scalar register
            row[isa.F_R0 + f] = ns - 1
    if spec.syntax == "reason":             # nop: the reason is optional
        reason = a[0] if a else "latency"
        if reason not in ("latency", "branch"):
            raise AssemblyError(f"{where}: nop reason must be 'latency' or 'branch', got {reason!r}")
        row[isa.F_IMM0] = isa.STALLS.index(reason)
        return row
    if len(a) != len(layout):
        raise AssemblyError(f"{where}: expects {len(layout)} operands ({spec.syntax}), got {len(a)}")
    addresses = 0
    for i, (kind, slot, imm) in enumerate(layout):
        at = f"{where}, operand {i + 1}"
        if kind == "reg":
            tok = spec.fields[slot - isa.F_R0]
            r = _reg(tok[0], a[i], at, ns if tok[0] == "s" else nv)
            if tok[0] == "s" and tok[1:] in ("=", "+") and r == isa.ZERO_REG:
                raise AssemblyError(f"{at}: s0 is the zero register and cannot be written")
            row[slot] = r
        elif kind == "addr" and spec.space is not None:
            row[slot], row[imm] = _addr(a[i], at, spec.space, ns)
        elif kind == "addr":                # a DMA's: source, then destination, in any space
            row[slot], row[imm] = _dma_addr(a[i], f"{at} ({('source', 'destination')[addresses]})", ns)
            addresses += 1
        elif kind == "imm":
            row[imm] = _imm(a[i], at)
        elif kind == "label":
            row[imm] = _label(a[i], at, labels, n)
        elif kind == "ch":
            ch = _imm(a[i], f"{at} (channel)")
            if not 0 <= ch < platform.dma_channels:
                raise AssemblyError(f"{at}: DMA channel {ch} out of range 0..{platform.dma_channels - 1}")
            row[slot] = ch
        elif kind == "desc":
            d = _imm(a[i], f"{at} (descriptor)")
            if not 0 <= d < ndesc:
                raise AssemblyError(f"{at}: DMA descriptor {d} not defined ({ndesc} defined)")
            row[slot] = d
    return row


def _dma_addr(value, where: str, ns: int) -> tuple[int, int]:
    if not isinstance(value, tuple) or len(value) != 2:
        raise AssemblyError(f"{where}: expected an address (sreg, offset), got {value!r}")
    return _reg("s", value[0], where, ns), _offset(value[1], where)


def _check_descriptor(d: Descriptor, name: str, platform: Platform) -> np.ndarray:
    where = f"DMA descriptor '{name}'"
    for label, sp in (("src", d.src), ("dst", d.dst)):
        if sp not in isa.SPACES:
            raise AssemblyError(f"{where}: {label} space {sp!r} unknown (known: {', '.join(isa.SPACES)})")
    if d.mode not in isa.DMA_MODES:
        raise AssemblyError(f"{where}: mode {d.mode!r} unknown (known: {', '.join(isa.DMA_MODES)})")
    if d.rows < 0 or d.row_bytes <= 0:
        raise AssemblyError(f"{where}: rows must be >= 0 (0 is an empty transfer) and row_bytes positive "
                            f"(rows={d.rows}, row_bytes={d.row_bytes})")
    if d.src_stride < 0 or d.dst_stride < 0:
        raise AssemblyError(f"{where}: strides must be non-negative")
    reach = max(d.rows - 1, 0) * max(d.src_stride, d.dst_stride) + d.row_bytes
    if d.rows > isa.MAX_DESC_ROWS or reach > isa.MAX_DESC_EXTENT:
        raise AssemblyError(f"{where}: spans {reach} bytes in {d.rows} rows, more than any memory "
                            f"(at most {isa.MAX_DESC_EXTENT} bytes in {isa.MAX_DESC_ROWS} rows)")
    if d.rows > 1 and d.dst_stride < d.row_bytes:
        raise AssemblyError(f"{where}: dst_stride {d.dst_stride} < row_bytes {d.row_bytes}: rows would overlap")
    if d.row_bytes % 2:
        raise AssemblyError(f"{where}: row_bytes must be even (FP16 granularity)")
    if d.mode == "broadcast" and d.dst not in ("SM", "AM"):
        raise AssemblyError(f"{where}: broadcast writes every DSP's SM or AM, not {d.dst}")
    if d.mode == "reduce_add":
        if d.dst not in ("GSM", "DDR") or d.row_bytes % 4:
            raise AssemblyError(f"{where}: reduce_add adds FP32 rows (row_bytes multiple of 4) into GSM or DDR")
    return np.array([isa.SPACES.index(d.src), isa.SPACES.index(d.dst), d.rows, d.row_bytes,
                     d.src_stride, d.dst_stride, isa.DMA_MODES.index(d.mode)], dtype=np.int64)


def _reg_effects(row: np.ndarray) -> tuple[list[tuple[str, int]], list[tuple[str, int]], str | None]:
    """(reads, writes, latency field) of one encoded instruction (:meth:`~mtemu.isa.OpSpec.register_effects`)."""
    spec = isa.OP_BY_CODE.get(int(row[isa.F_OP]))
    return spec.register_effects(row) if spec is not None else ([], [], None)


_TARGET_OPS = isa.op_table(has_target=True)


def check_latency_hazards(prog: Program, platform: Platform) -> None:
    """Reject reads (and overwrites) of a register whose earlier write has not landed.

    Straight-line tracking; branch targets start with every register ready, and a control
    transfer must find every write landed by the next bundle, so blocks check independently.
    Each distinct bundle's registers are worked out once (:func:`_bundle_hazards`); the program is
    checked with array operations (:func:`_hazard_free`), and one they flag is walked bundle by bundle
    (:func:`_walk_hazards`, the reference), which names the first hazard.
    """
    code = prog.code
    n = code.shape[0]
    if not n:
        return
    flat = np.ascontiguousarray(code, dtype=np.int64).reshape(n, -1)
    _, first, inverse = np.unique(flat.view(np.dtype((np.void, flat.shape[1] * 8))).ravel(),
                                  return_index=True, return_inverse=True)
    check_hazards_indexed(prog, platform, code[first], inverse.ravel())


def check_hazards_indexed(prog: Program, platform: Platform, distinct: np.ndarray, ids: np.ndarray) -> None:
    """:func:`check_latency_hazards` given the program's bundles as ``distinct[ids]`` (a generator that
    keeps its bundles so: each distinct bundle is looked at once). ``distinct`` may differ from the
    program's bundles in immediates other than branch targets, which hazards do not depend on."""
    lat = platform.latencies
    n = prog.code.shape[0]
    if not n:
        return
    known = _shared_memo(_HAZARDS, lat)           # a bundle's hazards depend on it and the latencies alone
    if len(_ROW_EFFECTS) > _SHARED_MAX:
        _ROW_EFFECTS.clear()
    # a bundle's hazards depend on its opcodes and registers alone, not on its immediates (addresses,
    # counts, targets): bundles that differ only there share one entry
    regs = np.ascontiguousarray(distinct[:, :, :isa.F_IMM0]).reshape(len(distinct), -1)
    _, first, inverse = np.unique(regs.view(np.dtype((np.void, regs.shape[1] * 8))).ravel(),
                                  return_index=True, return_inverse=True)
    entries = []
    for b in first.tolist():
        key = regs[b].tobytes()
        got = known.get(key)
        if got is None:
            got = known[key] = _hazard_entry(_bundle_hazards(distinct[b], lat, _ROW_EFFECTS))
        entries.append(got)
    ids = inverse.ravel()[ids]
    targets = _targets(prog, distinct)
    if not _hazard_free(n, entries, ids, targets):
        _walk_hazards(prog, lat, [entries[i][0] for i in ids.tolist()], targets)


def hazard_free_by_parts(parts: list[np.ndarray], fillers: np.ndarray, platform: Platform) -> bool:
    """Whether every program made of ``parts`` (runs of encoded bundles, each ending in a control
    transfer), in any order and any number of times, with any of the bundles ``fillers`` anywhere
    between them, is free of latency hazards: what :func:`check_latency_hazards` would find in each.

    A filler that writes no register leaves nothing in flight, and a part's last control transfer must
    find its writes landed, so every part starts with nothing in flight and each is checked once, the
    parts one after another. False when a filler writes a register, a part does not end in a control
    transfer or a part faults: then each program has to be checked on its own (which names the fault)."""
    lat = platform.latencies
    if any(_bundle_hazards(block, lat, _ROW_EFFECTS)[1] for block in fillers):
        return False
    if not all(len(part) and _bundle_hazards(part[-1], lat, _ROW_EFFECTS)[2] for part in parts):
        return False
    blocks = [*parts, fillers]
    code = np.concatenate(blocks) if blocks else np.zeros((0, isa.N_UNITS, isa.N_FIELDS), dtype=np.int64)
    try:
        check_latency_hazards(Program(code, np.zeros((0, isa.N_DESC), dtype=np.int64)), platform)
    except AssemblyError:
        return False
    return True


def check_dma_offset(value, bundle: int, operand: int) -> int:
    """A DMA's address offset (``operand`` 3, the source, or 4, the destination, of bundle ``bundle``),
    checked as the assembler checks it."""
    return _offset(value, f"bundle {bundle}, unit SIEU, dma, operand {operand} "
                          f"({('source', 'destination')[operand - 3]})")


def _reg_id(reg: tuple[str, int]) -> int:
    """A register as one integer (scalar registers first, then vector ones)."""
    return reg[1] + (1 << 31 if reg[0] == "v" else 0)


def _hazard_entry(hazards: tuple) -> tuple:
    """A bundle's :func:`_bundle_hazards` and, for :func:`_hazard_free`, the registers it touches, those
    it writes and their latencies, as integers."""
    touched, updates, _control, _clean = hazards
    return (hazards, [_reg_id(r) for r in touched], [_reg_id(r) for r, _l, _u in updates],
            [lat for _r, lat, _u in updates])


def _targets(prog: Program, distinct: np.ndarray) -> set[int]:
    """Bundles where tracking starts again: the labels and every branch target (``distinct``: every
    bundle of the program, once or more)."""
    targets = set(prog.labels.values())
    if len(distinct):
        branching = _TARGET_OPS[distinct[:, :, isa.F_OP]]
        targets.update(distinct[:, :, isa.F_IMM0][branching].tolist())
    return targets


def _csr(lists: list[list], dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenated items, offsets and counts of a list of lists."""
    counts = np.fromiter(map(len, lists), dtype=np.intp, count=len(lists))
    offsets = np.zeros(len(lists), dtype=np.intp)
    np.cumsum(counts[:-1], out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=dtype, count=int(counts.sum()))
    return flat, offsets, counts


def _gather(flat: np.ndarray, offsets: np.ndarray, counts: np.ndarray, ids: np.ndarray):
    """(bundle, item) of every item of every bundle, bundle ``b`` holding the items of ``ids[b]``, in order."""
    per = counts[ids]
    total = int(per.sum())
    bundle = np.repeat(np.arange(len(ids), dtype=np.intp), per)
    starts = np.cumsum(per) - per
    at = np.repeat(offsets[ids] - starts, per) + np.arange(total, dtype=np.intp)
    return bundle, flat[at]


def _hazard_free(n: int, entries: list[tuple], ids: np.ndarray, targets: set[int]) -> bool:
    """True when :func:`_walk_hazards` finds nothing in the program whose bundle ``b`` is the distinct
    bundle ``entries[ids[b]]`` (:func:`_hazard_entry`); False where it may fault (the walk then decides
    and names the fault).

    The walk's state is the last write to each register since tracking last started (a branch target,
    or the bundle after a control transfer: a *segment*). A bundle faults if it touches a register whose
    last earlier write in its segment is still in flight (issued at ``w`` with latency ``l``:
    ``w + l > b``), and a control transfer at ``c`` faults if some register's last write in its segment
    has ``w + l > c + 1``; earlier writes to that register landed before the write that replaced them
    (it touched the register), so only the last one can be late."""
    hazards = [e[0] for e in entries]
    if not all(h[3] for h in hazards):
        return False
    touched = [e[1] for e in entries]
    w_regs = [e[2] for e in entries]
    w_lats = [e[3] for e in entries]
    control = np.array([h[2] for h in hazards], dtype=bool)[ids]
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    starts[[t for t in targets if 0 <= t < n]] = True
    starts[1:] |= control[:-1]
    seg = np.cumsum(starts) - 1
    seg_end = np.append(np.flatnonzero(starts)[1:] - 1, n - 1)       # each segment's last bundle
    wr_flat, w_off, w_cnt = _csr(w_regs, np.int64)
    wl_flat = _csr(w_lats, np.int64)[0]
    wb, wr = _gather(wr_flat, w_off, w_cnt, ids)
    wl = _gather(wl_flat, w_off, w_cnt, ids)[1]
    if not len(wb):
        return True
    # writes by register, then bundle (a stable sort keeps a bundle's writes in the walk's order)
    by_reg = np.argsort(wr, kind="stable")
    wr, wb, wl = wr[by_reg], wb[by_reg], wl[by_reg]
    wkey = wr * (n + 1) + wb
    t_flat, t_off, t_cnt = _csr(touched, np.int64)
    tb, tr = _gather(t_flat, t_off, t_cnt, ids)
    # each touch's last write to its register in an earlier bundle (a bundle's own writes land after it)
    last = np.searchsorted(wkey, tr * (n + 1) + tb, side="left") - 1
    ok = last >= 0
    last = np.maximum(last, 0)
    prior = ok & (wr[last] == tr) & (seg[wb[last]] == seg[tb])
    if np.any(prior & (wb[last] + wl[last] > tb)):
        return False
    # the last write to each register in a segment that ends in a control transfer
    final = np.ones(len(wr), dtype=bool)
    final[:-1] = (wr[1:] != wr[:-1]) | (seg[wb[1:]] != seg[wb[:-1]])
    end = seg_end[seg[wb]]
    return not np.any(final & control[end] & (wb + wl > end + 1))


def _walk_hazards(prog: Program, lat, per_bundle: list[tuple], targets: set[int]) -> None:
    """The reference check: walk the program bundle by bundle with the writes in flight; raise at the first
    hazard (``per_bundle``: each bundle's :func:`_bundle_hazards`)."""
    code = prog.code
    ready: dict[tuple[str, int], tuple[int, int, int]] = {}   # reg -> (ready cycle, bundle, unit)
    cycle = 0
    for b in range(code.shape[0]):
        if b in targets:
            ready = {}
        touched, updates, control, clean = per_bundle[b]
        if not clean or any(reg in ready and ready[reg][0] > cycle for reg in touched):
            _raise_hazard(b, cycle, ready, code[b], lat)
        for reg, latency, u in updates:
            ready[reg] = (cycle + latency, b, u)
        cycle += 1
        if control:
            for reg, (t_ready, bb, uu) in ready.items():
                if t_ready > cycle:
                    raise AssemblyError(
                        f"bundle {b}, unit SBR: control transfer while {reg[0]}{reg[1]} (written in bundle {bb}, "
                        f"{isa.UNITS[uu]}) is still in flight; pad with nops")
            ready = {}


def _effects(block: np.ndarray, known: dict | None = None) -> list[tuple[int, isa.OpSpec, list, list, str | None]]:
    """(unit, spec, reads, writes, latency field) of each instruction of one encoded bundle, in unit order.
    ``known``: a row's opcode and register fields (all its effects depend on) -> its effects, filled as
    rows are met (distinct bundles share most rows)."""
    out = []
    for u in range(isa.N_UNITS):
        row = block[u]
        op = int(row[isa.F_OP])
        if op == 0:
            continue
        if known is None:
            reads, writes, latname = _reg_effects(row)
        else:
            key = row[:isa.F_IMM0].tobytes()
            got = known.get(key)
            if got is None:
                got = known[key] = _reg_effects(row)
            reads, writes, latname = got
        out.append((u, isa.OP_BY_CODE[op], reads, writes, latname))
    return out


def _bundle_hazards(block: np.ndarray, lat, known: dict | None = None) -> tuple[tuple, tuple, bool, bool]:
    """What one bundle's check needs, whatever came before it: the registers it reads (s0 aside) or
    writes, whose earlier writes must have landed; its writes as (register, latency, unit) in unit
    order; whether it transfers control; whether it is free of hazards inside itself (a read of a
    register another unit writes in the bundle, two units writing one register)."""
    effects = _effects(block, known)
    same_bundle = {(kind, r): u for u, _s, _r, writes, _l in effects for kind, r in writes}
    touched, updates, writers = [], [], {}
    clean, control = True, False
    for u, spec, reads, writes, latname in effects:
        control |= spec.control
        for kind, r in reads:
            if kind == "s" and r == isa.ZERO_REG:
                continue
            writer = same_bundle.get((kind, r))
            clean &= writer is None or writer == u
            touched.append((kind, r))
        for reg in writes:
            clean &= writers.setdefault(reg, u) == u
            touched.append(reg)
            updates.append((reg, getattr(lat, latname), u))
    return tuple(dict.fromkeys(touched)), tuple(updates), control, clean


def _raise_hazard(b: int, cycle: int, ready: dict, block: np.ndarray, lat) -> None:
    """Walk bundle ``b`` instruction by instruction against the writes in flight and raise at its first
    hazard (the messages name the bundle, unit, opcode, register and the write it waits for)."""
    effects = _effects(block)
    same_bundle = {(kind, r): u for u, _s, _r, writes, _l in effects for kind, r in writes}
    writes_here = []
    for u, spec, reads, writes, _latname in effects:
        for kind, r in reads:
            if kind == "s" and r == isa.ZERO_REG:
                continue
            writer = same_bundle.get((kind, r))
            if writer is not None and writer != u:
                raise AssemblyError(
                    f"bundle {b}, unit {isa.UNITS[u]}, {spec.name}: reads {kind}{r} 1 cycle(s) before the write "
                    f"issued in the same bundle ({isa.UNITS[writer]}) lands")
            pending = ready.get((kind, r))
            if pending is not None and pending[0] > cycle:
                raise AssemblyError(
                    f"bundle {b}, unit {isa.UNITS[u]}, {spec.name}: reads {kind}{r} {pending[0] - cycle} "
                    f"cycle(s) before the write issued in bundle {pending[1]} ({isa.UNITS[pending[2]]}) lands")
        for kind, r in writes:
            pending = ready.get((kind, r))
            if pending is not None and pending[0] > cycle:
                raise AssemblyError(
                    f"bundle {b}, unit {isa.UNITS[u]}, {spec.name}: overwrites {kind}{r} while the write "
                    f"issued in bundle {pending[1]} is still in flight")
            writes_here.append(((kind, r), u))
    for reg, uu in writes_here:
        if any(w == reg and wu != uu for w, wu in writes_here):
            raise AssemblyError(f"bundle {b}: two units write {reg[0]}{reg[1]} in one bundle")
    raise AssertionError(f"bundle {b}: a hazard was flagged that the walk does not find")


# ------------------------------------------------------------------------------------------
# Text form
# ------------------------------------------------------------------------------------------
def _fmt_args(spec: isa.OpSpec, row: np.ndarray, prog: Program, label_of: dict[int, str]) -> str:
    out = []
    for kind, slot, imm in operand_layout(spec):
        if kind == "reg":
            out.append(f"{spec.fields[slot - isa.F_R0][0]}{int(row[slot])}")
        elif kind == "addr":
            out.append(f"[s{int(row[slot])}+{int(row[imm])}]")
        elif kind == "imm":
            out.append(str(int(row[imm])))
        elif kind == "label":
            out.append(label_of[int(row[imm])])
        elif kind == "reason":
            out.append(isa.STALLS[int(row[imm])])
        elif kind == "ch":
            out.append(str(int(row[slot])))
        else:
            out.append(prog.descriptor_names[int(row[slot])])
    return ", ".join(out)


def disassemble(prog: Program) -> str:
    """Readable text that :func:`parse` turns back into the same arrays."""
    label_of: dict[int, str] = {}
    for name, pc in sorted(prog.labels.items(), key=lambda kv: (kv[1], kv[0])):
        label_of.setdefault(pc, name)
    for b in range(prog.bundles):
        for u in range(isa.N_UNITS):
            if _TARGET_OPS[prog.code[b, u, isa.F_OP]]:
                pc = int(prog.code[b, u, isa.F_IMM0])
                label_of.setdefault(pc, f"L{pc}")
    lines = []
    for k, row in enumerate(prog.descriptors):
        src, dst, rows, rb, ss, ds, mode = (int(x) for x in row)
        lines.append(f".desc {prog.descriptor_names[k]} src={isa.SPACES[src]} dst={isa.SPACES[dst]} rows={rows} "
                     f"row_bytes={rb} src_stride={ss} dst_stride={ds} mode={isa.DMA_MODES[mode]}")
    extra = {pc: [n for n, p in prog.labels.items() if p == pc] for pc in set(prog.labels.values())}
    for b in range(prog.bundles):
        names = list(dict.fromkeys(([label_of[b]] if b in label_of else []) + sorted(extra.get(b, []))))
        for name in names:
            lines.append(f"{name}:")
        parts = []
        for u in range(isa.N_UNITS):
            row = prog.code[b, u]
            op = int(row[isa.F_OP])
            if op == 0:
                continue
            spec = isa.OP_BY_CODE[op]
            args = _fmt_args(spec, row, prog, label_of)
            parts.append(f"{spec.name}@{isa.UNITS[u]}" + (f" {args}" if args else ""))
        lines.append("{ " + " | ".join(parts) + " }")
    for name, pc in prog.labels.items():
        if pc == prog.bundles:
            lines.append(f"{name}:")
    return "\n".join(lines) + "\n"


_ADDR_RE = re.compile(r"^\[\s*(s\d+)\s*([+-]\s*-?\d+)?\s*\](?:@(\w+))?$")


def _parse_operand(tok: str, where: str):
    tok = tok.strip()
    m = _ADDR_RE.match(tok)
    if m:
        sign_digits = m.group(2).replace(" ", "") if m.group(2) else "0"
        # "[s1+-4]" is s1 - 4: the signs multiply
        off = (-1 if sign_digits.count("-") % 2 else 1) * int(sign_digits.lstrip("+-"))
        return (m.group(1), off, m.group(3)) if m.group(3) else (m.group(1), off)
    if len(tok) > 40 and re.fullmatch(r"-?(\d+|0x[0-9a-fA-F]+)", tok):
        raise AssemblyError(f"{where}: integer {tok[:20]}... of {len(tok)} digits is out of range")
    if re.fullmatch(r"-?\d+", tok):
        return int(tok)
    if re.fullmatch(r"0x[0-9a-fA-F]+", tok):
        return int(tok, 16)
    return tok


def _split_args(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def parse(text: str, platform: Platform = DEFAULT, source: str = "<text>",
          check_hazards: bool = True) -> Program:
    """Assemble the text form. Errors name the source line as well as bundle and unit."""
    builder = ProgramBuilder(platform)
    if not isinstance(text, str):
        raise AssemblyError(f"{source}: program text must be a str, got {type(text).__name__}")
    desc_ids: dict[str, int] = {}
    desc_lines: dict[str, int] = {}
    pending: list[tuple[int, list[Instr]]] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{line_no}"
        if line.startswith(".desc"):
            parts = line.split()
            if len(parts) < 2:
                raise AssemblyError(f"{where}: .desc needs a name")
            kv = {}
            for p in parts[2:]:
                if "=" not in p:
                    raise AssemblyError(f"{where}: .desc field {p!r} is not key=value")
                k, v = p.split("=", 1)
                kv[k] = v
            try:
                desc_ids[parts[1]] = builder.descriptor(
                    kv.pop("src"), kv.pop("dst"), int(kv.pop("rows")), int(kv.pop("row_bytes")),
                    int(kv.pop("src_stride")), int(kv.pop("dst_stride")), kv.pop("mode", "copy"), name=parts[1])
            except KeyError as exc:
                raise AssemblyError(f"{where}: .desc {parts[1]} is missing field {exc.args[0]}") from None
            except (ValueError, OverflowError) as exc:
                raise AssemblyError(f"{where}: .desc {parts[1]}: {exc}") from None
            if kv:
                raise AssemblyError(f"{where}: .desc {parts[1]} has unknown field(s) {', '.join(kv)}")
            desc_lines.setdefault(parts[1], line_no)
            continue
        if line.endswith(":") and not line.startswith("{"):
            try:
                builder.label(line[:-1].strip())
            except AssemblyError as exc:
                raise AssemblyError(f"{where}: {exc}") from None
            continue
        if not (line.startswith("{") and line.endswith("}")):
            raise AssemblyError(f"{where}: expected '{{ ... }}' bundle, 'label:' or '.desc', got {line!r}")
        body = line[1:-1].strip()
        instrs = []
        for part in filter(None, (p.strip() for p in body.split("|"))):
            head, _, rest = part.partition(" ")
            op, _, unit = head.partition("@")
            args = [_parse_operand(t, where) for t in _split_args(rest)] if rest.strip() else []
            if op == "dma" and len(args) >= 2 and isinstance(args[1], str):
                if args[1] not in desc_ids:
                    raise AssemblyError(f"{where}: unknown DMA descriptor '{args[1]}'")
                args[1] = desc_ids[args[1]]
            instrs.append(Instr(op, tuple(args), unit or None))
        pending.append((line_no, instrs))
        builder.bundle(*instrs)
    try:
        return builder.assemble(check_hazards=check_hazards)
    except AssemblyError as exc:
        msg = str(exc)
        m = re.match(r"bundle (\d+)", msg)
        d = re.match(r"DMA descriptor '([^']+)'", msg)
        if m and int(m.group(1)) < len(pending):
            msg = f"{source}:{pending[int(m.group(1))][0]}: {msg}"
        elif d and d.group(1) in desc_lines:
            msg = f"{source}:{desc_lines[d.group(1)]}: {msg}"
        elif not msg.startswith(source):
            msg = f"{source}: {msg}"
        raise AssemblyError(msg) from None

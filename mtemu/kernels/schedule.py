"""A small list scheduler that turns an ordered list of operations into VLIW bundles.

Used by kernel generators for fully unrolled micro-kernels, the way a VLIW compiler
software-pipelines a loop: each operation is placed at the earliest cycle where a unit that can
run it is free and where its register constraints hold:

- read-after-write: a source is read no earlier than its producer's issue + latency;
- write-after-read: a register is overwritten only after every read of its old value;
- write-after-write: a register is overwritten only after the earlier write has landed.

``fence=True`` on an operation forbids placing it (or anything after it in the list) before every
earlier operation has completed: this is how the "no software pipeline" variant is built.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import isa
from ..assembler import MAX_PROGRAM_BUNDLES, Instr, program_too_long
from ..errors import AssemblyError
from ..platform import Platform


@dataclass
class Op:
    name: str
    args: tuple
    reads: tuple[tuple[str, int], ...]
    writes: tuple[tuple[str, int], ...] = ()
    fence: bool = False


def schedule(ops: list[Op], platform: Platform) -> list[list[Instr]]:
    """Return bundles (lists of pinned instructions); empty cycles become empty lists."""
    lat = platform.latencies
    unit_busy: dict[int, set[int]] = {}
    ready: dict[tuple[str, int], int] = {}       # register -> cycle its latest value is readable
    last_read: dict[tuple[str, int], int] = {}   # register -> last cycle its current value is read
    placed: list[tuple[int, Instr]] = []
    floor = 0          # fence: nothing may be placed before this cycle
    completion = 0     # latest completion of anything placed so far
    # (units, latency, unit names) per opcode, looked up once: a GEMM's micro-kernels place ~10**5 ops
    per_op: dict[str, tuple[tuple[int, ...], int]] = {}
    names = isa.UNITS
    zero = ("s", isa.ZERO_REG)
    for op in ops:
        got = per_op.get(op.name)
        if got is None:
            spec = isa.OP_BY_NAME[op.name]
            got = per_op[op.name] = (tuple(spec.units), getattr(lat, spec.latency) if spec.latency else 1)
        units, latency = got
        if op.fence and completion > floor:
            floor = completion
        t = floor
        for r in op.reads:
            if r == zero:
                continue
            v = ready.get(r, 0)
            if v > t:
                t = v
        for w in op.writes:
            v = ready.get(w, 0)
            if v > t:
                t = v
            v = last_read.get(w, -1) + 1
            if v > t:
                t = v
        while True:                         # the earliest cycle from t with one of the op's units free
            busy = unit_busy.get(t)
            if busy is None:
                busy = unit_busy[t] = set()
            for unit in units:              # the first free one, in the op's unit order
                if unit not in busy:
                    break
            else:
                t += 1
                continue
            break
        busy.add(unit)
        for r in op.reads:
            if last_read.get(r, -1) < t:
                last_read[r] = t
        for w in op.writes:
            ready[w] = t + latency
            if last_read.get(w, -1) < t:
                last_read[w] = t
        if t + latency > completion:
            completion = t + latency
        if completion > MAX_PROGRAM_BUNDLES:       # before a list of that many empty bundles exists
            raise program_too_long(platform, completion)
        placed.append((t, Instr(op.name, op.args, names[unit])))
    if not placed:
        return []
    length = max(completion, max(t for t, _ in placed) + 1)
    bundles: list[list[Instr]] = [[] for _ in range(length)]
    for t, instr in placed:
        bundles[t].append(instr)
    return bundles


def check_registers(needed_s: int, needed_v: int, platform: Platform, what: str) -> None:
    if needed_v > platform.vector_registers:
        raise AssemblyError(f"{what}: needs {needed_v} vector registers, the platform has {platform.vector_registers}")
    if needed_s > platform.scalar_registers - 1:
        raise AssemblyError(f"{what}: needs {needed_s} scalar registers, the platform has "
                            f"{platform.scalar_registers - 1} free")

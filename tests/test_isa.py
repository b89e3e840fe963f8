"""The opcode table (mtemu.isa) is the one statement of the ISA: its flags agree with each opcode's
operands, the OP_* numbers and every other module's op sets derive from it, and the assembler's
hazard rules are the latencies it names."""
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from mtemu import isa, semantics
from mtemu.assembler import ProgramBuilder, ins
from mtemu.errors import AssemblyError
from mtemu.platform import DEFAULT, Latencies

ROOT = Path(__file__).resolve().parents[1]
SPECS = {spec.name: spec for spec in isa.OPS}


def test_codes_and_names_are_unique_and_the_op_numbers_come_from_the_table():
    assert len({s.code for s in isa.OPS}) == len(isa.OPS) and len(SPECS) == len(isa.OPS)
    assert 0 not in isa.OP_BY_CODE                      # 0 is the empty slot
    consts = {k: v for k, v in vars(isa).items() if k.startswith("OP_") and isinstance(v, int)}
    assert consts == {f"OP_{s.name.upper()}": s.code for s in isa.OPS}
    assert isa.N_OPCODES == max(consts.values()) + 1


# literal lists, tuples or sets that name two or more opcodes (or an opcode and a number)
_HAND_LIST = re.compile(r"[(\[{]([^()\[\]{}]*\bOP_[A-Z0-9_]+\b[^()\[\]{}]*)[)\]}]")


def test_no_module_builds_an_op_list_by_hand():
    """Op sets come from the table's flags (isa.ops_where / isa.op_table), so a new opcode cannot be
    left out of one: no literal list of OP_ names anywhere in mtemu but isa.py."""
    found = []
    for path in sorted((ROOT / "mtemu").rglob("*.py")):
        if path.name == "isa.py":
            continue
        text = path.read_text()
        for m in _HAND_LIST.finditer(text):
            if "," in m.group(1):
                found.append(f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)[:80]}")
    assert not found, "op lists written by hand (derive them from isa.OPS flags):\n" + "\n".join(found)


def test_the_hand_list_check_would_catch_one():
    assert _HAND_LIST.search("X = np.array([isa.OP_VFMA,\n isa.OP_VMAX])")
    assert _HAND_LIST.search("if op in (0, isa.OP_NOP):")
    assert not _HAND_LIST.search("if op == isa.OP_VFMA or op == isa.OP_VMAX:")


@pytest.mark.parametrize("spec", isa.OPS, ids=lambda s: s.name)
def test_flags_agree_with_the_operands(spec):
    kinds = spec.field_kinds
    assert all(f == "" or (f[0] in "svlcd" and f[1:] in ("", "=", "+")) for f in spec.fields)
    assert spec.units and all(0 <= u < isa.N_UNITS for u in spec.units)
    # a written register has a latency class, and only then
    assert (spec.latency is not None) == bool(spec.writes)
    assert spec.latency is None or spec.latency in {f.name for f in fields(Latencies)}
    # memory: an op with a space addresses memory and says how wide its elements are
    assert (spec.space is not None) <= spec.addresses_memory
    assert (spec.access_bytes > 0) == (spec.space is not None)
    assert spec.addresses_memory == (spec.space is not None or "d" in kinds)   # else a DMA
    assert spec.addresses_memory == ("[" in spec.syntax)
    # what the functional queue must see: vector registers, AM, and stores to SM
    stores_sm = spec.space == isa.SP_SM and not spec.writes
    assert spec.touches_am == (spec.vector or spec.space == isa.SP_AM or stores_sm)
    # control: branches name a target; control runs on the branch unit and is never plain
    assert spec.has_target == ("label" in spec.syntax)
    assert spec.has_target <= spec.control
    assert spec.control <= (spec.units == (isa.SBR,))
    assert not (spec.is_plain and (spec.control or "d" in kinds))
    # a plain op writes scalar registers only by loading them
    assert not (spec.is_plain and "s" in spec.writes and not spec.addresses_memory)
    assert spec.libm <= spec.is_plain and spec.libm <= spec.vector
    assert spec.is_mac <= (spec.units == (isa.VMAC,)) and spec.is_mac <= spec.is_plain
    assert spec.busy or spec.name == "nop"
    # the link register is the only implicit operand; a named scalar destination is r0
    assert spec.names_scalar_dest == (spec.fields[0] == "s=")
    assert ("l" in "".join(spec.fields)) == (spec.name in ("call", "ret"))


def test_operand_syntax_uses_each_field_once():
    """Each operand of the text form fills the next register field (an address: a register and an
    immediate); the link register is filled in by the assembler."""
    for spec in isa.OPS:
        regs = [f for f in spec.fields if f and f[0] != "l"]
        ops = [t.strip() for t in spec.syntax.split(",") if t.strip()]
        reg_tokens = [t for t in ops if t not in ("imm", "label", "reason")]
        assert len(reg_tokens) == len(regs), spec.name


def test_derived_sets():
    # (what the hand-written lists these replace named; a new vector op adds to the first)
    assert set(isa.ops_where(touches_am=True)) >= {isa.OP_BY_NAME[n].code for n in (
        "vfma", "svbcast", "svbcastw", "vexp", "vlog", "vmax", "ssth", "vldh", "vldw", "vstw", "vsth")}
    assert set(isa.ops_where(has_target=True)) == {isa.OP_BR, isa.OP_BNZ, isa.OP_BDEC, isa.OP_CALL}
    assert set(isa.ops_where(names_scalar_dest=True)) == {isa.OP_SADDI, isa.OP_SADD, isa.OP_SMOVI, isa.OP_SLDH,
                                                          isa.OP_SLDD, isa.OP_SMVD, isa.OP_SFADDD}
    table = isa.op_table(is_plain=True)
    assert table.shape == (isa.N_OPCODES,) and not table[0] and table[isa.OP_NOP] and not table[isa.OP_DMA]
    assert isa.ops_where(lambda s: s.space == isa.SP_AM, vector=True).tolist() == [8, 9, 10, 11, 28, 29, 31, 32]
    assert isa.ops_where(fp64=True).tolist() == [26, 27, 28, 29, 30, 31, 32, 33, 34, 35]
    with pytest.raises(AttributeError):
        isa.ops_where(no_such_flag=True)


def test_register_effects_follow_the_fields():
    row = np.array([isa.OP_VFMA, 1, 2, 3, 0, 0, 0])
    assert isa.OP_BY_NAME["vfma"].register_effects(row) == ([("v", 2), ("v", 3), ("v", 1)], [("v", 1)], "vmac")
    row = np.array([isa.OP_BDEC, 0, 5, 0, 0, 7, 0])
    assert isa.OP_BY_NAME["bdec"].register_effects(row) == ([("s", 5)], [("s", 5)], "scalar_alu")
    row = np.array([isa.OP_DMA, 1, 0, 4, 6, 0, 0])          # channel and descriptor are not registers
    assert isa.OP_BY_NAME["dma"].register_effects(row) == ([("s", 4), ("s", 6)], [], None)


def test_every_opcode_has_a_statement_of_its_meaning():
    assert set(semantics.EXECUTE) == set(isa.OP_BY_CODE)
    for code, fn in semantics.EXECUTE.items():
        assert fn.__name__ == isa.OP_BY_CODE[code].name and fn.__doc__


# ------------------------------------------------------------------------------------------
# hazard rules = the table's latencies
# ------------------------------------------------------------------------------------------
# per opcode that writes a register: an instruction writing s5 or v5 (s1 holds 0: addresses are valid)
WRITERS = {
    "vfma": ins("vfma", "v5", "v1", "v2"), "svbcast": ins("svbcast", "v5", "s1"),
    "svbcastw": ins("svbcastw", "v5", "s1"), "vexp": ins("vexp", "v5", "v1"), "vlog": ins("vlog", "v5", "v1"),
    "vmax": ins("vmax", "v5", "v1", "v2"), "saddi": ins("saddi", "s5", "s1", 1),
    "sadd": ins("sadd", "s5", "s1", "s1"), "smovi": ins("smovi", "s5", 3), "sldh": ins("sldh", "s5", ("s1", 0)),
    "vldh": ins("vldh", "v5", ("s1", 0)), "vldw": ins("vldw", "v5", ("s1", 0)),
    "sldd": ins("sldd", "s5", ("s1", 0)), "svbcastd": ins("svbcastd", "v5", "s1"),
    "vldd": ins("vldd", "v5", ("s1", 0)), "vfmad": ins("vfmad", "v5", "v1", "v2"),
    "vlddg": ins("vlddg", "v5", ("s1", 0), "s1"), "vlddm4": ins("vlddm4", "v5", ("s1", 0)),
    "smvd": ins("smvd", "s5", "v1", 0), "sfaddd": ins("sfaddd", "s5", "s1", "s1"),
}
READERS = {"s": ins("saddi", "s6", "s5", 0), "v": ins("vstw", ("s1", 0), "v5")}


def _assemble(*bundles):
    b = ProgramBuilder(DEFAULT)
    for bundle in bundles:
        b.bundle(*bundle)
    b.bundle(ins("halt"))
    return b.assemble()


def test_every_register_writer_is_covered():
    control = {"bdec", "call"}       # their writes are checked at the control transfer (below)
    assert set(WRITERS) == {s.name for s in isa.OPS if s.writes} - control


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_read_is_refused_until_the_latency_the_table_names(name):
    spec = SPECS[name]
    latency = getattr(DEFAULT.latencies, spec.latency)
    reader = READERS[spec.writes]
    _assemble([WRITERS[name]], *[[ins("nop")]] * (latency - 1), [reader])          # lands in time
    if latency > 1:
        with pytest.raises(AssemblyError, match="before the write"):
            _assemble([WRITERS[name]], *[[ins("nop")]] * (latency - 2), [reader])
        with pytest.raises(AssemblyError, match="still in flight|before the write"):    # nor overwritten early
            _assemble([WRITERS[name]], *[[ins("nop")]] * (latency - 2), [WRITERS[name]])
    with pytest.raises(AssemblyError, match="same bundle"):
        _assemble([WRITERS[name], reader])


def test_a_control_transfer_waits_for_every_write_to_land():
    """Every write lands by the bundle after a control transfer (so each basic block checks alone)."""
    for name in sorted(WRITERS):
        latency = getattr(DEFAULT.latencies, SPECS[name].latency)
        _assemble([WRITERS[name]], *[[ins("nop")]] * max(latency - 2, 0), [ins("barrier")])
        if latency > 2:
            with pytest.raises(AssemblyError, match="control transfer"):
                _assemble([WRITERS[name]], *[[ins("nop")]] * (latency - 3), [ins("barrier")])

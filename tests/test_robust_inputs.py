"""Input files and program text: random content gives a result or a named error that carries the
file and line, never a traceback."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtemu.assembler import parse
from mtemu.errors import AssemblyError
from mtemu.platform import DEFAULT
from rtcommon.errors import UserError
from rtcommon.fileio import check_output_dir, check_output_file
from rtcommon.jsonio import MAX_NESTING, _nesting, load_json_file, load_table_file, parse_json, read_text, strict

ONE = DEFAULT.with_overrides(dsps=1)
TOKENS = ["{", "}", "|", ",", "[", "]", "s1", "s0", "v3", "v99", "+", "-", "@GSM", "@AM", ":", "0", "-4", "7",
          "0x10", "99999999999999999999", "9" * 60, "smovi", "saddi", "vldh", "vfma", "dma", "dmawait", "br",
          "bdec", "halt", "nop", "branch", "top", "top:", ".desc", "d", "src=DDR", "dst=AM", "rows=2",
          "row_bytes=64", "src_stride=64", "dst_stride=64", "mode=copy", "rows=-1", "\x00", "é"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.sampled_from(TOKENS), max_size=8).map(" ".join), max_size=6))
def test_random_program_text_assembles_or_names_its_line(lines):
    text = "\n".join(lines + ["{ halt }"])
    try:
        parse(text, ONE, source="p.s")
    except AssemblyError as exc:
        assert str(exc).startswith("p.s"), str(exc)


def test_assembler_refuses_text_that_is_not_a_string():
    with pytest.raises(AssemblyError, match="must be a str"):
        parse(b"{ halt }", ONE, source="p.s")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_parse_json_gives_a_value_or_a_named_error(text):
    try:
        parse_json(text, "x.json")
    except UserError as exc:
        assert str(exc).startswith("x.json: ")


def _nesting_reference(text: str) -> int:
    """The nesting pre-check as a plain loop over the characters: what ``_nesting`` must equal."""
    depth = deepest = 0
    in_str = escape = False
    for ch in text:
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


NESTING_CASES = [
    "", "[]", "[[{}]]", '["[[[["]', '{"a": "]]]", "b": [[1]]}', '["\\"[[", "x"]', '"\\\\"[[',
    '["unterminated [[[', '"ends in a backslash\\', '["\\\\\\"]"]', "]]][[", "}}}{", '\\"[[["]]',
    '[\n"line\\\nbreak" [ ]', '["é", {"ü": ["\\u005b"]}]', "[" * 50 + '"' + "[" * 50,
]


@pytest.mark.parametrize("text", NESTING_CASES)
def test_nesting_matches_the_character_loop(text):
    assert _nesting(text) == _nesting_reference(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='[]{}"\\ a\n', max_size=60))
def test_nesting_matches_the_character_loop_on_random_text(text):
    assert _nesting(text) == _nesting_reference(text)


def test_json_readers_name_the_file(tmp_path):
    (tmp_path / "a.json").write_text("[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1))
    with pytest.raises(UserError, match="a.json: JSON nested deeper"):
        load_json_file(tmp_path / "a.json")
    (tmp_path / "b.toml").write_text("x = [" * 3)
    with pytest.raises(UserError, match="b.toml: not valid TOML"):
        load_table_file(tmp_path / "b.toml")
    (tmp_path / "c.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="top level must be a table"):
        load_table_file(tmp_path / "c.json")
    with pytest.raises(UserError, match="cannot read file"):
        read_text(tmp_path / "missing.json")
    nested = "[" * MAX_NESTING + "]" * MAX_NESTING
    assert json.loads(nested) == parse_json(nested, "ok")        # exactly the limit is fine


def test_strict_replaces_non_finite_values_and_numpy_scalars():
    import numpy as np
    replaced = []
    out = strict({"a": np.float32("nan"), "b": (np.int64(3), float("-inf"))}, "$", replaced)
    assert out == {"a": None, "b": [3, None]} and replaced == ["$.a (nan)", "$.b[1] (-inf)"]


def test_output_checks(tmp_path):
    (tmp_path / "f").write_text("x")
    check_output_dir(tmp_path / "new" / "deeper")          # missing parents are created later
    check_output_file(tmp_path / "new" / "x.json")
    with pytest.raises(UserError, match="is a file, not a folder"):
        check_output_dir(tmp_path / "f", "--out")
    with pytest.raises(UserError, match=r"has a file in the way \("):
        check_output_dir(tmp_path / "f" / "sub", "--out")
    with pytest.raises(UserError, match="is a folder, not a file"):
        check_output_file(tmp_path, "--trace")
    with pytest.raises(UserError, match="has a file in the way"):
        check_output_file(tmp_path / "f" / "x.json", "--trace")

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtemu.errors import CapacityError, MtemuError
from mtemu.kernels.capacity import AttentionTiles, attention_capacity_report, attention_tiles_fit, check_attention_tiles
from mtemu.platform import DEFAULT

NAMES = ["AM", "SM_bc_prime", "SM_br_prime", "GSM"]


def _failed_names(msg: str) -> list[str]:
    return re.findall(r"inequality (AM|SM_bc_prime|SM_br_prime|GSM):", msg)


def _excess(msg: str, name: str) -> int:
    m = re.search("inequality " + re.escape(name) + r": [^;]* exceeds the \d+-byte \w+ by (\d+) bytes", msg)
    assert m, msg
    return int(m.group(1))


def _assert_only(tiles, plat, name, excess):
    with pytest.raises(CapacityError) as ei:
        check_attention_tiles(tiles, plat)
    msg = str(ei.value)
    assert _failed_names(msg) == [name]
    assert _excess(msg, name) == excess
    rep = {r["name"]: r for r in attention_capacity_report(tiles, plat)}
    assert rep[name]["slack"] == -excess and not rep[name]["fits"]
    assert all(r["fits"] for n, r in rep.items() if n != name)


def test_report_closed_form_default_platform():
    t = AttentionTiles(br=128, bc=128, d=128, br_prime=64, bc_prime=32)
    rep = attention_capacity_report(t, DEFAULT)
    assert [r["name"] for r in rep] == NAMES
    used = [r["used"] for r in rep]
    assert used == [2 * (128 * 128 + 2 * 128 * 128 + 2 * 128 * 128), 2 * 32 * 128, 2 * 64 * 128, 2 * 128 * 128]
    assert [r["limit"] for r in rep] == [768 * 1024, 64 * 1024, 64 * 1024, 6 * 1024 * 1024]
    assert [r["slack"] for r in rep] == [r["limit"] - r["used"] for r in rep]
    assert [r["memory"] for r in rep] == ["AM", "SM", "SM", "GSM"]
    check_attention_tiles(t, DEFAULT)
    assert attention_tiles_fit(t, DEFAULT)


def test_am_exactly_full_default_platform_then_one_column_more():
    # 2*(256*256 + 4*256*d) = 786432 exactly for d = 320
    full = AttentionTiles(br=256, bc=256, d=320, br_prime=128, bc_prime=128)
    check_attention_tiles(full, DEFAULT)
    assert attention_capacity_report(full, DEFAULT)[0]["slack"] == 0
    # d + 1 adds 2*(2*Br + 2*Bc) = 2048 bytes
    _assert_only(AttentionTiles(256, 256, 321, 128, 128), DEFAULT, "AM", 2048)


def test_am_one_element_more():
    plat = DEFAULT.with_overrides(am_bytes=128)
    # 2*(2*15 + 2*2*1 + 2*15*1) = 128; 2*(1*21 + 2*1*1 + 2*21*1) = 130
    check_attention_tiles(AttentionTiles(2, 15, 1, 1, 1), plat)
    _assert_only(AttentionTiles(1, 21, 1, 1, 1), plat, "AM", 2)


def test_sm_bc_prime_boundary():
    check_attention_tiles(AttentionTiles(256, 256, 64, 128, 128), DEFAULT)   # 2*128*256 = 65536
    _assert_only(AttentionTiles(256, 256, 64, 128, 129), DEFAULT, "SM_bc_prime", 512)
    # one element more: Bc'*Br from 32768 to 32769
    check_attention_tiles(AttentionTiles(32768, 1, 1, 1, 1), DEFAULT)
    _assert_only(AttentionTiles(32769, 1, 1, 1, 1), DEFAULT, "SM_bc_prime", 2)


def test_sm_br_prime_boundary():
    check_attention_tiles(AttentionTiles(1, 32768, 1, 1, 1), DEFAULT)
    _assert_only(AttentionTiles(1, 32769, 1, 1, 1), DEFAULT, "SM_br_prime", 2)
    _assert_only(AttentionTiles(256, 256, 64, 129, 128), DEFAULT, "SM_br_prime", 512)


def test_gsm_boundary():
    plat = DEFAULT.with_overrides(gsm_bytes=128)
    check_attention_tiles(AttentionTiles(8, 64, 1, 8, 8), plat)                  # 2*64*1 = 128
    _assert_only(AttentionTiles(8, 65, 1, 8, 8), plat, "GSM", 2)
    # realistic: 6 MiB GSM holds Bc*d = 3*2**20 elements; needs a large AM to isolate GSM
    big = DEFAULT.with_overrides(am_bytes=64 * 1024 * 1024)
    check_attention_tiles(AttentionTiles(1, 24576, 128, 1, 1), big)
    _assert_only(AttentionTiles(1, 24577, 128, 1, 1), big, "GSM", 256)


def test_several_failures_all_named():
    plat = DEFAULT.with_overrides(am_bytes=64, sm_bytes=64, gsm_bytes=64)
    with pytest.raises(CapacityError) as ei:
        check_attention_tiles(AttentionTiles(40, 40, 40, 40, 40), plat)
    assert _failed_names(str(ei.value)) == NAMES
    assert not attention_tiles_fit(AttentionTiles(40, 40, 40, 40, 40), plat)


@pytest.mark.parametrize("field,value", [("br", 0), ("bc", -1), ("d", 1.5), ("br_prime", True), ("bc_prime", "8")])
def test_bad_tile_values_name_the_field(field, value):
    kw = dict(br=8, bc=8, d=8, br_prime=8, bc_prime=8)
    kw[field] = value
    with pytest.raises(MtemuError, match=field):
        check_attention_tiles(AttentionTiles(**kw), DEFAULT)


def test_sub_tile_larger_than_tile_rejected():
    with pytest.raises(MtemuError, match="br_prime"):
        check_attention_tiles(AttentionTiles(8, 8, 8, 9, 8), DEFAULT)
    with pytest.raises(MtemuError, match="bc_prime"):
        attention_capacity_report(AttentionTiles(8, 8, 8, 8, 9), DEFAULT)
    with pytest.raises(MtemuError, match="AttentionTiles"):
        check_attention_tiles((8, 8, 8, 8, 8), DEFAULT)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2048), st.integers(1, 2048), st.integers(1, 512), st.data())
def test_raises_iff_some_slack_negative(br, bc, d, data):
    t = AttentionTiles(br, bc, d, data.draw(st.integers(1, br)), data.draw(st.integers(1, bc)))
    rep = attention_capacity_report(t, DEFAULT)
    bad = [r["name"] for r in rep if r["slack"] < 0]
    if bad:
        with pytest.raises(CapacityError) as ei:
            check_attention_tiles(t, DEFAULT)
        assert _failed_names(str(ei.value)) == bad
    else:
        check_attention_tiles(t, DEFAULT)

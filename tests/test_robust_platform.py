"""Platform values: finite, in a sane range, with the unit named when a value is off by a unit."""
import math
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtemu.errors import PlatformError
from mtemu.platform import DEFAULT, RANGES, Latencies, Platform, as_platform, load_platform, validate_platform

NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2 ** 70, 2 ** 70),
                    st.sampled_from([0, 1, 30, 1.75, 1e-30, 1e30, 2 ** 63, float("nan"), float("inf")]),
                    st.booleans(), st.text(max_size=3), st.none())


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(RANGES)), NUMBERS, max_size=4))
def test_random_overrides_give_a_sane_platform_or_a_named_error(values):
    try:
        plat = DEFAULT.with_overrides("test", **values)
    except PlatformError as exc:
        assert any(name in str(exc) for name in values), str(exc)
        return
    for name, (lo, hi, _unit) in RANGES.items():
        v = getattr(plat, name)
        assert math.isfinite(v) and lo <= v <= hi
    assert plat.peak_mac_per_s > 0 and plat.bytes_per_cycle(plat.ddr_bandwidth) > 0


@pytest.mark.parametrize("name, value, hint", [
    ("ddr_bandwidth", 30, "ddr_bandwidth is in bytes/s; for 30 GB/s write 30e9"),
    ("gsm_bandwidth", 120, "for 120 GB/s write 120e9"),
    ("clock_hz", 1.75, "clock_hz is in Hz; for 1.75 GHz write 1.75e9"),
    ("ddr_bandwidth", 1e-30, "outside the sane range"),
    ("dma_latency_cycles", 10 ** 18, "outside the sane range 0..1e+09 (cycles)"),
    ("clock_hz", float("nan"), "must be a finite number"),
    ("dsps", 2.0, "must be an integer"),
])
def test_unit_slips_and_absurd_values_name_the_unit(name, value, hint):
    with pytest.raises(PlatformError, match=name) as info:
        load_platform(**{name: value})
    assert hint in str(info.value)


def test_latencies_are_bounded_too():
    with pytest.raises(PlatformError, match="latencies.vmac"):
        DEFAULT.with_overrides(latencies={"vmac": 10 ** 12})
    assert DEFAULT.with_overrides(latencies={"vmac": 0}).latencies.vmac == 0


def test_the_default_and_the_shipped_platform_files_are_valid():
    assert validate_platform(DEFAULT) is DEFAULT
    assert load_platform("platforms/mt3000-raw-ddr.toml").ddr_bandwidth == 51e9


def test_as_platform_refuses_what_is_not_a_platform():
    assert as_platform(None) is DEFAULT
    for bad in ({"dsps": 2}, "mt3000", 24):
        with pytest.raises(PlatformError, match="expected an mtemu Platform"):
            as_platform(bad)
    assert isinstance(as_platform(Platform(latencies=Latencies())), Platform)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([".json", ".toml"]))
def test_platform_files_of_random_bytes_are_named_errors(tmp_path_factory, data, suffix):
    path = tmp_path_factory.mktemp("plat") / f"p{suffix}"
    path.write_bytes(data)
    try:
        plat = load_platform(path)
    except PlatformError as exc:
        assert str(path) in str(exc)
    else:
        assert validate_platform(plat) is plat


@pytest.mark.parametrize("text, match", [
    ("[" * 5000 + "]" * 5000, "nested deeper"),
    ('{"dsps": 1' + "0" * 5000 + "}", "unreadable JSON value"),
    ('{"ddr_bandwidth": NaN}', "NaN, which is not a number"),
    ('{"ddr_bandwidth": Infinity}', "Infinity, which is not a number"),
])
def test_platform_json_edge_cases(tmp_path, text, match):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(PlatformError, match=match):
        load_platform(path)


def test_platform_files_that_are_folders_or_not_utf8(tmp_path):
    with pytest.raises(PlatformError, match="cannot read platform file"):
        load_platform(tmp_path)
    (tmp_path / "p.toml").write_bytes(b"ddr_bandwidth = 3\xff")
    with pytest.raises(PlatformError, match="not UTF-8 text"):
        load_platform(tmp_path / "p.toml")


def test_every_numeric_field_has_a_range():
    numeric = {f.name for f in fields(Platform)} - {"name", "latencies"}
    assert numeric == set(RANGES)
    for name, (lo, hi, _unit) in RANGES.items():
        assert lo <= getattr(DEFAULT, name) <= hi, name

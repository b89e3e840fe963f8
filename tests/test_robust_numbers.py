"""Huge integers and non-finite floats in every numeric field: one named error, never an
OverflowError (ranges are compared in arbitrary precision before any float conversion)."""
import json
from dataclasses import fields

import pytest

from mtemu.errors import PlatformError
from mtemu.platform import RANGES, Latencies, load_platform
from ratrain.errors import ConfigError
from ratrain.spec.models import from_hf_config, get_model
from ratrain.spec.platform import TrainingPlatform
from rtcommon.cache import write_json_cache
from rtcommon.checks import checked_number

HUGE = 10 ** 400
LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
         "num_attention_heads": 32, "vocab_size": 32000}


def test_checked_number_rules():
    assert checked_number(5, "x", integer=True, lo=1, hi=10) == 5
    for bad, match in ((True, "must be an integer"), (5.0, "must be an integer"), (HUGE, "401 digits"),
                       (-HUGE, "outside the sane range 1..10")):
        with pytest.raises(ValueError, match=match):
            checked_number(bad, "x", integer=True, lo=1, hi=10)
    for bad, match in ((float("inf"), "finite"), (float("nan"), "finite"), (HUGE, "401 digits"), ("1", "a number")):
        with pytest.raises(ValueError, match=match):
            checked_number(bad, "x", integer=False, lo=0, hi=1e9)


@pytest.mark.parametrize("name", sorted(RANGES) + [f"latencies.{f.name}" for f in fields(Latencies)])
def test_a_huge_integer_in_any_cluster_field_is_named(name):
    values = {"latencies": {name.split(".")[1]: HUGE}} if "." in name else {name: HUGE}
    with pytest.raises(PlatformError, match=rf"field '{name}' = an integer of 401 digits is outside"):
        load_platform(**values)
    with pytest.raises(ConfigError, match=rf"field '{name}' = an integer of 401 digits"):
        TrainingPlatform.from_dict({"cluster": values})


@pytest.mark.parametrize("field", ["link_bandwidth", "link_latency_s", "peak_mac_per_s"])
@pytest.mark.parametrize("value", [HUGE, -HUGE])
def test_a_huge_integer_in_a_link_field_is_named(field, value):
    with pytest.raises(ConfigError, match=field):
        TrainingPlatform.from_dict({field: value})


@pytest.mark.parametrize("key", ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                 "vocab_size", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta"])
@pytest.mark.parametrize("value", [HUGE, 1e400, 1e300])
def test_hf_config_fields_are_bounded_and_finite(tmp_path, key, value):
    path = tmp_path / "config.json"
    body = json.dumps({**LLAMA, key: HUGE if value == HUGE else 0}).replace(
        f'"{key}": 0', f'"{key}": {value!r}' if value != 1e400 else f'"{key}": 1e400')
    path.write_text(body)
    with pytest.raises(ConfigError, match=rf"config\.json: field {key} "):
        from_hf_config(path)


def test_hf_architectures_of_odd_types_are_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64, "architectures": [[{"a": 1}], None]}))
    with pytest.raises(ConfigError, match="field architectures=.* names no supported model"):
        from_hf_config(path)


def test_gpt_names_with_absurd_sizes_are_refused():
    with pytest.raises(ConfigError, match="field vocab = .* is above"):
        get_model("gpt-h64-l2-a2-v1000000000000000")


def test_cli_huge_platform_field_is_one_line(tmp_path, run_cli):
    from mtemu.cli import main as mtemu_main
    from ratrain.cli import main as ratrain_main
    path = tmp_path / "p.toml"
    path.write_text(f"[latencies]\nvmac = {HUGE}\n")
    for main in (mtemu_main, ratrain_main):
        code, _, err = run_cli(main, ["platform", "--platform", str(path)])
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and "latencies.vmac" in err


def _shipped_profile():
    from pathlib import Path
    folder = Path(__file__).resolve().parent.parent / "ratrain" / "data" / "profiles"
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("source") == "emulated" and any(o["kind"] == "attention" for o in data["ops"]):
            return data
    pytest.skip("no shipped emulated profile")


@pytest.mark.parametrize("edit", ["empty", "short", "not-a-list"])
def test_a_cached_profile_with_a_broken_kernel_list_is_rebuilt(tmp_path, edit):
    from ratrain.cost.profile import _load_if_current
    from rtcommon.caches import CacheWarning

    data = _shipped_profile()
    path = tmp_path / "p.json"
    write_json_cache(path, data)
    assert _load_if_current(path, data["emulator_version"], data["platform_key"]) is not None
    attention = next(o for o in data["ops"] if o["kind"] == "attention")
    attention["gemms"] = {"empty": [], "short": [["attention-fwd", 8]], "not-a-list": "x"}[edit]
    write_json_cache(path, data)            # as a faulty version would write it: the checksum holds
    with pytest.warns(CacheWarning, match="is malformed"):
        assert _load_if_current(path, data["emulator_version"], data["platform_key"]) is None

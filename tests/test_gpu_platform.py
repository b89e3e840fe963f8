"""GPU-cluster platforms: the shipped files, the file format's round trip, one-line errors for bad
input (library and CLI), derived figures, overrides, and MT-3000-only commands refusing them."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtemu.cli import main as mtemu_main
from ratrain.cli import main as ratrain_main
from ratrain.errors import ConfigError
from ratrain.spec.gpu import RANGES, GpuKernelModel, GpuPlatform, check_value
from ratrain.spec.platform import TrainingPlatform
from ratrain.spec.platforms import load_platform, platform_from_dict, require_mt3000

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = ROOT / "platforms"
GPU_FILES = ("a100-measured-cluster.toml", "dgx-a100.toml", "dgx-h100.toml", "rtx4090-pcie.toml")
MT3000_FILES = ("bandwidth-rich.toml", "more-memory.toml", "bandwidth-rich-more-memory.toml", "mt3000-30gbps.toml",
                "mt3000-raw-ddr.toml")
GIB = 2 ** 30


def _gpu(name: str = "dgx-a100.toml") -> GpuPlatform:
    return load_platform(PLATFORMS / name)


# --- shipped files ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", GPU_FILES)
def test_every_shipped_gpu_file_loads_and_round_trips(tmp_path, name):
    plat = load_platform(PLATFORMS / name)
    assert isinstance(plat, GpuPlatform) and plat.kind == "gpu-cluster"
    payload = plat.to_json()
    assert payload["kind"] == "gpu-cluster" and set(payload) == {
        "name", "kind", "device", "node", "network", "collectives", "kernels", "host", "derived"}
    assert GpuPlatform.from_dict(payload) == plat
    dumped = tmp_path / "p.json"
    dumped.write_text(json.dumps(payload))
    again = load_platform(dumped)
    assert again == plat and again.to_json() == payload


def test_every_gpu_file_in_platforms_is_shipped_and_every_field_carries_a_comment():
    shipped = {p.name for p in PLATFORMS.glob("*.toml") if 'kind = "gpu-cluster"' in p.read_text()}
    assert shipped == set(GPU_FILES)
    for name in GPU_FILES:
        for line in (PLATFORMS / name).read_text().splitlines():
            if "=" in line and not line.startswith(("#", "name", "kind", "[")):
                assert "#" in line, f"{name}: field without its source: {line}"


@pytest.mark.parametrize("name", MT3000_FILES)
def test_the_mt3000_files_still_load_as_mt3000(name):
    plat = load_platform(PLATFORMS / name)
    assert isinstance(plat, TrainingPlatform) and plat == TrainingPlatform.from_file(PLATFORMS / name)
    assert require_mt3000(plat, "test") is plat


def test_mt3000_json_names_its_kind_and_round_trips(tmp_path):
    payload = TrainingPlatform().to_json()
    assert payload["kind"] == "mt3000"
    assert platform_from_dict(payload) == TrainingPlatform()
    path = tmp_path / "mt.json"
    path.write_text(json.dumps(payload))
    assert load_platform(path) == TrainingPlatform()
    assert load_platform(None) == TrainingPlatform()
    # the emulator reads the same file (its [cluster] table) and refuses a GPU one
    assert mtemu_main(["platform", "--platform", str(path), "--json"]) == 0


# --- derived figures -------------------------------------------------------------------------
@pytest.mark.parametrize("name, budget_gib, hbm_gib, peak, intra, node_nic", [
    ("a100-measured-cluster.toml", 38, 40, 312e12, 300e9, 100e9),     # 800 Gbit/s per node; NVLink per the datasheet
    ("dgx-a100.toml", 78, 80, 312e12, 300e9, 200e9),                  # 8 x 200 Gbit/s
    ("dgx-h100.toml", 78, 80, 989e12, 450e9, 400e9),                  # 8 x 400 Gbit/s
    ("rtx4090-pcie.toml", 22, 24, 165.2e12, 32e9, 200e9),             # 8 x 200 Gbit/s
])
def test_derived_figures(name, budget_gib, hbm_gib, peak, intra, node_nic):
    plat = _gpu(name)
    assert plat.memory_budget_bytes == plat.device.usable_bytes == budget_gib * GIB
    assert plat.device.hbm_bytes == hbm_gib * GIB
    assert plat.peak_flops == plat.device.peak_fp16_flops == peak
    assert plat.node.intra_bandwidth == intra and plat.node.gpus_per_node == 8
    derived = plat.to_json()["derived"]
    assert derived["memory_budget_bytes"] == budget_gib * GIB and derived["memory_budget_gib"] == budget_gib
    assert derived["node_nic_bandwidth"] == node_nic and derived["nic_bandwidth_per_gpu"] == node_nic / 8
    assert derived["node_peak_flops"] == 8 * peak


def test_the_pcie_platform_has_no_peer_to_peer_and_the_others_do():
    assert not _gpu("rtx4090-pcie.toml").node.peer_to_peer
    assert _gpu("rtx4090-pcie.toml").node.intra_topology == "pcie-host"
    assert all(_gpu(n).node.peer_to_peer for n in GPU_FILES if n != "rtx4090-pcie.toml")


def test_dgx_a100_carries_the_calibration_clusters_fit():
    fitted, dgx = _gpu("a100-measured-cluster.toml"), _gpu("dgx-a100.toml")
    assert dgx.kernels == fitted.kernels and dgx.collectives == fitted.collectives
    assert fitted.kernels != GpuKernelModel()                       # the fit moved them off the defaults


# --- overrides -------------------------------------------------------------------------------
def test_overrides_dotted_and_flat():
    base = _gpu()
    p = base.with_overrides(**{"device.usable_bytes": 70 * GIB, "kernels.launch_s": 1e-6}, algorithm="tree",
                            attention="flash")
    assert p.memory_budget_bytes == 70 * GIB and p.kernels.launch_s == 1e-6
    assert p.collectives.algorithm == "tree" and p.kernels.attention == "flash"
    assert p.collectives.launch_s == base.collectives.launch_s and p.node == base.node
    assert base.memory_budget_bytes == 78 * GIB                         # the original is untouched
    assert base.with_overrides(name="x").name == "x"
    assert base.with_overrides(peak_fp16_flops=100e12).peak_flops == 100e12


@pytest.mark.parametrize("overrides, match", [
    ({"launch_s": 1e-6}, "field 'launch_s' is in collectives and kernels: name its table"),
    ({"colour": 1}, "unknown field 'colour'"),
    ({"device.colour": 1}, "unknown field 'device.colour'"),
    ({"network.model": "x"}, "unknown field 'network.model'"),
    ({"usable_bytes": 81 * GIB}, "field 'device.usable_bytes' = 86973087744 exceeds device.hbm_bytes"),
    ({"hbm_bytes": 10 * GIB}, "exceeds device.hbm_bytes = 10737418240"),
    ({"peer_to_peer": False}, "field 'node.peer_to_peer' = false needs node.intra_topology = 'pcie-host'"),
    ({"kind": "mt3000"}, "field 'kind' must be 'gpu-cluster'"),
    ({"intra_latency_s": 5}, "for 5 us write 5e-06"),
    ({"gemm_efficiency": 80}, "for 80 % write 0.8"),
])
def test_bad_overrides_are_named_errors(overrides, match):
    with pytest.raises(ConfigError, match="platform 'dgx-a100' override") as info:
        _gpu().with_overrides(**overrides)
    assert match in str(info.value) and "\n" not in str(info.value)


NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2 ** 70, 2 ** 70),
                    st.sampled_from([0, 1, 30, 1e-30, 1e30, 10 ** 400, float("nan"), float("inf")]),
                    st.booleans(), st.text(max_size=3), st.none())


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(RANGES)), NUMBERS, max_size=4))
def test_random_overrides_give_a_sane_platform_or_a_named_error(values):
    try:
        plat = _gpu().with_overrides(**values)
    except ConfigError as exc:
        assert any(name in str(exc) for name in values) and "\n" not in str(exc), str(exc)
        return
    for name, (lo, hi, _unit) in RANGES.items():
        table, _, field = name.partition(".")
        v = getattr(getattr(plat, table), field)
        assert math.isfinite(v) and lo <= v <= hi
    assert plat.device.usable_bytes <= plat.device.hbm_bytes


# --- bad files -------------------------------------------------------------------------------
GOOD = (PLATFORMS / "dgx-a100.toml").read_text()


def _edit(line_start: str, new: str) -> str:
    """The DGX A100 file with the line starting ``line_start`` replaced by ``new``."""
    lines = GOOD.splitlines()
    hits = [i for i, line in enumerate(lines) if line.startswith(line_start)]
    assert len(hits) == 1, line_start
    lines[hits[0]] = new
    return "\n".join(lines) + "\n"


BAD_FILES = [
    (_edit("intra_bandwidth", "intra_bandwidth = 0"), "node.intra_bandwidth", "outside the sane range"),
    (_edit("nic_bandwidth", "nic_bandwidth = -25e9"), "network.nic_bandwidth", "outside the sane range"),
    (_edit("hbm_bandwidth", "hbm_bandwidth = 2039"), "device.hbm_bandwidth", "for 2039 GB/s write 2039e9"),
    (_edit("nic_bandwidth", "nic_bandwidth = 200"), "network.nic_bandwidth", "200 Gbit/s is 25e9"),
    (_edit("usable_bytes", "usable_bytes = 85899345921"), "device.usable_bytes", "exceeds device.hbm_bytes"),
    (_edit("intra_topology", 'intra_topology = "infiniband"'), "node.intra_topology",
     "must be one of nvswitch, nvlink, pcie-host"),
    (_edit("algorithm", 'algorithm = "butterfly"'), "collectives.algorithm", "must be one of ring, tree, auto"),
    (_edit("attention", 'attention = "fused"'), "kernels.attention", "must be one of unfused, flash"),
    (_edit("hbm_bytes", "hbm_bytes = 1" + "0" * 400), "device.hbm_bytes", "an integer of 401 digits"),
    (_edit("peak_fp16_flops", "peak_fp16_flops = 1" + "0" * 400), "device.peak_fp16_flops",
     "an integer of 401 digits"),
    (_edit("hbm_bandwidth", "hbm_bandwidth = nan"), "device.hbm_bandwidth", "must be a finite number"),
    (_edit("intra_latency_s", "intra_latency_s = inf"), "node.intra_latency_s", "must be a finite number"),
    (_edit("sm_count", 'sm_count = "108"'), "device.sm_count", "must be an integer"),
    (_edit("sm_count", "sm_count = 108.0"), "device.sm_count", "must be an integer"),
    (_edit("model", "model = 5"), "device.model", "must be a non-empty string"),
    (_edit("peer_to_peer", "peer_to_peer = 1"), "node.peer_to_peer", "must be true or false"),
    (_edit("hbm_bandwidth", "hbm_bandwidth = true"), "device.hbm_bandwidth", "must be a number, got True"),
    (_edit("gpus_per_node", "gpus_per_node = false"), "node.gpus_per_node", "must be an integer, got False"),
    (_edit("gemm_efficiency", "gemm_efficiency = 1.5"), "kernels.gemm_efficiency", "outside the sane range"),
    (_edit("gpus_per_node", "gpus_per_node = 8\ncolour = 3"), "'colour'", "unknown field 'colour' in [node]"),
    (_edit("[network]", "[networks]"), "'networks'", "unknown field 'networks'"),
    (_edit("kind", 'kind = "tpu-pod"'), "'kind'", "must be one of mt3000, gpu-cluster"),
    (_edit("nics_per_node", ""), "network.nics_per_node", "lacks field"),
    (_edit("name", ""), "'name'", "needs a top-level field 'name'"),
    (_edit("name", "name = 7"), "'name'", "must be a non-empty string"),
    (_edit("kind", 'kind = "gpu-cluster"\nlaunch_s = 1e-6'), "'launch_s'", "name its table"),
    (GOOD.replace("[device]", "device = 3\n[devices]", 1), "[device]", "must be a table"),
]


@pytest.mark.parametrize("text, field, match", BAD_FILES, ids=[f"{i}-{c[2][:20]}" for i, c in enumerate(BAD_FILES)])
def test_bad_gpu_files_are_one_line_errors_naming_file_and_field(tmp_path, text, field, match):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_platform(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and field in msg and match in msg and "\n" not in msg, msg


@pytest.mark.parametrize("text, field, match", BAD_FILES[:12], ids=[c[1] for c in BAD_FILES[:12]])
def test_the_cli_gives_exit_2_one_stderr_line_and_no_stdout(capsys, tmp_path, text, field, match):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    for argv in (["platform", "--platform", str(path), "--json"], ["platform", "--platform", str(path)]):
        assert ratrain_main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and field in err and str(path) in err, err


def test_the_cli_in_a_subprocess(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(_edit("usable_bytes", "usable_bytes = 85899345921"))
    run = subprocess.run([sys.executable, "-m", "ratrain.cli", "platform", "--platform", str(path), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "device.usable_bytes" in run.stderr and "Traceback" not in run.stderr


def test_json_huge_integers_and_bools_are_named_too(tmp_path):
    payload = _gpu().to_json()
    payload["network"]["nics_per_node"] = 10 ** 400
    path = tmp_path / "p.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(ConfigError, match=r"network\.nics_per_node' = an integer of 401 digits"):
        load_platform(path)
    assert check_value("t", "device.sm_count", 132) == 132
    with pytest.raises(ConfigError, match="must be an integer, got True"):
        check_value("t", "device.sm_count", True)


# --- the CLI on a good GPU platform, and the commands that need MT-3000 --------------------
def test_platform_command_prints_a_gpu_platform(capsys):
    path = str(PLATFORMS / "dgx-h100.toml")
    assert ratrain_main(["platform", "--platform", path, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload == _gpu("dgx-h100.toml").to_json()
    assert ratrain_main(["platform", "--platform", path]) == 0
    text = capsys.readouterr().out
    assert text.startswith("dgx-h100: 8 x H100-SXM5-80GB per node (132 SMs, 989 TFLOP/s dense FP16")
    for table in ("device:", "node:", "network:", "collectives:", "kernels:"):
        assert f"\n{table}\n" in text


@pytest.mark.parametrize("argv", [
    ["profile", "--model", "llama2-7b", "--source", "roofline"],
    ["reproduce", "fig9"],
])
def test_mt3000_commands_refuse_a_gpu_platform_in_one_line(capsys, tmp_path, argv):
    path = str(PLATFORMS / "rtx4090-pcie.toml")
    assert ratrain_main(argv + ["--platform", path, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert f"{path} is a GPU-cluster platform; ratrain {argv[0]} needs an MT-3000 platform" in err


@pytest.mark.parametrize("argv", [
    ["memory", "--model", "llama2-7b", "--pp", "4", "--dp", "2"],
    ["simulate", "--model", "llama2-7b", "--pp", "2", "--dp", "4", "--accum", "4"],
    ["plan", "--model", "llama2-7b", "--clusters", "8", "--global-batch", "8"],
    ["time-to-train", "--model", "llama2-7b", "--clusters", "8", "--mtbf-hours", "10", "--steps", "10",
     "--checkpoint-s", "30", "--pp", "4", "--dp", "2"],
])
def test_training_commands_run_on_a_gpu_platform(capsys, argv):
    assert ratrain_main(argv + ["--platform", str(PLATFORMS / "rtx4090-pcie.toml"), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload


def test_tiles_and_the_emulator_refuse_a_gpu_platform(capsys):
    path = str(PLATFORMS / "dgx-a100.toml")
    assert ratrain_main(["platform", "--platform", path, "--tiles", "tuned"]) == 2
    assert "--tiles chooses MT-3000 kernel tiles" in capsys.readouterr().err
    assert mtemu_main(["platform", "--platform", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a GPU-cluster platform; the emulator needs an MT-3000 platform" in err
    with pytest.raises(ConfigError, match="is a GPU-cluster platform"):
        TrainingPlatform.from_file(path)


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 10 ** 400), st.floats(allow_nan=False),
                        st.text(max_size=4), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2),
                                                                                                   st.integers(),
                                                                                                   max_size=1))
FIELDS = [(t, f) for t, part in _gpu().to_json().items() if isinstance(part, dict) and t != "derived" for f in part]


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.sampled_from(FIELDS), JSON_VALUES)
def test_any_value_in_any_field_of_a_file_loads_sane_or_names_file_and_field(tmp_path_factory, where, value):
    table, field = where
    payload = _gpu().to_json()
    payload[table][field] = value
    path = tmp_path_factory.mktemp("gpu") / "p.json"
    path.write_text(json.dumps(payload))
    try:
        plat = load_platform(path)
    except ConfigError as exc:
        msg = str(exc)
        # the JSON reader refuses a non-finite number before any field is read: it names the file
        assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
        assert field in msg or "Infinity" in msg, msg
    else:
        assert getattr(getattr(plat, table), field) == value
        assert GpuPlatform.from_dict(plat.to_json()) == plat

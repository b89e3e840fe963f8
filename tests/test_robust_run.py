"""`mtemu run` under bad input: a Python program's Kernel checked field by field, output names
that stay in --out-dir, all-or-nothing output writes, sizes in Python ints, strict @sreg."""
import numpy as np
import pytest

from mtemu.assembler import ProgramBuilder, ins
from mtemu.cli import main
from mtemu.errors import MtemuError
from mtemu.platform import DEFAULT
from mtemu.program_runner import Kernel, Region, _sreg_value, parse_output_spec, run_kernel, run_program
from rtcommon import fileio
from rtcommon.errors import UserError

P1 = DEFAULT.with_overrides(dsps=1)


def halt_program():
    b = ProgramBuilder(P1)
    b.bundle(ins("halt"))
    return b.assemble()


@pytest.mark.parametrize("fields, match", [
    ({"init_sregs": {0: [1]}}, r"init_sregs\[0\] must be a dict"),
    ({"init_sregs": {0: {1: 0.5}}}, r"init_sregs\[0\]\[1\] must be a 64-bit integer"),
    ({"init_sregs": {"0": {1: 1}}}, r"DSP '0' outside"),
    ({"dsp_program": [0.5]}, r"dsp_program\[0\] = 0.5 is not a program index"),
    ({"dsp_program": [0, 0]}, "one program index per DSP"),
    ({"ddr_bytes": "lots"}, r"ddr_bytes must be a non-negative integer, got 'lots'"),
    ({"ddr_bytes": -1}, "ddr_bytes must be a non-negative integer"),
    ({"useful_macs": -10 ** 9}, "useful_macs must be a non-negative integer"),
    ({"useful_macs": 10 ** 12}, "useful_macs = .* is more than the cluster can do"),
    ({"outputs": {"../../escaped": Region("DDR", 0, (8,), "float16")}}, "must be a plain identifier"),
    ({"outputs": {"z": Region("DDR", 0.5, (8,), "float16")}}, "address must be an integer"),
    ({"outputs": {"z": Region("DDR", 0, (8.0,), "float16")}}, "shape must be a tuple of positive integers"),
    ({"outputs": {"z": ("DDR", 0)}}, "expected a Region"),
    ({"programs": []}, "non-empty list"),
    ({"programs": ["halt"]}, r"programs\[0\] is a str"),
])
def test_a_bad_kernel_field_is_named(fields, match):
    kernel = Kernel([halt_program()])
    for key, value in fields.items():
        setattr(kernel, key, value)
    with pytest.raises(MtemuError, match=match):
        run_kernel(kernel, P1, mode="functional")


def test_a_float_code_array_is_refused():
    prog = halt_program()
    prog.code = prog.code.astype(np.float64)
    with pytest.raises(MtemuError, match=r"programs\[0\]\.code must be an int64 array, got float64"):
        run_kernel(Kernel([prog]), P1)


def test_sizes_do_not_wrap_in_int64():
    _name, region = parse_output_spec("w=DDR:0:4294967296x4294967296:float16")
    assert region.nbytes == 2 ** 65
    kernel = Kernel([halt_program()])
    with pytest.raises(MtemuError, match="lies outside DDR"):
        run_kernel(kernel, P1, outputs={"w": region})


@pytest.mark.parametrize("expr", ["5 6", "+", "", "dsp dsp", "3*", "*dsp", "1 +"])
def test_sreg_expressions_that_are_not_sums_are_errors(expr):
    with pytest.raises(MtemuError, match="expected terms like"):
        _sreg_value(expr, "p.s:1: @sreg")


@pytest.mark.parametrize("expr, value", [("5", (0, 5)), ("16*dsp + 64", (16, 64)), ("-dsp - 0x10", (-1, -16)),
                                         ("  7 * dsp ", (7, 0)), ("dsp+dsp", (2, 0))])
def test_sreg_sums_still_parse(expr, value):
    assert _sreg_value(expr, "w") == value


PY_ESCAPE = """from mtemu.assembler import ProgramBuilder, ins
from mtemu.program_runner import Kernel, Region
DSPS = 1
def build(platform):
    b = ProgramBuilder(platform)
    b.bundle(ins('halt'))
    return Kernel([b.assemble()], outputs={'../../escaped': Region('DDR', 0, (8,), 'float16')})
"""


def test_an_output_name_cannot_leave_the_out_dir(tmp_path, capsys):
    prog = tmp_path / "a" / "b" / "k.py"
    prog.parent.mkdir(parents=True)
    prog.write_text(PY_ESCAPE)
    out = tmp_path / "a" / "b" / "out"
    assert main(["run", str(prog), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plain identifier" in err[0]
    assert not list(tmp_path.rglob("escaped*"))


def test_writes_are_all_or_nothing_and_a_full_disk_names_the_file(tmp_path, monkeypatch):
    real = fileio._stage
    calls = []

    def full_disk(target, data):
        calls.append(target)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(target, data)

    monkeypatch.setattr(fileio, "_stage", full_disk)
    with pytest.raises(UserError, match=r"z\.npy: cannot write \(No space left on device\); nothing was written"):
        fileio.atomic_write_many({tmp_path / "a.npy": b"1", tmp_path / "z.npy": b"2"})
    assert list(tmp_path.iterdir()) == []


def test_max_cycles_beyond_the_machine_limit_is_named(tmp_path):
    prog = tmp_path / "h.s"
    prog.write_text("# @dsps 1\n{ halt }\n")
    with pytest.raises(MtemuError, match="--max-cycles = 10+ is outside the sane range 1..1152921504606846976"):
        run_program(prog, DEFAULT, max_cycles=10 ** 30, out_dir=None)
    with pytest.raises(MtemuError, match="--max-seconds"):
        run_program(prog, DEFAULT, max_seconds=float("inf"), out_dir=None)


def test_the_wall_clock_guard_holds_whatever_the_cycle_limit(tmp_path):
    prog = tmp_path / "loop.s"
    prog.write_text("# @dsps 1\nloop:\n{ br loop }\n{ halt }\n")
    with pytest.raises(MtemuError, match="wall-clock limit of 0.5 s .* the limit is --max-seconds"):
        run_program(prog, DEFAULT, max_cycles=2 ** 60, max_seconds=0.5, out_dir=None)


def test_the_readme_run_example_runs_as_shown(tmp_path, monkeypatch, capsys):
    import json
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    line = re.search(r"^mtemu run examples/[^#\n]*", (root / "README.md").read_text(), re.M).group(0)
    monkeypatch.chdir(root)
    assert main(shlex.split(line)[1:] + ["--out-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["cycles"] > 0

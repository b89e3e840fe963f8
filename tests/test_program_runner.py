"""mtemu run's library: specs, loading, checks before the run, faults during it, nothing half written."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mtemu.assembler import ProgramBuilder, ins
from mtemu.errors import AssemblyError, MachineError, MtemuError
from mtemu.platform import DEFAULT
from mtemu.program_runner import (
    Kernel,
    Region,
    default_max_cycles,
    load_kernel,
    parse_input_spec,
    parse_output_spec,
    parse_region,
    run_kernel,
    run_program,
)

P2 = DEFAULT.with_overrides(dsps=2)

COPY = """# copy 8 FP16 values DDR -> AM -> DDR on every DSP, each to its own slot
# @dsps 2
# @input  x=DDR:0:8:float16
# @output y=DDR:64:2x8:float16
# @sreg s2 = 16*dsp + 64
.desc in src=DDR dst=AM rows=1 row_bytes=16 src_stride=16 dst_stride=16 mode=copy
.desc out src=AM dst=DDR rows=1 row_bytes=16 src_stride=16 dst_stride=16 mode=copy
{ dma 0, in, [s0+0], [s0+0] }
{ dmawait 0 }
{ dma 1, out, [s0+0], [s2+0] }
{ dmawait 1 }
{ halt }
"""


ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_specs_parse_and_refuse_clearly():
    assert parse_region("AM.3:0x40:4x384:float16", "x", True) == Region("AM", 64, (4, 384), "float16", 3)
    assert parse_input_spec("a=dir/a.npy@DDR:128") == ("a", "dir/a.npy", Region("DDR", 128))
    assert parse_input_spec("a=a.npy") == ("a", "a.npy", None)
    assert parse_output_spec("c=GSM:0:16:float32") == ("c", Region("GSM", 0, (16,), "float32"))
    assert parse_output_spec("c") == ("c", None)
    for bad, match in (("a", "NAME=FILE"), ("1a=x.npy", "NAME=FILE"), ("a=x.npy@HBM:0", "unknown memory"),
                       ("a=x.npy@DDR:zz", "integer"), ("a=x.npy@GSM.1:0", "per DSP")):
        with pytest.raises(MtemuError, match=match):
            parse_input_spec(bad)
    for bad, match in (("c=DDR:0", "SPACE:ADDR:SHAPE:DTYPE"), ("c=DDR:0:4:float64", "not supported"),
                       ("c=DDR:0:0x4:float16", "positive"), ("c/d=DDR:0:4:float16", "identifier")):
        with pytest.raises(MtemuError, match=match):
            parse_output_spec(bad)


def test_text_program_with_directives(tmp_path):
    path = write(tmp_path, "copy.s", COPY)
    kernel, plat = load_kernel(path, DEFAULT)
    assert plat.dsps == 2 and kernel.init_sregs == {0: {2: 64}, 1: {2: 80}}
    x = np.arange(8, dtype=np.float16)
    r = run_kernel(kernel, plat, inputs={"x": x})
    assert (r.outputs["y"] == np.stack([x, x])).all()
    assert r.report.dsps == 2 and r.report.dma_bytes["ddr"] == 64 and r.report.cycles > 600
    # --dsps wins over the directive
    _k, plat1 = load_kernel(path, DEFAULT, dsps=1)
    assert plat1.dsps == 1
    with pytest.raises(MtemuError, match=r"bad.s:3: unknown directive '@inptu'"):
        load_kernel(write(tmp_path, "bad.s", COPY.replace("@input", "@inptu", 1)), DEFAULT)
    with pytest.raises(AssemblyError, match=r"copy2.s:\d+: .*unknown opcode 'dmx'"):
        load_kernel(write(tmp_path, "copy2.s", COPY.replace("{ halt }", "{ dmx }\n{ halt }")), DEFAULT)


def test_inputs_are_checked_before_the_run(tmp_path):
    kernel, plat = load_kernel(write(tmp_path, "copy.s", COPY), DEFAULT)
    cases = [
        ({"x": np.zeros(9, np.float16)},
         r"input x \(array\): has shape \(9,\) float16; its destination DDR:0:8:float16 expects"),
        ({"x": np.zeros(8, np.float32)}, r"has shape \(8,\) float32; .* expects \(8,\) float16"),
        ({"x": np.zeros(8, np.float64)}, "float64 is not a machine type"),
        ({}, r"input\(s\) x declared by the program but not given"),
        ({"x": np.zeros(8, np.float16), "z": np.zeros(2, np.float16)}, "declares no input 'z'"),
        ({"x": (np.zeros(8, np.float16), Region("GSM", plat.gsm_bytes - 8))}, "lies outside GSM"),
        ({"x": np.zeros(8, np.float16), "w": (np.zeros(8, np.float32), Region("AM", 2))},
         r"input w \(array\): AM:2:8:float32: address 2 is not aligned to its 4-byte float32"),
        ({"x": np.zeros(8, np.float16), "w": (np.zeros(4, np.float16), Region("DDR", 8))}, "inputs w and x overlap"),
    ]
    for inputs, match in cases:
        with pytest.raises(MtemuError, match=match):
            run_kernel(kernel, plat, inputs=inputs)


def test_outputs_are_checked_and_written_only_after_success(tmp_path):
    prog = write(tmp_path, "copy.s", COPY)
    np.save(tmp_path / "x.npy", np.arange(8, dtype=np.float16))
    out = tmp_path / "out"
    for spec, match in (("y=AM:0:8:float16", "AM is per DSP; name one"), ("y=SM.0:65530:8:float16", "outside SM"),
                        ("q", "not declared by the program"), ("y=DDR:1:8:float16", "not aligned")):
        with pytest.raises(MtemuError, match=match):
            run_program(prog, DEFAULT, inputs=[f"x={tmp_path / 'x.npy'}"], outputs=[spec], out_dir=out)
    # a fault during the run writes nothing
    np.save(tmp_path / "x9.npy", np.arange(9, dtype=np.float16))
    with pytest.raises(MtemuError, match="expects"):
        run_program(prog, DEFAULT, inputs=[f"x={tmp_path / 'x9.npy'}"], out_dir=out)
    bad = write(tmp_path, "fault.s", COPY.replace("[s2+0] }", "[s2+100000] }"))
    with pytest.raises(MachineError, match="DSP 0, PC 2, unit SIEU: .* DDR address 100064 is outside"):
        run_program(bad, DEFAULT, inputs=[f"x={tmp_path / 'x.npy'}"], out_dir=out)
    assert not out.exists()
    with pytest.raises(MtemuError, match="no such file"):
        run_program(prog, DEFAULT, inputs=[f"x={tmp_path / 'nope.npy'}"], out_dir=out)
    r = run_program(prog, DEFAULT, inputs=[f"x={tmp_path / 'x.npy'}"], outputs=["y", "first=DDR:64:4:float16"],
                    out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == ["first.npy", "y.npy"]
    assert (np.load(out / "first.npy") == np.arange(4)).all() and r.report.outputs["y"] == str(out / "y.npy")
    # timing mode: same cycles, no data, no outputs
    t = run_program(prog, DEFAULT, mode="timing", out_dir=tmp_path / "t")
    assert t.report.cycles == r.report.cycles and t.outputs == {} and not (tmp_path / "t").exists()


def _single(platform, *bundles):
    """The bundles, padding for the longest latency, then halt."""
    b = ProgramBuilder(platform)
    for bundle in bundles:
        b.bundle(*bundle)
    b.nops(9)
    b.bundle(ins("halt"))
    return Kernel([b.assemble()])


def test_faults_name_dsp_pc_unit_and_address():
    p1 = DEFAULT.with_overrides(dsps=1)
    with pytest.raises(MachineError, match=r"DSP 0, PC 1, unit VLDST1: access of 384 bytes at AM address 786240"):
        run_kernel(_single(p1, [ins("smovi", 1, p1.am_bytes - 192)], [ins("vldh", 2, (1, 0))]), p1)
    with pytest.raises(MachineError, match=r"DSP 0, PC 1, unit VLDST1: unaligned AM address 3 \(needs 2-byte"):
        run_kernel(_single(p1, [ins("smovi", 1, 3)], [ins("vldh", 2, (1, 0))]), p1)
    with pytest.raises(MachineError, match=r"unit SLDST: access of 2 bytes at SM address -2"):
        run_kernel(_single(p1, [ins("smovi", 1, -2)], [ins("sldh", 2, (1, 0))]), p1)


def test_deadlock_names_the_dsps_quickly():
    p4 = DEFAULT.with_overrides(dsps=4)
    b = ProgramBuilder(p4)
    b.bundle(ins("bnz", 3, "out"))
    b.bundle(ins("barrier"))
    b.label("out")
    b.bundle(ins("halt"))
    kernel = Kernel([b.assemble()], init_sregs={2: {3: 1}, 3: {3: 1}})
    t0 = time.time()
    with pytest.raises(MachineError, match=r"deadlock: DSP\(s\) 0, 1 wait at a barrier \(PC 1\) that halted DSP\(s\) "
                                           r"2, 3 will never reach"):
        run_kernel(kernel, p4)
    assert time.time() - t0 < 1.0


def test_infinite_loop_stops_within_a_second_at_the_default_limit():
    p24 = DEFAULT
    b = ProgramBuilder(p24)
    b.label("top")
    b.bundle(ins("br", "top"))
    b.bundle(ins("halt"))
    kernel = Kernel([b.assemble()])
    limit = default_max_cycles(kernel, p24, 0)
    assert limit == 1_000_000 + 2_000 * 2
    t0 = time.time()
    with pytest.raises(MachineError, match=f"cycle limit {limit} exceeded .* raise it with --max-cycles"):
        run_kernel(kernel, p24)
    assert time.time() - t0 < 1.0
    with pytest.raises(MachineError, match="cycle limit 500 exceeded"):
        run_kernel(kernel, p24, max_cycles=500)


def test_python_program_contract(tmp_path):
    good = write(tmp_path, "k.py", "from mtemu.assembler import ProgramBuilder, ins\nDSPS = 3\n"
                 "def build(platform):\n    b = ProgramBuilder(platform)\n    b.bundle(ins('halt'))\n"
                 "    return b.assemble()\n")
    kernel, plat = load_kernel(good, DEFAULT)
    assert plat.dsps == 3 and run_kernel(kernel, plat).report.cycles == 1
    for text, match in (("x = 1\n", r"must define build\(platform\)"),
                        ("def build(platform):\n    return 3\n", "returned int, not a Kernel"),
                        ("def build(platform):\n    raise ValueError('boom')\n", "build.*failed: ValueError: boom"),
                        ("def build(:\n", "loading failed: SyntaxError"),
                        ("DSPS = 0\ndef build(p):\n    pass\n", "DSP count must be a positive integer")):
        with pytest.raises(MtemuError, match=match):
            load_kernel(write(tmp_path, "bad.py", text), DEFAULT)
    with pytest.raises(MtemuError, match="no such program file"):
        load_kernel(tmp_path / "missing.s", DEFAULT)


def _user_threads() -> set:
    return {t for t in threading.enumerate() if t is not threading.main_thread()}


@pytest.mark.parametrize("body", ["    while True:\n        pass\n",                  # a Python loop
                                  "    try:\n        while True:\n            pass\n"   # that swallows Exception
                                  "    except Exception:\n        pass\n",
                                  "    import time\n    time.sleep(10 ** 6)\n"])       # blocked in C
def test_a_python_build_past_its_deadline_is_refused_and_leaves_no_thread_holding_the_exit(tmp_path, body):
    before = _user_threads()
    prog = write(tmp_path, "slow.py", "def build(platform):\n" + body)
    t0 = time.monotonic()
    with pytest.raises(MtemuError, match=r"slow.py: loading and build\(platform\) did not finish within 0.3 s"):
        load_kernel(prog, DEFAULT, build_seconds=0.3)
    assert time.monotonic() - t0 < 3
    left = _user_threads() - before
    assert all(t.daemon for t in left)          # a sleeping one may linger, but never holds the exit
    if "sleep" not in body:
        assert not left


def test_threads_a_python_program_starts_are_stopped_or_daemons(tmp_path):
    before = _user_threads()
    prog = write(tmp_path, "spawn.py",
                 "import threading, time\nfrom mtemu.assembler import ProgramBuilder, ins\n"
                 "def spin():\n    while True:\n        pass\n"
                 "threading.Thread(target=spin, daemon=False).start()\n"        # even an explicit non-daemon
                 "threading.Thread(target=time.sleep, args=(10 ** 6,)).start()\n"
                 "def build(platform):\n    b = ProgramBuilder(platform)\n    b.bundle(ins('halt'))\n"
                 "    return b.assemble()\n")
    kernel, plat = load_kernel(prog, DEFAULT)
    assert run_kernel(kernel, plat).report.cycles == 1
    left = _user_threads() - before
    assert len(left) <= 1 and all(t.daemon for t in left)


@pytest.mark.slow  # the quick layer's costliest: the full suite (CI) runs it
def test_mtemu_run_ends_on_a_build_deadline_with_one_line(tmp_path):
    prog = write(tmp_path, "slow.py", "import time\ndef build(platform):\n    time.sleep(10 ** 6)\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mtemu.cli", "run", str(prog), "--build-seconds", "0.5"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "--build-seconds" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 60

"""Run a hand-written program: load it, place its inputs, run it, collect its outputs, report.

The library behind ``mtemu run``. A program is either

- a text file in the assembler's form (:func:`mtemu.assembler.parse`). Comment lines starting
  ``# @`` declare what the runner needs (the assembler ignores them)::

      # @dsps 1                              DSPs it is written for (``--dsps`` overrides)
      # @input  x=DDR:0:768:float16          an input: where it goes, its shape and dtype
      # @output z=DDR:3072:768:float16       an output: where it is read after the run
      # @sreg   s2 = 1536*dsp + 64           initial scalar register, may depend on the DSP index
      # @ddr-bytes 65536                     DDR to allocate beyond the declared regions

- or a Python file defining ``build(platform) -> Kernel`` (or a bare :class:`Program`), and
  optionally ``DSPS = n``. ``build`` gets the platform with ``dsps`` already set, so a kernel
  can size itself to it. :class:`Kernel` carries the programs, per-DSP registers and descriptor
  tables, and the declared inputs and outputs.

Regions are ``SPACE:ADDR[:SHAPE:DTYPE]``; SPACE is ``DDR``, ``GSM``, ``SM`` or ``AM`` (an input
placed in ``SM``/``AM`` goes to every DSP's copy; ``AM.3`` names DSP 3; an output from SM/AM must
name its DSP). SHAPE is ``768`` or ``4x384``; DTYPE one of :data:`DTYPES`. Every memory starts
zeroed. Inputs of the wrong shape or dtype for a declared input, regions outside a memory or
misaligned for their dtype, and overlapping inputs are refused before the run; outputs are
written only after a run that succeeded, each atomically.
"""
from __future__ import annotations

import ctypes
import importlib.util
import io
import math
import re
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from rtcommon.checks import checked_number, is_integer, show_value
from rtcommon.errors import UserError
from rtcommon.fileio import atomic_write_many

from . import isa
from .assembler import Program, parse
from .errors import MachineError, MtemuError
from .machine import MAX_CYCLES_LIMIT, Cluster, RunStats
from .platform import Platform, as_platform
from .trace import TraceOptions

DTYPES = {"float16": np.float16, "float32": np.float32, "uint16": np.uint16, "int16": np.int16,
          "uint32": np.uint32, "int32": np.int32}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
# default cycle limit: a fixed floor, plus a generous allowance per static bundle and per byte
# the declared regions move at the DDR rate (an infinite loop stops within about a second)
MAX_CYCLES_FLOOR = 1_000_000
MAX_CYCLES_PER_BUNDLE = 2_000
MAX_CYCLES_PER_DDR_CYCLE = 16
# wall-clock guard on every run, whatever its cycle limit (--max-cycles 2**60 on an endless loop
# would otherwise run for days); the jitted loop checks it between chunks, about once a second
DEFAULT_MAX_SECONDS = 600.0
# wall-clock cap on loading a Python program and running its build(platform): the user's code runs
# in a daemon thread (threads it starts inherit that, so none keeps the process alive)
DEFAULT_BUILD_SECONDS = 60.0


@dataclass(frozen=True)
class Region:
    """A place in the machine's memory; ``shape``/``dtype`` may be left to the data placed there."""

    space: str
    addr: int
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    dsp: int | None = None           # SM/AM: one DSP's copy; None means every DSP (inputs only)

    @property
    def nbytes(self) -> int:
        if self.shape is None or self.dtype is None:
            raise MtemuError(f"region {self.describe()} has no shape and dtype")
        # Python ints: a 4294967296x4294967296 shape must not wrap to 0 bytes in int64
        return math.prod(int(s) for s in self.shape) * np.dtype(DTYPES[self.dtype]).itemsize

    def describe(self) -> str:
        sp = self.space + (f".{self.dsp}" if self.dsp is not None else "")
        tail = f":{'x'.join(map(str, self.shape))}:{self.dtype}" if self.shape is not None and self.dtype else ""
        return f"{sp}:{self.addr}{tail}"


@dataclass
class Kernel:
    """Everything the runner needs besides the data (what a Python program's ``build`` returns)."""

    programs: list[Program]
    dsp_program: list[int] | None = None           # program index per DSP (default: 0 everywhere)
    init_sregs: dict[int, dict[int, int]] = field(default_factory=dict)
    dsp_descriptors: dict[int, np.ndarray] | None = None
    inputs: dict[str, Region] = field(default_factory=dict)
    outputs: dict[str, Region] = field(default_factory=dict)
    ddr_bytes: int = 0                              # DDR to allocate besides the declared regions
    useful_macs: int | None = None                  # for utilization (default: VFMAs x lanes)


@dataclass
class RunReport:
    """What ``mtemu run`` reports; every figure comes from the emulated run."""

    program: str
    mode: str
    dsps: int
    cycles: int
    seconds: float
    bundles: int
    busy: dict[str, int]                 # issues per unit, summed over DSPs
    stalls: dict[str, int]               # DSP-cycles lost per reason
    dma_bytes: dict[str, int]            # bytes through each DMA server kind
    server_busy: dict[str, float]        # busy fraction of each DMA server over the run
    vfma: int
    macs: int
    utilization: float                   # MACs / (peak MACs per cycle x cycles)
    max_cycles: int
    outputs: dict[str, str]              # output name -> .npy path written (functional mode)
    stats: RunStats | None = None

    def to_json(self) -> dict:
        return {"program": self.program, "mode": self.mode, "dsps": self.dsps, "cycles": self.cycles,
                "seconds": self.seconds, "bundles": self.bundles, "busy": self.busy, "stalls": self.stalls,
                "dma_bytes": self.dma_bytes, "server_busy": self.server_busy, "vfma": self.vfma,
                "macs": self.macs, "utilization": self.utilization, "max_cycles": self.max_cycles,
                "outputs": self.outputs}

    def text(self) -> str:
        lines = [f"{self.program} ({self.mode}, {self.dsps} DSP{'s' if self.dsps > 1 else ''})",
                 f"  cycles       {self.cycles} ({self.seconds * 1e6:.3f} us)",
                 f"  bundles      {self.bundles}",
                 f"  utilization  {100 * self.utilization:.2f}% ({self.vfma} VFMA, {self.macs} MACs)",
                 "  unit issues  " + ", ".join(f"{k} {v}" for k, v in self.busy.items()),
                 "  stalls       " + ", ".join(f"{k} {v}" for k, v in self.stalls.items()) + " (DSP-cycles)",
                 "  DMA bytes    " + ", ".join(f"{k} {v}" for k, v in self.dma_bytes.items()),
                 "  DMA busy     " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in self.server_busy.items())]
        for name, path in self.outputs.items():
            lines.append(f"  output       {name} -> {path}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# specs
# --------------------------------------------------------------------------------------------
def _int(text: str, what: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise MtemuError(f"{what}: expected an integer, got {text!r}") from None


def parse_region(text: str, what: str, need_layout: bool) -> Region:
    """``SPACE[.DSP]:ADDR[:SHAPE:DTYPE]`` (SHAPE like ``768`` or ``4x384``)."""
    parts = text.split(":")
    if len(parts) not in (2, 4) or (need_layout and len(parts) != 4):
        form = "SPACE:ADDR:SHAPE:DTYPE" if need_layout else "SPACE:ADDR[:SHAPE:DTYPE]"
        raise MtemuError(f"{what}: expected {form}, got {text!r}")
    space, _, dsp_txt = parts[0].partition(".")
    space = space.upper()
    if space not in isa.SPACES:
        raise MtemuError(f"{what}: unknown memory {space!r} (known: {', '.join(isa.SPACES)})")
    dsp = None
    if dsp_txt:
        if space not in ("SM", "AM"):
            raise MtemuError(f"{what}: only SM and AM are per DSP; {space} takes no '.DSP'")
        dsp = _int(dsp_txt, f"{what} DSP")
    addr = _int(parts[1], f"{what} address")
    shape = dtype = None
    if len(parts) == 4:
        try:
            shape = tuple(int(x) for x in parts[2].lower().split("x"))
        except ValueError:
            raise MtemuError(f"{what}: shape must look like 768 or 4x384, got {parts[2]!r}") from None
        if not shape or any(s <= 0 for s in shape):
            raise MtemuError(f"{what}: shape dimensions must be positive, got {parts[2]!r}")
        dtype = parts[3].strip().lower()
        if dtype not in DTYPES:
            raise MtemuError(f"{what}: dtype {parts[3]!r} not supported (use one of {', '.join(DTYPES)})")
    return Region(space, addr, shape, dtype, dsp)


def parse_input_spec(text: str) -> tuple[str, str, Region | None]:
    """``NAME=FILE.npy[@SPACE:ADDR]`` -> (name, file, placement or None for the declared one)."""
    name, eq, rest = text.partition("=")
    if not eq or not _NAME_RE.match(name):
        raise MtemuError(f"--input {text!r}: expected NAME=FILE.npy[@SPACE:ADDR] with NAME a plain identifier")
    path, at, where = rest.rpartition("@") if "@" in rest else (rest, "", "")
    if not path:
        raise MtemuError(f"--input {text!r}: no file given")
    return name, path, parse_region(where, f"--input {name}", False) if at else None


def parse_output_spec(text: str) -> tuple[str, Region | None]:
    """``NAME=SPACE:ADDR:SHAPE:DTYPE`` or ``NAME`` (a declared output)."""
    name, eq, rest = text.partition("=")
    if not _NAME_RE.match(name):
        raise MtemuError(f"--output {text!r}: NAME must be a plain identifier (it names NAME.npy)")
    return name, parse_region(rest, f"--output {name}", True) if eq else None


# --------------------------------------------------------------------------------------------
# loading programs
# --------------------------------------------------------------------------------------------
_SREG_RE = re.compile(r"^s(\d+)\s*=\s*(.+)$")
# one term of an @sreg expression: dsp, INT*dsp or INT (INT in any base int(x, 0) reads)
_SREG_TERM = r"(?:dsp|[0-9A-Za-z_]+(?:\s*\*\s*dsp)?)"
_SREG_EXPR = re.compile(rf"\s*[+-]?\s*{_SREG_TERM}(?:\s*[+-]\s*{_SREG_TERM})*\s*")
_SREG_PART = re.compile(rf"([+-]?)\s*({_SREG_TERM})")


def _sreg_value(expr: str, where: str) -> tuple[int, int]:
    """``A*dsp + B`` (any of the terms) -> (A, B); anything else ("5 6", "+") is an error."""
    if not _SREG_EXPR.fullmatch(expr):
        raise MtemuError(f"{where}: expected terms like 'A*dsp + B', got {expr!r}")
    a = b = 0
    for sign, term in _SREG_PART.findall(expr):
        k = -1 if sign == "-" else 1
        term = term.replace(" ", "")
        if term == "dsp":
            a += k
        elif term.endswith("*dsp"):
            a += k * _int(term[:-4], where)
        else:
            b += k * _int(term, where)
    return a, b


def _pragmas(text: str, source: str) -> tuple[dict, list[tuple[int, int, int]]]:
    decl: dict = {"dsps": None, "inputs": {}, "outputs": {}, "ddr_bytes": 0}
    sregs: list[tuple[int, int, int]] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line.startswith("# @"):
            continue
        where = f"{source}:{line_no}"
        key, _, rest = line[3:].partition(" ")
        rest = rest.strip()
        if key == "dsps":
            decl["dsps"] = _int(rest, f"{where}: @dsps")
        elif key in ("input", "output"):
            name, eq, spec = rest.partition("=")
            name = name.strip()
            if not eq or not _NAME_RE.match(name):
                raise MtemuError(f"{where}: @{key} needs NAME=SPACE:ADDR:SHAPE:DTYPE")
            table = decl[key + "s"]
            if name in table:
                raise MtemuError(f"{where}: @{key} {name} declared twice")
            table[name] = parse_region(spec.strip(), f"{where}: @{key} {name}", True)
        elif key == "sreg":
            m = _SREG_RE.match(rest)
            if not m:
                raise MtemuError(f"{where}: @sreg needs 'sN = A*dsp + B', got {rest!r}")
            a, b = _sreg_value(m.group(2), f"{where}: @sreg")
            sregs.append((int(m.group(1)), a, b))
        elif key == "ddr-bytes":
            decl["ddr_bytes"] = _int(rest, f"{where}: @ddr-bytes")
        else:
            raise MtemuError(f"{where}: unknown directive '@{key}' (known: dsps, input, output, sreg, ddr-bytes)")
    return decl, sregs


def load_kernel(path: str | Path, platform: Platform, dsps: int | None = None,
                build_seconds: float | None = DEFAULT_BUILD_SECONDS) -> tuple[Kernel, Platform]:
    """Load a text or Python program; returns the kernel and the platform it runs on.

    ``dsps`` (the ``--dsps`` flag) wins over what the program declares, which wins over the platform.
    A Python program's loading and ``build`` together get ``build_seconds`` of wall time (None: no cap).
    """
    path = Path(path)
    if not path.is_file():
        raise MtemuError(f"{path}: no such program file")
    if path.suffix == ".py":
        if build_seconds is not None:
            build_seconds = checked_number(build_seconds, "--build-seconds", integer=False, lo=1e-3, hi=1e7,
                                           error=MtemuError)
        return _with_deadline(lambda: _load_python(path, platform, dsps), build_seconds, path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise MtemuError(f"{path}: cannot read program ({exc})") from None
    decl, sregs = _pragmas(text, str(path))
    plat = _with_dsps(platform, dsps if dsps is not None else decl["dsps"], str(path))
    program = parse(text, plat, source=str(path))
    init = {d: {r: a * d + b for r, a, b in sregs} for d in range(plat.dsps)} if sregs else {}
    return Kernel([program], init_sregs=init, inputs=decl["inputs"], outputs=decl["outputs"],
                  ddr_bytes=decl["ddr_bytes"]), plat


class _DeadlinePassed(BaseException):
    """Raised inside the user's code when its wall-time cap has passed (not an Exception: a bare
    ``except Exception`` in the program does not swallow it)."""


def _quiet_deadline_hook(previous):
    """A thread's exception hook that says nothing when the thread ended on its deadline."""
    def hook(args) -> None:
        if not issubclass(args.exc_type, _DeadlinePassed):
            previous(args)
    hook.mtemu_deadline = True
    return hook


def _interrupt(thread: threading.Thread) -> None:
    """Raise :class:`_DeadlinePassed` in ``thread`` at its next Python instruction (a thread blocked
    in C, e.g. in ``time.sleep``, gets it when the call returns; as a daemon it never holds the exit)."""
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_DeadlinePassed))


def _with_deadline(call, seconds: float | None, path: Path):
    """``call()`` in a daemon thread, stopped after ``seconds``; threads running the program's code
    that it left running are stopped too (others it started are daemons, as its thread is)."""
    before = set(threading.enumerate())
    box: dict = {}
    if not getattr(threading.excepthook, "mtemu_deadline", False):
        threading.excepthook = _quiet_deadline_hook(threading.excepthook)

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:      # handed to the caller's thread as it is
            box["error"] = exc

    worker = threading.Thread(target=target, name=f"mtemu-build-{path.name}", daemon=True)
    worker.start()
    worker.join(seconds)
    timed_out = worker.is_alive()
    # the program's own threads only (their code is the program's module): a thread another part of
    # the process started meanwhile is not the program's to stop
    module = _module_name(path)
    theirs = [t for t in set(threading.enumerate()) - before
              if t is worker or type(t).__module__ == module
              or getattr(getattr(t, "_target", None), "__module__", None) == module]
    for thread in theirs:
        _interrupt(thread)
    for thread in theirs:
        thread.join(0.5)
    if timed_out:
        raise MtemuError(f"{path}: loading and build(platform) did not finish within {seconds:g} s of wall "
                         "time (--build-seconds)")
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, _DeadlinePassed):
            raise MtemuError(f"{path}: build(platform) was stopped (--build-seconds)") from None
        raise exc
    return box["value"]


def _load_python(path: Path, platform: Platform, dsps: int | None) -> tuple[Kernel, Platform]:
    module = _import(path)
    declared = getattr(module, "DSPS", None)
    plat = _with_dsps(platform, dsps if dsps is not None else declared, str(path))
    build = getattr(module, "build", None)
    if not callable(build):
        raise MtemuError(f"{path}: a Python program must define build(platform) -> Kernel or Program")
    try:
        built = build(plat)
    except MtemuError:
        raise
    except (Exception, SystemExit) as exc:   # the user's code: report it on one line, naming the file
        raise MtemuError(f"{path}: build(platform) failed: {type(exc).__name__}: {exc}") from None
    if isinstance(built, Program):
        built = Kernel([built])
    if not isinstance(built, Kernel):
        raise MtemuError(f"{path}: build(platform) returned {type(built).__name__}, not a Kernel or Program")
    return built, plat


def _module_name(path: Path) -> str:
    """The name a Python program is imported under (``sys.modules``)."""
    return "mtemu_program_" + re.sub(r"\W", "_", path.stem)


def _import(path: Path):
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise MtemuError(f"{path}: cannot load as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module            # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except MtemuError:
        raise
    except (Exception, SystemExit) as exc:   # SystemExit: a script that calls sys.exit
        raise MtemuError(f"{path}: loading failed: {type(exc).__name__}: {exc}") from None
    return module


def _with_dsps(platform: Platform, dsps, source: str) -> Platform:
    if dsps is None or dsps == platform.dsps:
        return platform
    if isinstance(dsps, bool) or not isinstance(dsps, int) or dsps < 1:
        raise MtemuError(f"{source}: DSP count must be a positive integer, got {dsps!r}")
    return platform.with_overrides(source, dsps=dsps)


# --------------------------------------------------------------------------------------------
# checking and placing data
# --------------------------------------------------------------------------------------------
def _check_region_fields(region: object, what: str) -> None:
    """A Region built by a Python program: every field of the right type (the text form is parsed)."""
    if not isinstance(region, Region):
        raise MtemuError(f"{what}: expected a Region, got {type(region).__name__}")
    if region.space not in isa.SPACES:
        raise MtemuError(f"{what}: unknown memory {show_value(region.space)} (known: {', '.join(isa.SPACES)})")
    if not is_integer(region.addr):
        raise MtemuError(f"{what}: address must be an integer, got {show_value(region.addr)}")
    if region.dsp is not None and not is_integer(region.dsp):
        raise MtemuError(f"{what}: dsp must be an integer or None, got {show_value(region.dsp)}")
    if region.shape is not None:
        if not isinstance(region.shape, tuple) or not region.shape \
                or not all(is_integer(n) and n > 0 for n in region.shape):
            raise MtemuError(f"{what}: shape must be a tuple of positive integers, got {show_value(region.shape)}")
    if region.dtype is not None and region.dtype not in DTYPES:
        raise MtemuError(f"{what}: dtype {show_value(region.dtype)} not supported (use one of {', '.join(DTYPES)})")


def check_kernel(kernel: object, platform: Platform, name: str) -> None:
    """Every field of a :class:`Kernel` (a Python program builds it freely) checked before the run, so a
    wrong type is one named error, not a traceback from deep in the machine."""
    if not isinstance(kernel, Kernel):
        raise MtemuError(f"{name}: expected a Kernel, got {type(kernel).__name__}")
    if not isinstance(kernel.programs, (list, tuple)) or not kernel.programs:
        raise MtemuError(f"{name}: Kernel.programs must be a non-empty list of Programs")
    for i, prog in enumerate(kernel.programs):
        if not isinstance(prog, Program):
            raise MtemuError(f"{name}: Kernel.programs[{i}] is a {type(prog).__name__}, not an assembled Program")
        for part in ("code", "descriptors"):
            arr = getattr(prog, part)
            if not isinstance(arr, np.ndarray) or arr.dtype != np.int64:
                kind = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
                raise MtemuError(f"{name}: Kernel.programs[{i}].{part} must be an int64 array, got {kind}")
    if kernel.dsp_program is not None:
        if not isinstance(kernel.dsp_program, (list, tuple)) or len(kernel.dsp_program) != platform.dsps:
            raise MtemuError(f"{name}: Kernel.dsp_program must list one program index per DSP ({platform.dsps})")
        for d, k in enumerate(kernel.dsp_program):
            if not is_integer(k) or not 0 <= k < len(kernel.programs):
                raise MtemuError(f"{name}: Kernel.dsp_program[{d}] = {show_value(k)} is not a program index "
                                 f"0..{len(kernel.programs) - 1}")
    if not isinstance(kernel.init_sregs, dict):
        raise MtemuError(f"{name}: Kernel.init_sregs must be a dict DSP -> {{register: value}}")
    for d, regs in kernel.init_sregs.items():
        if not is_integer(d) or not 0 <= d < platform.dsps:
            raise MtemuError(f"{name}: Kernel.init_sregs: DSP {show_value(d)} outside 0..{platform.dsps - 1}")
        if not isinstance(regs, dict):
            raise MtemuError(f"{name}: Kernel.init_sregs[{d}] must be a dict register -> value, "
                             f"got {type(regs).__name__}")
        for r, v in regs.items():
            if not is_integer(r) or not 0 < r < platform.scalar_registers:
                raise MtemuError(f"{name}: Kernel.init_sregs[{d}]: register {show_value(r)} outside "
                                 f"1..{platform.scalar_registers - 1}")
            if not is_integer(v) or not -(1 << 63) <= v < (1 << 63):
                raise MtemuError(f"{name}: Kernel.init_sregs[{d}][{r}] must be a 64-bit integer, got {show_value(v)}")
    if kernel.dsp_descriptors is not None:
        if not isinstance(kernel.dsp_descriptors, dict):
            raise MtemuError(f"{name}: Kernel.dsp_descriptors must be a dict DSP -> int64 array")
        for d, table in kernel.dsp_descriptors.items():
            if not is_integer(d) or not isinstance(table, np.ndarray) or table.dtype.kind not in "iu":
                raise MtemuError(f"{name}: Kernel.dsp_descriptors[{show_value(d)}] must be an integer array")
    for label in ("inputs", "outputs"):
        table = getattr(kernel, label)
        if not isinstance(table, dict):
            raise MtemuError(f"{name}: Kernel.{label} must be a dict name -> Region")
        for key, region in table.items():
            # a name becomes NAME.npy: a plain identifier, never a path ("../../escaped")
            if not isinstance(key, str) or not _NAME_RE.match(key):
                raise MtemuError(f"{name}: Kernel.{label} name {show_value(key)} must be a plain identifier")
            _check_region_fields(region, f"{name}: Kernel.{label}[{key!r}]")
    if not is_integer(kernel.ddr_bytes) or kernel.ddr_bytes < 0:
        raise MtemuError(f"{name}: Kernel.ddr_bytes must be a non-negative integer, got {show_value(kernel.ddr_bytes)}")
    if kernel.ddr_bytes > platform.ddr_bytes:
        raise MtemuError(f"{name}: Kernel.ddr_bytes = {show_value(kernel.ddr_bytes)} is more than the platform's DDR "
                         f"({platform.ddr_bytes} bytes)")
    if kernel.useful_macs is not None and (not is_integer(kernel.useful_macs) or kernel.useful_macs < 0):
        raise MtemuError(f"{name}: Kernel.useful_macs must be a non-negative integer or None, "
                         f"got {show_value(kernel.useful_macs)}")


def _capacity(platform: Platform, space: str) -> int:
    return {"SM": platform.sm_bytes, "AM": platform.am_bytes, "GSM": platform.gsm_bytes,
            "DDR": platform.ddr_bytes}[space]


def _check_region(region: Region, what: str, platform: Platform, output: bool) -> None:
    cap = _capacity(platform, region.space)
    nbytes = region.nbytes
    item = np.dtype(DTYPES[region.dtype]).itemsize
    if region.addr < 0 or region.addr + nbytes > cap:
        raise MtemuError(f"{what}: {region.describe()} ({nbytes} bytes at {region.addr}) lies outside "
                         f"{region.space} (0..{cap} bytes)")
    if region.addr % max(item, 2):
        raise MtemuError(f"{what}: {region.describe()}: address {region.addr} is not aligned to its "
                         f"{item}-byte {region.dtype} elements")
    if region.dsp is not None and not 0 <= region.dsp < platform.dsps:
        raise MtemuError(f"{what}: {region.describe()}: DSP {region.dsp} outside 0..{platform.dsps - 1}")
    if output and region.space in ("SM", "AM") and region.dsp is None:
        raise MtemuError(f"{what}: {region.space} is per DSP; name one, e.g. {region.space}.0:{region.addr}")


def _resolve_inputs(kernel: Kernel, given: dict[str, tuple[np.ndarray, Region | None, str]],
                    platform: Platform, functional: bool) -> dict[str, tuple[np.ndarray, Region]]:
    """Match given arrays with declared inputs; refuse wrong shape, dtype, place or overlap."""
    out: dict[str, tuple[np.ndarray, Region]] = {}
    for name, (arr, where, origin) in given.items():
        what = f"input {name} ({origin})"
        if not isinstance(arr, np.ndarray):
            raise MtemuError(f"{what}: expected a NumPy array, got {type(arr).__name__}")
        dtype = arr.dtype.name
        if dtype not in DTYPES:
            raise MtemuError(f"{what}: dtype {dtype} is not a machine type (use one of {', '.join(DTYPES)}; "
                             f"e.g. .astype(np.float16))")
        declared = kernel.inputs.get(name)
        if declared is None and where is None:
            known = ", ".join(kernel.inputs) or "none declared"
            raise MtemuError(f"{what}: the program declares no input {name!r} (declared: {known}); "
                             f"place it with {name}=FILE.npy@SPACE:ADDR")
        if declared is not None:
            if arr.shape != declared.shape or dtype != declared.dtype:
                raise MtemuError(f"{what}: has shape {arr.shape} {dtype}; its destination "
                                 f"{declared.describe()} expects {declared.shape} {declared.dtype}")
        region = replace(where or declared, shape=tuple(arr.shape) or (1,), dtype=dtype)
        _check_region(region, what, platform, output=False)
        out[name] = (arr, region)
    missing = [n for n in kernel.inputs if n not in given]
    if missing and functional:
        raise MtemuError(f"input(s) {', '.join(missing)} declared by the program but not given "
                         f"({', '.join(f'{n}={kernel.inputs[n].describe()}' for n in missing)})")
    # overlapping inputs would make the result depend on the placement order: refuse
    items = sorted(out.items())
    for i, (n1, (_a1, r1)) in enumerate(items):
        for n2, (_a2, r2) in items[i + 1:]:
            same_copy = r1.dsp is None or r2.dsp is None or r1.dsp == r2.dsp
            lo, hi = max(r1.addr, r2.addr), min(r1.addr + r1.nbytes, r2.addr + r2.nbytes)
            if r1.space == r2.space and same_copy and lo < hi:
                raise MtemuError(f"inputs {n1} and {n2} overlap in {r1.space} (bytes {lo}..{hi})")
    return out


def _resolve_outputs(kernel: Kernel, requested: dict[str, Region | None], platform: Platform) -> dict[str, Region]:
    out = {}
    for name, region in requested.items():
        if region is None:
            if name not in kernel.outputs:
                known = ", ".join(kernel.outputs) or "none declared"
                raise MtemuError(f"output {name}: not declared by the program (declared: {known}); "
                                 f"give {name}=SPACE:ADDR:SHAPE:DTYPE")
            region = kernel.outputs[name]
        _check_region(region, f"output {name}", platform, output=True)
        out[name] = region
    return out


def ddr_extent(kernel: Kernel, regions: list[Region]) -> int:
    """DDR bytes the run needs: the kernel's own plus every declared or placed DDR region."""
    ends = [kernel.ddr_bytes] + [r.addr + r.nbytes for r in regions if r.space == "DDR" and r.shape is not None]
    return max(ends)


def default_max_cycles(kernel: Kernel, platform: Platform, data_bytes: int) -> int:
    """A generous cycle limit derived from the program's static size and the data it moves."""
    bundles = sum(p.bundles for p in kernel.programs)
    ddr_cycles = data_bytes / (platform.ddr_bandwidth / platform.clock_hz)
    limit = MAX_CYCLES_FLOOR + MAX_CYCLES_PER_BUNDLE * bundles + MAX_CYCLES_PER_DDR_CYCLE * ddr_cycles
    return int(min(limit, MAX_CYCLES_LIMIT))     # the machine's largest (overflow-safe) limit


def _place(cluster: Cluster, arr: np.ndarray, region: Region, platform: Platform) -> None:
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    targets = range(platform.dsps) if region.space in ("SM", "AM") and region.dsp is None else [region.dsp or 0]
    for d in targets:
        cluster.region(region.space, region.addr, raw.size, d)[:] = raw


def _collect(cluster: Cluster, region: Region) -> np.ndarray:
    raw = cluster.region(region.space, region.addr, region.nbytes, region.dsp or 0).copy()
    return raw.view(DTYPES[region.dtype]).reshape(region.shape)


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    report: RunReport
    outputs: dict[str, np.ndarray]
    stats: RunStats


def run_kernel(kernel: Kernel, platform: Platform, *, inputs: dict[str, np.ndarray | tuple] | None = None,
               outputs: list[str] | dict[str, Region | None] | None = None, mode: str = "functional",
               max_cycles: int | None = None, trace: TraceOptions | None = None,
               name: str = "program", max_seconds: float | None = DEFAULT_MAX_SECONDS) -> RunResult:
    """Place ``inputs`` (name -> array, or (array, Region)), run, return the report and the outputs.

    ``outputs``: names of declared outputs, or name -> Region (None for the declared one);
    default: every declared output. Everything is checked before the machine starts.
    """
    if mode not in ("functional", "timing"):
        raise MtemuError(f"mode must be 'functional' or 'timing', got {mode!r}")
    functional = mode == "functional"
    check_kernel(kernel, as_platform(platform, name), name)
    given = {}
    for key, value in (inputs or {}).items():
        arr, where = value if isinstance(value, tuple) else (value, None)
        given[key] = (arr, where, "array")
    return _run(kernel, platform, given, outputs, functional, (max_cycles, max_seconds), trace, name)


def _limits(max_cycles: object, max_seconds: object) -> tuple[int | None, float | None]:
    """The cycle and wall-clock limits checked in Python ints/floats (a huge --max-cycles is named)."""
    if max_cycles is not None:
        max_cycles = checked_number(max_cycles, "--max-cycles", integer=True, lo=1, hi=MAX_CYCLES_LIMIT,
                                    error=MtemuError)
    if max_seconds is not None:
        max_seconds = checked_number(max_seconds, "--max-seconds", integer=False, lo=1e-3, hi=1e7,
                                     error=MtemuError)
    return max_cycles, max_seconds


def _run(kernel, platform, given, outputs, functional, limits, trace, name) -> RunResult:
    max_cycles, max_seconds = _limits(*limits)
    check_kernel(kernel, platform, name)
    placed = _resolve_inputs(kernel, given, platform, functional)
    if outputs is None:
        outputs = list(kernel.outputs)
    requested = dict(outputs) if isinstance(outputs, dict) else {n: None for n in outputs}
    regions_out = _resolve_outputs(kernel, requested, platform)
    regions = ([r for _a, r in placed.values()] + list(regions_out.values()) + list(kernel.inputs.values())
               + list(kernel.outputs.values()))
    ddr = ddr_extent(kernel, regions)
    if ddr > platform.ddr_bytes:
        raise MtemuError(f"{name}: needs {ddr} bytes of DDR; the platform has {platform.ddr_bytes}")
    data_bytes = sum(r.nbytes for r in regions)
    limit = default_max_cycles(kernel, platform, data_bytes) if max_cycles is None else max_cycles
    cluster = Cluster(platform, ddr_bytes=ddr, functional=functional)
    if functional:
        for arr, region in placed.values():
            _place(cluster, arr, region, platform)
    try:
        stats = cluster.run(kernel.programs, dsp_program=kernel.dsp_program, init_sregs=kernel.init_sregs,
                            max_cycles=limit, dsp_descriptors=kernel.dsp_descriptors, trace=trace,
                            max_seconds=max_seconds)
    except MachineError as exc:
        if "cycle limit" in str(exc) and max_cycles is None:
            raise MachineError(f"{name}: {exc}; the default limit is derived from the program's size and "
                               f"data, raise it with --max-cycles") from None
        if "wall-clock limit" in str(exc):
            raise MachineError(f"{name}: {exc}; the limit is --max-seconds (default {DEFAULT_MAX_SECONDS:g})") from None
        raise MachineError(f"{name}: {exc}") from None
    results = {n: _collect(cluster, r) for n, r in regions_out.items()} if functional else {}
    report = make_report(stats, name, "functional" if functional else "timing", limit, kernel.useful_macs)
    if report.utilization > 1:
        raise MtemuError(f"{name}: Kernel.useful_macs = {kernel.useful_macs} is more than the cluster can do in "
                         f"{stats.cycles} cycles ({platform.peak_macs_per_cycle} MACs per cycle)")
    return RunResult(report, results, stats)


def make_report(stats: RunStats, name: str, mode: str, max_cycles: int, useful_macs: int | None = None) -> RunReport:
    p = stats.platform
    cycles = max(stats.cycles, 1)
    macs = useful_macs if useful_macs is not None else stats.vfma * stats.lanes
    busy = {k: v / cycles for k, v in stats.server_busy.items() if not k.startswith("local")}
    local = [v for k, v in stats.server_busy.items() if k.startswith("local")]
    busy["local_max"] = max(local, default=0.0) / cycles
    return RunReport(name, mode, p.dsps, stats.cycles, stats.seconds(), stats.bundles, stats.busy_cycles(),
                     stats.stall_cycles(), {**stats.server_bytes, "total": stats.dma_bytes}, busy, stats.vfma,
                     int(macs), macs / (p.peak_macs_per_cycle * cycles), max_cycles, {}, stats)


def _load_npy(path: str, name: str) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise MtemuError(f"input {name}: {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise MtemuError(f"input {name}: {path}: not a readable .npy file ({exc})") from None
    if not isinstance(arr, np.ndarray):
        raise MtemuError(f"input {name}: {path}: holds several arrays (.npz); give one .npy")
    return arr


def run_program(path: str | Path, platform: Platform, *, inputs: list[str] = (), outputs: list[str] = (),
                out_dir: str | Path | None = ".", mode: str = "functional", dsps: int | None = None,
                max_cycles: int | None = None, trace: TraceOptions | None = None,
                max_seconds: float | None = DEFAULT_MAX_SECONDS,
                build_seconds: float | None = DEFAULT_BUILD_SECONDS) -> RunResult:
    """``mtemu run``: load, check, run, then write each output as ``out_dir/NAME.npy`` (None: write none)."""
    if mode not in ("functional", "timing"):
        raise MtemuError(f"mode must be 'functional' or 'timing', got {mode!r}")
    kernel, plat = load_kernel(path, platform, dsps, build_seconds)
    given = {}
    for spec in inputs:
        name, file, where = parse_input_spec(spec)
        if name in given:
            raise MtemuError(f"--input {name} given twice")
        given[name] = (_load_npy(file, name), where, file)
    requested: dict[str, Region | None] = {}
    for spec in outputs:
        name, region = parse_output_spec(spec)
        if name in requested:
            raise MtemuError(f"--output {name} given twice")
        requested[name] = region
    if not outputs:
        requested = {n: None for n in kernel.outputs}
    result = _run(kernel, plat, given, requested, mode == "functional", (max_cycles, max_seconds), trace,
                  str(path))
    if result.outputs and out_dir is not None:
        out = Path(out_dir)
        blobs = {}
        for name, arr in result.outputs.items():
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            blobs[name] = buf.getvalue()
        # all or none: a full disk while writing the second file leaves not even the first
        try:
            atomic_write_many({out / f"{name}.npy": blob for name, blob in blobs.items()})
        except UserError as exc:
            raise MtemuError(str(exc)) from None
        for name in blobs:
            result.report.outputs[name] = str(out / f"{name}.npy")
    return result

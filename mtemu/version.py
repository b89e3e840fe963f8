"""Version of the emulated timing: keys every cache of emulated numbers.

``emulator_version(family)`` hashes the package version, ``TIMING_VERSION`` and the programs the
family's generators build for a few reference shapes (code, DMA descriptors, per-DSP tables) on
the default platform. What decides a kernel's cycles is the program and the machine: a change to
a generator that alters its programs changes the version, while a refactor, a new parameter or
a docstring does not. Platform values are keyed separately (``Platform.timing_digest``). A change
to the machine's timing semantics (DMA model, branch cost, scheduling) must bump
``TIMING_VERSION``; tests/test_profile.py re-emulates shipped latencies and fails if any cycle
count differs, which catches a forgotten bump.

Building the reference programs takes seconds, so the result is remembered per state of the
sources that could change them (a hash of mtemu's generator, assembler, ISA and platform files):
in ``mtemu/data/versions.json`` (shipped, written by scripts/ship_profiles.py) and in the user
cache (the ``versions`` cache of :mod:`rtcommon.caches`). A source edit costs one rebuild of the
reference programs; it changes the version only if the programs changed.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np

from rtcommon import caches
from rtcommon.cache import read_json_cache, write_json_cache
from rtcommon.fileio import atomic_write_json

from ._version import __version__
from .assembler import Program
from .kernels.attention import build_attention_backward, build_attention_forward, plan_attention
from .kernels.attention.forward import plan_attention_forward
from .kernels.gemm import GemmTiles, build_gemm
from .kernels.gemm_a_resident import AResidentGemmTiles, build_a_resident
from .platform import DEFAULT

# Bump when the machine's timing semantics change (DMA model, branch cost, scheduling...).
TIMING_VERSION = 2

_ROOT = Path(__file__).parent
SHIPPED_VERSIONS = _ROOT / "data" / "versions.json"
# sources whose text could change a reference program (the machine's are TIMING_VERSION's job)
_SOURCES = ("_version.py", "assembler.py", "isa.py", "platform.py", "kernels")

# Reference shapes: remainders in every loop (none of them a multiple of the tiles).
_GEMM_SHAPES = ((600, 1000, 700),)
_ATTENTION_SHAPES = ((4, 2, 320, 64),)


def _update(h, obj) -> None:
    """Feed a program's encoded form (arrays, tables, labels) into the hash, recursively."""
    if isinstance(obj, Program):
        h.update(obj.code.tobytes())
        h.update(obj.descriptors.tobytes())
        h.update(repr(sorted(obj.labels.items())).encode())
    elif isinstance(obj, np.ndarray):
        h.update(str(obj.dtype).encode() + repr(obj.shape).encode() + obj.tobytes())
    elif isinstance(obj, dict):
        for key in sorted(obj, key=repr):
            h.update(repr(key).encode())
            _update(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _update(h, item)
    else:
        h.update(repr(obj).encode())


def _gemm_programs() -> list:
    out = []
    for m, k, n in _GEMM_SHAPES:
        for tiles in (GemmTiles(), GemmTiles(pipelined=False)):
            gp = build_gemm(m, k, n, tiles, DEFAULT)
            out.append((gp.program, gp.dsp_descriptors, gp.init_sregs, gp.useful_macs))
        gp = build_a_resident(m, k, n, AResidentGemmTiles(), DEFAULT)
        out.append((gp.program, gp.dsp_descriptors, gp.init_sregs, gp.useful_macs))
    return out


def _attention_programs() -> list:
    out = []
    for heads, kv_heads, seq, d in _ATTENTION_SHAPES:
        for variant in ("resident", "ddr-staged"):
            ap = build_attention_backward(plan_attention(heads, kv_heads, seq, d, variant=variant), DEFAULT)
            out.append((ap.programs, ap.useful_macs, ap.tile_pairs, ap.schedule))
        ap = build_attention_forward(plan_attention_forward(heads, kv_heads, seq, d), DEFAULT)
        out.append((ap.programs, ap.useful_macs, ap.tile_pairs, ap.schedule))
    return out


_PROGRAMS = {"gemm": _gemm_programs, "attention": _attention_programs}


def source_digest() -> str:
    """Hash of the sources the reference programs are built from."""
    h = hashlib.sha256(f"{__version__}|timing{TIMING_VERSION}".encode())
    for rel in _SOURCES:
        path = _ROOT / rel
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f.relative_to(_ROOT).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _user_versions() -> Path:
    return caches.path("versions") / caches.cache("versions").entries


def _read_versions(path: Path) -> dict:
    # damaged or edited: warned, and rebuilt below; the shipped file carries no checksum
    return read_json_cache(path, checksum=path != SHIPPED_VERSIONS) or {}


def program_version(kernel: str) -> str:
    """The hash of the family's reference programs, built now (seconds)."""
    h = hashlib.sha256(f"{__version__}|timing{TIMING_VERSION}".encode())
    _update(h, _PROGRAMS[kernel]())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def emulator_version(kernel: str = "gemm") -> str:
    """Version of the emulated timing of one kernel family ('gemm' or 'attention'), or 'all'."""
    if kernel == "all":
        h = hashlib.sha256(b"all")
        for name in sorted(_PROGRAMS):
            h.update(emulator_version(name).encode())
        return h.hexdigest()[:16]
    if kernel not in _PROGRAMS:
        raise ValueError(f"unknown kernel family {kernel!r} (known: {', '.join(_PROGRAMS)}, all)")
    key = f"{source_digest()}|{kernel}"
    for path in (SHIPPED_VERSIONS, _user_versions()):
        got = _read_versions(path).get(key)
        if isinstance(got, str) and len(got) == 16:
            return got
    version = program_version(kernel)
    # no writable cache: warned, and the next process builds them again
    write_json_cache(_user_versions(), {**_read_versions(_user_versions()), key: version})
    return version


def write_shipped_versions() -> Path:
    """Record the current sources' versions in the package (run by scripts/ship_profiles.py)."""
    atomic_write_json(SHIPPED_VERSIONS, {f"{source_digest()}|{k}": program_version(k) for k in sorted(_PROGRAMS)})
    return SHIPPED_VERSIONS

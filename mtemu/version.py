"""Version of the emulated timing: keys every cache of emulated numbers.

``emulator_version(family)`` hashes the package version, ``TIMING_VERSION`` and the programs the
family's generators build for a few reference shapes (code, DMA descriptors, per-DSP tables) on
the default platform. What decides a kernel's cycles is the program and the machine: a change to
a generator that alters its programs changes the version, while a refactor, a new parameter or
a docstring does not. Platform values are keyed separately (``Platform.timing_digest``). A change
to the machine's timing semantics (DMA model, branch cost, scheduling) must bump
``TIMING_VERSION``; tests/test_profile.py re-emulates shipped latencies and fails if any cycle
count differs, which catches a forgotten bump.

Building the reference programs (:mod:`mtemu.version_programs`, which loads the generators) takes
seconds, so the result is remembered per state of the sources that could change them (a hash of
mtemu's generator, assembler, ISA and platform files): in ``mtemu/data/versions.json`` (shipped,
written by scripts/ship_profiles.py) and in the user cache (the ``versions`` cache of
:mod:`rtcommon.caches`). A source edit costs one rebuild of the
reference programs; it changes the version only if the programs changed.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
from pathlib import Path

from rtcommon import caches
from rtcommon.cache import read_json_cache, write_json_cache
from rtcommon.fileio import atomic_write_json

from ._version import __version__

# Bump when the machine's timing semantics change (DMA model, branch cost, scheduling...).
TIMING_VERSION = 2

_ROOT = Path(__file__).parent
SHIPPED_VERSIONS = _ROOT / "data" / "versions.json"
# sources whose text could change a reference program (the machine's are TIMING_VERSION's job)
_SOURCES = ("_version.py", "assembler.py", "isa.py", "platform.py", "kernels")

# The kernel families with reference programs (built by mtemu.version_programs, which loads the generators:
# only a source state whose versions are not recorded yet needs it, so looking a version up stays light).
FAMILIES = ("attention", "gemm")


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
    programs = importlib.import_module("mtemu.version_programs")
    h = hashlib.sha256(f"{__version__}|timing{TIMING_VERSION}".encode())
    programs.update_hash(h, programs.PROGRAMS[kernel]())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def emulator_version(kernel: str = "gemm") -> str:
    """Version of the emulated timing of one kernel family ('gemm' or 'attention'), or 'all'."""
    if kernel == "all":
        h = hashlib.sha256(b"all")
        for name in sorted(FAMILIES):
            h.update(emulator_version(name).encode())
        return h.hexdigest()[:16]
    if kernel not in FAMILIES:
        raise ValueError(f"unknown kernel family {kernel!r} (known: {', '.join(FAMILIES)}, all)")
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
    atomic_write_json(SHIPPED_VERSIONS, {f"{source_digest()}|{k}": program_version(k) for k in sorted(FAMILIES)})
    return SHIPPED_VERSIONS

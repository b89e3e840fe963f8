"""Built kernel programs on disk, so a new process loads a GEMM's program instead of building it.

Building a Table 5 GEMM (list-scheduling its micro-kernels, assembling and hazard-checking some
30 000 bundles) takes seconds; emulating it in timing mode takes a fraction of that. Each built
program is kept as ``<cache>/programs/<key>.npz`` (an .npz deflated at zlib level 1: code, descriptors,
per-DSP descriptor tables, and a JSON header with the labels, descriptor names, initial registers
and the key itself). When a functional run keeps a program's prepared tables (:func:`mtemu.fast.prepared.kept`),
this module keeps the program's code uncompressed as well (``<cache>/program-code/<hash>.bin``, an array
file: int64, as the machine runs it), and a load maps that copy when it is there, instead of
inflating and widening the compressed copy: a first call's 7 MB of code for a 1024^3 GEMM without
fresh memory to fault in. Timing runs do not keep it (the tuner builds hundreds of programs); the
folder is kept under ``MTEMU_PREPARED_CACHE_MB`` like the prepared tables. The key hashes,
like the latency profiles: the kernel name, the version of the sources that generate its program
(:func:`generator_version`), the shape, the tiles and the platform digest.

Files are written atomically. A file that cannot be read, or whose header names another key, is
rebuilt and rewritten with a :class:`ProgramCacheWarning` (a :class:`rtcommon.caches.CacheWarning`);
a cache folder that cannot be written only costs the rebuild next time (with a warning). The folders
are the ``programs`` and ``program-code`` caches of :mod:`rtcommon.caches` (which names their format
versions); ``MTEMU_PROGRAM_CACHE=0`` turns them off.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import zipfile
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from rtcommon import caches
from rtcommon.arrayfile import ArrayFileError, read_arrays, write_arrays
from rtcommon.fileio import atomic_write_bytes
from rtcommon.hostmem import small_pages

from .. import isa
from .._version import __version__
from ..assembler import Program
from ..fast import prepared as prepared_store
from ..platform import Platform

# bumped in rtcommon.caches when the file layout changes (programs 2: code stored as int32 where it fits)
FORMAT = caches.cache("programs").version
CODE_FORMAT = caches.cache("program-code").version
_ROOT = Path(__file__).resolve().parent.parent

# Sources that generate a kernel's program (its bits, not its timing). The platform enters the key
# through its digest.
_GENERATOR_SOURCES = {
    "gemm": ("isa.py", "assembler.py", "kernels/schedule.py", "kernels/gemm.py"),
    "gemm_a_resident": ("isa.py", "assembler.py", "kernels/schedule.py", "kernels/gemm.py",
                        "kernels/gemm_a_resident.py"),
    "gemm_fp64": ("isa.py", "assembler.py", "kernels/schedule.py", "kernels/gemm_fp64.py"),
    "gemm_fp64_nt": ("isa.py", "assembler.py", "kernels/schedule.py", "kernels/gemm_fp64.py"),
}


@functools.lru_cache(maxsize=None)
def generator_version(kernel: str) -> str:
    """Hash of the sources that generate ``kernel``'s programs ('gemm' or 'gemm_a_resident')."""
    h = hashlib.sha256(f"{__version__}|program".encode())
    for rel in _GENERATOR_SOURCES[kernel]:
        h.update(rel.encode())
        h.update((_ROOT / rel).read_bytes())
    return h.hexdigest()[:16]

Built = tuple[Program, dict[int, np.ndarray], dict[int, dict[int, int]]]


class ProgramCacheWarning(caches.CacheWarning):
    """A cached program could not be used (unreadable or for another key); it was rebuilt."""


def program_cache_dir() -> Path:
    return caches.path("programs")


def cache_key(kernel: str, shape: tuple[int, ...], tiles, platform: Platform) -> str:
    """The identity of one built program (a JSON string; its hash names the file)."""
    return json.dumps([FORMAT, kernel, generator_version(kernel), [int(x) for x in shape], asdict(tiles),
                       platform.digest()], sort_keys=True)


def _key_hash(key: str) -> str:
    """The name of a built program: its file's and its ``Program.origin``."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def cache_path(key: str) -> Path:
    return program_cache_dir() / f"{_key_hash(key)}.npz"


def cached_program(kernel: str, shape: tuple[int, ...], tiles, platform: Platform, build: Callable[[], Built]) -> Built:
    """``build()`` (program, per-DSP descriptor tables, initial registers), or its copy on disk."""
    key = cache_key(kernel, shape, tiles, platform)
    if not prepared_store.enabled():
        return _frozen(build(), key)
    path = cache_path(key)
    if path.exists():
        try:
            return _frozen(_load(path, key), key)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            caches.warn(f"program cache {path}: {exc}; rebuilding it", ProgramCacheWarning, stacklevel=3)
    built = build()
    try:
        atomic_write_bytes(path, _dump(key, *built))
    except OSError as exc:      # a read-only cache costs the build next time, nothing else
        caches.warn(f"cannot write the program cache in {path.parent} ({exc.strerror or exc}); running "
                    "without it", ProgramCacheWarning)
    return _frozen(built, key)


def _frozen(built: Built, key: str) -> Built:
    """Kernel programs are shared (lru caches): read-only, and kept prepared by the machine (named by
    their key, so that in functional mode the machine keeps its prepared tables on disk too)."""
    built[0].origin = _key_hash(key)
    built[0].freeze()
    return built


def code_key(origin: str) -> str:
    """The identity of the code kept for the program named ``origin``."""
    return json.dumps(["code", CODE_FORMAT, origin])


def code_path(origin: str) -> Path:
    return caches.path("program-code") / f"{hashlib.sha256(code_key(origin).encode()).hexdigest()[:32]}.bin"


def keep_code(program: Program) -> None:
    """Keep the code of a named program whose prepared tables a functional run keeps (unless it is there
    already), then drop the least recently used copies beyond ``MTEMU_PREPARED_CACHE_MB``; a copy larger
    than an eighth of it is not kept."""
    if not program.origin:
        return
    path = code_path(program.origin)
    limit = prepared_store.limit_bytes()
    if path.exists() or program.code.size * 8 > limit // 8:
        return
    try:
        write_arrays(path, code_key(program.origin), [(np.ascontiguousarray(program.code, dtype=np.int64),)])
        caches.evict_lru(path.parent, "*.bin", limit)
    except OSError as exc:
        caches.warn(f"cannot write the program code in {path.parent} ({exc.strerror or exc}); running without "
                    "it", ProgramCacheWarning)


prepared_store.on_kept(keep_code)


def load_code(origin: str) -> np.ndarray | None:
    """The code kept for the program named ``origin`` (int64, bundles x units x fields, mapped
    copy-on-write), or None if there is none or it is unusable (then with a :class:`ProgramCacheWarning`,
    and deleted, so that the next functional run keeps it again). A copy read is marked as recently used."""
    path = code_path(origin)
    try:
        groups = read_arrays(path, code_key(origin), mapped=True)[0]
    except FileNotFoundError:
        return None
    except ArrayFileError as exc:
        caches.warn(f"program code {exc}; deleted it, inflating the program's own", ProgramCacheWarning, stacklevel=4)
        drop_code(origin)
        return None
    if len(groups) == 1 and groups[0] is not None and len(groups[0]) == 1 and groups[0][0].dtype == np.int64 \
            and groups[0][0].ndim == 3:
        try:
            os.utime(path)
        except OSError:
            pass
        return groups[0][0]
    caches.warn(f"program code {path}: not a program's code; deleted it, inflating the program's own",
                ProgramCacheWarning, stacklevel=4)
    drop_code(origin)
    return None


def drop_code(origin: str) -> None:
    """Forget the code kept for the program named ``origin`` (it did not match the program)."""
    try:
        code_path(origin).unlink()
    except OSError:
        pass


def _dump(key: str, program: Program, dsp_descriptors: dict[int, np.ndarray],
          init_sregs: dict[int, dict[int, int]]) -> bytes:
    dsps = sorted(dsp_descriptors)
    header = {"key": key, "labels": program.labels, "descriptor_names": list(program.descriptor_names),
              "dsp_descriptors": dsps,
              "init_sregs": [[int(d), [[int(r), int(v)] for r, v in sorted(regs.items())]]
                             for d, regs in sorted(init_sregs.items())]}
    tables = (np.stack([dsp_descriptors[d] for d in dsps]) if dsps
              else np.zeros((0,) + program.descriptors.shape, np.int64))
    header["checksum"] = _checksum(header, program.code, program.descriptors, tables)
    return _npz_bytes({"header": np.array(json.dumps(header, sort_keys=True)), "code": _narrow(program.code),
                       "descriptors": program.descriptors, "tables": tables})


# zlib level of the program files: level 1 deflates the Table 5 programs' 190 MB of arrays in a
# third of the CPU time of ``np.savez_compressed``'s default level 6 (0.7 against 2.3 s) into 45 %
# more bytes (6.3 against 4.3 MB); a first run writes every program it builds, a later one only reads
_NPZ_LEVEL = 1


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """``arrays`` as the bytes of an .npz archive (what ``np.load`` reads), deflated at :data:`_NPZ_LEVEL`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=_NPZ_LEVEL) as archive:
        for name, arr in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asanyarray(arr), allow_pickle=False)
    return buf.getvalue()


def _checksum(header: dict, code: np.ndarray, descriptors: np.ndarray, tables: np.ndarray) -> str:
    """A program file's checksum: its header (but this field) and the wrapping sums of its arrays' int64
    words, each with its shape (a sum, not a hash, of the code: it is read on every load, some MB)."""
    h = hashlib.sha256(json.dumps({k: v for k, v in header.items() if k != "checksum"}, sort_keys=True).encode())
    for arr in (code, descriptors, tables):
        words = np.ascontiguousarray(arr, dtype=np.int64).view(np.uint64)
        h.update(f"{arr.shape}:{int(np.add.reduce(words, axis=None, dtype=np.uint64)) if words.size else 0};".encode())
    return h.hexdigest()


def _load(path: Path, key: str) -> Built:
    with small_pages(), np.load(path, allow_pickle=False) as z:
        header = json.loads(str(z["header"]))
        if header.get("key") != key:
            raise ValueError("the file holds another program (key mismatch)")
        code = load_code(_key_hash(key))       # the copy a functional run keeps with its tables, mapped
        stored = _stored_shape(z.zip, "code.npy") if code is not None else None
        if code is not None and code.shape != stored:
            caches.warn(f"the code kept for {path.name} in {code_path(_key_hash(key))} has shape {code.shape}, "
                        f"the program {stored}; deleted it, inflating the program's own", ProgramCacheWarning,
                        stacklevel=4)
            drop_code(_key_hash(key))
            code = None
        kept = code is not None
        if code is None:
            code = _read_widened(z.zip, "code.npy")
        descs = np.ascontiguousarray(z["descriptors"], dtype=np.int64)
        tables = np.asarray(z["tables"], dtype=np.int64)
        sound = header.get("checksum") == _checksum(header, code, descs, tables)
        if not sound and kept:                 # the kept copy or the file is wrong: the file's own code decides
            drop_code(_key_hash(key))
            code = _read_widened(z.zip, "code.npy")
            sound = header.get("checksum") == _checksum(header, code, descs, tables)
        if not sound:
            raise ValueError("checksum mismatch (edited or damaged since it was written)")
    if code.ndim != 3 or code.shape[1:] != (isa.N_UNITS, isa.N_FIELDS) or descs.ndim != 2 \
            or descs.shape[1:] != (isa.N_DESC,) or tables.shape[1:] != descs.shape \
            or tables.shape[0] != len(header["dsp_descriptors"]):
        raise ValueError(f"arrays of unexpected shape (code {code.shape}, descriptors {descs.shape}, "
                         f"tables {tables.shape})")
    program = Program(code, descs, {str(k): int(v) for k, v in header["labels"].items()},
                      [str(x) for x in header["descriptor_names"]])
    dsp_descriptors = {int(d): tables[i].copy() for i, d in enumerate(header["dsp_descriptors"])}
    init = {int(d): {int(r): int(v) for r, v in regs} for d, regs in header["init_sregs"]}
    return program, dsp_descriptors, init


_CHUNK = 1 << 16        # elements inflated and widened at a time


def _stored_shape(archive: zipfile.ZipFile, member: str) -> tuple[int, ...]:
    """The shape of the array stored as ``member`` of an .npz (its header only is inflated)."""
    with archive.open(member) as fh:
        return _read_header(fh)[0]


def _read_header(fh) -> tuple:
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fh)
    return np.lib.format.read_array_header_2_0(fh)


def _read_widened(archive: zipfile.ZipFile, member: str) -> np.ndarray:
    """The integer array stored as ``member`` of an .npz, as int64: inflated a chunk at a time straight
    into the result, which is the only large buffer made (``np.load`` would make three: the inflated
    bytes, the stored array and the widened copy, each a fresh 4 KB page fault per page on a first call;
    for a 1024^3 GEMM's code some 2,900 faults against 2,000, ~4 ms less)."""
    with archive.open(member) as fh:
        shape, fortran, dtype = _read_header(fh)
        if fortran or dtype.kind != "i":
            raise ValueError(f"{member}: expected a C-ordered signed integer array, got {dtype} (fortran={fortran})")
        out = np.empty(shape, np.int64)
        flat = out.reshape(-1)
        for at in range(0, flat.size, _CHUNK):
            part = min(_CHUNK, flat.size - at)
            raw = fh.read(part * dtype.itemsize)
            if len(raw) != part * dtype.itemsize:
                raise ValueError(f"{member}: the stored array is shorter than its header says")
            flat[at:at + part] = np.frombuffer(raw, dtype)
    return out


def _narrow(code: np.ndarray) -> np.ndarray:
    """``code`` as int32 when every field fits (a 1024^3 GEMM's is: half the bytes to inflate and check
    on a first call, ~3 ms less); :func:`_read_widened` widens either form back to int64."""
    if code.size and (int(code.min()) < -(1 << 31) or int(code.max()) >= 1 << 31):
        return code
    return code.astype(np.int32)

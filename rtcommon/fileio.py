"""Crash-safe file writes: write to a temporary file in the same folder, then rename."""
from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import UserError

# mkstemp creates files readable by the owner only; results should get the permissions a plain
# open() would give. Read the process umask once (setting it back at once), at import.
_UMASK = os.umask(0)
os.umask(_UMASK)


def _first_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (what a later mkdir(parents=True) builds on)."""
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    return probe


def check_output_dir(path: str | os.PathLike, flag: str = "output folder") -> None:
    """Refuse a folder we could not create or write into, before any work is done: a file in the
    way (ENOTDIR), a read-only or unsearchable ancestor. Missing parents are fine (we create them).
    ``flag`` (e.g. "--out") starts the message; empty to start with the path."""
    target = Path(os.fspath(path) or ".")
    base = _first_existing(target.absolute())
    if not base.is_dir():
        what = "is a file" if base == target.absolute() else f"has a file in the way ({base})"
        raise UserError(f"{flag} {target}: {what}, not a folder".strip())
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {target}: {base} is not writable".strip())


def check_output_file(path: str | os.PathLike, flag: str = "output file") -> None:
    """Refuse an output file that could not be written: a folder of that name, a file in the way
    of its folder, or a folder we could not create or write into."""
    target = Path(os.fspath(path))
    if not os.fspath(path) or target.is_dir():
        raise UserError(f"{flag} {target}: is a folder, not a file".strip())
    base = _first_existing(target.absolute().parent)
    if not base.is_dir():
        raise UserError(f"{flag} {target}: has a file in the way ({base})".strip())
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {target}: {base} is not writable".strip())


def _stage(target: Path, data: bytes) -> str:
    """Write ``data`` to a new temporary file beside ``target``; return its name."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the new file, never a part."""
    target = Path(path)
    tmp = _stage(target, data)
    try:
        os.replace(tmp, target)
    except BaseException:
        _unlink(tmp)
        raise


def atomic_write_many(files: dict[str | os.PathLike, bytes]) -> None:
    """Write several files all or none: each goes to a temporary name first, and only when every
    one is written (a full disk fails here) are they renamed into place. A failure is a
    :class:`UserError` naming the file; no temporary file is left behind."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            target = Path(path)
            try:
                staged.append((_stage(target, data), target))
            except OSError as exc:
                raise UserError(f"{target}: cannot write ({exc.strerror or exc}); nothing was written") from None
        for tmp, target in staged:
            os.replace(tmp, target)
    finally:
        for tmp, _target in staged:
            _unlink(tmp)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_write_figure(path: str | os.PathLike, fig: Any, dpi: int = 100, **savefig_kwargs: Any) -> None:
    """Render a Matplotlib figure as PNG (x tick labels that would overlap rotated apart: the house
    style, rtcommon.figstyle), close it, and write the file atomically."""
    import matplotlib.pyplot as plt  # only when a figure is written: rtcommon stays light

    from rtcommon.figstyle import readable_xticks

    readable_xticks(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, **savefig_kwargs)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())

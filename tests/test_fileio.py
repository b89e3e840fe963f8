"""Crash-safe writes: whole files only, and the permissions a plain open() would give."""
import os
import stat

import pytest

from rtcommon.fileio import atomic_write_bytes, atomic_write_json


def test_written_file_has_umask_permissions_and_no_temporaries(tmp_path):
    mask = os.umask(0)
    os.umask(mask)
    target = tmp_path / "sub" / "out.json"
    atomic_write_json(target, {"a": 1})
    assert target.read_text() == '{\n  "a": 1\n}\n'
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    assert [p.name for p in target.parent.iterdir()] == ["out.json"]


def test_a_failed_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "out.bin"
    atomic_write_bytes(target, b"old")
    with pytest.raises(TypeError):               # the write itself fails
        atomic_write_bytes(target, object())
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]

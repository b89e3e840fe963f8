"""The cache registry (rtcommon.caches): one root, the per-package aliases, the docs' table, and
``mtemu cache --json`` over it."""
import json
import re
from pathlib import Path

import pytest

from mtemu.cli import main as mtemu_main
from mtemu.kernels import program_cache
from mtemu.tune import tune_cache_dir
from ratrain.cost import profile
from rtcommon import caches

ROOT = Path(__file__).resolve().parents[1]


def _table() -> list[list[str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("\n## Caches\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| `")]
    return rows


def test_the_architecture_table_lists_exactly_the_registered_caches():
    rows = _table()
    assert [r[0].strip("`") for r in rows] == [c.name for c in caches.CACHES]
    for row, c in zip(rows, caches.CACHES, strict=True):
        folder = re.match(r"`<root>/([^`]*)`", row[1]).group(1)
        assert folder == "/".join(x for x in (c.part, c.folder, c.entries) if x), row
        assert row[3] == ("-" if c.version is None else str(c.version)), row
        assert c.writer.split(" ")[0].lower() in row[4].lower(), row


def test_one_root_holds_every_cache_and_the_package_variables_move_their_part(tmp_path, monkeypatch):
    for name in (*caches.PART_VARIABLES.values(), caches.NUMBA_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(caches.ROOT_VARIABLE, str(tmp_path / "root"))
    for c in caches.CACHES:
        assert c.path().is_relative_to(tmp_path / "root" / c.part), c
    assert tune_cache_dir() == tmp_path / "root" / "mtemu" / "tune"
    assert program_cache.program_cache_dir() == tmp_path / "root" / "mtemu" / "programs"
    assert profile.cache_dir() == tmp_path / "root" / "ratrain"
    monkeypatch.setenv("MTEMU_CACHE_DIR", str(tmp_path / "m"))
    monkeypatch.setenv("RATRAIN_CACHE_DIR", str(tmp_path / "r"))
    assert caches.path("numba") == tmp_path / "m" / "numba" and caches.path("prepared") == tmp_path / "m" / "prepared"
    assert caches.path("profiles") == tmp_path / "r" / "profiles"
    monkeypatch.setenv(caches.NUMBA_VARIABLE, str(tmp_path / "n"))
    assert caches.path("numba") == tmp_path / "n"          # the user's own wins
    monkeypatch.setenv(caches.NUMBA_VARIABLE, str(tmp_path / "n" / f"{caches.JIT_FOLDER_PREFIX}0123"))
    assert caches.path("numba") == tmp_path / "n"          # as mtemu left it for its workers
    assert caches.path("simulator-jit") == tmp_path / "n" / "ratrain-sim"     # beside the emulator's


def test_the_compiled_event_loop_goes_to_its_registered_folder():
    from ratrain.sim import event_kernel
    assert event_kernel.CACHE_FOLDER == caches.path("simulator-jit")
    with event_kernel._numba_cache_here():
        import numba
        assert numba.config.CACHE_DIR == str(caches.path("simulator-jit"))


def test_tests_run_on_their_own_root():
    assert caches.root() != Path.home() / ".cache"
    assert not any(c.path().is_relative_to(Path.home() / ".cache") for c in caches.CACHES
                   if c.name not in ("numba", "simulator-jit"))


def test_mtemu_cache_json_lists_every_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MTEMU_CACHE_DIR", str(tmp_path))
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "a.json").write_text("{}")
    (tmp_path / "tune" / "b.json").write_text("{\"x\": 1}")
    assert mtemu_main(["cache", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    listed = {c["name"]: c for c in payload["caches"]}
    assert list(listed) == [c.name for c in caches.CACHES]
    assert listed["tune"]["entries"] == 2 and listed["tune"]["bytes"] == 2 + 8
    assert listed["tune"]["folder"] == str(tmp_path / "tune") and listed["programs"]["version"] == 3


def test_a_cache_warning_is_one_line_on_the_cli(tmp_path, monkeypatch, capsys):
    caches._warned.clear()

    def handler(args):
        caches.warn(f"{tmp_path / 'x.json'}: damaged; ignored (it will be rebuilt)")
        return {}, "done"
    monkeypatch.setattr("mtemu.cli.cache._cache", handler)
    from mtemu.cli import build_parser
    from rtcommon.cli import run_main
    parser = build_parser()
    assert run_main("mtemu", parser, ["cache"]) == 0
    err = capsys.readouterr().err
    assert err == f"mtemu cache: warning: {tmp_path / 'x.json'}: damaged; ignored (it will be rebuilt)\n"


def test_every_cache_warning_is_a_cache_warning():
    from mtemu.fast.prepared import PreparedCacheWarning
    assert issubclass(PreparedCacheWarning, caches.CacheWarning)
    assert issubclass(program_cache.ProgramCacheWarning, caches.CacheWarning)
    assert issubclass(caches.CacheWarning, UserWarning)
    with pytest.warns(caches.CacheWarning, match="once"):
        caches.warn("said once")
        caches.warn("said once")

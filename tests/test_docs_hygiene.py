"""The repository reads as a reference: no work diary in its text, no stale module paths in its docs.

(a) Tracked text files (docs, README, CHANGELOG, code, tests, platform files, CI) never speak of work
    periods, tracker numbers or dates of work: say what a thing is, not when or under which ticket
    it was done. (b) Every module path the docs and the code's comments name (``mtemu/x.py``,
    ``ratrain/spec/y.py``, a bare ``z.py``, a dotted ``mtemu.x.y``) exists in the tree as it is when
    the test runs, so the check follows modules that move. (c) Versions agree across the package
    metadata and the changelog; the README's test command is CI's; ARCHITECTURE.md lists every
    command; references to CHOICES.md sections name existing headings.
"""
from __future__ import annotations

import re
import subprocess
import tomllib
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mtemu", "ratrain", "rtcommon")
TEXT_SUFFIXES = {".md", ".py", ".toml", ".yaml", ".json", ".s", ".txt", ""}
SKIP = {"ratrain/data/corpus.txt"}          # shipped training text (standard-library docstrings)

# What a diary or a tracker leaves behind. "issue" alone is the VLIW verb (a bundle issues), so only
# its tracker forms are flagged.
DIARY = [
    (re.compile(r"\bsessions? \d+", re.I), "work period ('session N')"),
    (re.compile(r"\b(this|last|next|that|the) session\b|\bsession's\b", re.I), "work period ('this session')"),
    (re.compile(r"\b(work|sprint) period\b|\bsprint \d+", re.I), "work period"),
    (re.compile(r"\bissues? #\d+|\bissue \d+\b|\bissues \d+(, \d+)+", re.I), "tracker number ('issue N')"),
    (re.compile(r"(?<![&\w])#\d{1,4}\b(?![0-9a-fA-F])"), "tracker number ('#N')"),
    (re.compile(r"\b(the|this|that) issue('s)?\b(?! (cycle|width|slot|order|rate|time))|\bissue target\b|"
                r"\(issue[:)]", re.I), "tracker reference ('the issue')"),
    (re.compile(r"\btracker\b|\bticket\b", re.I), "tracker reference"),
    (re.compile(r"\bstop \d+\b", re.I), "work period ('stop N')"),
    (re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b"), "date"),
    (re.compile(r"\b(half day|half hour of the host|this morning|yesterday|last week)\b", re.I), "date of work"),
]
# Commit hashes in prose (docs only: code and tests hold hex digests on purpose).
COMMIT = re.compile(r"(?<![\w/.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![\w/])")

# (file, text the line contains): the few hits that are not diary.
ALLOWED = {
    ("docs/reference/paper-targets.md", "(Zhou, 2026-07-09)"),     # the cited review's date
    ("tests/test_docs_hygiene.py", ""),                              # the patterns themselves
}


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        files = out.split()
    except (OSError, subprocess.CalledProcessError):
        files = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return [f for f in files if (ROOT / f).is_file()]


def _text_files() -> list[str]:
    return [f for f in _tracked() if Path(f).suffix in TEXT_SUFFIXES and f not in SKIP
            and not f.startswith(("tests/fixtures/", "results/"))]


RELEASE_HEADING = re.compile(r"^## \[\d+\.\d+\.\d+\] - \d{4}-\d\d-\d\d$")     # a release's date


def _allowed(rel: str, line: str) -> bool:
    if rel == "CHANGELOG.md" and RELEASE_HEADING.match(line):
        return True
    return any(rel == f and text in line for f, text in ALLOWED)


def test_no_work_diary_or_tracker_numbers():
    hits = []
    for rel in _text_files():
        try:
            lines = (ROOT / rel).read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(lines, 1):
            if _allowed(rel, line):
                continue
            for pattern, what in DIARY:
                m = pattern.search(line)
                if m:
                    hits.append(f"{rel}:{n}: {what}: {m.group(0)!r}")
            if rel.endswith(".md"):
                m = COMMIT.search(line)
                if m:
                    hits.append(f"{rel}:{n}: commit hash: {m.group(0)!r}")
    assert not hits, "say what it is, not when or under which ticket:\n" + "\n".join(hits)


# ------------------------------------------------------------------------- module paths in the docs

def _docs() -> list[str]:
    """The docs, and the comments and docstrings of the code (tests name missing modules on purpose).
    The changelog names modules as they were when a release moved them, so it is left out."""
    return [f for f in _tracked() if (f.endswith(".md") and f != "CHANGELOG.md")
            or (f.endswith(".py") and not f.startswith("tests/"))]


@lru_cache(maxsize=None)
def _py_files() -> tuple[str, ...]:
    return tuple(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
                 if not any(part.startswith(".") for part in p.relative_to(ROOT).parts))


# a path ending in .py (bare names too), or a package folder: mtemu/kernels/attention/
PY_PATH = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)*[A-Za-z_]\w*\.py)\b")
FOLDER = re.compile(r"(?<![\w./-])((?:mtemu|ratrain|rtcommon)(?:/[A-Za-z_]\w*)+)/(?![\w.])")
DOTTED = re.compile(r"(?<![\w./-])((?:mtemu|ratrain|rtcommon)(?:\.[A-Za-z_]\w*)+)")


def _path_exists(path: str) -> bool:
    return any(f == path or f.endswith("/" + path) for f in _py_files())


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _dotted_exists(name: str) -> bool:
    """``a.b.c``: the longest prefix that is a module, then one name that module defines or imports."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut])
        if module is None:
            continue
        if cut == len(parts):
            return True
        attr = parts[cut]
        end = r"\w*" if attr.endswith("_") else r"\b"            # atomic_write_* names a family
        return re.search(rf"\b{re.escape(attr)}{end}", module.read_text(encoding="utf-8")) is not None
    return False


def _stale_paths(rel: str) -> list[str]:
    out = []
    for n, line in enumerate((ROOT / rel).read_text(encoding="utf-8").splitlines(), 1):
        for m in PY_PATH.finditer(line):
            if not _path_exists(m.group(1)):
                out.append(f"{rel}:{n}: {m.group(1)}")
        for m in FOLDER.finditer(line):
            if not (ROOT / m.group(1)).is_dir():
                out.append(f"{rel}:{n}: {m.group(1)}/")
        for m in DOTTED.finditer(line):
            name = m.group(1).rstrip(".")
            if not _dotted_exists(name):
                out.append(f"{rel}:{n}: {name}")
    return out


def test_docs_name_only_modules_that_exist():
    stale = [s for rel in _docs() for s in _stale_paths(rel)]
    assert not stale, "the docs (or code comments) name modules that are not in the tree:\n" + "\n".join(stale)


def test_dotted_names_resolve_statically():
    assert _dotted_exists("mtemu.platform.Platform")
    assert _dotted_exists("ratrain.spec.platform")
    assert not _dotted_exists("ratrain.costmodel.step_breakdown")
    assert not _dotted_exists("mtemu.platform.NoSuchName")
    assert _path_exists("mtemu/kernels/gemm.py") and _path_exists("gemm.py") and not _path_exists("cli_model.py")


# ------------------------------------------------------------------- CHOICES.md sections named in code

SECTION_REF = re.compile(r"""CHOICES\.md[,:]?\s*\(?["'“]([^"'”]+)["'”]""")


def test_choices_sections_named_elsewhere_exist():
    """A reference such as docs/CHOICES.md, "One platform" names a heading (or the start of one)."""
    headings = [h.lstrip("#").strip().lower() for h in (ROOT / "docs" / "CHOICES.md").read_text().splitlines()
                if h.startswith("#")]
    missing = []
    for rel in _text_files():
        if rel in ("docs/CHOICES.md", "tests/test_docs_hygiene.py"):
            continue
        text = (ROOT / rel).read_text(encoding="utf-8", errors="replace")
        for m in SECTION_REF.finditer(re.sub(r'"\s*\n\s*"', "", text)):
            ref = " ".join(m.group(1).split()).lower()
            if not any(h.startswith(ref) for h in headings):
                missing.append(f"{rel}: {m.group(1)!r}")
    assert not missing, "references to CHOICES.md sections that do not exist:\n" + "\n".join(missing)


# ------------------------------------------------------------------------------------ test command

def test_readme_test_command_is_what_ci_runs():
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if "-m pytest" in ln]
    readme = re.search(r"python -m pytest[^\n#]*", (ROOT / "README.md").read_text())
    assert ci and readme, "no pytest line in .ci/run or README.md"
    assert ci[-1].replace("python3 ", "python ") == readme.group(0).strip()


# ------------------------------------------------------------------------------------------- version

def _pyproject_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_versions_agree():
    import mtemu
    import ratrain

    assert mtemu.__version__ == ratrain.__version__ == _pyproject_version()


def test_changelog_has_the_package_version_and_releases():
    text = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\S.*)$", text, re.M)
    assert sections, "CHANGELOG.md has no '## [X.Y.Z] - date|unreleased' sections"
    versions = [v for v, _ in sections]
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
    released = [v for v, when in sections if when.strip().lower() != "unreleased"]
    unreleased = [v for v, when in sections if when.strip().lower() == "unreleased"]
    # The package carries the newest released version until the release bumps it (the version is
    # hashed into the emulator's cache keys, so it moves together with the shipped profiles).
    assert _pyproject_version() in released + unreleased
    assert len(unreleased) <= 1 and (not unreleased or unreleased[0] == versions[0])


@pytest.mark.parametrize("pattern,line", [
    (0, "Session 11: register-blocked"), (3, "(issue 13)"), (3, "issues 12, 13"), (4, "fixes #26 here"),
    (5, "the issue fixes 30 GB/s"), (8, "measured 2026-11-30"),
])
def test_diary_patterns_catch(pattern, line):
    assert DIARY[pattern][0].search(line)


@pytest.mark.parametrize("line", [
    "a bundle issues up to eight instructions", "the DMA's issue cycle", "colour '#333333'",
    "&#124;", "the real issue width", "at issue or from the queue",
])
def test_diary_patterns_spare(line):
    assert not any(p.search(line) for p, _ in DIARY)


# ------------------------------------------------------------------------------- ARCHITECTURE.md

def _subcommands(parser) -> list[str]:
    import argparse

    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += list(action.choices)
    return out


def test_architecture_lists_every_command_and_experiment():
    from mtemu.cli import build_parser as mtemu_parser
    from ratrain.cli import build_parser as ratrain_parser
    from ratrain.repro.report import EXPERIMENT_NAMES

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    missing = [f"{tool} {name}" for tool, parser in (("mtemu", mtemu_parser()), ("ratrain", ratrain_parser()))
               for name in _subcommands(parser) if f"`{tool} {name}" not in text]
    missing += [f"experiment {name}" for name in EXPERIMENT_NAMES if f"`{name}`" not in text]
    assert not missing, "docs/ARCHITECTURE.md does not list: " + ", ".join(missing)

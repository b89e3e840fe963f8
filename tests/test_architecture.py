"""The house rules, checked: imports go down the data flow, no cycles, none hidden in functions."""
from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# ratrain's rooms in data-flow order: a module may import its own room or an earlier one.
RATRAIN_ROOMS = ["errors", "spec", "cost", "sim", "plan", "replay", "repro", "cli"]
# Imports allowed inside functions: plotting libraries kept off the import path of a library
# module that only draws on request, and Dask, an optional extra that takes a second to import
# (only a sweep given --scheduler needs it).
# numpy: ratrain.sim.simulator binds it on first use, because the CLI's parsers import that module for
# its names and --help must not load NumPy
LAZY_OK = {"matplotlib", "matplotlib.pyplot", "matplotlib.patches", "matplotlib.ticker", "dask.distributed",
           "rtcommon.figstyle"}
# Command modules import what only running the command needs inside its handler, so that --help and
# argument errors answer at once (a command loads what it runs, nothing its parser does not need);
# those imports count in the graph below like top-level ones.
HANDLER_IMPORTS_OK = ("ratrain.cli.", "mtemu.cli.")


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, module: str) -> tuple[list[list[str]], list[tuple[int, list[str]]]]:
    """(per module-level import statement: the names it may load, first the module it names;
    [(line, those names)] of imports inside functions)."""
    top, nested = _parsed_imports(path, module)
    return [list(names) for names in top], [(line, list(names)) for line, names in nested]


@functools.lru_cache(maxsize=None)
def _parsed_imports(path: Path, module: str) -> tuple[tuple, tuple]:
    """:func:`_imports` of one file, parsed once per test run (every test here reads every file)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top, nested = [], []

    def names(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        return [base] + [f"{base}.{a.name}" for a in node.names]

    for node in tree.body:
        if isinstance(node, ast.Import):
            top += [[n] for n in names(node)]
        elif isinstance(node, ast.ImportFrom):
            top.append(names(node))
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    nested.append((node.lineno, names(node)))
    return tuple(map(tuple, top)), tuple((line, tuple(n)) for line, n in nested)


def _graph(package: str) -> dict[str, set[str]]:
    mods = _modules(package)
    graph = {}
    for name, path in mods.items():
        deps = set()
        top, nested = _imports(path, name)
        if name.startswith(HANDLER_IMPORTS_OK):
            top += [statement for _, statement in nested]
        for statement in top:
            # `from pkg import mod` depends on pkg.mod; `from pkg import name` on pkg itself
            subs = [m for m in statement[1:] if m in mods]
            deps.update(subs or [statement[0]])
        graph[name] = {m for m in deps if m in mods and m != name}
    return graph


@pytest.mark.parametrize("package", ["ratrain", "mtemu", "rtcommon"])
def test_no_import_cycles(package):
    graph = _graph(package)
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep] if dep in stack else [node, dep]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


@pytest.mark.parametrize("package", ["ratrain", "mtemu", "rtcommon"])
def test_no_imports_hidden_in_functions(package):
    hidden = []
    for name, path in _modules(package).items():
        if name.startswith(HANDLER_IMPORTS_OK):
            continue
        _, nested = _imports(path, name)
        hidden += [f"{path.relative_to(ROOT)}:{line} imports {mod}" for line, (mod, *_) in nested
                   if mod not in LAZY_OK]
    assert not hidden, "imports inside functions:\n" + "\n".join(hidden)


def test_ratrain_imports_go_down_the_data_flow():
    rank = {room: i for i, room in enumerate(RATRAIN_ROOMS)}

    def room(mod: str) -> str | None:
        parts = mod.split(".")
        return parts[1] if len(parts) > 1 and parts[0] == "ratrain" and parts[1] in rank else None

    wrong = []
    for name, deps in _graph("ratrain").items():
        here = room(name)
        for dep in deps:
            there = room(dep)
            if here and there and rank[there] > rank[here]:
                wrong.append(f"{name} ({here}) imports {dep} ({there})")
    assert not wrong, "imports against the data flow:\n" + "\n".join(wrong)


def test_rtcommon_and_mtemu_do_not_import_ratrain():
    for package in ("rtcommon", "mtemu"):
        for name, path in _modules(package).items():
            top, nested = _imports(path, name)
            loaded = [m for statement in top + [s for _, s in nested] for m in statement]
            bad = [m for m in loaded if m == "ratrain" or m.startswith("ratrain.")]
            assert not bad, f"{name} imports {bad}"


def test_simulator_and_planner_import_without_numba():
    code = ("import sys, ratrain.plan.planner, ratrain.sim.simulator, ratrain.cli, mtemu, mtemu.platform; "
            "assert 'numba' not in sys.modules, sorted(m for m in sys.modules if m.startswith('numba'))[:3]")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr

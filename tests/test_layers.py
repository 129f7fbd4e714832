"""The package's shape: layers that import only downward, no import circle, commands as leaves,
no module over 1,000 lines.

The layers are `pyproject.toml`'s import-linter contract (commands > reports > plans > cells
> data > core); these tests run it, and check with grimp's import graph (the one
import-linter builds, imports inside functions included) what the contract cannot say.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("core", "data", "cells", "plans", "reports")  # bottom to top


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("encoder_eval")


def _commands(graph: grimp.ImportGraph) -> set[str]:
    """The top-level modules: the command line (every layer package is below them)."""
    return {
        m
        for m in graph.find_children("encoder_eval")
        if m.rsplit(".", 1)[1] not in LAYERS and m != "encoder_eval.__main__"
    }


def test_the_layer_contract_is_kept() -> None:
    exe = Path(sys.executable).parent / "lint-imports"
    cmd = [str(exe)] if exe.exists() else [shutil.which("lint-imports") or "lint-imports"]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_no_import_circle(graph: grimp.ImportGraph) -> None:
    """Tarjan's strongly connected components over module imports: every one is a single
    module, so no module reaches itself through others."""
    modules = sorted(graph.modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    assert circles == []


def test_no_command_module_is_imported_by_another_module(graph: grimp.ImportGraph) -> None:
    """`cli` dispatches by module name (importlib), so no module imports a command; the
    library layers hold every shared type."""
    commands = _commands(graph)
    assert {"encoder_eval.run", "encoder_eval.sweep", "encoder_eval.summarize"} <= commands
    importers = {
        cmd: sorted(graph.find_modules_that_directly_import(cmd) - {"encoder_eval.__main__"})
        for cmd in commands
    }
    assert {c: i for c, i in importers.items() if i} == {}


def test_every_library_module_lives_in_a_layer(graph: grimp.ImportGraph) -> None:
    """A module at the top level is a command: it has a `main(argv)`."""
    import importlib

    for cmd in sorted(_commands(graph) - {"encoder_eval"}):
        assert callable(getattr(importlib.import_module(cmd), "main", None)), cmd


MAX_MODULE_LINES = 1_000  # a module past this holds several concepts: split it along them


def test_no_module_is_over_a_thousand_lines() -> None:
    """One module a concept (issue 41): `docs/development.md` maps each to its facts."""
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines())
        for p in (REPO / "encoder_eval").rglob("*.py")
    }
    over = {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them): {over}"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(root: Path) -> list[str]:
    """Every use of another module's private name in the package under `root`: `from
    encoder_eval.x import _y`, and `x._y` where `x` names an imported encoder_eval module
    (`import encoder_eval.x as x`, `from encoder_eval import x`); dunder names are public."""
    package = root / "encoder_eval"

    def module_of(path: Path) -> str:
        parts = list(path.relative_to(root).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def is_module(name: str) -> bool:
        rel = Path(*name.split("."))
        return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()

    found = []
    for path in sorted(package.rglob("*.py")):
        here = module_of(path)
        package_of_here = here if path.name == "__init__.py" else here.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names: dict[str, str] = {}  # local name -> the encoder_eval module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    base = package_of_here.split(".")[
                        : len(package_of_here.split(".")) - node.level + 1
                    ]
                    source = ".".join(base + ([source] if source else []))
                if source.split(".")[0] != "encoder_eval":
                    continue
                for alias in node.names:
                    if _is_private(alias.name) and source != here:
                        found.append(
                            f"{path.relative_to(root)}:{node.lineno}: {source}.{alias.name}"
                        )
                    if is_module(f"{source}.{alias.name}"):
                        names[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "encoder_eval":
                        bound = alias.asname or alias.name.split(".")[0]
                        names[bound] = alias.name if alias.asname else "encoder_eval"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in names:
                owner = ".".join([names[value.id], *reversed(chain)])
                if owner != here and is_module(owner):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {owner}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    """A name with a leading underscore is its module's own (issue 51): what another module
    needs is public, with a docstring saying what it is, so a module's private names can
    change without reading the rest of the package. Tests may still reach private names."""
    assert private_imports(REPO) == []

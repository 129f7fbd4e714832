"""The package's shape: layers that import only downward, no import circle, commands as leaves,
no module over 1,000 lines.

The layers are `pyproject.toml`'s import-linter contract (commands > reports > plans > cells
> data > core); these tests run it, and check with grimp's import graph (the one
import-linter builds, imports inside functions included) what the contract cannot say.
"""

from __future__ import annotations

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

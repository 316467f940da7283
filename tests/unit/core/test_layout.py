"""The package's shape: stages import downwards only, no import circles, backends stay behind
their interface."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from support import paths

PACKAGE = paths.PACKAGE
BACKEND_NAMES = re.compile(
    r"\b(DockerBackend|LocalBackend|DockerKind|LocalKind|backends\.docker)\b"
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "harness" not in p.parts}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every repromatrix module ``path`` imports, wherever in the file the import is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from pkg import submodule` imports the submodule; `from mod import name`, mod.
            subs = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [s for s in subs if s in known] or [node.module]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, set(mods)) - {name} for name, path in mods.items()}


def cycle_in(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_the_package_modules():
    assert cycle_in(graph()) is None


@pytest.mark.parametrize(
    "stage", ["matrix", "images", "models", "backends", "run", "results", "reports"]
)
def test_no_stage_imports_the_command_line(stage: str):
    for name, targets in graph().items():
        if name.startswith(f"repromatrix.{stage}"):
            upward = {
                t for t in targets if t.startswith(("repromatrix.commands", "repromatrix.cli"))
            }
            assert not upward, f"{name} imports {upward}"


def test_matrix_imports_nothing_of_triage():
    # The scenario loader reads what triage matches; what both need lives below them both.
    for name, targets in graph().items():
        if name.startswith("repromatrix.matrix"):
            triage = {t for t in targets if t.startswith("repromatrix.triage")}
            assert not triage, f"{name} imports {triage}"


def test_no_module_outside_backends_names_a_backend():
    for name, path in modules().items():
        # The rehearsal rehearses the Docker backend's GPU lane: it is Docker's by definition.
        if name.startswith(("repromatrix.backends", "repromatrix.rehearsal")):
            continue
        text = path.read_text(encoding="utf-8")
        assert not BACKEND_NAMES.search(text), f"{name} names a backend"
        assert not re.search(r"""["'](docker|local)["']""", text), f"{name} switches on a name"

"""docs/DESIGN.md walks one cell from matrix.yaml to its compat.md row, file by file: the
drawing holds for the code (every file there, the function named first in it, the imports
leading from the command line to the compat.md writer through those files alone)."""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Mapping

from support import paths
from support.imports import imports_of

DESIGN = paths.ROOT / "docs" / "DESIGN.md"
PACKAGE = paths.PACKAGE
TABLE = re.compile(r"<!-- cell-path: (\d+) files -->\n(.*?)<!-- /cell-path -->", re.S)
ROW = re.compile(r"^\| (\d+) \| `([^`]+)` \| `([^`]+)`", re.M)
# The most files the walk may take: it may get shorter, never longer (the goal was 15).
MOST = 15
# A listed module reached through others on purpose: the backend, by its kind in the
# registry (no module outside backends/ names a backend: test_layout).
THROUGH = {
    "repromatrix.backends.docker.engine": {
        "repromatrix.backends.kinds",
        "repromatrix.backends.docker",
        "repromatrix.backends.docker.kind",
    },
}
ENTRY, WRITER = "repromatrix.cli", "repromatrix.reports.markdown"


def drawing() -> tuple[int, list[tuple[str, str]]]:
    """The count the drawing states, and its (file, first name) rows in order."""
    found = TABLE.search(DESIGN.read_text(encoding="utf-8"))
    assert found, "docs/DESIGN.md has no cell-path table"
    rows = ROW.findall(found.group(2))
    assert [int(number) for number, _, _ in rows] == list(range(1, len(rows) + 1))
    return int(found.group(1)), [(file, name) for _, file, name in rows]


def module_of(file: str) -> str:
    return "repromatrix." + file.removesuffix(".py").replace("/", ".")


def graph() -> dict[str, set[str]]:
    """Every module's imports of the package, the programs inside images included, and the
    command line's commands (``cli`` imports them by name)."""
    files = {
        module_of(str(p.relative_to(PACKAGE))).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    edges = {name: imports_of(path, set(files)) - {name} for name, path in files.items()}
    edges[ENTRY] |= {name for name in files if name.startswith("repromatrix.commands.")}
    return edges


def reachable(edges: Mapping[str, set[str]], start: str, allowed: set[str]) -> set[str]:
    seen, queue = {start}, deque([start])
    while queue:
        for nxt in edges.get(queue.popleft(), ()):
            if nxt in allowed and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def test_the_drawing_counts_its_files_and_keeps_to_the_most() -> None:
    stated, rows = drawing()
    files = [file for file, _ in rows]
    assert stated == len(rows) == len(set(files)) <= MOST


def test_every_file_of_the_drawing_exists_and_holds_the_function_it_names() -> None:
    for file, name in drawing()[1]:
        path = PACKAGE / file
        assert path.is_file(), f"docs/DESIGN.md names {file}, which is not there"
        first = name.split(".")[0].split("(")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
        }
        assert first in defined, f"{file} defines no {first}"


def test_the_imports_lead_from_the_command_line_to_compat_md_through_the_drawing_alone() -> None:
    listed = {module_of(file) for file, _ in drawing()[1]}
    edges = graph()
    assert WRITER in reachable(edges, ENTRY, listed), "no import chain through the drawing"
    for module in sorted(listed):
        allowed = listed | THROUGH.get(module, set())
        assert module in reachable(edges, ENTRY, allowed), (
            f"{module} is not reached from the command line through the drawing's files"
        )


def test_the_check_finds_a_file_off_the_path() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": set(), "x": {"c"}}
    assert reachable(edges, "a", {"b", "c"}) == {"a", "b", "c"}
    assert "c" not in reachable(edges, "a", {"x", "c"})

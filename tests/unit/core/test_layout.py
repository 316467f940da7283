"""The package's shape: stages import downwards only, no import circles, backends stay behind
their interface."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from support import paths
from support.imports import imports_of

PACKAGE = paths.PACKAGE
BACKEND_NAMES = re.compile(
    r"\b(DockerBackend|LocalBackend|DockerKind|LocalKind|backends\.docker)\b"
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "harness" not in p.parts}


@functools.cache  # the sources do not change during a run; each test reads, none writes
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


# The packages from the bottom up (docs/DESIGN.md draws them): each may import the ones
# before it, never one after it. The top-level modules (model, errors, grammars, ...)
# are the foundation under all of them, and the programs that run inside images (harness,
# probes) import nothing of the package at all.
ORDER = (
    "host",
    "matrix",
    "upstream",
    "images",
    "models",
    "triage",
    "results",
    "backends",
    "reports",
    "run",
    "fleet",
    "slurm",
    "publish",
    "bisect",
    "drafting",
    "rehearsal",
    "watch",
    "commands",
)
TOP = ("cli", "__main__")  # the command line sits on top of everything


def package_of(module: str) -> str:
    """The package a module belongs to: ``repromatrix.run.cell`` -> ``run``; a top-level
    module is its own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def rank(package: str) -> int:
    if package in ORDER:
        return ORDER.index(package) + 1
    return len(ORDER) + 1 if package in TOP else 0  # the foundation


def test_every_package_has_a_place_in_the_order():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages - {"harness", "probes"} == set(ORDER)


@pytest.mark.parametrize("package", ORDER)
def test_no_package_imports_one_above_it(package: str):
    for name, targets in graph().items():
        if package_of(name) != package:
            continue
        upward = {t for t in targets if rank(package_of(t)) > rank(package)}
        assert not upward, f"{name} imports {upward}: above {package} in the order"


def test_the_foundation_imports_no_package():
    for name, targets in graph().items():
        if rank(package_of(name)) == 0 and name != "repromatrix":
            packages = {t for t in targets if rank(package_of(t)) > 0}
            assert not packages, f"{name} imports {packages}"


def test_the_order_check_finds_an_arrow_back_up():
    assert rank(package_of("repromatrix.results.store")) > rank("matrix")
    assert rank(package_of("repromatrix.triage.triager")) > rank(package_of("repromatrix.matrix"))
    assert rank("cli") > rank("commands") > rank("run") > rank("host")


def test_programs_that_run_inside_images_import_only_their_own_folder():
    for folder in ("harness", "probes"):
        for path in (PACKAGE / folder).glob("*.py"):
            text = path.read_text(encoding="utf-8")
            pattern = rf"^\s*(from|import) repromatrix\.(?!{folder}\b)"
            assert not re.search(pattern, text, re.M), f"{path} imports the package"


def test_no_module_outside_backends_names_a_backend():
    for name, path in modules().items():
        # The rehearsal rehearses the Docker backend's GPU lane: it is Docker's by definition.
        if name.startswith(("repromatrix.backends", "repromatrix.rehearsal")):
            continue
        text = path.read_text(encoding="utf-8")
        assert not BACKEND_NAMES.search(text), f"{name} names a backend"
        assert not re.search(r"""["'](docker|local)["']""", text), f"{name} switches on a name"


def class_names(text: str) -> list[str]:
    """The names of the classes ``text`` defines, at any depth."""
    return re.findall(r"^\s*class (\w+)\b", text, re.M)


def test_no_class_name_is_defined_twice():
    # One name per meaning: two classes of one name in the package are two concepts a reader
    # has to tell apart by their module (issue 33). The in-image programs count too.
    where: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in class_names(path.read_text(encoding="utf-8")):
            where.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, twice


def test_the_class_name_reader_finds_nested_classes():
    assert class_names("class A:\n    class B(Base):\n        pass\n") == ["A", "B"]

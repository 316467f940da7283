"""The test tree mirrors the package: fast tests in unit/, real ones in integration/, all run."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from support import paths

TESTS = paths.TESTS
REAL = re.compile(r"pytest\.mark\.(docker|vllm|browser)\b")
# Integration tests may instead need a real outside program (a registry, debootstrap).
OUTSIDE = re.compile(r"pytest\.mark\.(docker|vllm|browser|program)\b")
STAGES = {p.name for p in paths.PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def test_every_test_file_is_collected() -> None:
    # pytest skips some folder names by default (`build` among them): a test file that
    # is never collected passes silently forever. support.collected_files lists the files
    # pytest chooses without importing them (seconds, where importing all took ten).
    argv = ["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "support.collected_files"]
    importable = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", *argv],
        cwd=paths.ROOT,
        env={**os.environ, "PYTHONPATH": importable},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    collected = {line.split("::")[0] for line in listed.splitlines() if "::" in line}
    on_disk = {str(p.relative_to(paths.ROOT)) for p in TESTS.rglob("test_*.py")}
    assert on_disk - collected == set()


def test_unit_tests_need_nothing_real_and_integration_tests_say_what_they_need() -> None:
    for path in (TESTS / "unit").rglob("test_*.py"):
        assert not REAL.search(path.read_text()), f"{path} needs something real: integration/"
    for path in (TESTS / "integration").rglob("test_*.py"):
        assert OUTSIDE.search(path.read_text()), f"{path} marks nothing real: unit/"


def test_test_folders_are_named_after_the_package() -> None:
    for kind in ("unit", "integration"):
        folders = {p.name for p in (TESTS / kind).iterdir() if p.is_dir() and p.name[0] != "_"}
        assert folders - STAGES - {"core"} == set(), f"tests/{kind} has folders no package has"


def imported_packages(files: list[Path]) -> dict[str, set[str]]:
    """The top-level modules outside the standard library that ``files`` import (absolute
    imports, wherever in the file), each with the files that import it."""
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {name.split(".")[0] for name in names} - set(sys.stdlib_module_names):
                found.setdefault(top, set()).add(str(path.relative_to(paths.ROOT)))
    return found


def test_the_test_extra_brings_everything_the_fast_tests_import() -> None:
    # `pip install -e '.[test]'` must be enough to collect and run tests/unit.
    project = tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["project"]
    required = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    named = {canonicalize_name(Requirement(line).name) for line in required}
    named.add(canonicalize_name(project["name"]))
    fast = [*(TESTS / "unit").rglob("*.py"), *(TESTS / "support").rglob("*.py")]
    imported = imported_packages([*fast, TESTS / "conftest.py"])
    distributions = metadata.packages_distributions()
    own = {"support"}  # tests/support, on pytest's pythonpath
    missing = {
        module: sorted(files)
        for module, files in imported.items()
        if module not in own
        and not named & {canonicalize_name(d) for d in distributions.get(module, [])}
    }
    assert missing == {}, "imported by the tests, brought by no dependency nor the test extra"

"""The test tree mirrors the package: fast tests in unit/, real ones in integration/, all run."""

from __future__ import annotations

import re
import subprocess
import sys

from support import paths

TESTS = paths.TESTS
REAL = re.compile(r"pytest\.mark\.(docker|vllm|browser)\b")
# Integration tests may instead need a real outside program (a registry, debootstrap).
OUTSIDE = re.compile(r"pytest\.mark\.(docker|vllm|browser|program)\b")
STAGES = {p.name for p in paths.PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def test_every_test_file_is_collected() -> None:
    # pytest skips some folder names by default (`build` among them): a test file that
    # is never collected passes silently forever.
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=paths.ROOT,
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

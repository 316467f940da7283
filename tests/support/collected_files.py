"""A pytest plugin (``-p support.collected_files``) that collects every test file pytest
would collect without importing it: each becomes one item, ``FILE::collected``.

What it checks is pytest's own choice of folders and files (``norecursedirs``, the
default ignores, ``python_files``); importing each module, the slow part of a
collection, is what every test run does anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


class _Collected(pytest.Item):
    def runtest(self) -> None:
        raise AssertionError("collect only: run with --collect-only")


class _TestFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        yield _Collected.from_parent(self, name="collected")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.File:
    """The test file pytest chose, as a file of one item, never imported."""
    return _TestFile.from_parent(parent, path=module_path)

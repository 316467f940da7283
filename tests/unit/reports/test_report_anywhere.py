"""``report`` from any folder holds the evidence against the shipped scenarios: a staged
crash is not held against an image although no ``./scenarios`` is there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from repromatrix.cli import main
from support.paths import DATA


def test_report_from_a_folder_without_scenarios_knows_the_staged_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "ci-cpu-matrix"
    shutil.copytree(DATA / "cpu-run" / "ci-cpu-matrix", run)
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(run)]) == 0
    upgrade = (run / "compat.md").read_text(encoding="utf-8")
    assert "🟢 safe; staged crash shown (not held against it): cpu-kv-cache-too-small" in upgrade

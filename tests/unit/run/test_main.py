"""The run's own steps that need no backend: what its reports are told of the documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.run.folder import RunFolder
from repromatrix.run.main import RunPlan, report_options
from support import factories, paths

ROOT = paths.ROOT


def test_the_runs_reports_know_the_scenarios_it_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # ./scenarios: what every report reads
    zoo = {s.id: s for s in load_scenarios(ROOT / "scenarios" / "zoo")}
    cell = factories.cell(of=zoo["cpu-startup-interrupted"])
    run = RunPlan(load_matrix(ROOT / "matrix.yaml"), (cell,), (cell,), RunFolder("r", tmp_path))
    documents = report_options(run).documents
    # A zoo run's own scenario: its kind keeps the staged interruption out of the safety.
    assert documents["cpu-startup-interrupted"].kind == "startup-interruption"
    assert "moe-lora-rank-over-128" in documents  # ./scenarios still there

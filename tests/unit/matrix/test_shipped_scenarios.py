"""The documented scenarios ship with the package and are read wherever a command runs; a
team's own ``scenarios/`` beside its matrix file adds to them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.errors import EXIT_OK, EXIT_USAGE
from repromatrix.matrix.inputs import shipped_scenarios
from support.paths import ROOT, SCENARIOS

TEAM_SCENARIO = (SCENARIOS / "healthy-cpu.yaml").read_text(encoding="utf-8")


def project_files() -> dict[str, bytes]:
    """Every scenario file of the project's ``scenarios/`` (and its zoo), by relative name."""
    found = [*SCENARIOS.glob("*.yaml"), *(SCENARIOS / "zoo").glob("*.yaml")]
    return {str(path.relative_to(SCENARIOS)): path.read_bytes() for path in found}


def test_the_installed_catalogue_is_the_project_folder() -> None:
    shipped = Path(str(shipped_scenarios()))
    found = [*shipped.glob("*.yaml"), *(shipped / "zoo").glob("*.yaml")]
    assert {str(p.relative_to(shipped)): p.read_bytes() for p in found} == project_files()


def test_the_built_package_carries_every_scenario_file(tmp_path: Path) -> None:
    """Built from a copy of the checkout (the link kept as a link) by setuptools' build_py, the
    step a wheel is made of, the package holds each scenario file, byte for byte, as a file."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "scenarios", tree / "scenarios")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", tree / "src", symlinks=True, ignore=ignore)
    assert (tree / "src" / "repromatrix" / "scenarios").is_symlink()
    built = tmp_path / "lib"
    subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py",
         "--build-lib", str(built)],
        cwd=tree, check=True, capture_output=True,
    )  # fmt: skip
    shipped = built / "repromatrix" / "scenarios"
    assert not shipped.is_symlink()
    found = [*shipped.glob("*.yaml"), *(shipped / "zoo").glob("*.yaml")]
    assert {str(p.relative_to(shipped)): p.read_bytes() for p in found} == project_files()


def team_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A team's own folder, the current one: its matrix file, no scenario folder."""
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "ours.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def planned_scenarios(capsys: pytest.CaptureFixture[str], *args: str) -> set[str]:
    assert main(["plan", "--matrix", "ours.yaml", "--lane", "cpu", "--json", *args]) == EXIT_OK
    return {cell["scenario"] for cell in json.loads(capsys.readouterr().out)}


def test_plan_from_a_team_folder_reads_the_shipped_scenarios(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    team_folder(tmp_path, monkeypatch)
    assert "healthy-cpu" in planned_scenarios(capsys)


def test_a_scenarios_folder_beside_the_matrix_adds_to_the_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    team_folder(tmp_path, monkeypatch)
    (tmp_path / "scenarios").mkdir()
    ours = TEAM_SCENARIO.replace("id: healthy-cpu", "id: our-healthy-cpu")
    (tmp_path / "scenarios" / "our-healthy-cpu.yaml").write_text(ours, encoding="utf-8")
    assert {"healthy-cpu", "our-healthy-cpu"} <= planned_scenarios(capsys)


def test_a_missing_scenarios_folder_says_what_is_read_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    team_folder(tmp_path, monkeypatch)
    code = main(["plan", "--matrix", "ours.yaml", "--scenarios", "mine"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "mine: no such scenario folder" in err
    assert "the scenarios shipped with repromatrix are read" in err

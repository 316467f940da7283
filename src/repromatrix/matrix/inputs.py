"""The matrix and the scenario catalogue, loaded together so both files' problems show at once."""

from __future__ import annotations

from pathlib import Path

from repromatrix.errors import ConfigError, Problem
from repromatrix.matrix.config import Matrix, load_matrix
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.model import Scenario


def load_inputs(matrix_path: Path, scenarios_dir: Path) -> tuple[Matrix, tuple[Scenario, ...]]:
    """Load the matrix and the catalogue, reporting the problems of both at once."""
    problems: list[Problem] = []
    matrix = scenarios = None
    try:
        matrix = load_matrix(matrix_path)
    except ConfigError as exc:
        problems.extend(exc.problems)
    try:
        scenarios = load_scenarios(scenarios_dir)
    except ConfigError as exc:
        problems.extend(exc.problems)
    if problems or matrix is None or scenarios is None:
        raise ConfigError(problems)
    return matrix, scenarios

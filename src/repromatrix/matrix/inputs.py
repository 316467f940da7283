"""The matrix and the scenario catalogue, loaded together so both files' problems show at once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from repromatrix.errors import ConfigError, Problem
from repromatrix.matrix.config import Matrix, load_matrix
from repromatrix.matrix.scenarios import load_catalogue
from repromatrix.model import Scenario

DEFAULT_SCENARIOS = Path("scenarios")


def scenario_dirs(given: Path | Sequence[Path] | None) -> tuple[Path, ...]:
    """The catalogue's folders: one, several (``--scenarios`` repeated), or ``scenarios/``."""
    if given is None:
        return (DEFAULT_SCENARIOS,)
    return (given,) if isinstance(given, Path) else tuple(given) or (DEFAULT_SCENARIOS,)


def load_inputs(
    matrix_path: Path, scenarios_dir: Path | Sequence[Path] | None
) -> tuple[Matrix, tuple[Scenario, ...]]:
    """Load the matrix and the catalogue (of one or several folders), reporting the problems
    of all of them at once."""
    problems: list[Problem] = []
    matrix = scenarios = None
    try:
        matrix = load_matrix(matrix_path)
    except ConfigError as exc:
        problems.extend(exc.problems)
    try:
        scenarios = load_catalogue(scenario_dirs(scenarios_dir))
    except ConfigError as exc:
        problems.extend(exc.problems)
    if problems or matrix is None or scenarios is None:
        raise ConfigError(problems)
    return matrix, scenarios

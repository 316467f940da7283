"""The matrix and the scenario catalogue, loaded together so both files' problems show at once."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from pathlib import Path

from repromatrix.errors import ConfigError, Problem
from repromatrix.matrix.config import Matrix, Rule, check_references, load_matrix
from repromatrix.matrix.scenarios import load_catalogue, load_scenarios
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
    return _for_catalogue(matrix, scenarios, scenario_dirs(scenarios_dir)), scenarios


def _for_catalogue(
    matrix: Matrix, scenarios: tuple[Scenario, ...], folders: Sequence[Path]
) -> Matrix:
    """The matrix as it applies to a catalogue without the default folder (``--scenarios
    scenarios/zoo``): its rules are checked against the default catalogue too (a misspelt
    name is still an error), then rules about scenarios not loaded are left out, since they
    can match no cell of this catalogue."""
    if DEFAULT_SCENARIOS in folders or not DEFAULT_SCENARIOS.is_dir():
        return matrix
    try:
        default = load_scenarios(DEFAULT_SCENARIOS)
    except ConfigError:
        return matrix  # not this matrix's catalogue: its rules must name the loaded scenarios
    check_references(matrix, (*scenarios, *default))
    loaded = {scenario.id for scenario in scenarios}
    return dataclasses.replace(
        matrix,
        exclude=_kept(matrix.exclude, loaded),
        include=_kept(matrix.include, loaded),
    )


def _kept(rules: Sequence[Rule], loaded: Collection[str]) -> tuple[Rule, ...]:
    """Each rule with only the loaded scenarios it names; a rule left with none is dropped."""
    kept: list[Rule] = []
    for rule in rules:
        named = rule.match.get("scenario")
        if named is None:
            kept.append(rule)
        elif named & set(loaded):
            match = {**rule.match, "scenario": named & frozenset(loaded)}
            kept.append(dataclasses.replace(rule, match=match))
    return tuple(kept)

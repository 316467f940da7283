"""The cells a bisect compares, one per version, and the outcomes earlier runs already have.

A bisect holds everything but the image fixed: one scenario variant, at one
level, on one GPU, model and flag set of one lane. The versions to search
need not be in matrix.yaml: the lane is extended in memory with an image per
version (the file is never touched), and the matrix's own rules still apply,
so each cell is exactly the cell ``repromatrix plan`` would list for that tag.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from repromatrix.bisect.answer import VersionEvidence
from repromatrix.errors import UsageError, suggest
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.expand import expand, levels
from repromatrix.results import store
from repromatrix.values import Cell, Lane, Level, Scenario


@dataclass(frozen=True)
class Target:
    """What stays fixed while the version moves (None: whichever the plan has, if only one)."""

    scenario: str
    lane: Lane
    variant: str | None = None
    level: Level | None = None
    gpu: str | None = None
    model: str | None = None
    flagset: str | None = None


def with_versions(matrix: Matrix, lane: Lane, tags: Sequence[str]) -> Matrix:
    """The matrix with ``lane``'s images replaced by one image per tag (listed ones kept as is)."""
    if lane not in matrix.lanes:
        raise UsageError(f"{matrix.file} defines no `{lane}` lane")
    config = matrix.lanes[lane]
    lanes = dict(matrix.lanes)
    lanes[lane] = replace(config, images=tuple(config.image(tag) for tag in tags))
    return replace(matrix, lanes=MappingProxyType(lanes))


def find_scenario(scenarios: Sequence[Scenario], name: str) -> Scenario:
    """The scenario with id ``name``; ``UsageError`` with the nearest id otherwise."""
    for scenario in scenarios:
        if scenario.id == name:
            return scenario
    ids = [scenario.id for scenario in scenarios]
    raise UsageError(f"no scenario `{name}`.{suggest(name, ids)}")


def resolve(target: Target, scenario: Scenario) -> Target:
    """Fill in the variant (the scenario's first) and the level (the one the lane has; engine)."""
    names = [variant.name for variant in scenario.variants]
    variant = target.variant or names[0]
    if variant not in names:
        raise UsageError(f"{scenario.id} has no variant `{variant}`.{suggest(variant, names)}")
    found = levels(scenario, target.lane)
    if not found:
        raise UsageError(f"{scenario.id} has no cells on the {target.lane} lane")
    level = target.level or found[0]
    if level not in found:
        raise UsageError(f"{scenario.id} has no {level} cells on the {target.lane} lane")
    return replace(target, variant=variant, level=level)


def select_cells(
    matrix: Matrix, scenarios: Sequence[Scenario], target: Target, tags: Sequence[str]
) -> dict[str, Cell]:
    """One cell per tag, by tag: the target's cells of the matrix extended with ``tags``."""
    scenario = find_scenario(scenarios, target.scenario)
    target = resolve(target, scenario)
    extended = with_versions(matrix, target.lane, tags)
    wanted = set(tags)
    cells = [
        cell
        for cell in expand(extended, scenarios, target.lane)
        if cell.image.tag in wanted and _wanted(cell, target)
    ]
    groups = sorted({(c.gpu.name, c.model.name, c.flagset.name) for c in cells})
    if not groups:
        raise UsageError(f"the plan has no {target.level} cell of {scenario.id}/{target.variant}")
    if len(groups) > 1:
        choices = "\n".join(f"  --gpu {g} --model {m} --flagset {f}" for g, m, f in groups)
        raise UsageError(f"{len(groups)} cell rows match; name one:\n{choices}")
    return {cell.image.tag: cell for cell in cells}


def _wanted(cell: Cell, target: Target) -> bool:
    return (
        cell.scenario.id == target.scenario
        and cell.variant.name == target.variant
        and cell.level is target.level
        and target.gpu in (None, cell.gpu.name)
        and target.model in (None, cell.model.name)
        and target.flagset in (None, cell.flagset.name)
    )


def run_folders(paths: Iterable[Path]) -> list[Path]:
    """The run folders under each path: the path itself when it is one, else its run folders."""
    found: list[Path] = []
    for path in paths:
        if (path / "cells").is_dir():
            found.append(path)
            continue
        if not path.is_dir():
            raise UsageError(f"--results {path}: no such folder")
        runs = sorted(child for child in path.iterdir() if (child / "cells").is_dir())
        if not runs:
            raise UsageError(f"--results {path} holds no run folder (no cells/ in it or below)")
        found += runs
    return found


def known_outcomes(paths: Iterable[Path], cells: Mapping[str, Cell]) -> dict[str, VersionEvidence]:
    """The outcome earlier runs saved for each tag's cell (a later folder wins), by tag."""
    tags = {cell.id: tag for tag, cell in cells.items()}
    known: dict[str, VersionEvidence] = {}
    for folder in run_folders(paths):
        found, _problems = store.read_results(folder)
        for result in found:
            if result.id in tags:
                known[tags[result.id]] = evidence(result, folder)
    return known


def evidence(result: store.CellResult, folder: Path) -> VersionEvidence:
    """A saved result as the evidence of its version's outcome."""
    return VersionEvidence(result.id, result.outcome, str(folder), result.reason, result.expected)

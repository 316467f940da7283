"""What a plan is made of: the matrix and the scenario catalogue, loaded together so both files'
problems show at once, and the lock applied to the loaded matrix (each following lane's tags,
GPU images pinned by digest) as a step of its own."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from repromatrix.errors import ConfigError, Problem
from repromatrix.matrix.config import LaneConfig, Matrix, Rule, check_references, load_matrix
from repromatrix.matrix.follow import LaneLock, Lock, LockedImage
from repromatrix.matrix.images import image_version, make_image
from repromatrix.matrix.scenarios import load_catalogue, load_scenarios
from repromatrix.values import Image, Lane, PullPolicy, Scenario

# The project's folder of documented scenarios, as named in a checkout of it.
PROJECT_SCENARIOS = Path("scenarios")


def shipped_scenarios() -> Path:
    """The documented scenarios installed with the package (``repromatrix/scenarios``: in a
    checkout a link to the project's ``scenarios/``, in a wheel a copy of it), named
    ``scenarios`` where the current folder's ``scenarios/`` is that very folder, so the files
    keep their short names in a checkout."""
    shipped = Path(str(resources.files("repromatrix") / "scenarios"))
    if PROJECT_SCENARIOS.is_dir() and PROJECT_SCENARIOS.resolve() == shipped.resolve():
        return PROJECT_SCENARIOS
    return shipped


def scenario_dirs(
    given: Path | Sequence[Path] | None, matrix_path: Path | None = None
) -> tuple[Path, ...]:
    """The catalogue's folders: those given (``--scenarios``, one or repeated), else the
    shipped scenarios together with a ``scenarios/`` folder beside the matrix file (a team's
    own, which adds to them)."""
    folders = (given,) if isinstance(given, Path) else tuple(given or ())
    return folders or default_scenario_dirs(matrix_path)


def default_scenario_dirs(matrix_path: Path | None = None) -> tuple[Path, ...]:
    """The shipped scenarios, and the ``scenarios/`` beside ``matrix_path`` when it is
    another folder."""
    shipped = shipped_scenarios()
    if matrix_path is None:
        return (shipped,)
    beside = matrix_path.parent / "scenarios"
    if not beside.is_dir() or beside.resolve() == shipped.resolve():
        return (shipped,)
    return (shipped, beside)


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
        scenarios = load_catalogue(scenario_dirs(scenarios_dir, matrix_path))
    except ConfigError as exc:
        problems.extend(exc.problems)
    if problems or matrix is None or scenarios is None:
        raise ConfigError(problems)
    folders = scenario_dirs(scenarios_dir, matrix_path)
    return _for_catalogue(matrix, scenarios, folders), scenarios


def _for_catalogue(
    matrix: Matrix, scenarios: tuple[Scenario, ...], folders: Sequence[Path]
) -> Matrix:
    """The matrix as it applies to a catalogue without the default folder (``--scenarios
    scenarios/zoo``): its rules are checked against the shipped catalogue too (a misspelt
    name is still an error), then rules about scenarios not loaded are left out, since they
    can match no cell of this catalogue."""
    shipped = shipped_scenarios()
    if shipped.resolve() in {folder.resolve() for folder in folders} or not shipped.is_dir():
        return matrix
    try:
        default = load_scenarios(shipped)
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


def apply_lock(matrix: Matrix, lock: Lock | None) -> Matrix:
    """The matrix with each following lane's images taken from the lock (GPU images pinned
    to the digest it names). A lane that lists its images is left as it is, unless the lock
    pins them (``listed_lock``: what ``watch`` hands the fleet), then each pinned image is
    pulled by its digest. No lock: the matrix as it is."""
    if lock is None:
        return matrix
    lanes = dict(matrix.lanes)
    for lane, config in matrix.lanes.items():
        locked = lock.lanes.get(lane)
        if locked is None:
            continue
        if config.follow is not None:
            images = tuple(locked_image(config, item) for item in locked.images)
            lanes[lane] = dataclasses.replace(config, images=images)
        elif dict(locked.rule) == listed_rule(config):
            lanes[lane] = dataclasses.replace(config, images=_pinned(config, locked))
    return dataclasses.replace(matrix, lanes=MappingProxyType(lanes))


def listed_rule(config: LaneConfig) -> dict[str, Any]:
    """The rule a lock records for a lane that lists its images: the list itself."""
    return {"listed": [image.tag for image in config.images]}


def _pinned(config: LaneConfig, locked: LaneLock) -> tuple[Image, ...]:
    digests = {item.tag: item.digest for item in locked.images if item.digest}
    return tuple(
        dataclasses.replace(
            image,
            ref=f"{_repository(image.ref)}@{digests[image.tag]}",
            pull=PullPolicy.MISSING,
        )
        if image.tag in digests
        else image
        for image in config.images
    )


def _repository(ref: str) -> str:
    """``host:5000/name:tag@sha256:..`` -> ``host:5000/name``."""
    name = ref.partition("@")[0]
    repository, colon, tag = name.rpartition(":")
    return repository if colon and "/" not in tag else name


def locked_image(config: LaneConfig, item: LockedImage) -> Image:
    """The image of one locked tag: on the GPU lane pulled by its digest, never by its tag."""
    runtime = config.runtime
    ref = f"{runtime.registry}@{item.digest}" if item.digest and config.lane is Lane.GPU else None
    version = image_version(item.tag)
    return make_image(config.lane, item.tag, version, runtime.registry, runtime.package, ref=ref)

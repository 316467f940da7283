"""What a cell really runs: its effective flags (and where each came from), what a baseline
expects, and identical effective cells planned once.

One precedence for flags, lowest first:

1. ``scenario``: the scenario's ``launch.flags`` supply what its trigger needs, only where
   the user's configuration leaves the flag open;
2. ``flagset``: the user's flag set, the configuration under test;
3. ``include``: flags an include rule of matrix.yaml adds to the combinations it matches
   (the user's configuration too, narrower than a flag set);
4. ``variant``: a workaround or control is the change being tested, so it wins.

A scenario applies where its trigger holds on these effective flags. A healthy baseline
knows every other scenario whose trigger holds for its own configuration and expects
that crash where the scenario's versions say so.

"No known fix" is never "avoided": where a scenario's ``fixed`` is unknown (null), a
version above its ``affected`` range is expected ``unknown`` (``after_range``), for a
scenario's own cells and a baseline's predicted crash alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from packaging.specifiers import Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from repromatrix.judgement import Expected
from repromatrix.matrix.conditions import Facts, holds
from repromatrix.values import Cell, Flags, FlagValue, Lane, Scenario, frozen_flags

# Lowest to highest: a later layer wins.
FLAG_LAYERS = ("scenario", "flagset", "include", "variant")


@dataclass(frozen=True)
class EffectiveFlags:
    """The merged flags of a cell and, per flag, the layer its value came from."""

    flags: Flags
    sources: Mapping[str, str]


def effective_flags(layers: Mapping[str, Mapping[str, FlagValue]]) -> EffectiveFlags:
    """Merge ``{layer: flags}`` in ``FLAG_LAYERS`` order; unknown layer names are a bug."""
    unknown = set(layers) - set(FLAG_LAYERS)
    if unknown:
        raise ValueError(f"unknown flag layers: {sorted(unknown)}")
    merged: dict[str, FlagValue] = {}
    sources: dict[str, str] = {}
    for layer in FLAG_LAYERS:
        for name, value in layers.get(layer, {}).items():
            merged[name] = value
            sources[name] = layer
    return EffectiveFlags(frozen_flags(merged), MappingProxyType(dict(sorted(sources.items()))))


def predicted_crashes(
    facts: Facts, scenarios: Sequence[Scenario], lane: Lane
) -> tuple[Scenario, ...]:
    """The crash scenarios of ``lane`` whose trigger holds for ``facts`` (a baseline's)."""
    return tuple(
        scenario
        for scenario in scenarios
        if not scenario.baseline
        and lane in scenario.lanes
        and scenario.trigger
        and holds(scenario.trigger, facts)
    )


def baseline_expected(
    predicted: Sequence[Scenario], version: Version | None
) -> tuple[Expected, str | None]:
    """What a baseline expects: the first predicted crash its image is affected by, named.

    No predicted crash, or none whose range holds the version: ``avoided``. An unknown
    version (``nightly``) with a predicted crash: ``unknown``, naming the first.
    """
    if not predicted:
        return Expected.AVOIDED, None
    if version is None:
        return Expected.UNKNOWN, predicted[0].id
    for scenario in predicted:
        if scenario.affected.contains(version, prereleases=True):
            return Expected.HIT, scenario.id
    for scenario in predicted:
        if unfixed_after(scenario, version):
            return Expected.UNKNOWN, scenario.id
    return Expected.AVOIDED, None


def unfixed_after(scenario: Scenario, version: Version) -> bool:
    """Whether ``version`` lies above the scenario's affected range while no fix is known."""
    return scenario.fixed is None and after_range(scenario.affected, version)


def after_range(affected: SpecifierSet, version: Version) -> bool:
    """Whether ``version`` lies above every version ``affected`` holds: it exceeds a bound
    from above (``<``, ``<=``, ``==``, ``~=``) and fails no bound from below."""
    if affected.contains(version, prereleases=True):
        return False
    failed = [s for s in affected if not s.contains(version, prereleases=True)]
    return all(_above(spec, version) for spec in failed)


def _above(spec: Specifier, version: Version) -> bool:
    """Whether ``version``, which ``spec`` refuses, is refused for being too new."""
    if spec.operator in (">", ">=", "!="):
        return False  # too old, or the one version left out
    text = spec.version.removesuffix(".*")
    try:
        bound = Version(text)
    except InvalidVersion:  # ``===`` compares text: no order to speak of
        return False
    if spec.operator == "==" and spec.version.endswith(".*"):
        return version > bound and not str(version).startswith(text + ".")
    return version >= bound if spec.operator == "<" else version > bound


def run_key(cell: Cell) -> tuple[object, ...]:
    """What decides what a cell runs: two cells with one key start the same thing."""
    return (
        cell.lane,
        cell.level,
        cell.image.key,  # two tags of one reference may still differ (a tag moves)
        cell.gpu.name,
        cell.model.name,
        cell.scenario.id,
        tuple(cell.flags.items()),
        tuple(sorted(cell.env.items())),
        cell.interrupt_on,
        cell.model_files,
        cell.scenario.launch.lora_rank,
        cell.container,  # a variant may change only the container (its shm, memory, port)
    )


def plan_once(cells: Sequence[Cell]) -> tuple[Cell, ...]:
    """Keep the first cell of each ``run_key``; it lists the ids it stands for in ``same_as``.

    ``cells`` are in id order, so which cell is kept does not depend on the selection
    beyond what it leaves out.
    """
    kept: dict[tuple[object, ...], Cell] = {}
    twins: dict[tuple[object, ...], list[str]] = {}
    for cell in cells:
        key = run_key(cell)
        if key in kept:
            twins[key].append(cell.id)
        else:
            kept[key], twins[key] = cell, []
    return tuple(
        replace(cell, same_as=tuple(twins[key])) if twins[key] else cell
        for key, cell in kept.items()
    )

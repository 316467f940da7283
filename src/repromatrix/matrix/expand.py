"""Expansion: the matrix and the scenario catalogue become cells, filtered as they are made.

Cells are images x GPUs x models x flag sets x scenarios x variants (x level:
engine, and probe where the scenario has a probe for the lane). A scenario
applies to an image/GPU/model/flag set when its trigger variant's effective
flags (``effective``: scenario < flag set < include < variant) satisfy its
trigger; its other variants (workarounds, controls) then follow. ``plan``
keeps one cell per identical effective run (``effective.plan_once``).

Filtering happens while walking the product, never after building it: a
branch the selector cannot select is skipped at the first level that rules
it out, excluded combinations are dropped as they are met, and trigger
evaluation is cached per GPU/model/flag set/scenario/variant (it does not
depend on the image).

include/exclude follow GitHub Actions: exclude first; then an include entry
that matches a surviving combination extends it (``flags``, ``deadline_s``),
and one that matches none adds its combination (it must then name one
image, GPU, model and flag set; the image may be a tag the lane does not list).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from packaging.version import Version

from repromatrix.errors import ConfigError, UsageError, suggest
from repromatrix.judgement import Expected
from repromatrix.matrix.conditions import Facts, holds
from repromatrix.matrix.config import LaneConfig, Matrix, Rule, check_references
from repromatrix.matrix.effective import (
    baseline_expected,
    effective_flags,
    plan_once,
    predicted_crashes,
    unfixed_after,
)
from repromatrix.matrix.parallelism import parallel_problems
from repromatrix.matrix.selector import Selector
from repromatrix.matrix.sources import check_adapters
from repromatrix.values import (
    Cell,
    Flags,
    FlagSet,
    FlagValue,
    Gpu,
    Image,
    Lane,
    Level,
    Model,
    PathWay,
    Scenario,
    Variant,
    frozen_flags,
)

CORE = ("image", "gpu", "model", "flagset")


def expected_outcome(
    scenario: Scenario, version: Version | None, triggered: bool, reaches: bool = True
) -> Expected:
    """Return what the scenario's documentation predicts for one cell.

    Not triggered (a workaround's flags, a baseline) → avoided; unknown version
    (nightly) → unknown; no way of the scenario's ``path`` taken (``reaches`` false) →
    not_reached; inside ``affected`` → hit; above ``affected`` with no known fix (``fixed``
    null) → unknown; fixed or otherwise → avoided. Pre-releases count as versions like any
    other (``0.31.1rc0`` is below ``0.31.1``).
    """
    if scenario.baseline or not triggered:
        return Expected.AVOIDED
    if version is None:
        return Expected.UNKNOWN
    if not reaches:
        return Expected.NOT_REACHED
    if scenario.affected.contains(version, prereleases=True):
        return Expected.HIT
    if unfixed_after(scenario, version):
        return Expected.UNKNOWN
    return Expected.AVOIDED


def takes_path(ways: Sequence[PathWay], holding: Sequence[bool], version: Version) -> bool:
    """Whether one of a scenario's ``path`` ways is taken on ``version`` (``holding``: whether
    each way's conditions hold for the cell); a scenario without a path makes no claim."""
    if not ways:
        return True
    return any(
        held and (way.versions is None or way.versions.contains(version, prereleases=True))
        for way, held in zip(ways, holding, strict=True)
    )


def levels(scenario: Scenario, lane: Lane) -> tuple[Level, ...]:
    """Return the levels a scenario has cells at on a lane: engine, probe, both or none."""
    found = [Level.ENGINE] if lane in scenario.lanes else []
    if scenario.probe is not None and lane in scenario.probe.lanes:
        found.append(Level.PROBE)
    return tuple(found)


def cell_id(lane: Lane, parts: Sequence[str], level: Level) -> str:
    """Return the canonical id ``lane/image/gpu/model/flagset/scenario/variant[@probe]``."""
    suffix = "@probe" if level is Level.PROBE else ""
    return "/".join((lane.value, *parts)) + suffix


def _include_flags(rules: Sequence[Rule]) -> Flags:
    """The flags of the include rules extending a cell, later rules winning."""
    merged: dict[str, FlagValue] = {}
    for rule in rules:
        merged.update(rule.flags)
    return frozen_flags(merged)


@dataclass(frozen=True)
class _Template:
    """Everything about a cell except its image: computed once, shared by every image."""

    flags: Flags
    sources: Mapping[str, str]
    triggered: bool
    interrupt_on: str | None
    predicted: tuple[Scenario, ...] = ()  # a baseline's: crashes its configuration triggers
    planned: bool = True  # the variant's own conditions (``when``) hold
    # Per way of the scenario's ``path``, whether its conditions hold (its versions aside);
    # empty where none is declared, for a workaround (it need not reach the path) and for a
    # probe (it calls the code itself).
    ways: tuple[bool, ...] = ()
    # A baseline's: per predicted crash, whether each way of its ``path`` holds.
    predicted_ways: tuple[tuple[bool, ...], ...] = ()


@dataclass(frozen=True)
class _Point:
    """One image/GPU/model/flag set combination of a lane, with the rules still in play."""

    image: Image
    gpu: Gpu
    model: Model
    flagset: FlagSet
    listed: bool  # False: the image is only there because an include adds it
    exclude: tuple[Rule, ...]
    adds: tuple[Rule, ...]
    include: tuple[Rule, ...]

    def parts(self, scenario: Scenario, variant: Variant) -> tuple[str, ...]:
        """Return the id parts after the lane."""
        names = (self.image.tag, self.gpu.name, self.model.name, self.flagset.name)
        return (*names, scenario.id, variant.name)

    @property
    def key(self) -> tuple[str, str, str]:
        """What merged flags and triggers depend on: everything but the image."""
        return (self.gpu.name, self.model.name, self.flagset.name)

    def kept(self, scenario: Scenario, variant: Variant, level: Level) -> bool:
        """Return whether exclude/include leave this scenario variant at this level in the plan."""
        if self.listed and not self.exclude:
            return True  # the common case, without building the names
        names = {"scenario": scenario.id, "variant": variant.name, "level": level.value}
        if self.listed and not _alive(self.exclude, names):
            return True
        return bool(_alive(self.adds, names))

    def extensions(self, scenario: Scenario, variant: Variant, level: Level) -> tuple[Rule, ...]:
        """Return the include rules that extend this scenario variant at this level."""
        if not self.include:
            return ()
        names = {"scenario": scenario.id, "variant": variant.name, "level": level.value}
        return _alive(self.include, names)


def expand(
    matrix: Matrix,
    scenarios: Sequence[Scenario],
    lane: Lane | None = None,
    selector: Selector | None = None,
) -> Iterator[Cell]:
    """Yield the cells of the matrix in id order, filtered by lane and selector as they are made."""
    chosen = selector or Selector()
    for name, config in sorted(matrix.lanes.items()):
        if lane not in (None, name):
            continue
        if config.follow is not None and not config.images:
            raise UsageError(
                f"lane `{name}` of {matrix.file} follows `{config.follow.words}`: its images "
                "come from a lock file, which this command did not read (--lock)"
            )
        yield from _LaneWalk(matrix, config, scenarios, chosen).cells()


class _LaneWalk:
    """One lane's walk through its product, with the caches of that walk."""

    def __init__(
        self, matrix: Matrix, config: LaneConfig, scenarios: Sequence[Scenario], selector: Selector
    ) -> None:
        self.config = config
        self.lane = config.lane
        self.selector = selector
        self.scenarios = [(s, levels(s, self.lane)) for s in scenarios if levels(s, self.lane)]
        self.catalogue = tuple(scenarios)
        self.exclude = _for_lane(matrix.exclude, self.lane)
        include = _for_lane(matrix.include, self.lane)
        self.adds = tuple(rule for rule in include if self._is_add(rule))
        # An added combination carries its rule's flags too: every include extends what it
        # matches, and an adding rule matches only what it adds.
        self.include = include
        self.templates: dict[tuple[object, ...], _Template] = {}
        self.expected: dict[tuple[object, ...], tuple[Expected, str | None]] = {}

    def cells(self) -> Iterator[Cell]:
        """Yield the lane's selected cells."""
        for point in self._points():
            for scenario, scenario_levels in self.scenarios:
                applies = [at for at in scenario_levels if self._applies(point, scenario, at)]
                for variant in scenario.variants:
                    for level in applies:
                        cell = self._cell(point, scenario, variant, level)
                        if cell is not None:
                            yield cell

    def _applies(self, point: _Point, scenario: Scenario, level: Level) -> bool:
        """A scenario applies where its trigger variant's merged flags satisfy its trigger."""
        return self._template(point, scenario, scenario.variants[0], level).triggered

    def _points(self) -> Iterator[_Point]:
        """Yield the core combinations the selector and the rules leave anything of."""
        tags = list(self.config.names("image"))
        tags += [tag for rule in self.adds if (tag := rule.single("image")) and tag not in tags]
        for image in (self.config.image(tag) for tag in dict.fromkeys(tags)):
            if not self.selector.could_select(f"{self.lane}/{image.tag}/"):
                continue
            listed = image in self.config.images
            for gpu, model, flagset in self._core():
                prefix = f"{self.lane}/{image.tag}/{gpu.name}/{model.name}/{flagset.name}/"
                if not self.selector.could_select(prefix):
                    continue
                values = {"lane": self.lane.value, "image": image.tag, "gpu": gpu.name}
                values |= {"model": model.name, "flagset": flagset.name}
                adds = _alive(self.adds, values)
                if listed or adds:
                    exclude, include = _alive(self.exclude, values), _alive(self.include, values)
                    yield _Point(image, gpu, model, flagset, listed, exclude, adds, include)

    def _core(self) -> Iterator[tuple[Gpu, Model, FlagSet]]:
        for gpu in self.config.gpus:
            for model in self.config.models:
                for flagset in self.config.flagsets:
                    yield gpu, model, flagset

    def _cell(
        self, point: _Point, scenario: Scenario, variant: Variant, level: Level
    ) -> Cell | None:
        """Return the cell of this combination, or ``None`` if the rules or selector drop it."""
        if not point.kept(scenario, variant, level):
            return None
        identifier = cell_id(self.lane, point.parts(scenario, variant), level)
        if not self.selector.matches(identifier):
            return None
        template = self._template(point, scenario, variant, level)
        if not template.planned:
            return None
        rules = point.extensions(scenario, variant, level)
        # The model's own deadline replaces the lane's; a scenario's start-up or an include
        # may only lengthen it.
        lane_deadline = point.model.deadline_s or self.config.runtime.deadline_s
        deadlines = [lane_deadline, scenario.launch.startup_timeout_s]
        deadlines += [rule.deadline_s for rule in rules if rule.deadline_s is not None]
        expected, named = self._expected(scenario, point.image, template)
        container = scenario.launch.container.merged(variant.container)
        return Cell(
            id=identifier,
            lane=self.lane,
            level=level,
            image=image_variant(point.image, container.image),
            gpu=point.gpu,
            model=point.model,
            flagset=point.flagset,
            scenario=scenario,
            variant=variant,
            expected=expected,
            flags=template.flags,
            env=MappingProxyType(self._env(point.gpu, scenario, variant)),
            deadline_s=max(deadlines),
            interrupt_on=template.interrupt_on,
            flag_sources=template.sources,
            predicted=template.predicted,
            expected_scenario=named,
            container=container,
        )

    def _env(self, gpu: Gpu, scenario: Scenario, variant: Variant) -> dict[str, str]:
        """The cell's environment: the lane's runtime ``env``, its GPU entry's over it (the
        fleet's NCCL settings), then the scenario's launch and variant (what the crash needs)."""
        return {
            **dict(self.config.runtime.env),
            **dict(gpu.env),
            **scenario.launch.env,
            **variant.env,
        }

    def _template(
        self, point: _Point, scenario: Scenario, variant: Variant, level: Level
    ) -> _Template:
        """Effective flags and trigger result; they do not depend on the image, so are cached."""
        rules = point.extensions(scenario, variant, level)
        key = (point.key, scenario.id, variant.name, tuple(map(id, rules)) if rules else ())
        cached = self.templates.get(key)
        if cached is None:
            effective = effective_flags(
                {
                    "scenario": scenario.launch.flags,
                    "flagset": point.flagset.flags,
                    "include": _include_flags(rules),
                    "variant": variant.flags,
                }
            )
            interrupt = scenario.launch.interrupt_on if variant.interrupt else None
            # A variant's model folder is the cell's own launch fact, as its flags are.
            files = variant.model_files or scenario.launch.model_files
            launch = replace(scenario.launch, model_files=files)
            container = scenario.launch.container.merged(variant.container)
            env = MappingProxyType({**scenario.launch.env, **variant.env})
            facts = Facts(
                point.model, point.gpu, effective.flags, launch, interrupt, container, env
            )
            predicted: tuple[Scenario, ...] = ()
            if scenario.baseline and level is Level.ENGINE:
                predicted = predicted_crashes(facts, self.catalogue, self.lane)
            predicted_ways = tuple(
                tuple(holds(way.when, facts) for way in crash.path) for crash in predicted
            )
            triggered = holds(scenario.trigger, facts)
            planned = holds(variant.when, facts)
            # A probe calls the decisive code itself: the path concerns engine start-ups.
            ways = (
                tuple(holds(way.when, facts) for way in scenario.path)
                if variant.needs_reach and level is Level.ENGINE
                else ()
            )
            cached = _Template(
                effective.flags,
                effective.sources,
                triggered,
                interrupt,
                predicted,
                planned,
                ways,
                predicted_ways,
            )
            self.templates[key] = cached
        return cached

    def _expected(
        self, scenario: Scenario, image: Image, template: _Template
    ) -> tuple[Expected, str | None]:
        """The expectation and the scenario it names, cached: specifier matching is slow."""
        predicted = tuple(s.id for s in template.predicted)
        ways = template.ways
        key = (scenario.id, image.tag, template.triggered, predicted, ways, template.predicted_ways)
        found = self.expected.get(key)
        if found is None:
            if scenario.baseline:
                # A predicted crash whose path this configuration does not take cannot happen.
                version = image.version
                taken = tuple(
                    crash
                    for crash, held in zip(template.predicted, template.predicted_ways, strict=True)
                    if version is None or takes_path(crash.path, held, version)
                )
                found = baseline_expected(taken, version)
            else:
                version = image.version
                reaches = not ways or (
                    version is not None and takes_path(scenario.path, ways, version)
                )
                expected = expected_outcome(scenario, version, template.triggered, reaches)
                found = (expected, scenario.id if expected is not Expected.AVOIDED else None)
            self.expected[key] = found
        return found

    def _is_add(self, rule: Rule) -> bool:
        """An include adds when it names one value per core axis and matches no surviving combo."""
        core = {axis: value for axis in CORE if (value := rule.single(axis)) is not None}
        if len(core) < len(CORE):
            return False
        if core["image"] not in self.config.names("image"):
            return True
        exclude = _alive(self.exclude, {"lane": self.lane.value, **core})
        for scenario, scenario_levels in self.scenarios:
            for variant in scenario.variants:
                for level in scenario_levels:
                    names = {"scenario": scenario.id, "variant": variant.name, "level": level.value}
                    if _alive([rule], names) and not _alive(exclude, names):
                        return False
        return True


def _for_lane(rules: Sequence[Rule], lane: Lane) -> tuple[Rule, ...]:
    return tuple(rule for rule in rules if rule.accepts("lane", lane.value))


def _alive(rules: Sequence[Rule], values: Mapping[str, str]) -> tuple[Rule, ...]:
    """Return the rules compatible with the given axis values (absent axes match anything)."""
    return tuple(r for r in rules if all(r.accepts(a, v) for a, v in values.items()))


def plan(
    matrix: Matrix,
    scenarios: Sequence[Scenario],
    lane: Lane | None = None,
    selector: Selector | None = None,
) -> tuple[Cell, ...]:
    """Return the selected cells; raise ``UsageError`` when the selection matches nothing."""
    check_references(matrix, scenarios)
    if lane is not None and lane not in matrix.lanes:
        raise UsageError(f"{matrix.file} defines no `{lane}` lane")
    cells = plan_once(tuple(expand(matrix, scenarios, lane, selector)))
    models = (model for config in matrix.lanes.values() for model in config.models)
    problems = [*check_adapters(cells, models), *parallel_problems(cells, matrix)]
    if problems:
        raise ConfigError(problems)
    if cells:
        return cells
    everything = [cell.id for cell in expand(matrix, scenarios, lane)]
    raise UsageError(_empty_selection(selector or Selector(), everything))


def _empty_selection(selector: Selector, everything: Sequence[str]) -> str:
    if not everything:
        return "the matrix has no cells: no scenario's trigger holds for any of its combinations"
    lines = [f"the selection matches none of the {len(everything)} cells of the plan"]
    for glob in selector.unmatched_only(everything):
        lines.append(f"  --only {glob!r} matches nothing.{_hint(glob, everything)}")
    if not selector.unmatched_only(everything) and selector.skip:
        lines.append(f"  --skip {' '.join(map(repr, selector.skip))} removes every cell left")
    return "\n".join(lines)


def _hint(glob: str, everything: Sequence[str]) -> str:
    """Point at the first literal part of the glob that is no part of any cell id."""
    known = {part for cell in everything for part in cell.removesuffix("@probe").split("/")}
    for part in glob.removesuffix("@probe").split("/"):
        if part and not any(char in part for char in "*?[{") and part not in known:
            return f" No cell id has a part `{part}`.{suggest(part, known)}"
    return ""


def image_variant(image: Image, variant: str | None) -> Image:
    """``image``, or its ``variant`` (``no-libnuma``): a key and so a render and tag of its own,
    so a variant image is never the lane's normal one."""
    if not variant:  # None, or "" for the normal image named over a launch's variant
        return image
    return replace(image, key=f"{image.key}-{variant}", variant=variant)


def path_notices(cells: Sequence[Cell]) -> tuple[str, ...]:
    """One line per scenario with a ``path`` that none of its planned engine cells takes:
    every one of them can at best show the crash's code path not reached."""
    taken: dict[str, bool] = {}
    for cell in cells:
        scenario = cell.scenario
        if not scenario.path or cell.level is not Level.ENGINE or not cell.variant.needs_reach:
            continue
        taken[scenario.id] = taken.get(scenario.id, False) or _takes(cell)
    return tuple(
        f"scenario `{name}`: no cell of this plan takes the crash's code path (its `path`); "
        "each can at best end not_reached, so none decides it"
        for name, yes in sorted(taken.items())
        if not yes
    )


def _takes(cell: Cell) -> bool:
    """Whether the cell takes one way of its scenario's path (an unknown version may)."""
    version = cell.image.version
    files = cell.variant.model_files or cell.scenario.launch.model_files
    launch = replace(cell.scenario.launch, model_files=files)
    facts = Facts(
        cell.model, cell.gpu, cell.flags, launch, cell.interrupt_on, cell.container, cell.env
    )
    holding = [holds(way.when, facts) for way in cell.scenario.path]
    return version is None or takes_path(cell.scenario.path, holding, version)

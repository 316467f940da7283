"""matrix.yaml: the lanes, their axes (images, GPUs, models, flag sets) and include/exclude rules.

``load_matrix`` reads and validates the whole file, reporting every problem
at once with its line and column; the ``Matrix`` it returns is frozen and
already checked, so expansion never meets a bad value. References to
scenarios and variants in include/exclude rules are checked against the
catalogue by ``check_references``, since the matrix alone does not know it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from repromatrix.errors import suggest
from repromatrix.matrix.images import image_version
from repromatrix.matrix.keys import AXES, ID_PARTS, section
from repromatrix.matrix.lanes import DEFAULT_BASE, BaseImage, LaneConfig, Runtime, read_lane
from repromatrix.matrix.yamlsrc import Location, Reader, YMap, YNode, YScalar, load_yaml
from repromatrix.values import Flags, Lane, Scenario, frozen_flags

__all__ = [
    "AXES",
    "DEFAULT_BASE",
    "ID_PARTS",
    "BaseImage",
    "LaneConfig",
    "Matrix",
    "Rule",
    "Runtime",
    "check_references",
    "load_matrix",
]


@dataclass(frozen=True)
class Rule:
    """One include or exclude entry: accepted values per named axis, plus what an include adds.

    An axis absent from ``match`` matches anything (GitHub Actions semantics).
    """

    where: Location
    match: Mapping[str, frozenset[str]]
    flags: Flags = field(default_factory=frozen_flags)
    deadline_s: float | None = None

    def accepts(self, axis: str, value: str) -> bool:
        """Return whether ``value`` on ``axis`` is compatible with this rule."""
        wanted = self.match.get(axis)
        return wanted is None or value in wanted

    def single(self, axis: str) -> str | None:
        """Return the one value this rule names on ``axis``, or ``None``."""
        wanted = self.match.get(axis)
        return next(iter(wanted)) if wanted is not None and len(wanted) == 1 else None


@dataclass(frozen=True)
class Matrix:
    """The whole matrix file, validated."""

    file: str
    lanes: Mapping[Lane, LaneConfig]
    include: tuple[Rule, ...] = ()
    exclude: tuple[Rule, ...] = ()


def load_matrix(path: Path) -> Matrix:
    """Read and validate a matrix file; raise ``ConfigError`` listing every problem in it."""
    root = load_yaml(path)
    reader = Reader()
    matrix = read_matrix(root, str(path), reader)
    reader.check()
    assert matrix is not None  # a None matrix always comes with problems
    return matrix


def read_matrix(root: YNode, file: str, reader: Reader) -> Matrix | None:
    """Build a ``Matrix`` from parsed YAML, recording problems in ``reader``."""
    body = reader.mapping(root, "the matrix")
    if body is None:
        return None
    keys = section("matrix")
    reader.keys(body, keys.names, "the matrix", required=keys.required)
    lanes = _read_lanes(body.get("lanes"), reader)
    exclude = _read_rules(body.get("exclude"), "exclude", lanes, reader)
    include = _read_rules(body.get("include"), "include", lanes, reader)
    return Matrix(file, MappingProxyType(lanes), include, exclude)


def _read_lanes(node: YNode | None, reader: Reader) -> dict[Lane, LaneConfig]:
    lanes: dict[Lane, LaneConfig] = {}
    if node is None:
        return lanes
    body = reader.mapping(node, "`lanes`")
    if body is None:
        return lanes
    for entry in body:
        if entry.key not in set(Lane):
            hint = suggest(entry.key, [lane.value for lane in Lane])
            reader.error(entry.where, f"unknown lane `{entry.key}`: use `cpu` or `gpu`.{hint}")
            continue
        config = read_lane(Lane(entry.key), entry.value, reader)
        if config is not None:
            lanes[Lane(entry.key)] = config
    if not body.entries:
        reader.error(body.where, "`lanes` must define at least one lane (`cpu` or `gpu`)")
    return lanes


def _read_rules(
    node: YNode | None, kind: str, lanes: Mapping[Lane, LaneConfig], reader: Reader
) -> tuple[Rule, ...]:
    if node is None or (isinstance(node, YScalar) and node.value is None):
        return ()
    items = reader.sequence(node, f"`{kind}`")
    rules = []
    for item in items or ():
        rule = _read_rule(item, kind, lanes, reader)
        if rule is not None:
            rules.append(rule)
    return tuple(rules)


def _read_rule(
    node: YNode, kind: str, lanes: Mapping[Lane, LaneConfig], reader: Reader
) -> Rule | None:
    what = f"an `{kind}` entry"
    body = reader.mapping(node, what)
    if body is None:
        return None
    reader.keys(body, section(kind).names, what)
    match: dict[str, frozenset[str]] = {}
    for entry in body:
        if entry.key in AXES:
            values = _rule_values(entry.value, entry.key, reader)
            if values is not None:
                match[entry.key] = values
    if not match:
        reader.error(body.where, f"{what} must name at least one of: {', '.join(AXES)}")
        return None
    flags, deadline = _include_extras(body, reader)
    rule = Rule(body.where, MappingProxyType(match), flags, deadline)
    _check_rule_names(rule, body, kind, lanes, reader)
    return rule


def _rule_values(node: YNode, axis: str, reader: Reader) -> frozenset[str] | None:
    items = reader.sequence(node, f"`{axis}`")
    if items is None:
        return None
    names = [reader.name(item, f"`{axis}`") for item in items]
    if not names or None in names:
        return None
    return frozenset(name for name in names if name is not None)


def _include_extras(body: YMap, reader: Reader) -> tuple[Flags, float | None]:
    flags_node, deadline_node = body.get("flags"), body.get("deadline_s")
    flags = reader.flags(flags_node, "`flags`") if flags_node is not None else None
    deadline = None
    if deadline_node is not None:
        deadline = reader.number(deadline_node, "`deadline_s`", positive=True)
    return frozen_flags(flags), deadline


def _check_rule_names(
    rule: Rule, body: YMap, kind: str, lanes: Mapping[Lane, LaneConfig], reader: Reader
) -> None:
    """Record names that no lane defines (an include may add a new image tag)."""
    lane_names = rule.match.get("lane", frozenset(lane.value for lane in lanes))
    chosen = [config for lane, config in lanes.items() if lane.value in lane_names]
    for level in sorted(rule.match.get("level", frozenset()) - {"engine", "probe"}):
        reader.error(_value_where(body, "level"), f"unknown level `{level}`: use engine or probe")
    for lane_name in sorted(lane_names - {lane.value for lane in lanes}):
        hint = suggest(lane_name, [lane.value for lane in lanes])
        reader.error(_value_where(body, "lane"), f"unknown lane `{lane_name}`.{hint}")
    if kind == "include":
        _check_added_images(rule, body, chosen, reader)
    for axis in ("image", "gpu", "model", "flagset"):
        # An include may add a tag; a lane that follows a rule knows its tags only once locked.
        if axis == "image" and (kind == "include" or any(c.follow for c in chosen)):
            continue
        known = {name for config in chosen for name in config.names(axis)}
        for name in sorted(rule.match.get(axis, frozenset()) - known):
            reader.error(
                _value_where(body, axis), f"unknown {axis} `{name}`.{suggest(name, known)}"
            )


def _check_added_images(
    rule: Rule, body: YMap, lanes: Sequence[LaneConfig], reader: Reader
) -> None:
    """An image tag an include adds to the CPU lane must name a version, as one the lane
    lists must (pip installs it): checked now, not when the image is rendered."""
    for config in lanes:
        if config.lane is not Lane.CPU or not _may_apply(rule, config):
            continue
        for tag in sorted(rule.match.get("image", frozenset()) - set(config.names("image"))):
            if image_version(tag) is None:
                package = config.runtime.package
                message = f"CPU image `{tag}` must be a {package} version (pip installs it)"
                reader.error(_value_where(body, "image"), message)


def _may_apply(rule: Rule, config: LaneConfig) -> bool:
    """Whether every axis the rule names has a value the lane defines."""
    axes = ("gpu", "model", "flagset")
    return all(not rule.match.get(a) or rule.match[a] & set(config.names(a)) for a in axes)


def _value_where(body: YMap, key: str) -> Location:
    node = body.get(key)
    return node.where if node is not None else body.where


def check_references(matrix: Matrix, scenarios: Sequence[Scenario]) -> None:
    """Raise ``ConfigError`` for rules naming scenarios or variants the catalogue lacks."""
    reader = Reader()
    ids = {scenario.id for scenario in scenarios}
    for rule in (*matrix.exclude, *matrix.include):
        _check_known(rule, "scenario", ids, reader)
        named = rule.match.get("scenario", ids)
        variants = {v.name for s in scenarios if s.id in named for v in s.variants}
        _check_known(rule, "variant", variants, reader)
    reader.check()


def _check_known(rule: Rule, axis: str, known: Collection[str], reader: Reader) -> None:
    for name in sorted(rule.match.get(axis, frozenset()) - set(known)):
        reader.error(rule.where, f"unknown {axis} `{name}` in a rule.{suggest(name, known)}")

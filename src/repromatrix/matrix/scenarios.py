"""The scenario catalogue: one YAML file per documented crash, read and validated.

``load_scenarios`` reads every ``*.yaml`` file of a folder and reports the
problems of all files at once. A scenario's first variant is always the
``trigger`` (the launch as documented); the file lists the workarounds and
controls that follow it, each a flag change on that launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from repromatrix.errors import ConfigError, Problem, suggest
from repromatrix.grammars import check_version_numbers
from repromatrix.matrix.conditions import subject_problem
from repromatrix.matrix.keys import BASELINE_FORBIDDEN, CRASH_REQUIRED, VARIANT_KINDS, section
from repromatrix.matrix.scenario_parts import (
    read_container,
    read_env,
    read_lanes,
    read_line_text,
    read_probe,
    read_reached,
    read_signatures,
    read_source,
)
from repromatrix.matrix.yamlsrc import (
    Location,
    Reader,
    YEntry,
    YMap,
    YNode,
    YScalar,
    YSeq,
    describe,
    load_yaml,
)
from repromatrix.values import (
    MODEL_FILES,
    Condition,
    ContainerOptions,
    FlagValue,
    Launch,
    LaunchMode,
    Op,
    PathWay,
    Scenario,
    ScenarioKind,
    Variant,
    frozen_flags,
)

# The first variant of every scenario: the launch as documented, or a baseline's healthy launch.
TRIGGER = Variant("trigger", "trigger", description="the launch as documented")
BASELINE = Variant("baseline", "baseline", description="the healthy launch")
ORDERING = {Op.GT, Op.GE, Op.LT, Op.LE}
# `affected: all`: every version, pre-releases included (contains() is called with prereleases).
ALL_VERSIONS = SpecifierSet(">=0")
NO_VERSION = SpecifierSet("<0")
NO_FOLDER = (
    "no such scenario folder (without --scenarios, the scenarios shipped with repromatrix are "
    "read, and a scenarios/ folder beside the matrix file adds to them)"
)


def load_scenarios(directory: Path) -> tuple[Scenario, ...]:
    """Read every scenario file in ``directory``; raise ``ConfigError`` listing all problems."""
    if not directory.is_dir():
        raise ConfigError([Problem(str(directory), 0, 0, NO_FOLDER)])
    paths = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    if not paths:
        raise ConfigError([Problem(str(directory), 0, 0, "no scenario files (*.yaml) here")])
    problems: list[Problem] = []
    scenarios: list[Scenario] = []
    for path in paths:
        try:
            scenarios.append(load_scenario(path))
        except ConfigError as exc:
            problems.extend(exc.problems)
    problems.extend(_duplicates(scenarios))
    if problems:
        raise ConfigError(problems)
    return tuple(sorted(scenarios, key=lambda s: s.id))


def load_catalogue(directories: Sequence[Path]) -> tuple[Scenario, ...]:
    """Read the scenario files of several folders as one catalogue (an id defined twice, in
    one folder or two, is a problem naming both files); raise ``ConfigError`` for all."""
    problems: list[Problem] = []
    scenarios: list[Scenario] = []
    for directory in dict.fromkeys(directories):
        try:
            scenarios.extend(load_scenarios(directory))
        except ConfigError as exc:
            problems.extend(exc.problems)
    problems.extend(_duplicates(scenarios))
    if problems:
        raise ConfigError(problems)
    return tuple(sorted(scenarios, key=lambda s: s.id))


def load_scenario(path: Path) -> Scenario:
    """Read one scenario file; raise ``ConfigError`` listing every problem in it."""
    reader = Reader()
    root = load_yaml(path)
    scenario = read_scenario(root, str(path), reader)
    if scenario is not None and scenario.id != path.stem:
        reader.error(_id_where(root), f"id `{scenario.id}` must match the file name `{path.stem}`")
    reader.check()
    assert scenario is not None  # a None scenario always comes with problems
    return scenario


def _id_where(root: YNode) -> Location:
    node = root.get("id") if isinstance(root, YMap) else None
    return (node or root).where


def _duplicates(scenarios: Sequence[Scenario]) -> list[Problem]:
    seen: dict[str, Scenario] = {}
    problems = []
    for scenario in scenarios:
        if scenario.id in seen:
            first = seen[scenario.id].file
            problems.append(
                Problem(
                    scenario.file, 0, 0, f"duplicate scenario id `{scenario.id}` (also in {first})"
                )
            )
        seen.setdefault(scenario.id, scenario)
    return problems


def read_scenario(root: YNode, file: str, reader: Reader) -> Scenario | None:
    """Build a ``Scenario`` from parsed YAML, recording problems in ``reader``."""
    body = reader.mapping(root, "a scenario")
    if body is None:
        return None
    baseline = _flag(body, "baseline", reader)
    keys = section("scenario")
    required = keys.required if baseline else (*keys.required, *CRASH_REQUIRED)
    reader.keys(body, keys.names, "a scenario", required=required)
    if baseline:
        for key in BASELINE_FORBIDDEN:
            if (node := body.get(key)) is not None:
                reader.error(node.where, f"a baseline expects no crash: remove `{key}`")
    id_node = body.get("id")
    scenario_id = reader.name(id_node, "scenario id") if id_node is not None else None
    probe = read_probe(body.get("probe"), reader)
    scenario = Scenario(
        id=scenario_id or "",
        title=_text(body, "title", reader) or "",
        lanes=read_lanes(body.get("lanes"), "`lanes`", reader, allow_empty=probe is not None),
        trigger=_trigger(body.get("trigger"), reader),
        launch=_launch(body.get("launch"), reader),
        signatures=read_signatures(body.get("signatures"), reader),
        reached=read_reached(body.get("reached"), reader),
        path=_path(body.get("path"), reader),
        affected=_specifiers(body.get("affected"), "`affected`", reader) or NO_VERSION,
        fixed=_specifiers(body.get("fixed"), "`fixed`", reader),
        variants=_variants(body.get("variants"), reader, BASELINE if baseline else TRIGGER),
        avoided=_text(body, "avoided", reader) or "",
        source=read_source(body.get("source"), reader),
        probe=probe,
        baseline=baseline,
        warning_is_crash=_flag(body, "warning_is_crash", reader),
        kind=_kind(body, reader),
        file=file,
    )
    return scenario if scenario_id else None


def _path(node: YNode | None, reader: Reader) -> tuple[PathWay, ...]:
    """The ``path`` list: each way a version range and conditions (at least one of them)."""
    if node is None:
        return ()
    ways: list[PathWay] = []
    for item in reader.sequence(node, "`path`") or ():
        body = reader.mapping(item, "a `path` entry")
        if body is None:
            continue
        reader.keys(body, section("path").names, "a `path` entry")
        versions = body.get("versions")
        when = body.get("when")
        if versions is None and when is None:
            reader.error(body.where, "a `path` entry needs `versions`, `when` or both")
            continue
        ways.append(
            PathWay(
                _specifiers(versions, "`versions`", reader) if versions is not None else None,
                _trigger(when, reader, "`when`"),
            )
        )
    if not ways and isinstance(node, YSeq) and not node.items:
        reader.error(node.where, "`path` must list at least one way (or be left out)")
    return tuple(ways)


def _kind(body: YMap, reader: Reader) -> ScenarioKind:
    """``kind``: a defect (the default), or a crash the matrix stages (a start-up interruption,
    a deliberate misconfiguration)."""
    text = _text(body, "kind", reader)
    if text is None:
        return ScenarioKind.DEFECT
    if text not in set(ScenarioKind):
        node = body.get("kind") or body
        kinds = [kind.value for kind in ScenarioKind]
        message = f"`kind` must be one of {', '.join(kinds)}, not `{text}`."
        reader.error(node.where, message + suggest(text, kinds))
        return ScenarioKind.DEFECT
    return ScenarioKind(text)


def _text(body: YMap, key: str, reader: Reader) -> str | None:
    node = body.get(key)
    return reader.text(node, f"`{key}`") if node is not None else None


def _name(body: YMap, key: str, reader: Reader) -> str | None:
    """A name by the grammar of the matrix's own (an adapter's): it goes into the server's argv."""
    node = body.get(key)
    return reader.name(node, f"`{key}`") if node is not None else None


def _flag(body: YMap, key: str, reader: Reader) -> bool:
    node = body.get(key)
    return bool(reader.boolean(node, f"`{key}`")) if node is not None else False


def _number(body: YMap, key: str, reader: Reader) -> float | None:
    node = body.get(key)
    if node is None or (isinstance(node, YScalar) and node.value is None):
        return None
    return reader.number(node, f"`{key}`", positive=True)


def _rank(node: YNode | None, reader: Reader) -> int | None:
    return reader.integer(node, "`lora_rank`", minimum=1) if node is not None else None


def _model_files(body: YMap, reader: Reader) -> str | None:
    """``model_files``: one of ``MODEL_FILES`` (a CPU-lane tiny model folder as served)."""
    text = _text(body, "model_files", reader)
    if text is not None and text not in MODEL_FILES:
        node = body.get("model_files")
        message = f"`model_files` must be one of {', '.join(MODEL_FILES)}, not `{text}`."
        reader.error((node or body).where, message + suggest(text, MODEL_FILES))
        return None
    return text


def _trigger(node: YNode | None, reader: Reader, what: str = "`trigger`") -> tuple[Condition, ...]:
    if node is None:
        return ()
    body = reader.mapping(node, what)
    if body is None:
        return ()
    conditions: list[Condition] = []
    for entry in body:
        problem = subject_problem(entry.key)
        if problem:
            reader.error(entry.where, problem)
            continue
        conditions.extend(_conditions(entry, reader))
    return tuple(conditions)


def _conditions(entry: YEntry, reader: Reader) -> list[Condition]:
    """``subject: value`` means ``eq``, ``subject: [a, b]`` means ``in``, or ``{gt: 128}``."""
    value = entry.value
    if isinstance(value, YSeq):
        return [Condition(entry.key, Op.IN, _values(value, reader))]
    if isinstance(value, YScalar):
        return [Condition(entry.key, Op.EQ, value.value)]
    if not value.entries:
        reader.error(value.where, f"`{entry.key}` needs a comparison, e.g. {{gt: 128}}")
    conditions = []
    for test in value:
        if test.key not in set(Op):
            hint = suggest(test.key, [op.value for op in Op])
            reader.error(test.where, f"unknown comparison `{test.key}`: use {', '.join(Op)}.{hint}")
        elif test.key == Op.IN:
            if isinstance(test.value, YSeq):
                conditions.append(Condition(entry.key, Op.IN, _values(test.value, reader)))
            else:
                reader.error(test.value.where, f"`in` needs a list, not {describe(test.value)}")
        else:
            ok, scalar = reader.scalar(test.value, f"`{test.key}`")
            if ok and (test.key not in ORDERING or _is_number(scalar)):
                conditions.append(Condition(entry.key, Op(test.key), scalar))
            elif ok:
                message = f"`{test.key}` compares numbers, not {describe(test.value)}"
                reader.error(test.value.where, message)
    return conditions


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _values(node: YSeq, reader: Reader) -> tuple[FlagValue, ...]:
    values: list[FlagValue] = []
    for item in node.items:
        ok, value = reader.scalar(item, "a value")
        if ok:
            values.append(value)
    return tuple(values)


def _launch(node: YNode | None, reader: Reader) -> Launch:
    body = reader.mapping(node, "`launch`") if node is not None else None
    if body is None:
        return Launch()
    reader.keys(body, section("launch").names, "`launch`")
    mode = LaunchMode.SERVER
    if (value := body.get("mode")) is not None:
        text = value.value if isinstance(value, YScalar) else None
        if isinstance(text, str) and text in set(LaunchMode):
            mode = LaunchMode(text)
        else:
            reader.error(
                value.where, f"`mode` must be `server` or `offline`, not {describe(value)}"
            )
    flags_node = body.get("flags")
    flags = reader.flags(flags_node, "`flags`") if flags_node is not None else None
    return Launch(
        mode=mode,
        flags=frozen_flags(flags),
        env=MappingProxyType(read_env(body.get("env"), "`env`", reader)),
        lora_adapter=_name(body, "lora_adapter", reader),
        lora_adapter_line=_line(body.get("lora_adapter")),
        interrupt_on=read_line_text(body.get("interrupt_on"), "`interrupt_on`", reader),
        startup_timeout_s=_number(body, "startup_timeout_s", reader) or Launch.startup_timeout_s,
        lora_rank=_rank(body.get("lora_rank"), reader),
        model_files=_model_files(body, reader),
        container=read_container(body.get("container"), reader),
    )


def _line(node: YNode | None) -> int:
    return node.where.line if node is not None else 0


def _specifiers(node: YNode | None, what: str, reader: Reader) -> SpecifierSet | None:
    """A PEP 440 specifier set (``>=0.31.0,<0.31.1rc0``), ``all``, or null for none."""
    if node is None or (isinstance(node, YScalar) and node.value is None):
        return None
    text = reader.text(node, what)
    if text is None:
        return None
    if text.strip() == "all":
        return ALL_VERSIONS
    if (why := check_version_numbers(text)) is not None:
        reader.error(node.where, f"{what} `{text[:60]}...` is refused: {why}")
        return None
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        reader.error(
            node.where,
            f"{what} `{text}` is not a version specifier set (e.g. `>=0.31.0,<0.31.1rc0` or `all`)",
        )
        return None


def _variants(node: YNode | None, reader: Reader, first: Variant) -> tuple[Variant, ...]:
    variants = [first]
    if node is None:
        return tuple(variants)
    for item in reader.sequence(node, "`variants`") or ():
        variant = _variant(item, reader)
        if variant is None:
            continue
        if any(v.name == variant.name for v in variants):
            reader.error(
                item.where, f"duplicate variant `{variant.name}` (`{first.name}` is reserved)"
            )
            continue
        variants.append(variant)
    return tuple(variants)


def _variant(node: YNode, reader: Reader) -> Variant | None:
    body = reader.mapping(node, "a variant")
    if body is None:
        return None
    keys = section("variant")
    reader.keys(body, keys.names, "a variant", required=keys.required)
    name_node, kind = body.get("name"), _text(body, "kind", reader)
    name = reader.name(name_node, "variant name") if name_node is not None else None
    if kind is not None and kind not in VARIANT_KINDS:
        where = (body.get("kind") or body).where
        kinds = ", ".join(f"`{k}`" for k in VARIANT_KINDS)
        message = f"`kind` must be one of {kinds}, not `{kind}`."
        reader.error(where, message + suggest(kind, VARIANT_KINDS))
    flags_node = body.get("flags")
    flags = reader.flags(flags_node, "`flags`") if flags_node is not None else None
    interrupt_node = body.get("interrupt")
    interrupt = reader.boolean(interrupt_node, "`interrupt`") if interrupt_node else True
    files = _model_files(body, reader)
    container = read_container(body.get("container"), reader)
    env = read_env(body.get("env"), "`env`", reader)
    changes = (flags, env, interrupt is False, files is not None, container != ContainerOptions())
    if not any(changes):
        reader.error(
            body.where,
            "a variant must change something: `flags`, `env`, `model_files`, `container` or "
            "`interrupt: false`",
        )
    if name is None or kind not in VARIANT_KINDS:
        return None
    description = _text(body, "description", reader) or ""
    return Variant(
        name,
        kind,
        frozen_flags(flags),
        description,
        interrupt is not False,
        env=MappingProxyType(env),
        when=_trigger(body.get("when"), reader, "`when`"),
        model_files=files,
        container=container,
    )

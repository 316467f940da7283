"""JSON Schemas of matrix.yaml and the scenario files, generated from the validator's key tables.

``keys`` says which keys each mapping holds and what kind of value each is;
this module maps every kind to the JSON Schema of what its reader accepts,
using the readers' own patterns and word lists. Editors that read the
``# yaml-language-server: $schema=`` comment then complete key names and
mark unknown keys and wrong types as the user types; the validator still
has the last word (cross references, version ranges, the file name).
"""

from __future__ import annotations

import json
from typing import Any

from repromatrix.grammars import (
    ENV_NAME,
    ENV_VALUE,
    SLURM_CONSTRAINT,
    SLURM_MEMORY,
    SLURM_NAME,
    SLURM_NAMES,
)
from repromatrix.matrix.conditions import NAMESPACES
from repromatrix.matrix.keys import (
    AXES,
    BASELINE_FORBIDDEN,
    CRASH_REQUIRED,
    LANES,
    MATRIX_SECTIONS,
    REACHED_FACT,
    REACHED_LINE,
    SCENARIO_SECTIONS,
    Key,
    MappingKind,
)
from repromatrix.matrix.lanes import CC_PATTERN, SHM_PATTERN
from repromatrix.matrix.scenario_parts import PROGRAM_PATTERN
from repromatrix.matrix.yamlsrc import FLAG_PATTERN, NAME_PATTERN
from repromatrix.values import Op

DRAFT = "http://json-schema.org/draft-07/schema#"
SCHEMA_FILES = {"matrix": "matrix.schema.json", "scenario": "scenario.schema.json"}
ORDERING = ("gt", "ge", "lt", "le")

Schema = dict[str, Any]


def _whole(pattern: str) -> str:
    """A Python ``fullmatch`` pattern as a JSON Schema (ECMA 262, search) pattern."""
    return f"^(?:{pattern})$"


TEXT: Schema = {"type": "string", "pattern": r"\S"}
NAME: Schema = {"type": "string", "pattern": _whole(NAME_PATTERN.pattern)}
SCALAR: Schema = {"type": ["string", "number", "boolean", "null"]}
NUMBER: Schema = {"type": "number", "exclusiveMinimum": 0}
FLAGS: Schema = {
    "type": ["object", "null"],
    "propertyNames": {"pattern": _whole(FLAG_PATTERN.pattern)},
    "additionalProperties": SCALAR,
}


def _one_or_list(item: Schema) -> Schema:
    """The readers take a lone value where a list is expected."""
    return {"anyOf": [item, {"type": "array", "items": item}]}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/definitions/{name}"}


def _size() -> Schema:
    # The reader lower-cases the size first, so upper-case units are accepted too.
    pattern = SHM_PATTERN.pattern.replace("[bkmg]", "[bkmgBKMG]")
    return {"anyOf": [{"type": "string", "pattern": _whole(pattern)}, {"type": "integer"}]}


def _trigger() -> Schema:
    any_name = {"env": r"[A-Za-z_][A-Za-z0-9_]*"}  # a variable name; a flag is snake_case
    subjects = [
        rf"{space}\.(?:{'|'.join(names)})"
        if names is not None
        else rf"{space}\.{any_name.get(space, '[a-z][a-z0-9_]*')}"
        for space, names in NAMESPACES.items()
    ]
    comparisons = {op.value: SCALAR for op in Op}
    comparisons.update({op: {"type": "number"} for op in ORDERING})
    comparisons["in"] = {"type": "array", "items": SCALAR}
    condition = {
        "anyOf": [
            SCALAR,
            {"type": "array", "items": SCALAR},
            {
                "type": "object",
                "minProperties": 1,
                "properties": comparisons,
                "additionalProperties": False,
            },
        ]
    }
    return {
        "type": "object",
        "propertyNames": {"pattern": _whole("|".join(subjects))},
        "additionalProperties": condition,
    }


def value_schema(key: Key) -> Schema:
    """The JSON Schema of what the validator's reader for ``key`` accepts."""
    simple: dict[str, Schema] = {
        "text": TEXT,
        "name": NAME,
        "number": NUMBER,
        "number_or_null": {"anyOf": [NUMBER, {"type": "null"}]},
        "boolean": {"type": "boolean"},
        "zero": {"const": 0},
        "flags": FLAGS,
        "seconds": {"type": "number", "minimum": 0},
        "env": {
            "type": "object",
            "propertyNames": {"pattern": _whole(ENV_NAME.pattern)},
            "additionalProperties": {
                "anyOf": [
                    {"type": "string", "pattern": _whole(ENV_VALUE.pattern)},
                    {"type": "number"},
                ]
            },
        },
        "size": _size(),
        "capability": {
            "anyOf": [{"type": "string", "pattern": _whole(CC_PATTERN.pattern)}, {"type": "number"}]
        },
        "version": {"type": ["string", "number", "null"]},
        "specifier": {"type": ["string", "null"]},
        "regex": {"type": "string", "format": "regex"},
        "gpu_name": {"type": "string", "minLength": 1},
        "scalar": {"type": ["string", "number"]},
        "program": {"type": "string", "pattern": _whole(PROGRAM_PATTERN.pattern)},
        "texts": _one_or_list(TEXT),
        "integers": _one_or_list({"type": "integer", "minimum": 1}),
        "names": _one_or_list(NAME),
        "lanes": _one_or_list({"enum": list(LANES)}),
        "globs": _one_or_list(TEXT),
        "trigger": _trigger(),
        "slurm_name": {"type": "string", "pattern": _whole(SLURM_NAME.pattern)},
        "slurm_names": {"type": "string", "pattern": _whole(SLURM_NAMES.pattern)},
        "slurm_constraint": {"type": "string", "pattern": _whole(SLURM_CONSTRAINT.pattern)},
        "slurm_memory": {"type": "string", "pattern": _whole(SLURM_MEMORY.pattern)},
    }
    if key.kind in simple:
        schema = dict(simple[key.kind])
    elif key.kind == "integer":
        schema = {"type": "integer", "minimum": key.minimum or 0}
    elif key.kind == "choice":
        schema = {"enum": list(key.choices)}
    elif key.kind == "choice_or_null":
        schema = {"enum": [*key.choices, None]}
    elif key.kind == "images":
        schema = _images(key)
    elif key.kind in ("section", "sections", "rules", "named"):
        schema = _nested(key)
    else:
        raise ValueError(f"no schema for the kind `{key.kind}` of `{key.name}`")
    return {"description": key.doc, **schema}


def _images(key: Key) -> Schema:
    """A tag, a list of tags and images, or the lane's follow rule (``key.ref``)."""
    assert key.ref is not None, key.name
    listed = {"type": "array", "items": {"anyOf": [NAME, _ref("image")]}}
    return {"anyOf": [NAME, listed, _ref(key.ref)]}


def _nested(key: Key) -> Schema:
    assert key.ref is not None, key.name
    inner = FLAGS if key.ref == "flags" else _ref(key.ref)
    if key.kind == "section":
        return inner
    if key.kind == "named":
        return {
            "type": "object",
            "minProperties": 1,
            "propertyNames": NAME,
            "additionalProperties": inner,
        }
    items: Schema = {"type": "array", "items": inner}
    return {"anyOf": [items, {"type": "null"}]} if key.kind == "rules" else items


def section_schema(section: MappingKind) -> Schema:
    """One mapping: its keys with their values, the required ones, and no others."""
    schema: Schema = {
        "type": "object",
        "description": section.doc,
        "properties": {key.name: value_schema(key) for key in section},
        "additionalProperties": False,
    }
    if section.required:
        schema["required"] = list(section.required)
    if section.name in ("include", "exclude"):
        schema["anyOf"] = [{"required": [axis]} for axis in AXES]
    if section.name == "lanes":
        schema["minProperties"] = 1
    if section.name == "scenario":
        schema.update(_baseline_rule())
    if section.name == "reached":
        schema["oneOf"] = _reached_forms()
    return schema


def _reached_forms() -> list[Schema]:
    """A ``reached`` entry is a log line (``pattern``) or a fact with ``equals`` or ``matches``."""
    line = {"required": ["pattern"], "not": {"anyOf": [{"required": [k]} for k in REACHED_FACT]}}
    tests = [
        {"required": ["fact", test], "not": {"anyOf": [{"required": [k]} for k in others]}}
        for test in REACHED_FACT[1:]
        for others in [(*REACHED_LINE, *(t for t in REACHED_FACT[1:] if t != test))]
    ]
    return [line, *tests]


def _baseline_rule() -> Schema:
    """A baseline expects no crash; every other scenario documents one."""
    return {
        "if": {"properties": {"baseline": {"const": True}}, "required": ["baseline"]},
        "then": {"not": {"anyOf": [{"required": [key]} for key in BASELINE_FORBIDDEN]}},
        "else": {"required": list(CRASH_REQUIRED)},
    }


def document_schema(kind: str) -> Schema:
    """The whole schema of ``matrix`` or ``scenario`` files: the root mapping and its parts."""
    sections = MATRIX_SECTIONS if kind == "matrix" else SCENARIO_SECTIONS
    root, *parts = sections
    titles = {"matrix": "repromatrix matrix.yaml", "scenario": "repromatrix scenario file"}
    return {
        "$schema": DRAFT,
        "title": titles[kind],
        **section_schema(root),
        "definitions": {part.name: section_schema(part) for part in parts},
    }


def schema_text(kind: str) -> str:
    """The schema as the published file holds it."""
    return json.dumps(document_schema(kind), indent=2) + "\n"

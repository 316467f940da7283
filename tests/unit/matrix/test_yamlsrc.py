"""YAML with positions: every value knows its line and column, and bad YAML is a ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest

from repromatrix.errors import ConfigError
from repromatrix.matrix.yamlsrc import (
    Reader,
    YMap,
    YScalar,
    YSeq,
    load_yaml,
    parse_yaml,
    to_plain,
)


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "f.yaml")
    return [str(p) for p in info.value.problems]


def test_positions_of_keys_and_values() -> None:
    root = parse_yaml("lanes:\n  gpu:\n    images: [v0.31.0, nightly]\n", "m.yaml")
    assert isinstance(root, YMap)
    lanes = root.get("lanes")
    assert isinstance(lanes, YMap)
    entry = lanes.entries[0]
    assert (entry.key, entry.where.line, entry.where.column) == ("gpu", 2, 3)
    gpu = entry.value
    assert isinstance(gpu, YMap)
    images = gpu.get("images")
    assert isinstance(images, YSeq)
    assert [(i.where.line, i.where.column) for i in images.items] == [(3, 14), (3, 23)]
    assert to_plain(root) == {"lanes": {"gpu": {"images": ["v0.31.0", "nightly"]}}}


def test_scalars_are_typed_but_keys_stay_text() -> None:
    root = parse_yaml("on: 1\nyes: 2.5\n3: null\nx: true\nd: 2024-01-02\n", "f")
    assert to_plain(root) == {"on": 1, "yes": 2.5, "3": None, "x": True, "d": "2024-01-02"}


def test_merge_keys_are_resolved() -> None:
    root = parse_yaml("base: &b {a: 1, b: 2}\nderived:\n  <<: *b\n  b: 3\n", "f")
    assert to_plain(root) == {"base": {"a": 1, "b": 2}, "derived": {"a": 1, "b": 3}}
    assert problems("b: &b {a: 1}\nd:\n  <<: *b\n  a: 2\n  a: 3\n") == [
        "f.yaml:5:3: duplicate key `a` (first at line 4)"
    ]


def test_duplicate_keys_are_reported_with_both_lines() -> None:
    assert problems("a: 1\nb: 2\na: 3\n") == ["f.yaml:3:1: duplicate key `a` (first at line 1)"]


def test_syntax_error_has_line_and_column() -> None:
    (message,) = problems("a: [1, 2\nb: 3\n")
    assert message.startswith("f.yaml:2:2: YAML syntax error")


def test_empty_file_and_unsupported_tags() -> None:
    assert problems("") == ["f.yaml: the file is empty"]
    assert problems("# only a comment\n") == ["f.yaml: the file is empty"]
    (message,) = problems("a: !!python/object:os.system x\n")
    assert "unsupported YAML tag" in message and message.startswith("f.yaml:1:4")
    assert "unsupported YAML tag" in problems("a: !custom 3\n")[0]
    assert to_plain(parse_yaml("a: 2024-13-45\n", "f")) == {"a": "2024-13-45"}  # text, not a date


def test_non_mapping_keys_are_reported() -> None:
    assert problems("? [a, b]\n: 1\n") == [
        "f.yaml:1:3: a key must be plain text, not a list or mapping"
    ]


def test_recursive_alias_is_a_problem_not_a_hang() -> None:
    (message,) = problems("a: &x [1, *x]\n")
    assert "refers to itself" in message


def test_alias_bomb_is_bounded() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]"
        for i in range(1, 9)
    ]
    (message,) = problems("\n".join(lines) + "\n")
    assert "alias bomb" in message


def test_files_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="is a folder"):
        load_yaml(tmp_path)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_yaml(binary)


def test_reader_collects_every_problem_and_suggests_keys() -> None:
    root = parse_yaml("imagez: 1\ncount: true\nname: Bad_Name\n", "f")
    assert isinstance(root, YMap)
    reader = Reader()
    reader.keys(root, ("images", "count", "name", "needed"), "a thing", required=("needed",))
    assert reader.integer(root.get("count") or root, "`count`") is None  # a boolean is no integer
    assert reader.name(root.get("name") or root, "name") is None
    messages = [p.message for p in reader.problems]
    assert "unknown key `imagez` in a thing. Perhaps you meant `images`?" in messages
    assert "a thing is missing the required key `needed`" in messages
    assert any("must be a whole number, not the boolean true" in m for m in messages)
    assert any("must be lower case" in m for m in messages)
    with pytest.raises(ConfigError) as info:
        reader.check()
    assert len(info.value.problems) == 4


def test_reader_numbers_reject_non_finite_and_huge() -> None:
    reader = Reader()
    where = parse_yaml("a: 1\n", "f").where
    assert reader.number(YScalar(where, float("nan")), "x") is None
    assert reader.number(YScalar(where, 10**400), "x") is None
    assert reader.number(YScalar(where, -1), "x", positive=True) is None
    assert reader.number(YScalar(where, 3), "x", positive=True) == 3.0
    assert len(reader.problems) == 3

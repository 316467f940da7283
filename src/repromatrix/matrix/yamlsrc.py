"""YAML loaded with the line and column of every key and value.

PyYAML's composer already knows where each node starts; this module keeps
that position on every value it hands back, so a loader can point at the
exact key or value that is wrong. Mapping keys are kept as the text written
in the file (``on:`` stays the key ``"on"``, not ``True``), duplicate keys
are reported, and anything that is not plain data (custom tags, on scalars,
mappings and lists alike, binary, recursive aliases, alias bombs) becomes a
problem instead of a value, as does a control character anywhere (even in a
comment): each problem is one line with its line and column, never PyYAML's
own multi-line message.

The limits hold while the file is read and composed, not after: at most
``MAX_BYTES`` are read, only from a regular file (a FIFO or a device is
refused without waiting on it), and composition stops at ``MAX_DEPTH`` levels
or ``MAX_NODES`` values, so a hostile file never builds a large tree or
exhausts the interpreter's stack.
"""

from __future__ import annotations

import functools
import math
import os
import re
import stat
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import yaml

from repromatrix.errors import ConfigError, Problem, suggest

Scalar: TypeAlias = str | int | float | bool | None

# Nodes converted per document: far above any real matrix, far below an alias bomb.
MAX_NODES = 200_000
MAX_DEPTH = 64
MAX_BYTES = 4 << 20  # a matrix or scenario file is a few kilobytes
# Texts up to this size are parsed once per process (the reports read the scenarios on every
# write, a run once per cell): the nodes are frozen, so one parse serves every reader.
_REMEMBERED_BYTES = 64 << 10

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_TAG}{name}" for name in ("str", "int", "float", "bool", "null")}
# A mapping or a list as plain data: the one tag each may have.
_COLLECTION_TAGS: dict[type[yaml.Node], str] = {
    yaml.MappingNode: f"{_TAG}map",
    yaml.SequenceNode: f"{_TAG}seq",
}
_TEXT_TAGS = {f"{_TAG}timestamp"}  # kept as written: a date is just text to us


@dataclass(frozen=True)
class Location:
    """A position in a source file (1-based line and column)."""

    file: str
    line: int
    column: int

    def problem(self, message: str) -> Problem:
        """Return a ``Problem`` at this position."""
        return Problem(self.file, self.line, self.column, message)


@dataclass(frozen=True)
class YScalar:
    """A scalar value (string, number, boolean or null) and where it was written."""

    where: Location
    value: Scalar


@dataclass(frozen=True)
class YSeq:
    """A sequence and where it starts."""

    where: Location
    items: tuple[YNode, ...]


@dataclass(frozen=True)
class YEntry:
    """One ``key: value`` pair of a mapping; ``where`` is the key's position."""

    key: str
    where: Location
    value: YNode
    explicit: bool = True  # False: it came from a `<<:` merge key


@dataclass(frozen=True)
class YMap:
    """A mapping, its entries in file order, and where it starts."""

    where: Location
    entries: tuple[YEntry, ...]

    def get(self, key: str) -> YNode | None:
        """Return the value for ``key``, or ``None`` when it is absent."""
        for entry in self.entries:
            if entry.key == key:
                return entry.value
        return None

    def __iter__(self) -> Iterator[YEntry]:
        return iter(self.entries)


YNode: TypeAlias = YScalar | YSeq | YMap


def describe(node: YNode) -> str:
    """Return a short description of a node's type for messages ("a mapping", "the number 3")."""
    if isinstance(node, YMap):
        return "a mapping"
    if isinstance(node, YSeq):
        return "a list"
    value = node.value
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    return f"the text {value!r}"


def to_plain(node: YNode) -> object:
    """Return the node as plain Python data (dicts, lists, scalars), positions dropped."""
    if isinstance(node, YScalar):
        return node.value
    if isinstance(node, YSeq):
        return [to_plain(item) for item in node.items]
    return {entry.key: to_plain(entry.value) for entry in node.entries}


def load_yaml(path: Path, display: str | None = None) -> YNode:
    """Read and parse one YAML document; raise ``ConfigError`` for any problem, never a traceback.

    ``display`` is the file name used in messages (defaults to ``str(path)``).
    """
    name = display or str(path)
    try:
        text = read_bounded(path).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError([Problem(name, 0, 0, "no such file")]) from None
    except IsADirectoryError:
        raise ConfigError([Problem(name, 0, 0, "is a folder, not a YAML file")]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(name, 0, 0, f"is not UTF-8 text ({exc.reason})")]) from None
    except OSError as exc:
        raise ConfigError([Problem(name, 0, 0, f"cannot be read: {exc.strerror}")]) from None
    except ValueError as exc:
        raise ConfigError([Problem(name, 0, 0, str(exc))]) from None
    return parse_yaml(text, name)


def read_bounded(path: Path, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path``; ``ValueError`` for anything else or too large.

    The file is opened without blocking, so a FIFO nobody writes to is refused
    at once instead of hanging the command.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(0, "is a folder", str(path))
        if not stat.S_ISREG(mode):
            raise ValueError("is not a regular file (a FIFO, a socket or a device)")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"is larger than {limit >> 20} MiB: not a matrix or scenario file")
    return data


def parse_yaml(text: str, file: str) -> YNode:
    """Parse YAML text into located nodes; raise ``ConfigError`` listing every problem found."""
    if len(text) <= _REMEMBERED_BYTES:
        return _parse_remembered(text, file)
    return _parse(text, file)


@functools.lru_cache(maxsize=256)  # a problem raises, and is never remembered
def _parse_remembered(text: str, file: str) -> YNode:
    return _parse(text, file)


def _parse(text: str, file: str) -> YNode:
    if len(text) > MAX_BYTES:
        raise ConfigError([Problem(file, 0, 0, f"is larger than {MAX_BYTES >> 20} MiB")])
    try:
        loader = _BoundedLoader(text)  # the reader refuses control characters here
    except yaml.reader.ReaderError as exc:
        raise ConfigError([_character_problem(exc, text, file)]) from None
    try:
        root = loader.get_single_node()
    except _TooBig as exc:
        mark = exc.problem_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        raise ConfigError([Problem(file, line, column, str(exc.problem))]) from None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError([_yaml_problem(exc, file)]) from None
    except yaml.YAMLError as exc:  # errors without a position
        raise ConfigError([Problem(file, 0, 0, f"YAML error: {_one_line(exc)}")]) from None
    finally:
        loader.dispose()
    if root is None:
        raise ConfigError([Problem(file, 0, 0, "the file is empty")])
    converter = _Converter(file)
    node = converter.convert(root, depth=0)
    if converter.problems:
        raise ConfigError(converter.problems)
    return node


def _character_problem(exc: yaml.reader.ReaderError, text: str, file: str) -> Problem:
    """A character YAML forbids anywhere, even in a comment, at its line and column."""
    before = text[: exc.position]
    line = before.count("\n") + 1
    column = exc.position - (before.rfind("\n") + 1) + 1
    code = exc.character if isinstance(exc.character, int) else ord(exc.character)
    message = f"a control character ({code:#04x}) YAML does not allow, even in a comment"
    return Problem(file, line, column, message)


def _one_line(exc: BaseException | str) -> str:
    """PyYAML's message for one line: its own are several, with marks into its internals."""
    return " ".join(str(exc).split())


def _yaml_problem(exc: yaml.MarkedYAMLError, file: str) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    parts = [_one_line(p) for p in (exc.context, exc.problem) if p]
    message = "YAML syntax error: " + ", ".join(parts) if parts else "YAML syntax error"
    if mark is None:
        return Problem(file, 0, 0, message)
    return Problem(file, mark.line + 1, mark.column + 1, message)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's composer, stopped at ``MAX_DEPTH`` levels and ``MAX_NODES`` nodes as it goes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        """Compose one node, refusing the document once it is too deep or too big."""
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                self._refuse(f"the document nests more than {MAX_DEPTH} levels deep")
            if self._nodes > MAX_NODES:
                self._refuse(f"the document has more than {MAX_NODES} values")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _refuse(self, message: str) -> None:
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        raise _TooBig(None, None, message, mark)


class _TooBig(yaml.MarkedYAMLError):
    """A document past the limits; its message stands alone (it is no syntax error)."""


class _Converter:
    """Turns composed PyYAML nodes into located nodes, collecting problems as it goes."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []
        self.count = 0
        self.active: set[int] = set()  # ids of nodes being converted: recursion guard
        self.constructor = yaml.SafeLoader("")

    def where(self, node: yaml.Node) -> Location:
        mark = node.start_mark
        return Location(self.file, mark.line + 1, mark.column + 1)

    def convert(self, node: yaml.Node, depth: int) -> YNode:
        here = self.where(node)
        self.count += 1
        if self.count > MAX_NODES:
            return self._fail(here, f"the document has more than {MAX_NODES} values (alias bomb?)")
        if depth > MAX_DEPTH or id(node) in self.active:
            return self._fail(here, "the document nests too deeply or refers to itself")
        self.active.add(id(node))
        try:
            if _COLLECTION_TAGS.get(type(node), node.tag) != node.tag:
                return self._fail(here, f"unsupported YAML tag `{node.tag}`: use plain values")
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, here, depth)
            if isinstance(node, yaml.SequenceNode):
                items = tuple(self.convert(item, depth + 1) for item in node.value)
                return YSeq(here, items)
            return self._scalar(node, here)
        finally:
            self.active.discard(id(node))

    def _fail(self, here: Location, message: str) -> YScalar:
        if not any(p.message == message for p in self.problems):
            self.problems.append(here.problem(message))
        return YScalar(here, None)

    def _mapping(self, node: yaml.MappingNode, here: Location, depth: int) -> YMap:
        explicit = sum(1 for key, _ in node.value if key.tag != f"{_TAG}merge")
        try:
            self.constructor.flatten_mapping(node)  # resolves `<<: *defaults` merge keys
        except yaml.YAMLError as exc:
            self.problems.append(here.problem(f"bad merge key (<<): {exc}"))
            return YMap(here, ())
        merged = len(node.value) - explicit  # merged entries come first; the file's own win
        entries: dict[str, YEntry] = {}
        for index, (key_node, value_node) in enumerate(node.value):
            key_where = self.where(key_node)
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append(
                    key_where.problem("a key must be plain text, not a list or mapping")
                )
                continue
            key = str(key_node.value)
            value = self.convert(value_node, depth + 1)
            first = entries.get(key)
            if index >= merged and first is not None and first.explicit:
                message = f"duplicate key `{key}` (first at line {first.where.line})"
                self.problems.append(key_where.problem(message))
                continue
            entries.pop(key, None)
            entries[key] = YEntry(key, key_where, value, explicit=index >= merged)
        return YMap(here, tuple(entries.values()))

    def _scalar(self, node: yaml.Node, here: Location) -> YScalar:
        if node.tag in _TEXT_TAGS:
            return YScalar(here, str(node.value))
        if node.tag not in _SCALAR_TAGS:
            return self._fail(here, f"unsupported YAML tag `{node.tag}`: use plain values")
        try:
            value = self.constructor.construct_object(node, deep=True)
        except Exception as exc:
            return self._fail(here, f"cannot read this value: {_one_line(exc)}")
        if not isinstance(value, str | int | float | bool | None):
            return self._fail(here, f"unsupported value {node.value!r}")
        return YScalar(here, value)


NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]*")


class Reader:
    """Reads typed values out of located nodes, collecting every problem instead of stopping.

    Each accessor returns ``None`` when the value is wrong (after recording why),
    so a loader can keep going and report all problems of a file at once.
    """

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def error(self, where: Location, message: str) -> None:
        """Record a problem at ``where``."""
        self.problems.append(where.problem(message))

    def check(self) -> None:
        """Raise ``ConfigError`` with every recorded problem, if there are any."""
        if self.problems:
            raise ConfigError(sorted(self.problems, key=_problem_order))

    def mapping(self, node: YNode, what: str) -> YMap | None:
        """Return ``node`` if it is a mapping, else record a problem."""
        if isinstance(node, YMap):
            return node
        self.error(node.where, f"{what} must be a mapping, not {describe(node)}")
        return None

    def sequence(self, node: YNode, what: str) -> tuple[YNode, ...] | None:
        """Return the items of a list (a lone scalar counts as a one-item list)."""
        if isinstance(node, YSeq):
            return node.items
        if isinstance(node, YScalar) and node.value is not None:
            return (node,)
        self.error(node.where, f"{what} must be a list, not {describe(node)}")
        return None

    def keys(
        self, node: YMap, allowed: Collection[str], what: str, required: Collection[str] = ()
    ) -> None:
        """Record unknown keys (with the nearest valid one) and missing required keys."""
        for entry in node:
            if entry.key not in allowed:
                hint = suggest(entry.key, allowed)
                self.error(entry.where, f"unknown key `{entry.key}` in {what}.{hint}")
        present = {entry.key for entry in node}
        for key in required:
            if key not in present:
                self.error(node.where, f"{what} is missing the required key `{key}`")

    def text(self, node: YNode, what: str) -> str | None:
        """Return a non-empty string."""
        if isinstance(node, YScalar) and isinstance(node.value, str) and node.value.strip():
            return node.value
        self.error(node.where, f"{what} must be text, not {describe(node)}")
        return None

    def grammar(self, node: YNode, what: str, check: Callable[[str], str | None]) -> str | None:
        """Return text that ``check`` accepts (``check`` says why a value is refused, or None)."""
        value = self.text(node, what)
        if value is None:
            return None
        if (why := check(value)) is not None:
            self.error(node.where, f"{what} {value!r} is refused: {why}")
            return None
        return value

    def name(self, node: YNode, what: str) -> str | None:
        """Return a name usable in a cell id: lower case letters, digits, ``.``, ``_``, ``-``."""
        value = node.value if isinstance(node, YScalar) else None
        if isinstance(value, str) and NAME_PATTERN.fullmatch(value):
            return value
        if isinstance(value, str):
            self.error(
                node.where,
                f"{what} `{value}` must be lower case letters, digits, `.`, `_` or `-` "
                "(it becomes part of cell ids)",
            )
        else:
            self.error(node.where, f"{what} must be a name, not {describe(node)}")
        return None

    def key_name(self, entry: YEntry, what: str) -> str | None:
        """Return a mapping key that must be a valid name (see ``name``)."""
        return self.name(YScalar(entry.where, entry.key), what)

    def integer(self, node: YNode, what: str, minimum: int | None = None) -> int | None:
        """Return an integer (not a boolean), at least ``minimum`` when given."""
        value = node.value if isinstance(node, YScalar) else None
        if not isinstance(value, int) or isinstance(value, bool):
            self.error(node.where, f"{what} must be a whole number, not {describe(node)}")
            return None
        if minimum is not None and value < minimum:
            self.error(node.where, f"{what} must be at least {minimum}, not {value}")
            return None
        return value

    def number(self, node: YNode, what: str, positive: bool = False) -> float | None:
        """Return a finite number (int or float, not a boolean), above 0 when ``positive``."""
        value = node.value if isinstance(node, YScalar) else None
        if not isinstance(value, int | float) or isinstance(value, bool):
            self.error(node.where, f"{what} must be a number, not {describe(node)}")
            return None
        number = float(value) if abs(value) < 1e300 else math.inf
        if not math.isfinite(number) or (positive and number <= 0):
            self.error(node.where, f"{what} must be a positive finite number, not {value}")
            return None
        return number

    def boolean(self, node: YNode, what: str) -> bool | None:
        """Return ``true`` or ``false``."""
        value = node.value if isinstance(node, YScalar) else None
        if isinstance(value, bool):
            return value
        self.error(node.where, f"{what} must be true or false, not {describe(node)}")
        return None

    def scalar(self, node: YNode, what: str) -> tuple[bool, Scalar]:
        """Return ``(True, value)`` for any scalar (a flag value), ``(False, None)`` otherwise."""
        if isinstance(node, YScalar):
            return True, node.value
        self.error(node.where, f"{what} must be a single value, not {describe(node)}")
        return False, None

    def flags(self, node: YNode, what: str) -> dict[str, Scalar] | None:
        """Return a mapping of snake_case flag names to scalar values."""
        if isinstance(node, YScalar) and node.value is None:
            return {}
        body = self.mapping(node, what)
        if body is None:
            return None
        flags: dict[str, Scalar] = {}
        for entry in body:
            if not FLAG_PATTERN.fullmatch(entry.key):
                hint = " (use snake_case: max_lora_rank, not --max-lora-rank)"
                self.error(entry.where, f"`{entry.key}` is not a flag name{hint}")
                continue
            ok, value = self.scalar(entry.value, f"flag `{entry.key}`")
            if ok and entry.key in SIZE_FLAGS:
                ok = self.integer(entry.value, f"flag `{entry.key}`", minimum=1) is not None
            if ok:
                flags[entry.key] = value
        return flags

    def strings(self, node: YNode, what: str) -> dict[str, str] | None:
        """Return a mapping of names to text (environment variables)."""
        body = self.mapping(node, what)
        if body is None:
            return None
        out: dict[str, str] = {}
        for entry in body:
            value = entry.value
            if isinstance(value, YScalar) and isinstance(value.value, str | int | float):
                out[entry.key] = str(value.value)
            else:
                self.error(value.where, f"{what} `{entry.key}` must be text, not {describe(value)}")
        return out


FLAG_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
# Flags vLLM reads as a count of GPUs (workers): whole numbers, at least 1 (checked here so
# that a 0 or a negative size is an error at its line wherever it is written).
SIZE_FLAGS = frozenset(("tensor_parallel_size", "pipeline_parallel_size"))


def _problem_order(problem: Problem) -> tuple[str, int, int]:
    return (problem.file, problem.line, problem.column)

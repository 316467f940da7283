"""The catalogue of causes: what a log line means and what to do about it, as data.

``repromatrix/data/triage_causes.yaml`` (package data) lists entries in order;
the first entry that matches a text names it. Each entry has a role: a
``cause`` (GPU out of memory, KV cache too small...), a ``consequence``
(vLLM's generic re-raises such as ``Engine core initialization failed``, never
a root cause) or ``weak`` evidence (interrupts, timeouts, masking messages: a
root cause only when nothing else is found); ``noise`` marks harmless messages
vLLM logs even at ERROR level; ``request`` marks a request the running server
refused (a prompt or ``max_tokens`` beyond the model's context), never a cause.
Consequences come before causes in the file, so a re-raise that quotes its cause
(``Worker failed with error 'CUDA out of memory'``) is not mistaken for it.

Where vLLM has a flag or an environment variable for the fix, ``fix_flags`` says it
as data (``fixes.py``): the changes that may avoid the cause. ``flag_bounds`` (top
level) gives the values vLLM accepts for each flag a fix lowers or raises, so a drafted
workaround never leaves that range. Every problem in the file is reported with its line.

Patterns are written in the subset of regular expressions that Python, RE2 and
``grep -E`` read alike (no ``\\d``, no ``(?:``), so the benchmark can run grep
with exactly the same patterns; they are matched by RE2 (``patterns.py``).

Searching a line with each of the catalogue's ~270 patterns costs far more than
checking whether the line contains each pattern's required literal (``in`` runs
in C), so ``Catalogue.match`` searches only the entries whose literal the line
holds. ``required_literal`` finds the longest run of plain characters that every
match must contain, conservatively: anything inside groups, classes,
alternations or optional parts is skipped, so the result may be shorter than
possible but never wrong. An empty result means "always search".
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from repromatrix.errors import ConfigError, Problem, suggest
from repromatrix.patterns import LiteralSet, Pattern, compile_pattern, regex_problem
from repromatrix.triage.fixes import BOUNDS_KEY, Bounds, FlagFix, parse_bounds, parse_fix_flags
from repromatrix.triage.fixes import KEY as FIX_FLAGS

BUILTIN = "triage_causes.yaml"
# libyaml's safe loader when PyYAML has it: reading the catalogue is a fixed cost of every run.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
LAYERS = ("image_pull", "container_start", "engine_startup", "first_request", "hang")
_REQUIRED = ("category", "title", "role", "explanation", "fix")
_OPTIONAL = (
    "patterns",
    "frames",
    "exceptions",
    "layer",
    "fatal",
    "as_warning",
    "after_shutdown_noise",
    FIX_FLAGS,
)
# How the prefilter reads a pattern's characters.
_SPECIAL = set(".^$*+?{}[]()|\\")
_BREAKING_ESCAPES = set("bBdDsSwWAZ")  # classes and anchors, not characters
_MAKES_OPTIONAL = set("?*{")  # the character before these may be absent


class Role(enum.StrEnum):
    """What a matching line is to the reasoning."""

    CAUSE = "cause"
    WEAK = "weak"
    CONSEQUENCE = "consequence"
    NOISE = "noise"  # known harmless messages, even at ERROR level
    REQUEST = "request"  # a request the running server refused: a request error
    # What the engine is waiting for (resources, a download, a lock): never a cause alone;
    # the cause of a start ended from outside (a signal, a time-out) while it waited.
    WAITING = "waiting"

    @property
    def never_root(self) -> bool:
        """Consequences, noise and refused requests are never a root cause."""
        return self in (Role.CONSEQUENCE, Role.NOISE, Role.REQUEST)


@dataclass(frozen=True)
class Cause:
    """One entry of the catalogue."""

    category: str
    title: str
    role: Role
    explanation: str
    fix: str
    patterns: tuple[str, ...] = ()  # searched in the message (exception type and text)
    frames: tuple[str, ...] = ()  # searched in the traceback's frames and source lines
    exceptions: tuple[str, ...] = ()  # when set, the exception's class name must be one of these
    layer: str | None = None  # fixed layer; None: from where in the log it happened
    fatal: bool = False  # a consequence that means the engine start is over
    as_warning: bool = False  # a cause even when vLLM logs it only as a WARNING
    # A report that a process ended: once the engine has logged its own orderly shutdown
    # (``Shutdown complete``), it is that shutdown, never a cause.
    after_shutdown_noise: bool = False
    fix_flags: tuple[FlagFix, ...] = ()  # the fix as flag and environment changes (fixes.py)
    regex: Pattern | None = field(default=None, compare=False, repr=False)
    frame_regex: Pattern | None = field(default=None, compare=False, repr=False)

    def matches(self, text: str, exception: str | None, frames: Sequence[str]) -> bool:
        """Whether this entry names a failure: its message or its frames match, and its class."""
        if self.exceptions and (exception or "").rsplit(".", 1)[-1] not in self.exceptions:
            return False
        if self.regex is not None and self.regex.search(text):
            return True
        return self.frame_regex is not None and any(self.frame_regex.search(f) for f in frames)


@dataclass(frozen=True)
class Catalogue:
    """The ordered entries; the first match wins."""

    causes: tuple[Cause, ...]
    # Each engine flag's valid values (``flag_bounds``), so a drafted workaround stays valid.
    bounds: Mapping[str, Bounds] = field(default_factory=lambda: MappingProxyType({}))

    def match(
        self,
        text: str,
        exception: str | None = None,
        frames: Sequence[str] = (),
        *,
        warning: bool = False,
    ) -> Cause | None:
        """The first entry naming ``text``; for a WARNING line only causes marked ``as_warning``."""
        index, unfiltered, by_frames = self._prefilter
        # Only entries whose required text occurs in the line are searched with regexes.
        candidates = {index[j][1] for j in self._literals.present(text)} | unfiltered
        for i in sorted(candidates | by_frames if frames else candidates):
            cause = self.causes[i]
            if warning and cause.role is Role.CAUSE and not cause.as_warning:
                continue
            if cause.matches(text, exception, frames):
                return cause
        return None

    @functools.cached_property
    def _literals(self) -> LiteralSet:
        """The prefilter's literals, found in one pass over a line."""
        return LiteralSet(tuple(literal for literal, _ in self._prefilter[0]))

    @functools.cached_property
    def _prefilter(self) -> tuple[tuple[tuple[str, int], ...], frozenset[int], frozenset[int]]:
        """(required literal, entry) pairs; entries with a pattern that has none; by frames."""
        index: list[tuple[str, int]] = []
        unfiltered: set[int] = set()
        for i, cause in enumerate(self.causes):
            for pattern in cause.patterns:
                literal = required_literal(pattern)
                if len(literal) >= 3:
                    index.append((literal, i))
                else:
                    unfiltered.add(i)
        by_frames = frozenset(i for i, c in enumerate(self.causes) if c.frame_regex is not None)
        return tuple(index), frozenset(unfiltered), by_frames

    def patterns(self) -> tuple[str, ...]:
        """Every message pattern, in order (what the benchmark gives grep)."""
        return tuple(p for cause in self.causes for p in cause.patterns)

    def category(self, name: str) -> Cause | None:
        """The entry of a category, or None."""
        return next((c for c in self.causes if c.category == name), None)


@functools.cache
def builtin_catalogue() -> Catalogue:
    """The catalogue shipped with repromatrix (``repromatrix/data/triage_causes.yaml``)."""
    source = resources.files("repromatrix").joinpath("data", BUILTIN)
    return parse_catalogue(source.read_text(encoding="utf-8"), BUILTIN)


def load_catalogue(path: Path) -> Catalogue:
    """Read a catalogue file; every problem in it is reported at once as a ``ConfigError``."""
    try:
        body = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Problem(str(path), 0, 0, f"cannot read: {exc}")]) from exc
    return parse_catalogue(body, str(path))


def parse_catalogue(body: str, file: str) -> Catalogue:
    """Build a catalogue from YAML text; ``file`` names it in error messages, with the line."""
    try:
        data, root = _load(body)
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(file, 0, 0, f"not valid YAML: {exc}")]) from exc
    entries = data.get("causes") if isinstance(data, Mapping) else None
    if not isinstance(entries, list):
        raise ConfigError([Problem(file, 0, 0, "expected a mapping with a `causes:` list")])
    within = _Located(file, root).at(("causes",), value=True)
    problems: list[Problem] = []
    causes = [_entry(item, within.at((i,)), problems) for i, item in enumerate(entries)]
    bounds, issues = parse_bounds(data.get(BOUNDS_KEY))
    top = _Located(file, root)
    problems.extend(top.at(path).problem(message) for path, message in issues)
    if problems:
        raise ConfigError(problems)
    return Catalogue(tuple(c for c in causes if c is not None), MappingProxyType(bounds))


def _load(body: str) -> tuple[Any, yaml.Node | None]:
    """The YAML's data and its composed nodes (which know their lines), with a safe loader."""
    loader = _LOADER(body)
    try:
        root = loader.get_single_node()
        return (loader.construct_document(root) if root is not None else None), root
    finally:
        loader.dispose()


@dataclass(frozen=True)
class _Located:
    """A node of the catalogue file, to report a problem with it at its file and line."""

    file: str
    node: yaml.Node | None

    def problem(self, message: str) -> Problem:
        """A problem at this node's line and column."""
        mark = self.node.start_mark if self.node is not None else None
        if mark is None:
            return Problem(self.file, 0, 0, message)
        return Problem(self.file, mark.line + 1, mark.column + 1, message)

    def at(self, path: tuple[str | int, ...], *, value: bool = False) -> _Located:
        """The node at ``path`` (keys and indices), as deep as it exists; a key's own node
        for the last key, unless ``value``."""
        node = self.node
        for depth, step in enumerate(path):
            last = depth == len(path) - 1
            if isinstance(node, yaml.SequenceNode) and isinstance(step, int):
                node = node.value[step] if step < len(node.value) else node
            elif isinstance(node, yaml.MappingNode):
                pair = next((kv for kv in node.value if kv[0].value == step), None)
                if pair is None:
                    break
                node = pair[0] if last and not value else pair[1]
            else:
                break
        return _Located(self.file, node)


def _entry(item: Any, where: _Located, problems: list[Problem]) -> Cause | None:
    if not isinstance(item, Mapping):
        problems.append(where.problem("expected a mapping"))
        return None
    found = len(problems)
    for key in _REQUIRED:
        if not isinstance(item.get(key), str) or not item[key].strip():
            problems.append(where.at((key,)).problem(f"`{key}` must be a non-empty string"))
    for key in sorted(set(item) - set(_REQUIRED) - set(_OPTIONAL), key=str):
        hint = suggest(str(key), (*_REQUIRED, *_OPTIONAL))
        message = f"unknown key `{key}`." + hint if hint else f"unknown key `{key}`"
        problems.append(where.at((key,)).problem(message))
    lists = {k: _strings(item.get(k), where.at((k,)), problems) for k in _OPTIONAL[:3]}
    if not lists["patterns"] and not lists["frames"]:
        problems.append(where.problem("needs `patterns` or `frames`"))
    if item.get("role") not in tuple(Role):
        problems.append(where.at(("role",)).problem(f"`role` must be one of {', '.join(Role)}"))
    if item.get("layer") not in (None, *LAYERS):
        message = f"`layer` must be one of {', '.join(LAYERS)}"
        problems.append(where.at(("layer",)).problem(message))
    for key in ("fatal", "as_warning", "after_shutdown_noise"):
        if not isinstance(item.get(key, False), bool):
            problems.append(where.at((key,)).problem(f"`{key}` must be true or false"))
    fix_flags, issues = parse_fix_flags(item.get(FIX_FLAGS))
    problems.extend(where.at(path).problem(message) for path, message in issues)
    regex = _compile(lists["patterns"], where.at(("patterns",)), problems)
    frame_regex = _compile(lists["frames"], where.at(("frames",)), problems)
    if len(problems) > found:
        return None
    return Cause(
        category=item["category"],
        title=item["title"],
        role=Role(item["role"]),
        explanation=" ".join(item["explanation"].split()),
        fix=" ".join(item["fix"].split()),
        patterns=lists["patterns"],
        frames=lists["frames"],
        exceptions=lists["exceptions"],
        layer=item.get("layer"),
        fatal=item.get("fatal", False),
        as_warning=item.get("as_warning", False),
        after_shutdown_noise=item.get("after_shutdown_noise", False),
        fix_flags=fix_flags,
        regex=regex,
        frame_regex=frame_regex,
    )


def _strings(value: Any, where: _Located, problems: list[Problem]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(where.problem("expected a list of non-empty strings"))
        return ()
    return tuple(value)


def _compile(patterns: tuple[str, ...], where: _Located, problems: list[Problem]) -> Pattern | None:
    if not patterns:
        return None
    for pattern in patterns:
        if (why := regex_problem(pattern)) is not None:
            problems.append(where.problem(f"bad pattern {pattern!r}: {why}"))
            return None
    return compile_pattern("|".join(f"({p})" for p in patterns))


def required_literal(pattern: str) -> str:
    """The longest literal every match of ``pattern`` contains ("" when none can be told)."""
    return max(required_literals(pattern), key=len, default="")


@functools.lru_cache(maxsize=4096)  # each triager asks again of every catalogue pattern
def required_literals(pattern: str) -> tuple[str, ...]:
    """Every literal run that each match of ``pattern`` contains, longest first."""
    # Cached: every triager's warning filter asks it of every pattern of the catalogue.
    if _top_level_alternation(pattern):
        return ()
    runs: list[str] = []
    run: list[str] = []
    depth = 0
    i = 0
    while i < len(pattern):
        char, i = pattern[i], i + 1
        literal: str | None = None
        if char == "\\" and i < len(pattern):
            escaped, i = pattern[i], i + 1
            literal = None if escaped in _BREAKING_ESCAPES or escaped.isalnum() else escaped
        elif char == "[":
            i = _after_class(pattern, i)
        elif char == "{" and "}" in pattern[i:]:
            i = pattern.index("}", i) + 1  # a repeat count, not text
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif char not in _SPECIAL:
            literal = char
        if literal is not None and depth == 0:
            optional = i < len(pattern) and pattern[i] in _MAKES_OPTIONAL
            run.append("" if optional else literal)
            if not optional:
                continue
        runs.append("".join(run))
        run = []
    runs.append("".join(run))
    return tuple(sorted((r for r in runs if r), key=len, reverse=True))


def _after_class(pattern: str, i: int) -> int:
    """The index after the ``]`` closing a character class that opened before ``i``."""
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1  # a leading ] is a member
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _top_level_alternation(pattern: str) -> bool:
    depth, i = 0, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            i = _after_class(pattern, i + 1)
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "|" and depth == 0:
            return True
        i += 1
    return False

"""The text a regular expression cannot match without: a cheap prefilter for many patterns.

Searching a line with each of the catalogue's ~270 patterns costs far more than
checking whether the line contains each pattern's required literal (``in`` runs
in C). ``required_literal`` finds the longest run of plain characters that every
match must contain, conservatively: anything inside groups, classes,
alternations or optional parts is skipped, so the result may be shorter than
possible but never wrong. An empty result means "always search".
"""

from __future__ import annotations

_SPECIAL = set(".^$*+?{}[]()|\\")
_BREAKING_ESCAPES = set("bBdDsSwWAZ")  # classes and anchors, not characters
_OPTIONAL = set("?*{")  # the character before these may be absent


def required_literal(pattern: str) -> str:
    """The longest literal every match of ``pattern`` contains ("" when none can be told)."""
    return max(required_literals(pattern), key=len, default="")


def required_literals(pattern: str) -> tuple[str, ...]:
    """Every literal run that each match of ``pattern`` contains, longest first."""
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
            optional = i < len(pattern) and pattern[i] in _OPTIONAL
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

"""Selecting cells by glob on their ids: ``--only`` and ``--skip``.

Globs use ``*`` (any run of characters, ``/`` included, so ``*moe-lora*``
finds a scenario wherever it sits in the id), ``?``, ``[...]`` and brace
expansion ``{a,b}`` (nested braces work; a brace with no comma is literal, as
in the shell). A cell is selected when it matches some ``--only`` glob (or
none is given) and no ``--skip`` glob.

``could_select(prefix)`` lets expansion drop a whole branch of the matrix
(say every cell under ``cpu/``) without building its cells.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from repromatrix.errors import UsageError

MAX_ALTERNATIVES = 10_000
_META = re.compile(r"[*?\[]")


def expand_braces(pattern: str) -> list[str]:
    """Return the alternatives of ``pattern``: ``a{b,c}d`` gives ``abd`` and ``acd``."""
    span = _first_brace(pattern)
    if span is None:
        return [pattern]
    start, end, parts = span
    head, tail = pattern[:start], pattern[end + 1 :]
    results: list[str] = []
    for part in parts:
        for rest in expand_braces(head + part + tail):
            results.append(rest)
            if len(results) > MAX_ALTERNATIVES:
                raise UsageError(
                    f"the glob {pattern!r} expands to over {MAX_ALTERNATIVES} patterns"
                )
    return results


def _first_brace(pattern: str) -> tuple[int, int, list[str]] | None:
    """Find the first balanced ``{...}`` with a top-level comma: (start, end, alternatives)."""
    for start, char in enumerate(pattern):
        if char != "{":
            continue
        depth, commas = 0, list[int]()
        for index in range(start, len(pattern)):
            if pattern[index] == "{":
                depth += 1
            elif pattern[index] == "}":
                depth -= 1
                if depth == 0:
                    if not commas:
                        break  # `{x}`: literal, look for the next brace
                    bounds = [start, *commas, index]
                    parts = [pattern[a + 1 : b] for a, b in itertools.pairwise(bounds)]
                    return start, index, parts
            elif pattern[index] == "," and depth == 1:
                commas.append(index)
    return None


def _literal_prefix(pattern: str) -> str:
    match = _META.search(pattern)
    return pattern if match is None else pattern[: match.start()]


def _compile(patterns: Sequence[str]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def _check(patterns: Sequence[str], option: str) -> tuple[str, ...]:
    for pattern in patterns:
        if not pattern.strip():
            raise UsageError(f"{option} needs a glob, not an empty string")
    return tuple(patterns)


@dataclass(frozen=True)
class Selector:
    """``--only`` and ``--skip`` globs, compiled once."""

    only: Sequence[str] = ()
    skip: Sequence[str] = ()
    _only: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _skip: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _only_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _skip_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        only = _check(self.only, "--only")
        skip = _check(self.skip, "--skip")
        object.__setattr__(self, "only", only)
        object.__setattr__(self, "skip", skip)
        expanded_only = tuple(p for glob in only for p in expand_braces(glob))
        expanded_skip = tuple(p for glob in skip for p in expand_braces(glob))
        object.__setattr__(self, "_only", expanded_only)
        object.__setattr__(self, "_skip", expanded_skip)
        object.__setattr__(self, "_only_re", _compile(expanded_only))
        object.__setattr__(self, "_skip_re", _compile(expanded_skip))

    @property
    def selects_all(self) -> bool:
        """Return whether this selector keeps every cell (no globs at all)."""
        return not self.only and not self.skip

    def matches(self, cell_id: str) -> bool:
        """Return whether the cell with this id is selected."""
        if self._only_re is not None and not self._only_re.match(cell_id):
            return False
        return self._skip_re is None or not self._skip_re.match(cell_id)

    def could_select(self, prefix: str) -> bool:
        """Return False only when no id starting with ``prefix`` can be selected.

        It errs towards True: a False lets expansion skip that branch entirely.
        """
        if self._only and not any(_compatible(prefix, p) for p in self._only):
            return False
        return not any(_covers(p, prefix) for p in self._skip)

    def unmatched_only(self, cell_ids: Sequence[str]) -> tuple[str, ...]:
        """Return the ``--only`` globs that match none of ``cell_ids`` (each compiled once)."""
        unmatched = []
        for glob in self.only:
            compiled = _compile(expand_braces(glob))
            assert compiled is not None  # a glob expands to one pattern at least
            if not any(compiled.match(cell_id) for cell_id in cell_ids):
                unmatched.append(glob)
        return tuple(unmatched)


def _compatible(prefix: str, pattern: str) -> bool:
    literal = _literal_prefix(pattern)
    return literal.startswith(prefix) or prefix.startswith(literal)


def _covers(pattern: str, prefix: str) -> bool:
    """A skip glob ``lit*`` (no other wildcard) covers every id under a prefix starting ``lit``."""
    literal = _literal_prefix(pattern)
    return pattern == literal + "*" and prefix.startswith(literal)

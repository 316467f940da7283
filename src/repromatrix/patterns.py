"""Regular expressions that come from data, matched in time linear in the text.

Scenario signatures, ``reached`` lines and fact tests, the
triage catalogue and a matrix GPU's ``/name/`` are written by people, and a
backtracking engine (Python's ``re``) can take exponential time on a line that
almost matches: ``ValueError:(.|\\s)*too small$`` or ``(a|a)*$`` on a 70-character
line runs for minutes, and a match in ``re`` cannot be interrupted. So every
pattern from data is compiled and matched by RE2 (``google-re2``), whose time is
linear in the text whatever the pattern: bounded by construction, not by a check
that could miss a shape.

What RE2 cannot take is refused when the file loads, with the reason:
backreferences (``\\1``), look-arounds (``(?=``, ``(?!``, ``(?<=``), possessive
repeats (``a++``), atomic groups (``(?>``) and ``\\Z`` (RE2 writes it ``\\z``).
Differences from ``re`` a pattern may meet: ``\\d``, ``\\w``, ``\\s`` and ``\\b``
are ASCII (``\\s`` is ``[\\t\\n\\f\\r ]``); without ``multiline``, ``$`` matches only
at the very end of the text (lines are searched without their line break, so
this is the same there).

The programs that run inside images have the standard library only, no RE2, and
match no pattern from data: a scenario's ``interrupt_on`` is text, not a pattern
(the harness looks for it in each line as it streams), and a probe reports what
vLLM raised for the runner to match against the scenario's signatures
(``run/cell.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import re2

_MULTILINE = "(?m)"


class PatternError(ValueError):
    """A pattern RE2 cannot take; the message says why."""


@dataclass(frozen=True)
class Pattern:
    """A compiled pattern from data: ``search`` and ``fullmatch`` answer yes or no."""

    text: str
    ignore_case: bool = False
    multiline: bool = False  # ``^`` and ``$`` at every line of a block, not only its ends
    _regex: re2._Regexp[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", _compiled(self.text, self.ignore_case, self.multiline))

    def search(self, text: str) -> bool:
        """Whether the pattern occurs anywhere in ``text``."""
        return self._regex.search(text) is not None

    def fullmatch(self, text: str) -> bool:
        """Whether the pattern matches the whole of ``text``."""
        return self._regex.fullmatch(text) is not None


def compile_pattern(text: str, *, ignore_case: bool = False, multiline: bool = False) -> Pattern:
    """``text`` compiled by RE2; ``PatternError`` says why when RE2 cannot take it."""
    return Pattern(text, ignore_case=ignore_case, multiline=multiline)


def regex_problem(text: str) -> str | None:
    """Why RE2 cannot take ``text`` (``not a valid regular expression: ...``), or ``None``."""
    try:
        compile_pattern(text)
    except PatternError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=4096)
def _compiled(text: str, ignore_case: bool, multiline: bool) -> re2._Regexp[str]:
    # Cached: a fact test or a GPU name is compiled where it is used, line after line.
    options = re2.Options()
    options.log_errors = False  # the reason is raised, not printed on stderr
    options.never_capture = True  # only whether it matches is asked, never a group
    options.case_sensitive = not ignore_case
    try:
        return re2.compile(_MULTILINE + text if multiline else text, options)
    except re2.error as exc:
        raise PatternError(_reason(exc)) from None


def _reason(exc: re2.error) -> str:
    detail = exc.args[0] if exc.args else ""
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", errors="replace")
    return (
        f"not a valid regular expression: {detail} (RE2, which matches in linear time, has no "
        "backreferences, look-arounds, possessive repeats or atomic groups, and writes `\\Z` "
        "as `\\z`)"
    )


class LiteralSet:
    """Which of many literal strings occur in a text, found in one pass (an RE2 set).

    Testing each literal with ``in`` reads the text once per literal: a few hundred
    literals made a 256 KiB line cost hundreds of scans. The set reads it once. The
    literals are all ``str`` (searched in text) or all ``bytes`` (searched byte for byte).
    """

    def __init__(self, literals: tuple[str, ...] | tuple[bytes, ...]) -> None:
        self.literals = literals
        self._set: Any = None  # re2.Set: its stubs take one of str or bytes, not a union
        if literals:
            options = re2.Options()
            options.log_errors = False
            options.never_capture = True
            if isinstance(literals[0], bytes):
                options.encoding = re2.Options.Encoding.LATIN1  # type: ignore[attr-defined]
            self._set = re2.Set.SearchSet(options)
            for literal in literals:
                self._set.Add(re2.escape(literal))  # type: ignore[type-var]
            self._set.Compile()

    def present(self, text: str | bytes) -> list[int]:
        """The indices of the literals that occur in ``text`` (in no particular order)."""
        if self._set is None:
            return []
        found: list[int] | None = self._set.Match(text)  # None when none occurs
        return found or []

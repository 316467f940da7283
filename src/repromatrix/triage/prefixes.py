"""Prefixes the log model does not know, learnt from the traceback headers they carry.

A product that wraps vLLM may put anything before each line (``[worker-3] ``,
``12:00:01.123 w3> ``). A line that ends in ``Traceback (most recent call
last):`` with no level and no known prefix shows such a prefix: the text before
``Traceback``. Its shape (the text with each run of digits free, since time
stamps and counters change from line to line) is learnt, and later lines that
start with the same shape are read without it, so the traceback's frames and
its exception line are read as such.
"""

from __future__ import annotations

import re

from repromatrix.triage.logmodel import Line

MAX_PREFIXES = 4
MAX_PREFIX_CHARS = 80
_TRACEBACK = "Traceback (most recent call last):"
# A prefix ends in a separator; a sentence ending in ": " ("hit an exception: ") is a message.
_PREFIX_END = re.compile(r"(?:[\]>|)}#]|[^\s:,]\s*-)\s*$")


class PrefixLearner:
    """Learns unknown line prefixes from traceback headers and strips them from later lines."""

    def __init__(self) -> None:
        self._shapes: list[re.Pattern[str]] = []

    def __bool__(self) -> bool:
        return bool(self._shapes)

    def learn(self, line: Line) -> None:
        """Learn the prefix of ``line`` when it is a traceback header under an unknown prefix."""
        if line.level is not None or line.stream is not None:
            return
        text = line.text.rstrip()
        if not text.endswith(_TRACEBACK):
            return
        prefix = text[: -len(_TRACEBACK)]
        if not prefix.strip() or len(prefix) > MAX_PREFIX_CHARS or not _PREFIX_END.search(prefix):
            return
        shape = re.compile(re.sub(r"\d+", r"\\d+", re.escape(prefix.rstrip())) + r" ?")
        if all(s.pattern != shape.pattern for s in self._shapes):
            self._shapes = [*self._shapes[-(MAX_PREFIXES - 1) :], shape]

    def remove(self, text: str) -> str | None:
        """``text`` without a learnt prefix, or None when it carries none."""
        for shape in self._shapes:
            match = shape.match(text)
            if match is not None:
                return text[match.end() :]
        return None

"""WARNING lines that cannot matter, told apart on the undecoded bytes.

A log made mostly of vLLM WARNING lines would otherwise cost a full parse and
a catalogue search per line. A WARNING line can matter only through the
catalogue's entries that apply at warning level (causes marked ``as_warning``,
consequences, weak evidence, noise), or as part of a traceback logged at
warning level. So a line with vLLM's WARNING header whose message contains
none of those entries' required literals, and does not look like a traceback
line (a frame, a source line, an exception line, a chain marker), is skipped
like an INFO line.

The literal test runs on the message with every digit read as ``0`` (both in
the message and in the literals): a literal present in the message is still
present then, so nothing that matters is skipped, and warnings repeated with
other numbers (counters, sizes, ids) share one cached answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import compress, repeat
from operator import is_not

from repromatrix.triage.catalogue import Catalogue, Role, required_literals

MAX_CACHED = 4096
# A warning's header (vLLM's, glog's, Python's warnings module) under the wrappers and
# prefixes the INFO fast path knows.
WARNING_HEADER = re.compile(
    rb"(?:\d{4}-\d\d-\d\dT[\d:.]+Z? )?"
    rb"(?:[A-Za-z0-9][\w.-]*\s*\|\s?)?"
    rb"(?:\([^()]*\) |\[rank\d+\]:)*"
    rb"(?:(?:WARNING|WARN) +(?:\d{4}-)?\d\d-\d\d[T ][\d:.,]+ +(?:\[[^\]\s]+\]|[\w.-]+:\d+\]) ?"
    rb"|\[?W\d{4} \d\d:\d\d:\d\d\.\d+ +(?:\d+ )?[\w.-]+:\d+\] ?"
    rb"|\S+\.pyx?:\d+: \w*Warning: )"
)
# Messages that may be a traceback's line: indented (frames, sources), empty, one word that
# may be an exception's name (alone or before a colon; a warning's category is none), a
# chain marker.
_TRACEBACK_LIKE = (
    rb"\s|$|(?![\w.]*Warning:)[\w.]+(?:\[[^\]]*\])?(?:\([\w.]*\))?(?::|$)"
    rb"|The above exception|During handling"
)
# A warning whose message may be nothing but a warning (one match decides both).
_PLAIN_WARNING = re.compile(WARNING_HEADER.pattern + rb"(?!" + _TRACEBACK_LIKE + rb")")
# Text that the slow path's reading changes (escapes, carriage returns), or that opens or
# ends a traceback wherever it stands.
_STRUCTURAL = (b"\x1b", b"^[", b"\r", b"Traceback (most recent", b"what():")
_DIGITS = bytes.maketrans(b"123456789", b"000000000")


class WarningFilter:
    """Tells the WARNING lines that no rule of the catalogue or the reader can use."""

    def __init__(self, catalogue: Catalogue) -> None:
        self._patterns = _warning_literals(catalogue)
        self._seen: dict[bytes, bool] = {}

    def skippable(self, raw: bytes) -> bool:
        """Whether ``raw`` is a WARNING line that cannot matter to the diagnosis."""
        key = raw.translate(_DIGITS)
        known = self._seen.get(key)
        return self._decide(key) if known is None else known

    def unskipped(self, lines: Sequence[bytes], indices: Iterable[int]) -> list[int]:
        """The ``indices`` of ``lines`` that are not skippable, in order.

        Lines already decided cost a translation and a dictionary look-up, both
        run by C code over the whole list; only the others reach ``_decide``.
        """
        if self._patterns is None:
            return list(indices)
        chosen = list(indices)
        keys = list(map(bytes.translate, map(lines.__getitem__, chosen), repeat(_DIGITS)))
        unsure = compress(
            zip(chosen, keys, strict=True), map(is_not, map(self._seen.get, keys), repeat(True))
        )
        return [index for index, key in unsure if not self._decide(key)]

    def _decide(self, key: bytes) -> bool:
        # The whole decision depends on the line with its digits read as 0 (the header's
        # patterns take any digit), so it is cached under that key.
        skippable = self._patterns is not None and _PLAIN_WARNING.match(key) is not None
        skippable = skippable and not self._may_matter(key)
        if len(self._seen) >= MAX_CACHED:
            self._seen.clear()
        self._seen[key] = skippable
        return skippable

    def _may_matter(self, key: bytes) -> bool:
        assert self._patterns is not None
        if any(map(key.__contains__, _STRUCTURAL)):
            return True
        # The whole line: the header's tag may hold a literal too.
        return any(all(map(key.__contains__, runs)) for runs in self._patterns)


def _warning_literals(catalogue: Catalogue) -> tuple[tuple[bytes, ...], ...] | None:
    """For each pattern that applies at warning level, the literals a match must contain.

    None when one of them has no literal of three characters or more to tell it by.
    """
    found: set[tuple[bytes, ...]] = set()
    for cause in catalogue.causes:
        if cause.role is Role.CAUSE and not cause.as_warning:
            continue
        for pattern in cause.patterns:
            runs = tuple(r.encode().translate(_DIGITS) for r in required_literals(pattern))
            if not runs or len(runs[0]) < 3:
                return None
            found.add(runs)
    return tuple(sorted(found))

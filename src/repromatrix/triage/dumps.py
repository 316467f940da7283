"""Dumps (``non-default args: {...}``, ``args: Namespace(...)``, config lines) hard-wrapped
by a paste or a terminal onto lines of their own: which lines are their pieces, and the
dump joined whole again.

The triager reads each piece as part of the dump (it states nothing); ``facts.read_launch``
reads the joined dump. Both apply the same test (``is_dump_piece``), so a line is a piece of
a dump for the one exactly when it is for the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from repromatrix.harness.oomwatch import LINE_PREFIX as HARNESS_LINE
from repromatrix.triage.logmodel import Line, continues_dump, is_dump, parse_line
from repromatrix.triage.tracebacks import is_traceback_line

MIN_WRAP = 60  # a line cut by a paste's hard wrap is at least this long
MAX_JOINED = 1 << 20  # a dump joined from its pieces stops growing here (memory stays bounded)


def is_dump_piece(line: Line) -> bool:
    """Whether ``line`` may be a wrapped piece of a dump: no prefix or header of its own,
    the dump's items (``name=value``, ``'name': value``), no line of a traceback nor the
    harness's. Whether it follows a dump is for the caller to say."""
    return continues_dump(line.text) and _bare(line)


def _bare(line: Line) -> bool:
    if line.level is not None or line.stream is not None:
        return False
    return not line.raw.startswith(HARNESS_LINE) and not is_traceback_line(line.text)


@dataclass
class _Record:
    text: str  # the first line verbatim, the text of each piece joined on
    width: int  # the first line's length: the width a paste cut it at, if it was cut
    last: int  # the last piece's length
    pieces: int = 0


def join_dumps(lines: Iterable[str]) -> Iterator[str]:
    """The lines of a log, each dump with its wrapped pieces joined onto the line it began
    on. The cut may fall inside the words that mark it (``non-default ar`` + ``gs: {``),
    and the last piece may hold no item (``True}``): once a dump was cut at a width, a
    bare line after a piece of exactly that width is its rest."""
    pending: _Record | None = None
    for raw in lines:
        if pending is not None and len(pending.text) < MAX_JOINED and _continues(pending, raw):
            pending.text += parse_line(0, raw).text
            pending.last, pending.pieces = len(raw), pending.pieces + 1
            continue
        if pending is not None:
            yield pending.text
        pending = _Record(raw, len(raw), len(raw))
    if pending is not None:
        yield pending.text


def _continues(record: _Record, raw: str) -> bool:
    cut = record.pieces > 0 and record.last == record.width >= MIN_WRAP
    # The cheap test first: most lines of a log hold no dump items at all.
    if not cut and not continues_dump(raw):
        return False
    line = parse_line(0, raw)
    if not _bare(line) or is_dump(line.text):
        return False  # a line of its own (a dump of its own starts a record)
    return cut or (continues_dump(line.text) and is_dump(record.text + line.text))

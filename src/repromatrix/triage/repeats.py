"""Stretches of a log that repeat the stretch just before them, byte for byte.

A log can be millions of lines that each say nothing or say the same thing: blank lines,
a one-character line, a retry loop printing the same short traceback. Reading each line
costs microseconds of Python however short it is, so such a log took minutes where a
log of long INFO lines of the same size takes a second. A copy of the stretch just read
cannot change the diagnosis: it restates findings that rank no earlier (within a rank
the earliest wins), re-marks what is already marked, and, once enough copies were read to
fill every bounded window of the state (recent lines, a traceback's frames, the last
errors), leaves that state as the copy before it did. So the triager reads copies of a
repeated stretch until they fill ``WINDOW_LINES`` lines (the last one alone, to learn what
one copy adds to the counts it keeps, such as refused requests) and counts the other
copies without reading them, moving the line numbers it keeps along.

Finding a repeat costs a search for the line's next occurrence within ``MAX_UNIT``
bytes and a comparison of doubling runs of copies (``memcmp`` speed), which only blocks
of short lines need: ``dense`` says which.
"""

from __future__ import annotations

from collections.abc import Iterator

MAX_UNIT = 16 << 10  # the longest stretch looked for (a short traceback is a few hundred bytes)
MIN_COPIES = 4  # fewer copies are read
# Copies are read until they fill every window the triager keeps (a traceback's last 48
# frames of two lines each, a process's 8 recent lines, the 12 last errors): from then on,
# each copy leaves the state as the one before it did.
WINDOW_LINES = 128
DENSE_LINE = 64  # bytes: blocks whose lines are shorter on average are searched for repeats


def copies_to_read(lines: int) -> int:
    """How many copies of a stretch of ``lines`` lines are read before the rest are counted."""
    return max(2, -(-WINDOW_LINES // lines))


def dense(block: bytes) -> bool:
    """Whether ``block``'s lines are short enough on average for per-line cost to dominate."""
    return (block.count(b"\n") + 1) * DENSE_LINE > len(block)


def repeats(block: bytes) -> Iterator[tuple[int, int, int]]:
    """The repeated stretches of whole lines of ``block`` (lines joined by ``\\n``).

    Each is ``(start, unit, copies)``: from byte ``start``, ``copies`` (at least
    ``MIN_COPIES``) consecutive copies of the ``unit`` bytes (whole lines, each with its
    ``\\n``; the block's last line counts as ending in one).
    """
    data = block + b"\n"
    end = len(data)
    start = 0
    while start < end:
        stop = data.index(b"\n", start) + 1
        line = data[start:stop]
        found = data.find(b"\n" + line, stop - 1, min(end, start + MAX_UNIT + len(line)))
        if found < 0:
            start = stop
            continue
        unit = found + 1 - start
        copies = _copies(data, start, data[start : start + unit])
        if copies < max(MIN_COPIES, copies_to_read(line_count(data, start, unit)) + 1):
            start = stop
            continue
        yield start, unit, copies
        start += unit * copies


def line_count(data: bytes, start: int, unit: int) -> int:
    """The lines in ``unit`` bytes of ``data`` from ``start``."""
    return data.count(b"\n", start, start + unit)


def _copies(data: bytes, start: int, unit: bytes) -> int:
    """How many copies of ``unit`` follow each other in ``data`` from ``start``."""
    copies, step = 1, 1
    size = len(unit)
    while True:
        if data.startswith(unit * step, start + copies * size):
            copies += step
            step *= 2
        elif step > 1:
            step //= 2
        else:
            return copies

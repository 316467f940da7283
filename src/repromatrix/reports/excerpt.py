"""A bounded excerpt of a cell's log: the lines around the root cause, then the end of the log.

Reports embed excerpts (JUnit system-out, the HTML table); the full log stays
in the cell folder. The input is streamed line by line, so a log of any size
costs memory for the excerpt only.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# CSI and OSC escape sequences (colours, cursor moves, titles) and the remaining C0 controls.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class ExcerptLimits:
    """How much of a log an excerpt keeps."""

    context: int = 15  # lines before and after the root-cause line
    tail: int = 30  # last lines of the log
    line_chars: int = 400  # longer lines are cut
    max_bytes: int = 8192  # the whole excerpt, UTF-8


def clean_line(line: str, limit: int) -> str:
    """Drop escape sequences and control characters, and cut the line to ``limit`` characters."""
    # Escape codes are few and short: cutting at a few times the limit first keeps
    # the regex work bounded on gigantic lines without cutting visible text early.
    text = _CONTROL.sub("", _ANSI.sub("", line[: limit * 4].rstrip("\r\n")))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def excerpt(lines: Iterable[str], anchor: str | None, limits: ExcerptLimits) -> str:
    """Return the lines around the first line containing ``anchor``, then the log's last lines.

    Skipped stretches are marked ``[… N lines …]``; the result never exceeds
    ``limits.max_bytes`` (the root-cause window keeps priority over the tail).
    """
    needle = clean_line(anchor, limits.line_chars).strip() if anchor else ""
    window, tail = _scan(lines, needle, limits)
    parts: list[str] = []
    last = -1
    if window:
        if window[0][0] > 0:
            parts.append(_gap(window[0][0]))
        parts.extend(text for _, text in window)
        last = window[-1][0]
    if tail and tail[0][0] > last + 1:
        parts.append(_gap(tail[0][0] - last - 1))
    parts.extend(text for _, text in tail)
    return _bounded("\n".join(parts), limits.max_bytes)


def _scan(
    lines: Iterable[str], needle: str, limits: ExcerptLimits
) -> tuple[list[tuple[int, str]], deque[tuple[int, str]]]:
    """Return the numbered anchor window (empty when no anchor matched) and the lines after it."""
    before: deque[tuple[int, str]] = deque(maxlen=limits.context)
    tail: deque[tuple[int, str]] = deque(maxlen=limits.tail)
    window: list[tuple[int, str]] = []
    after_left = -1  # lines still owed to the window; -1 until the anchor is found
    for number, raw in enumerate(lines):
        text = clean_line(raw, limits.line_chars)
        if after_left > 0:
            window.append((number, text))
            after_left -= 1
        elif after_left == 0:
            tail.append((number, text))
        elif needle and needle in text:
            window = [*before, (number, text)]
            tail.clear()
            after_left = limits.context
        else:
            before.append((number, text))
            tail.append((number, text))
    return window, tail


def _gap(count: int) -> str:
    return f"[… {count} line{'s' if count != 1 else ''} …]"


def _bounded(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    marker = "\n[… excerpt cut …]"
    keep = max_bytes - len(marker.encode("utf-8"))
    return data[:keep].decode("utf-8", errors="ignore") + marker


def read_lines(path: Path, max_chars: int = 64 * 1024) -> Iterator[str]:
    """Yield the lines of a log file, each at most ``max_chars`` long, whatever bytes it holds.

    The rest of a longer line is read and dropped in pieces, so a log that is one
    gigantic line costs ``max_chars`` of memory, not its size.
    """
    with path.open(encoding="utf-8", errors="replace") as handle:
        while line := handle.readline(max_chars):
            yield line
            rest = line
            while len(rest) == max_chars and not rest.endswith("\n"):
                rest = handle.readline(max_chars)


def log_excerpt(path: Path, anchor: str | None, limits: ExcerptLimits) -> str:
    """Return the excerpt of the log at ``path``, or a note when it cannot be read."""
    try:
        return excerpt(read_lines(path), anchor, limits)
    except OSError as exc:
        return f"[log not readable: {exc.strerror or exc}]"

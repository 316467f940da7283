"""Long steps that say they are alive: a start line, a line every so often, an end line.

Wheelhouse downloads, virtualenvs, image builds, pulls and model generation
take minutes on a fresh machine; a CI log that says nothing for six minutes
looks hung. ``heartbeat`` wraps such a step: plain lines only (they read the
same on a terminal and in a CI log), with the elapsed time, and with bytes and
an estimate when the step reports how far it is (``Beat.progress``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

EVERY_S = 30.0


def duration(value: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    total = max(0, round(value))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def size(count: float) -> str:
    """Bytes for a person: ``512 B``, ``3.4 MB``, ``1.2 GB``."""
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


@dataclass
class Beat:
    """How far a step is; the step updates it, the heartbeat reads it."""

    what: str
    started: float = field(default_factory=time.monotonic)
    done: int = 0  # bytes (or steps) so far
    total: int = 0  # 0 when unknown
    unit: str | None = None  # None: bytes; else what is counted (``versions``)

    def progress(self, done: int, total: int = 0) -> None:
        """Record how far the step is (bytes or steps)."""
        self.done, self.total = done, total

    def line(self) -> str:
        """``what: 1.2 of 4.3 GB (28%), 45s, eta 2m`` or ``what: 45s``."""
        elapsed = time.monotonic() - self.started
        if not self.total:
            return f"{self.what}: still going, {duration(elapsed)}"
        share = self.done / self.total
        left = elapsed / share - elapsed if share > 0 else None
        eta = f", eta {duration(left)}" if left is not None else ""
        if self.unit is None:
            amount = f"{size(self.done)} of {size(self.total)}"
        else:
            amount = f"{self.done} of {self.total} {self.unit}"
        return f"{self.what}: {amount} ({share:.0%}), {duration(elapsed)}{eta}"


@contextmanager
def heartbeat(
    note: Callable[[str], None], what: str, every_s: float = EVERY_S, *, says_end: bool = True
) -> Iterator[Beat]:
    """Say ``what`` starts, how it goes every ``every_s`` seconds, and how long it took
    (unless ``says_end`` is False: a step whose caller reports its end with its one figure)."""
    beat = Beat(what)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            note(beat.line())

    note(f"{what}: started")
    ticker = threading.Thread(target=tick, name=f"heartbeat: {what}", daemon=True)
    ticker.start()
    try:
        yield beat
    finally:
        stop.set()
        ticker.join()
    if says_end:
        note(f"{what}: done in {duration(time.monotonic() - beat.started)}")

"""Progress of a long run: one line when a cell starts and one when it ends, with elapsed and ETA.

A matrix of engine cells takes minutes per cell, so a person watching needs to
see that it moves and roughly when it will finish. Each cell keeps its own
start time (cells run at the same time). Without a pool the ETA is the mean
time of the cells finished so far times the cells left: crude, but honest. A
pool (``track``) gives its own: the planner's simulation of the rest by the
estimates, with the running cells, shown on one line after each cell ends
while others still run. Lines come only at starts and ends: readable in CI logs.

Every line is shown through ``visible`` and ``redact_text``: a reason comes
from a cell's log, which may hold escape sequences or a secret.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from repromatrix.heartbeat import duration
from repromatrix.run.pool import PoolProgress
from repromatrix.secret_env import redact_text
from repromatrix.visible import visible


def eta(durations: list[float], remaining: int) -> float | None:
    """Seconds left, from the mean duration of finished cells; None before any has finished."""
    if not durations:
        return None
    return sum(durations) / len(durations) * remaining


@dataclass
class Progress:
    """Prints a run's progress to ``out`` (stderr by default)."""

    total: int
    out: TextIO = field(default_factory=lambda: sys.stderr)
    # How many of ``total`` will really run; skipped cells take no time and must not weigh
    # on the ETA (a GPU lane skipped on a CPU host would otherwise promise hours).
    to_run: int | None = None
    clock: Callable[[], float] = time.monotonic
    done: int = 0
    durations: list[float] = field(default_factory=list)
    _started: float = field(init=False)
    _cell_started: dict[str, float] = field(init=False, default_factory=dict)
    _snapshot: Callable[[], PoolProgress] | None = field(init=False, default=None)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._started = self.clock()

    def track(self, snapshot: Callable[[], PoolProgress] | None) -> None:
        """Take the ETA and the running cells from a pool's ``snapshot`` (None: stop)."""
        self._snapshot = snapshot

    def note(self, message: str) -> None:
        """A line about the run itself (images being built, the model being made)."""
        self._print(f"[{self._elapsed()}] {message}")

    def start(self, cell_id: str) -> None:
        """A cell is about to run."""
        self._cell_started[cell_id] = self.clock()
        snap = self._snapshot() if self._snapshot else None
        if snap is not None:
            left: float | None = snap.eta_s
        else:
            remaining = (
                self.total - self.done if self.to_run is None else self.to_run - len(self.durations)
            )
            left = eta(self.durations, remaining)
        when = f", eta {duration(left)}" if left is not None else ""
        also = len(snap.running) - 1 if snap is not None else 0
        others = f" ({also} other(s) running)" if also > 0 else ""
        number = self.done + 1 if snap is None else self.done
        self._print(f"[{number}/{self.total} {self._elapsed()}{when}] start {cell_id}{others}")

    def end(self, cell_id: str, outcome: str, reason: str = "", *, ran: bool = True) -> None:
        """A cell has its result; ``ran`` is False for cells that never started (skips)."""
        began = self._cell_started.pop(cell_id, None)
        took = self.clock() - began if ran and began is not None else 0.0
        self.done += 1
        if ran:
            self.durations.append(took)
        why = f": {reason}" if reason else ""
        line = f"[{self.done}/{self.total} {self._elapsed()}] {outcome} {cell_id}"
        self._print(f"{line} ({duration(took)}){why}" if ran else f"{line}{why}")
        snap = self._snapshot() if self._snapshot else None
        running = [key for key in snap.running if key != cell_id] if snap else []
        if snap is not None and running:
            state = (
                f"{len(running)} running, {self.done}/{self.total} done, eta {duration(snap.eta_s)}"
            )
            self._print(f"[{self._elapsed()}] {state}: {', '.join(running)}")

    def _elapsed(self) -> str:
        return duration(self.clock() - self._started)

    def _print(self, line: str) -> None:
        with self._lock:  # a backend's note may come from a cell's thread
            print(visible(redact_text(line)), file=self.out, flush=True)

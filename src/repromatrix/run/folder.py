"""The run folder: its id and path, the cells still to run in it, its plan, and its claim.

One run writes a run folder at a time: a lock held for as long as the run lasts. Two
runs writing the same ``results/<run>/`` (a ``--resume`` started while the run is still
going, two CI steps with one ``--run-id``) would interleave results and reports. The
first takes an exclusive ``flock`` on ``<run>/.lock``; the second is refused with the
holder's pid. The kernel drops the lock when the holder dies, so a killed run never
blocks a resume.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from repromatrix.errors import UsageError
from repromatrix.grammars import RUN_ID
from repromatrix.model import Cell
from repromatrix.results import store

LOCK_FILE = ".lock"


@dataclass(frozen=True)
class RunFolder:
    """A run's id and its folder, ``<results>/<run_id>/``."""

    run_id: str
    path: Path


def new_run_id(now: datetime | None = None) -> str:
    """A run id from the UTC time, sortable: ``20250101-120000``."""
    return (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")


def resolve_folder(results: Path, run_id: str | None, resume: bool) -> RunFolder:
    """The run's folder; ``--resume`` without an id continues the latest run."""
    if run_id is None and resume:
        latest = latest_run(results)
        if latest is None:
            raise UsageError(f"--resume: no earlier run under {results}/ to continue")
        run_id = latest.name
    run_id = run_id or new_run_id()
    return RunFolder(run_id, store.run_folder(results, run_id))


def latest_run(results: Path, besides: Path | None = None) -> Path | None:
    """The run folder under ``results`` whose id sorts last (run ids are UTC times), other
    than ``besides``; None when there is none."""
    runs = sorted(p.name for p in results.glob("*/") if RUN_ID.fullmatch(p.name) and p != besides)
    return results / runs[-1] if runs else None


def pending(cells: Sequence[Cell], run_dir: Path, resume: bool) -> tuple[Cell, ...]:
    """The cells still to run: all of them, or with ``--resume`` those without a result."""
    if not resume:
        return tuple(cells)
    done = store.finished_ids(run_dir)
    return tuple(cell for cell in cells if cell.id not in done)


def record_plan(run_dir: Path, cells: Sequence[Cell], matrix: Path) -> None:
    """Write ``plan.json`` before any cell runs, so every report of this run, finished or
    not, lists the planned cells that never ran (a resumed run adds to the earlier plan)."""
    earlier, _ = store.read_plan(run_dir)
    ids = {*(earlier or ()), *(cell.id for cell in cells)}
    store.write_plan(run_dir, ids, matrix=matrix.name)


@dataclass
class RunClaim:
    """A held claim on a run folder; ``release`` gives it up (also at exit)."""

    path: Path
    fd: int | None

    def release(self) -> None:
        """Give the folder up; safe twice."""
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def claim(run_dir: Path) -> RunClaim:
    """Claim ``run_dir`` for this run, or raise ``UsageError`` naming the run that holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise UsageError(
            f"{run_dir} is being written by another run (pid {holder}); wait for it to end "
            "or choose another --run-id"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return RunClaim(path, fd)


@contextmanager
def claimed(run_dir: Path) -> Iterator[RunClaim]:
    """Hold ``run_dir`` for the duration of the ``with`` block (see ``claim``)."""
    held = claim(run_dir)
    try:
        yield held
    finally:
        held.release()

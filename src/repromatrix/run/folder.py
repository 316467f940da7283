"""One run writes a run folder at a time: a lock held for as long as the run lasts.

Two runs writing the same ``results/<run>/`` (a ``--resume`` started while the
run is still going, two CI steps with one ``--run-id``) would interleave
results and reports. The first takes an exclusive ``flock`` on
``<run>/.lock``; the second is refused with the holder's pid. The kernel
drops the lock when the holder dies, so a killed run never blocks a resume.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from repromatrix.errors import UsageError

LOCK_FILE = ".lock"


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

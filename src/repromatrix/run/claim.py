"""The claim on a run folder: one run writes ``results/<run>/`` at a time, on any file system.

The claim is the file ``<run>/.lock``, made exclusively (a hard link of a finished
temporary file, so it never exists half-written; ``O_EXCL`` where links are not
allowed) and holding who made it: host, boot id, pid and the process's start time,
and the Slurm job and attempt it runs in. ``flock`` is not used: on the network file
systems clusters share folders over it is missing, local to one node, or slow. A
second run is refused, naming the holder, unless the holder provably no longer
runs, and then the claim is taken over:

- an earlier attempt of the same Slurm job (Slurm runs one attempt of a job at a
  time, so a requeued task takes over from its preempted self, from any node);
- a holder on this machine whose boot has ended (another boot id), or whose process
  has ended (no such pid, or a pid since reused by another process: its start time
  differs).

A holder on another machine is never presumed dead: the refusal says which file to
remove once that machine is known to be gone. A lock file of the versions that held
an ``flock`` (its pid only) is taken over when no process holds an ``flock`` on it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from repromatrix.errors import UsageError

LOCK_FILE = ".lock"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
TAKE_OVER_TRIES = 3


@dataclass(frozen=True)
class Holder:
    """Who holds a claim: enough to prove, from another process or node, that it is gone."""

    host: str
    boot_id: str
    pid: int
    started: int | None  # the process's start time in clock ticks after boot (None: unknown)
    job: str | None = None  # the Slurm job it runs in, ``<cluster>/<job id>``
    attempt: int = 0  # which attempt of that job (``SLURM_RESTART_COUNT``)

    def describe(self) -> str:
        """``pid 123 on node7 (Slurm job c/45, attempt 0)``."""
        job = f" (Slurm job {self.job}, attempt {self.attempt})" if self.job else ""
        return f"pid {self.pid} on {self.host}{job}"

    def to_json(self) -> dict[str, Any]:
        """The lock file's content."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Holder:
        """Read a lock file's content back (``ValueError`` when it is not one)."""
        try:
            started, job = data["started"], data.get("job")
            holder = cls(
                host=str(data["host"]),
                boot_id=str(data["boot_id"]),
                pid=int(data["pid"]),
                started=None if started is None else int(started),
                job=None if job is None else str(job),
                attempt=int(data.get("attempt", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a claim: {exc}") from exc
        return holder


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (None: no such process here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces and parentheses.
    fields = stat.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def this_process(environ: Mapping[str, str] | None = None) -> Holder:
    """The holder this process writes into a claim."""
    env = os.environ if environ is None else environ
    try:
        boot_id = BOOT_ID.read_text(encoding="ascii").strip()
    except OSError:
        boot_id = ""
    job_id = env.get("SLURM_JOB_ID")
    job = f"{env.get('SLURM_CLUSTER_NAME', '')}/{job_id}" if job_id else None
    attempt = env.get("SLURM_RESTART_COUNT", "0")
    return Holder(
        host=socket.gethostname(),
        boot_id=boot_id,
        pid=os.getpid(),
        started=process_start(os.getpid()),
        job=job,
        attempt=int(attempt) if attempt.isdigit() else 0,
    )


def still_running(pid: int, started: int | None) -> bool:
    """Whether process ``pid`` of this machine runs and is the one that started at ``started``."""
    now = process_start(pid)
    if now is None:
        return False
    return started is None or now == started


def gone(
    holder: Holder, me: Holder, running: Callable[[int, int | None], bool] = still_running
) -> str | None:
    """Why ``holder`` provably no longer runs, as seen by ``me``; None when it may still run."""
    if holder.job is not None and holder.job == me.job and holder.attempt < me.attempt:
        return f"it was attempt {holder.attempt} of this Slurm job, which is now at {me.attempt}"
    if holder.host != me.host or not holder.boot_id:
        return None
    if holder.boot_id != me.boot_id:
        return f"{holder.host} has rebooted since"
    if holder.pid == me.pid and holder.started == me.started:
        return None  # this very process holds it already
    if not running(holder.pid, holder.started):
        return "its process has ended"
    return None


@dataclass
class RunClaim:
    """A held claim on a run folder; ``release`` gives it up (also at exit)."""

    path: Path
    holder: Holder
    held: bool = True

    def release(self) -> None:
        """Give the folder up; safe twice, and never removes a claim someone else took over."""
        if not self.held:
            return
        self.held = False
        if _read_holder(self.path) == self.holder:
            with suppress(FileNotFoundError):
                self.path.unlink()


def claim(run_dir: Path, me: Holder | None = None) -> RunClaim:
    """Claim ``run_dir`` for this run, or raise ``UsageError`` naming the run that holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    me = me or this_process()
    for _ in range(TAKE_OVER_TRIES):
        if _create(path, me):
            return RunClaim(path, me)
        holder = _read_holder(path)
        if holder is None:
            continue  # it went away between the two calls: try again
        why = _legacy_gone(path) if isinstance(holder, str) else gone(holder, me)
        if why is None:
            raise UsageError(_refusal(run_dir, path, holder))
        _take_over(path, holder)
    raise UsageError(f"{run_dir}: other runs keep claiming it at the same time; try again")


@contextmanager
def claimed(run_dir: Path) -> Iterator[RunClaim]:
    """Hold ``run_dir`` for the duration of the ``with`` block (see ``claim``)."""
    held = claim(run_dir)
    try:
        yield held
    finally:
        held.release()


def _create(path: Path, me: Holder) -> bool:
    """Make the lock file holding ``me``, atomically; False when one exists."""
    body = json.dumps(me.to_json(), sort_keys=True).encode() + b"\n"
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(body)
    staged = Path(name)
    try:
        os.link(staged, path)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        return _create_exclusive(path, body)  # a file system without hard links
    finally:
        staged.unlink(missing_ok=True)


def _create_exclusive(path: Path, body: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as handle:
        handle.write(body)
    return True


def _read_holder(path: Path) -> Holder | str | None:
    """The lock file's holder; its text when it is a lock of the ``flock`` versions (a pid);
    None when there is no lock file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    try:
        return Holder.from_json(json.loads(text))
    except (ValueError, AttributeError):
        return text.strip()


def _legacy_gone(path: Path) -> str | None:
    """A lock file of the ``flock`` versions is free when no process holds its ``flock``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return "it is gone"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return None  # held, or flock does not work here: nothing is proven
    finally:
        os.close(fd)
    return "no process holds its flock"


def _take_over(path: Path, holder: Holder | str) -> None:
    """Move the dead holder's lock file aside, unless another run replaced it meanwhile."""
    aside = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another run took it over first
    if _read_holder(aside) != holder:
        with suppress(FileExistsError):
            os.link(aside, path)  # not the one judged dead: put it back
    aside.unlink(missing_ok=True)


def _refusal(run_dir: Path, path: Path, holder: Holder | str) -> str:
    who = holder.describe() if isinstance(holder, Holder) else f"pid {holder or '?'}"
    advice = "wait for it to end or choose another --run-id"
    if isinstance(holder, Holder) and holder.host != socket.gethostname():
        advice += f"; if {holder.host} is gone for good, remove {path}"
    return f"{run_dir} is being written by another run ({who}); {advice}"

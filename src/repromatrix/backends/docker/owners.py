"""Which process started a container of this tool, and whether that process is still alive.

Every container a run creates carries, beside its run and cell, the labels of
the process that made it (``Owner``): the host's name, the boot (the kernel's
``boot_id``), the process id and the process's start time (so a pid reused
after the run died is not taken for it). At the start of a run, a container
whose owner is dead is stale: a CI job killed mid-run left it, and it may still
hold GPUs. ``stale`` decides that from the labels alone, and touches nothing a
live run may own:

- a container of another host (another machine sharing the engine, or a run
  inside another container, whose hostname differs) is never stale;
- on this host, one of an earlier boot is stale (its process died with that boot);
- on this host and boot, one whose process is gone, or is another process now
  (another start time), is stale; one whose process lives (another agent, a Slurm
  task beside this one) is not;
- a container without these labels (made by an older version) is never stale.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

HOST_LABEL = "repromatrix.host"
BOOT_LABEL = "repromatrix.boot"
PID_LABEL = "repromatrix.pid"
STARTED_LABEL = "repromatrix.pid_started"  # the process's start, in clock ticks after boot
PROC = Path("/proc")


@dataclass(frozen=True)
class Owner:
    """The process that starts a run's containers, as its labels name it."""

    host: str
    boot: str
    pid: int
    started: str | None = None

    def labels(self) -> dict[str, str]:
        """The labels every container of this process carries."""
        labels = {HOST_LABEL: self.host, BOOT_LABEL: self.boot, PID_LABEL: str(self.pid)}
        if self.started is not None:
            labels[STARTED_LABEL] = self.started
        return labels


def process_started(pid: int, proc: Path = PROC) -> str | None:
    """When process ``pid`` started (field 22 of ``/proc/<pid>/stat``), or None when there is
    no such process."""
    try:
        stat = (proc / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count after its last ")".
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def this_process(pid: int | None = None, proc: Path = PROC) -> Owner:
    """This process (or ``pid``) as an ``Owner``: host name, boot, pid, start time."""
    number = pid if pid is not None else os.getpid()
    try:
        boot = (proc / "sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        boot = ""
    return Owner(socket.gethostname(), boot, number, process_started(number, proc))


def stale(labels: Mapping[str, str], here: Owner, started: Callable[[int], str | None]) -> bool:
    """Whether the process that made a container with ``labels`` is dead, seen from ``here``
    (``started`` reads a live process's start time; see the module doc for the rules)."""
    host, boot, pid = labels.get(HOST_LABEL), labels.get(BOOT_LABEL), labels.get(PID_LABEL)
    if host is None or boot is None or pid is None or not pid.isdigit() or host != here.host:
        return False
    if boot != here.boot:
        return bool(boot) and bool(here.boot)
    now = started(int(pid))
    if now is None:
        return True
    then = labels.get(STARTED_LABEL)
    return then is not None and then != now

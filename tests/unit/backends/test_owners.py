"""Whose containers are stale (``backends.docker.owners``): a dead run's are, a live run's never."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from repromatrix.backends.docker.owners import (
    BOOT_LABEL,
    HOST_LABEL,
    PID_LABEL,
    STARTED_LABEL,
    Owner,
    process_started,
    stale,
    this_process,
)

HERE = Owner("runner-1", "boot-a", 4242, "1000")


def labels(**changes: str) -> dict[str, str]:
    return {**HERE.labels(), **changes}


def alive(pid: int) -> str | None:
    """The process table of the test: 4242 started at 1000, 77 at 55, nothing else."""
    return {4242: "1000", 77: "55"}.get(pid)


def test_this_process_is_read_from_the_host():
    me = this_process()
    assert me.pid == os.getpid() and me.host == socket.gethostname()
    assert me.boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert me.started is not None and me.started == process_started(os.getpid())
    assert me.labels() == {
        HOST_LABEL: me.host,
        BOOT_LABEL: me.boot,
        PID_LABEL: str(me.pid),
        STARTED_LABEL: me.started,
    }


def test_a_process_that_ended_has_no_start():
    child = subprocess.Popen(["sleep", "30"])
    started = process_started(child.pid)
    child.kill()
    child.wait()
    assert started is not None and process_started(child.pid) is None


def test_a_live_runs_containers_are_never_stale():
    assert not stale(labels(), HERE, alive)  # this very process
    assert not stale(labels(**{PID_LABEL: "77", STARTED_LABEL: "55"}), HERE, alive)  # beside it


def test_a_dead_runs_containers_are_stale():
    assert stale(labels(**{PID_LABEL: "99"}), HERE, alive)  # no such process
    assert stale(labels(**{PID_LABEL: "77", STARTED_LABEL: "56"}), HERE, alive)  # pid reused
    assert stale(labels(**{BOOT_LABEL: "boot-0"}), HERE, alive)  # an earlier boot


def test_what_cannot_be_told_is_never_touched():
    assert not stale(labels(**{HOST_LABEL: "runner-2", PID_LABEL: "99"}), HERE, alive)
    assert not stale({"repromatrix.run": "old"}, HERE, alive)  # made before these labels
    assert not stale(labels(**{PID_LABEL: "x"}), HERE, alive)
    no_start = {k: v for k, v in labels(**{PID_LABEL: "77"}).items() if k != STARTED_LABEL}
    assert not stale(no_start, HERE, alive)  # a live pid, no start to compare
    assert not stale(labels(**{BOOT_LABEL: ""}), HERE, alive)

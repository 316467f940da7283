"""Which process the kernel's OOM killer ended inside this container, and when.

Standard library only (it runs beside ``harness.py`` on the image's python). A
killed engine process leaves no traceback, and Docker's ``State.OOMKilled`` is
not always set when the victim is a grandchild of the container's first
process, so the harness watches for itself: it polls the processes it can see
(their names: vLLM titles its processes ``VLLM::EngineCore`` and the like) and
the container cgroup's OOM kill counter (``memory.events`` ``oom_kill`` on
cgroup v2, ``memory.oom_control`` on v1). When the counter rises, the processes
that vanished (or became zombies) since the last poll are the victims; with more
of them than kills, the largest resident sets, as the OOM killer chooses.

Each victim is handed over twice: as data, a record the runner reads
(``@@repromatrix-oom {"pid", "name", "rss_kb", "oom_kill_count", "memory_limit"}``,
``kill_record``; its decision comes from it), and as one line in the kernel's own
words, for an operator reading the log like ``dmesg`` (``kill_line``, which the runner
also makes of a record, so both say the same):
``[repromatrix harness] Memory cgroup out of memory: Killed process 57 (VLLM::EngineCore) ...``
The record comes first, and triage does not read the line after it back.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

COUNTERS = (
    ("/sys/fs/cgroup/memory.events", "oom_kill"),  # cgroup v2
    ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),  # cgroup v1
)
LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
POLL_S = 0.2
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
LINE_PREFIX = "[repromatrix harness] "
# How every account of a kill for people begins (``kill_line``; the runner's too).
KILL_WORDS = "Memory cgroup out of memory: Killed process "
# The record of a kill for the runner: ``harness.PROTOCOL_PREFIX`` + "oom " (this module is
# the harness's sibling and cannot import it).
RECORD_PREFIX = "@@repromatrix-oom "


@dataclass(frozen=True)
class Proc:
    """One process as last seen: its pid, name and resident set."""

    pid: int
    name: str
    rss_bytes: int


def oom_kills(paths: tuple[tuple[str, str], ...] = COUNTERS) -> int | None:
    """The cgroup's OOM kill count, or None when no counter can be read."""
    for path, key in paths:
        try:
            with open(path, encoding="ascii") as handle:
                for line in handle:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def memory_limit() -> str | None:
    """The cgroup's memory limit as the kernel prints it (``max`` or bytes), or None."""
    for path in LIMITS:
        try:
            with open(path, encoding="ascii") as handle:
                return handle.read().strip()
        except OSError:
            continue
    return None


def process_name(pid: int, proc: str = "/proc") -> str | None:
    """A process's title (``VLLM::EngineCore``; else its command line or comm); None if gone."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as handle:
            argv = [part for part in handle.read().split(b"\0") if part]
        if argv:
            return " ".join(part.decode(errors="replace") for part in argv)[:200]
        with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def snapshot(proc: str = "/proc", own: int | None = None) -> dict[int, Proc]:
    """Every live (not zombie) process visible here but ``own``: pid → ``Proc``."""
    seen: dict[int, Proc] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == own:
            continue
        pid = int(entry)
        try:
            with open(f"{proc}/{pid}/stat", encoding="utf-8", errors="replace") as handle:
                fields = handle.read().rpartition(")")[2].split()
        except OSError:
            continue
        if not fields or fields[0] in ("Z", "X"):
            continue
        name = process_name(pid, proc)
        if name is not None:
            seen[pid] = Proc(pid, name, int(fields[21]) * PAGE if len(fields) > 21 else 0)
    return seen


def victims(before: dict[int, Proc], after: dict[int, Proc], kills: int) -> list[Proc]:
    """The ``kills`` processes of ``before`` gone from ``after`` most likely killed: the
    largest resident sets first, as the OOM killer picks."""
    gone = [p for pid, p in before.items() if pid not in after]
    return sorted(gone, key=lambda p: (-p.rss_bytes, p.pid))[:kills]


def kill_line(victim: Proc, counted: int, limit: str | None) -> str:
    """The line printed for one victim (the kernel's words, then where the fact comes from)."""
    rss = victim.rss_bytes // 1024
    where = f"cgroup oom_kill count {counted}, memory limit {limit or 'unknown'}"
    return f"{LINE_PREFIX}{KILL_WORDS}{victim.pid} ({victim.name}) anon-rss:{rss}kB ({where})"


def kill_record(victim: Proc, counted: int, limit: str | None) -> str:
    """The record printed for one victim, for the runner: its facts as JSON."""
    record = {
        "pid": victim.pid,
        "name": victim.name,
        "rss_kb": victim.rss_bytes // 1024,
        "oom_kill_count": counted,
        "memory_limit": limit,
    }
    return RECORD_PREFIX + json.dumps(record, sort_keys=True)


def line_of(record: Mapping[str, object]) -> str | None:
    """``kill_line`` of a record read back (None: not a record of a kill)."""
    pid, name, rss = record.get("pid"), record.get("name"), record.get("rss_kb")
    count, limit = record.get("oom_kill_count"), record.get("memory_limit")
    if not isinstance(pid, int) or not isinstance(name, str):
        return None
    rss_kb = rss if isinstance(rss, int) else 0
    counted = count if isinstance(count, int) else 0
    return kill_line(
        Proc(pid, name, rss_kb * 1024), counted, limit if isinstance(limit, str) else None
    )


class OomMonitor:
    """A thread that reports each OOM-killed process through ``report``: its record for the
    runner, then its line for people (triage reads the line only where no record came first:
    the log of an earlier harness)."""

    def __init__(self, report: Callable[[str], None]) -> None:
        self.report = report
        self.killed: list[Proc] = []
        self.counted = oom_kills() or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> OomMonitor:
        """Start watching (nothing to watch when the cgroup has no readable counter)."""
        if oom_kills() is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        """Take a last look, then stop."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        before = snapshot(own=os.getpid())
        while True:
            stopping = self._stop.wait(POLL_S)
            after = snapshot(own=os.getpid())
            count = oom_kills() or 0
            if count > self.counted:
                found = victims(before, after, count - self.counted)
                if found or stopping:
                    self.counted = count
                for victim in found:
                    self.killed.append(victim)
                    limit = memory_limit()
                    self.report(kill_record(victim, count, limit))
                    self.report(kill_line(victim, count, limit))
                if not found:
                    # The victim may still be exiting: keep the older snapshot to compare.
                    after = {**after, **before}
            before = after
            if stopping:
                return

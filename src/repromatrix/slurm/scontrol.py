"""What ``scontrol show job --oneliner`` says of an array's tasks, read into plain values.

Task end states come from here (``scontrol`` keeps a job for ``MinJobAge`` after it
ends, 300 s by default) and from what each task writes when it ends, never from
``sacct``: many sites, and the sandbox CI runs in, have no accounting database.
Each line is one record of ``Key=Value`` fields. The tasks of an array still
pending share one record whose ``ArrayTaskId`` is a range (``2-5``, ``1,3,7-9%2``);
each started task has its own.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

FIELD = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/]*)=")
INDEXES = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


class Phase(enum.Enum):
    """Where a task is: waiting for a node, running on one, or ended."""

    WAITING = "pending"
    RUNNING = "running"
    ENDED = "done"


WAITING_STATES = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESV_DEL_HOLD"}
    | {"SPECIAL_EXIT", "RESIZING"}
)
RUNNING_STATES = frozenset(
    {"RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED", "POWER_UP_NODE"}
)
# Everything else has ended: COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED,
# OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, REVOKED.


def state_word(state: str) -> str:
    """A ``JobState``'s word: ``CANCELLED by 0`` is ``CANCELLED``."""
    return state.split(maxsplit=1)[0] if state.strip() else "UNKNOWN"


def phase(state: str) -> Phase:
    """The phase of a ``JobState``."""
    word = state_word(state)
    if word in WAITING_STATES:
        return Phase.WAITING
    return Phase.RUNNING if word in RUNNING_STATES else Phase.ENDED


@dataclass(frozen=True)
class JobRecord:
    """One record of ``scontrol show job``: a job, or a task (or the pending tasks) of an array."""

    job_id: str
    array_job_id: str | None
    array_tasks: tuple[int, ...]  # () when the job is no array task
    state: str
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0
    node: str | None = None

    @property
    def phase(self) -> Phase:
        """Waiting, running or ended."""
        return phase(self.state)


def fields(line: str) -> dict[str, str]:
    """The ``Key=Value`` fields of one record; a value runs to the next key."""
    found = list(FIELD.finditer(line))
    values: dict[str, str] = {}
    for match, following in zip(found, [*found[1:], None], strict=True):
        end = following.start() if following is not None else len(line)
        values[match.group(1)] = line[match.end() : end].strip()
    return values


def task_indexes(text: str) -> tuple[int, ...]:
    """``2-5`` → 2, 3, 4, 5; ``1,3,7-9%2`` → 1, 3, 7, 8, 9 (``%`` limits tasks at once);
    ``0-8:4`` → 0, 4, 8 (a step)."""
    indexes: list[int] = []
    for part in text.split("%", 1)[0].split(","):
        match = INDEXES.fullmatch(part.strip())
        if match is None:
            continue
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        step = int(match.group(3)) if match.group(3) else 1
        indexes.extend(range(first, last + 1, step))
    return tuple(indexes)


def parse_records(text: str) -> tuple[JobRecord, ...]:
    """Every record of ``scontrol show job --oneliner`` output."""
    found = (fields(line) for line in text.splitlines())
    return tuple(record(values) for values in found if "JobId" in values)


def record(values: dict[str, str]) -> JobRecord:
    """One record from its fields."""
    exit_code, _, signal = values.get("ExitCode", "").partition(":")
    array_job = values.get("ArrayJobId")
    tasks = values.get("ArrayTaskId")
    node = values.get("BatchHost") or values.get("NodeList") or None
    return JobRecord(
        job_id=values.get("JobId", ""),
        array_job_id=array_job if array_job else None,
        array_tasks=task_indexes(tasks) if tasks else (),
        state=values.get("JobState", "UNKNOWN"),
        reason=values.get("Reason", ""),
        exit_code=int(exit_code) if exit_code.isdigit() else None,
        signal=int(signal) if signal.isdigit() else None,
        restarts=int(values["Restarts"]) if values.get("Restarts", "").isdigit() else 0,
        node=None if node in ("(null)", "None assigned") else node,
    )


def by_task(records: tuple[JobRecord, ...]) -> dict[int, JobRecord]:
    """Each array task's record by its index (the pending tasks share theirs)."""
    return {index: rec for rec in records for index in rec.array_tasks}

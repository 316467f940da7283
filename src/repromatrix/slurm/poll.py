"""Waiting for a submission: its tasks polled from Slurm, a line each time something moves.

Each poll reads every array's tasks from ``scontrol`` and counts the results in each
task's shard (a result file exists only once its cell is saved). A line is printed
when a task starts, ends or goes back to the queue (a requeue: it resumes its shard),
and a summary when the counts move: tasks pending, running and done, with the cells
each running task has finished. A submission has ended once every task has ended
and ``squeue`` lists none of its jobs (a requeued task is queued again before that).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix.errors import InfraError
from repromatrix.results import store
from repromatrix.slurm import cluster
from repromatrix.slurm.finish import Records, records_of
from repromatrix.slurm.scontrol import JobRecord, Phase, state_word
from repromatrix.slurm.submission import Submission, TaskEntry

POLL_S = 5.0
POLL_FAILURES = 24  # polls in a row Slurm may fail to answer (a busy controller) before giving up


@dataclass(frozen=True)
class TaskView:
    """One task as one poll saw it."""

    task: TaskEntry
    phase: Phase
    state: str
    node: str | None
    attempt: int
    done: int  # cells with a result in its shard

    def line(self) -> str:
        """``h100-1 (41_1) RUNNING on node7: 2/5 cells``."""
        where = f" on {self.node}" if self.node and self.phase is not Phase.WAITING else ""
        again = f", attempt {self.attempt + 1}" if self.attempt else ""
        cells = f"{self.done}/{len(self.task.cells)} cells"
        return f"{self.task.name} ({self.task.slurm_id}) {self.state}{where}{again}: {cells}"


def count_results(shard: Path) -> int:
    """How many cells of a shard have their result (a cheap count: no file is parsed)."""
    cells = shard / store.CELLS_DIR
    return sum(1 for _ in cells.rglob(store.RESULT_FILE)) if cells.is_dir() else 0


def view(submission: Submission, records: Records) -> tuple[TaskView, ...]:
    """Every task of ``submission`` as ``records`` (one poll) show it; a task scontrol no
    longer knows has ended."""
    views = []
    for task in submission.tasks:
        record: JobRecord | None = records.get(task.array, {}).get(task.index)
        phase = record.phase if record is not None else Phase.ENDED
        state = state_word(record.state) if record is not None else "ENDED"
        node = record.node if record is not None else None
        attempt = record.restarts if record is not None else 0
        done = count_results(submission.shard(task))
        views.append(TaskView(task, phase, state, node, attempt, done))
    return tuple(views)


def summary(views: Sequence[TaskView]) -> str:
    """``slurm: 1 pending, 2 running, 3 done; cells 7/20 (h100-1 on node7: 2/5, ...)``."""
    counts = {phase: sum(1 for v in views if v.phase is phase) for phase in Phase}
    tasks = ", ".join(f"{n} {phase.value}" for phase, n in counts.items())
    done = sum(v.done for v in views)
    total = sum(len(v.task.cells) for v in views)
    running = [
        f"{v.task.name} on {v.node or '?'}: {v.done}/{len(v.task.cells)}"
        for v in views
        if v.phase is Phase.RUNNING
    ]
    detail = f" ({', '.join(running)})" if running else ""
    return f"slurm: {tasks}; cells {done}/{total}{detail}"


def changes(before: Mapping[str, TaskView], now: Sequence[TaskView]) -> list[str]:
    """The lines for tasks that started, ended or went back to the queue since ``before``."""
    lines = []
    for current in now:
        earlier = before.get(current.task.name)
        if earlier is not None and earlier.phase is current.phase:
            continue
        if current.phase is Phase.WAITING and earlier is not None:
            lines.append(f"{current.line()}: back in the queue, it resumes its shard")
        elif current.phase is not Phase.WAITING:
            lines.append(current.line())
    return lines


def wait(
    submission: Submission,
    note: Callable[[str], None],
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> Records:
    """Poll until every task of ``submission`` has ended; return the last records seen. A poll
    Slurm does not answer is tried again (a controller busy or restarting), up to a limit."""
    seen: dict[str, TaskView] = {}
    last = ""
    failures = 0
    while True:
        try:
            records = records_of(submission)
            ended = not cluster.queued(submission.job_ids)
        except InfraError as exc:
            failures += 1
            if failures >= POLL_FAILURES:
                raise
            if failures == 1:
                note(f"Slurm did not answer ({exc}); asking again")
            sleep(poll_s)
            continue
        failures = 0
        views = view(submission, records)
        for line in changes(seen, views):
            note(line)
        seen = {v.task.name: v for v in views}
        if (line := summary(views)) != last:
            note(line)
            last = line
        if ended and all(v.phase is Phase.ENDED for v in views):
            return records
        sleep(poll_s)

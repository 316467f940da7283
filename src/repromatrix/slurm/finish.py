"""The end of a submission: how each task ended, its unfinished cells named, the shards
gathered into the run, the reports written.

How a task ended comes from ``scontrol`` while it still knows the job, else from the
``task.json`` the task wrote (a task killed hard wrote its start only, and says so).
A task that failed or was killed (a lost node, its time limit, someone's ``scancel``)
ends each of its cells without a result as an infrastructure error naming the task,
its end and its log, so the run says which task lost them. A submission the
submitter itself cancelled (Ctrl-C) leaves them without a result, for ``--resume``.
The waiting submitter and the detached merge job (``finish_detached``) both end here.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from repromatrix.errors import EXIT_INFRA, EXIT_OK, InfraError, RepromatrixError, UsageError
from repromatrix.judgement import Outcome
from repromatrix.matrix.expand import expand
from repromatrix.matrix.inputs import apply_lock, load_inputs
from repromatrix.reports.write import write_reports
from repromatrix.results import store
from repromatrix.results.merge import MergeResult, gather
from repromatrix.results.store import now_iso
from repromatrix.run.cell import NOT_RUN, CellRun, Ran, infra_error, save
from repromatrix.run.claim import claim
from repromatrix.run.folder import RunFolder
from repromatrix.slurm import cluster
from repromatrix.slurm.scontrol import JobRecord, Phase, by_task, state_word
from repromatrix.slurm.submission import (
    Submission,
    TaskEnd,
    TaskEntry,
    read,
    read_task_end,
    submissions,
    write,
)
from repromatrix.upstream.resolve import Locking, Upstream, lock_for
from repromatrix.values import Cell

Records = Mapping[str, Mapping[int, JobRecord]]  # array name -> task index -> its record


@dataclass(frozen=True)
class Ended:
    """How one task ended, and the cells it left without a result."""

    task: TaskEntry
    state: str  # Slurm's word (COMPLETED, TIMEOUT, NODE_FAIL, ...) or its own record's
    host: str | None
    exit_code: int | None
    unfinished: tuple[str, ...]
    job: str = ""  # 41_1: the submission's record, else the task's own (scripts submitted by hand)

    def describe(self) -> str:
        """``Slurm task 41_1 (h100-1) ended TIMEOUT on node7``."""
        where = f" on {self.host}" if self.host else ""
        code = f" (exit status {self.exit_code})" if self.exit_code not in (None, 0) else ""
        job = self.job or self.task.slurm_id
        return f"Slurm task {job} ({self.task.name}) ended {self.state}{where}{code}"


def task_end(
    record: JobRecord | None, written: TaskEnd | None
) -> tuple[str, str | None, int | None]:
    """The state, host and exit status of an ended task, from scontrol or else its own record
    (which adds the signal that stopped a task Slurm calls FAILED)."""
    if record is not None and record.phase is Phase.ENDED:
        state = state_word(record.state)
        stopped = written is not None and written.attempt == record.restarts and written.signal
        if stopped and written is not None and state == "FAILED":
            state += f" after {written.signal}"  # the time limit's warning, a signal of someone's
        return state, record.node, record.exit_code
    if written is None:
        return "before it started", None, None
    if written.ended_at is None:
        return (
            "without writing its end (killed: a lost node, or a kill past its time limit)",
            written.host,
            None,
        )
    if written.signal:
        return f"by {written.signal}", written.host, written.exit_code
    return ("COMPLETED" if written.exit_code == 0 else "FAILED"), written.host, written.exit_code


def ends_of(submission: Submission, records: Records) -> tuple[Ended, ...]:
    """How each task of ``submission`` ended, and which of its cells have no result."""
    ended = []
    for task in submission.tasks:
        shard = submission.shard(task)
        record = records.get(task.array, {}).get(task.index)
        written = read_task_end(shard)
        state, host, code = task_end(record, written)
        done = store.finished_ids(shard)
        unfinished = tuple(cell for cell in task.cells if cell not in done)
        job = task.slurm_id if task.job_id else (written.job if written else "")
        ended.append(Ended(task, state, host, code, unfinished, job))
    return tuple(ended)


def name_unfinished(
    submission: Submission, ended: Sequence[Ended], cells: Mapping[str, Cell]
) -> list[str]:
    """Save each unfinished cell of a task that failed as an infra error naming the task, in
    its shard; return the ids of those no longer in the matrix (left without a result)."""
    lost: list[str] = []
    for end in ended:
        log = submission.logs / f"{end.task.name}.log"
        reason = f"{end.describe()} before this cell finished (the task's output: {log})"
        folder = RunFolder(end.task.shard, submission.shard(end.task))
        for cell_id in end.unfinished:
            cell = cells.get(cell_id)
            if cell is None:
                lost.append(cell_id)
                continue
            ran = Ran(now_iso(), CellRun(infra_error(reason), NOT_RUN))
            save(folder, cell, ran, {})
    return lost


def finish_submission(
    submission: Submission,
    records: Records,
    cells: Mapping[str, Cell],
    note: Callable[[str], None],
) -> tuple[Ended, ...]:
    """Read how the tasks ended, name the cells failed tasks left (unless the submitter
    cancelled them), and mark the submission finished."""
    ended = ends_of(submission, records)
    for end in ended:
        count = len(end.task.cells)
        done = count - len(end.unfinished)
        note(f"{end.describe()}: {done}/{count} cell(s) finished")
    if not submission.cancelled:
        failed = [end for end in ended if end.unfinished]
        lost = name_unfinished(submission, failed, cells)
        for end in failed:
            note(
                f"{end.task.name}: {len(end.unfinished)} cell(s) it left are infra errors naming it"
            )
        if lost:
            note(
                f"{len(lost)} unfinished cell(s) are no longer in the matrix: left without a result"
            )
    write(replace(submission, finished=True))
    return ended


def gather_run(run_dir: Path) -> MergeResult:
    """Every shard of every submission of the run, gathered into the run folder."""
    shards = [sub.shard(task) for sub in submissions(run_dir) for task in sub.tasks]
    return gather(shards, run_dir)


def outcomes_of(run_dir: Path, cell_ids: Sequence[str]) -> dict[str, int]:
    """How many of ``cell_ids`` ended with each outcome in the run folder."""
    wanted = set(cell_ids)
    results, _ = store.read_results(run_dir)
    return dict(Counter(r.outcome.value for r in results if r.id in wanted))


def records_of(submission: Submission) -> dict[str, dict[int, JobRecord]]:
    """What scontrol says of each array's tasks now ({} for an array it no longer knows)."""
    found = {array: cluster.show(job) for array, job in submission.jobs.items()}
    return {array: by_task(records) if records else {} for array, records in found.items()}


def cells_by_id(submission: Submission) -> dict[str, Cell]:
    """The matrix's cells by id, as the submission's matrix, scenarios and lock plan them."""
    scenarios = tuple(Path(s) for s in submission.scenarios) or None
    lock = Path(submission.lock) if submission.lock else None
    matrix, catalogue = load_inputs(Path(submission.matrix), scenarios)
    matrix = apply_lock(matrix, lock_for(matrix, Locking(lock), _no_upstream).lock)
    wanted = {cell for task in submission.tasks for cell in task.cells}
    return {cell.id: cell for cell in expand(matrix, catalogue) if cell.id in wanted}


def _no_upstream() -> Upstream:
    # The submitter resolved the lock before any task ran: a merge never resolves again.
    raise InfraError(
        "the run's lock of follow rules is missing: resolve it with `repromatrix plan`"
    )


CLAIM_WAIT_S = 120.0  # the submitter lets go of the run folder just after it submits


@contextmanager
def claimed_when_free(folder: Path, wait_s: float = CLAIM_WAIT_S) -> Iterator[None]:
    """The run folder's claim, waited for a while: tasks that end at once may start the merge
    job before the detaching submitter has let the folder go."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            held = claim(folder)
            break
        except UsageError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2.0)
    try:
        yield
    finally:
        held.release()


def finish_detached(run_dir: str, submission_dir: str) -> int:
    """The merge job of ``--detach``: finish the submission, gather, report; exit 3 when a
    cell is an infra error or was skipped, as ``repromatrix run`` does."""
    folder = Path(run_dir)

    def note(line: str) -> None:
        print(f"repromatrix: {line}", file=sys.stderr, flush=True)

    try:
        with claimed_when_free(folder):
            submission = read(Path(submission_dir))
            finish_submission(submission, records_of(submission), cells_by_id(submission), note)
            merged = gather_run(folder)
            summary = write_reports(folder)
    except RepromatrixError as exc:
        note(f"error: {exc}")
        return exc.exit_code
    for line in [*merged.lines()[1:], *summary.lines()]:
        note(line)
    counts = outcomes_of(folder, [c for task in submission.tasks for c in task.cells])
    outcomes = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    note(f"done: {outcomes}; reports in {folder}/")
    bad = counts.get(Outcome.INFRA_ERROR.value, 0) + counts.get(Outcome.SKIPPED.value, 0)
    return EXIT_INFRA if bad else EXIT_OK

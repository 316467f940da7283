"""A Slurm run's submission as the submitter records it, and its tasks' shards (no tests)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from repromatrix.fleet.jobs import JobBudget, estimator
from repromatrix.results.store import now_iso
from repromatrix.run.cell import NOT_RUN, CellRun, Ran, save, skipped
from repromatrix.run.folder import RunFolder
from repromatrix.slurm.arrays import split
from repromatrix.slurm.submission import (
    Submission,
    TaskEntry,
    make_folders,
    new_submission,
    submitted,
    write,
)
from repromatrix.values import Cell
from support import factories

RUN_ID = "20260101-120000"


def cells(count: int) -> list[Cell]:
    """``count`` CPU cells of one image: one array of one task (a fleet job per image)."""
    return [factories.cell(variant=f"v{i}", deadline_s=60.0) for i in range(count)]


def submission_of(run_dir: Path, of: Sequence[Cell], job_id: str = "41") -> Submission:
    """The recorded submission of ``of`` into ``run_dir``, its arrays all given ``job_id``."""
    arrays = split(of, {c.id for c in of}, JobBudget(), estimator({}))
    made = new_submission(run_dir, RUN_ID, arrays, Path("matrix.yaml"))
    make_folders(made)
    return write(submitted(made, {array.name: job_id for array in arrays}))


def finish_cell(submission: Submission, task: TaskEntry, cell: Cell) -> None:
    """Save a result for ``cell`` in ``task``'s shard, as the task's run does."""
    folder = RunFolder(task.shard, submission.shard(task))
    ran = Ran(now_iso(), CellRun(skipped("ran in the task"), NOT_RUN))
    save(folder, cell, ran, {})

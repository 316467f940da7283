"""What a Slurm run keeps in its run folder: each submission, its tasks' shards and ends.

A run folder of a Slurm run is like any other (cells, plan, reports); beside them::

    <run>/slurm/<n>/submission.json        what submission n asked for: arrays, job ids, tasks
    <run>/slurm/<n>/<array>.sbatch         each array's batch script (finish.sbatch: --detach)
    <run>/slurm/<n>/logs/<array>-<i>.log   each task's output, every attempt appended
    <run>/slurm/<n>/shards/<shard>/        each task's own run folder; task.json: how it ended

A first run is submission 1; each ``--resume`` adds one with the cells still without a
result. A shard's run id names its containers too, so it holds the run's id, the
submission, the array and the task: two runs on one node never share one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.grammars import RUN_ID, SLURM_NAME, load_json
from repromatrix.results.schema import is_cell_id
from repromatrix.results.store import Unreadable, atomic_write, read_file
from repromatrix.slurm.arrays import TaskArray

SLURM_DIR = "slurm"
RECORD_FILE = "submission.json"
TASK_FILE = "task.json"
MAX_TASK_BYTES = 64 * 1024  # task.json is a few hundred bytes
MAX_RECORD_BYTES = 64 * 1024 * 1024  # submission.json: a line per cell of the run
JOB_ID = re.compile(r"[0-9]{1,20}")
MAX_TASK_TEXT = 256  # characters of a host, a job id, a signal name, a time
SHARDS_DIR = "shards"
LOGS_DIR = "logs"
FINISH_SCRIPT = "finish.sbatch"


@dataclass(frozen=True)
class TaskEntry:
    """One task as the submission recorded it."""

    array: str
    index: int
    shard: str  # the shard's run id (its folder under shards/)
    only: tuple[str, ...]
    cells: tuple[str, ...]
    job_id: str = ""  # the array's job id once submitted

    @property
    def name(self) -> str:
        """``cpu-0``: the array and the index."""
        return f"{self.array}-{self.index}"

    @property
    def slurm_id(self) -> str:
        """``41_0``, as squeue and scontrol write it."""
        return f"{self.job_id}_{self.index}"


@dataclass(frozen=True)
class Submission:
    """One submission of a run: its arrays' jobs and tasks, and how it stands."""

    number: int
    folder: Path  # <run>/slurm/<n>
    matrix: str  # the matrix file (absolute): the merge job finds the cells by their ids
    scenarios: tuple[str, ...] = ()  # the scenario folders given (absolute), if any
    lock: str | None = None  # the lock of the matrix's follow rules (absolute), if any
    jobs: Mapping[str, str] = field(default_factory=dict)  # array name -> job id
    tasks: tuple[TaskEntry, ...] = ()
    finish_job: str | None = None  # --detach: the job that merges and reports
    cancelled: bool = False  # the submitter cancelled it (Ctrl-C): unfinished cells stay open
    finished: bool = False  # its tasks' ends were read and its shards gathered

    @property
    def shards(self) -> Path:
        """Where the tasks' run folders are."""
        return self.folder / SHARDS_DIR

    @property
    def logs(self) -> Path:
        """Where the tasks' output goes."""
        return self.folder / LOGS_DIR

    def shard(self, task: TaskEntry) -> Path:
        """The run folder of ``task``."""
        return self.shards / task.shard

    @property
    def job_ids(self) -> tuple[str, ...]:
        """Every job it submitted: the arrays, then the merge job."""
        finish = (self.finish_job,) if self.finish_job else ()
        return (*self.jobs.values(), *finish)

    def to_json(self) -> dict[str, Any]:
        """submission.json."""
        return {
            "number": self.number,
            "matrix": self.matrix,
            "scenarios": list(self.scenarios),
            "lock": self.lock,
            "jobs": dict(self.jobs),
            "tasks": [asdict(task) for task in self.tasks],
            "finish_job": self.finish_job,
            "cancelled": self.cancelled,
            "finished": self.finished,
        }

    @classmethod
    def from_json(cls, folder: Path, data: Mapping[str, Any]) -> Submission:
        """Read submission.json back."""
        tasks = tuple(
            TaskEntry(
                array=str(t["array"]),
                index=int(t["index"]),
                shard=str(t["shard"]),
                only=tuple(t["only"]),
                cells=tuple(t["cells"]),
                job_id=str(t.get("job_id", "")),
            )
            for t in data.get("tasks", [])
        )
        return cls(
            number=int(data["number"]),
            folder=folder,
            matrix=str(data["matrix"]),
            scenarios=tuple(str(s) for s in data.get("scenarios", [])),
            lock=str(data["lock"]) if data.get("lock") else None,
            jobs={str(k): str(v) for k, v in dict(data.get("jobs", {})).items()},
            tasks=tasks,
            finish_job=data.get("finish_job"),
            cancelled=bool(data.get("cancelled")),
            finished=bool(data.get("finished")),
        )


def slurm_dir(run_dir: Path) -> Path:
    """``<run>/slurm``."""
    return run_dir / SLURM_DIR


def submissions(run_dir: Path) -> Iterator[Submission]:
    """The run's submissions, in order."""
    folders = [p for p in slurm_dir(run_dir).glob("*/") if p.name.isdigit()]
    for folder in sorted(folders, key=lambda p: int(p.name)):
        if (folder / RECORD_FILE).is_file():
            yield read(folder)


def read(folder: Path) -> Submission:
    """The submission recorded in ``folder``; ``UsageError`` naming the file when it is not
    one this tool wrote. Each value that becomes a path, an argument or a cell is checked by
    its grammar (``_checked``): a shard is a run id, a cell a cell id, a job id digits."""
    path = folder / RECORD_FILE
    try:
        submission = Submission.from_json(folder, load_json(read_file(path, MAX_RECORD_BYTES)))
        return _checked(submission)
    except (Unreadable, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise UsageError(f"{path}: not a submission this repromatrix wrote ({exc})") from exc


def _checked(submission: Submission) -> Submission:
    ids = [*submission.jobs.values(), *([submission.finish_job] if submission.finish_job else [])]
    ids += [task.job_id for task in submission.tasks if task.job_id]
    if bad := [i for i in ids if not JOB_ID.fullmatch(str(i))]:
        raise ValueError(f"job id {str(bad[0])[:40]!r} is not a Slurm job id")
    for task in submission.tasks:
        if not RUN_ID.fullmatch(task.shard) or not SLURM_NAME.fullmatch(task.array):
            raise ValueError(f"task {task.array[:40]!r} {task.shard[:80]!r}: not a shard's name")
        if bad_cells := [c for c in task.cells if not isinstance(c, str) or not is_cell_id(c)]:
            raise ValueError(f"{str(bad_cells[0])[:80]!r} is not a cell id")
        if not all(isinstance(glob, str) and glob.isprintable() for glob in task.only):
            raise ValueError("`only` holds something other than one-line globs")
    return submission


def write(submission: Submission) -> Submission:
    """Record ``submission`` (atomically, like every file of a run folder)."""
    body = json.dumps(submission.to_json(), indent=1).encode() + b"\n"
    atomic_write(submission.folder / RECORD_FILE, body)
    return submission


def new_submission(
    run_dir: Path,
    run_id: str,
    arrays: Sequence[TaskArray],
    matrix: Path,
    scenarios: Sequence[Path] = (),
    *,
    lock: Path | None = None,
) -> Submission:
    """The next submission of the run, its tasks named; nothing is written or submitted."""
    numbers = [int(p.name) for p in slurm_dir(run_dir).glob("*/") if p.name.isdigit()]
    number = max(numbers, default=0) + 1
    folder = slurm_dir(run_dir) / str(number)
    tasks = tuple(
        TaskEntry(
            array=array.name,
            index=task.index,
            shard=shard_id(run_id, number, array.name, task.index),
            only=task.job.only,
            cells=task.cell_ids,
        )
        for array in arrays
        for task in array.tasks
    )
    return Submission(
        number,
        folder,
        matrix=str(matrix.resolve()),
        scenarios=tuple(str(s.resolve()) for s in scenarios),
        lock=str(lock.resolve()) if lock is not None else None,
        tasks=tasks,
    )


def make_folders(submission: Submission) -> None:
    """Make the submission's folders before anything is submitted: Slurm makes none, and a
    task whose output folder is missing fails without a word."""
    submission.logs.mkdir(parents=True, exist_ok=True)
    submission.shards.mkdir(parents=True, exist_ok=True)


def submitted(submission: Submission, jobs: Mapping[str, str]) -> Submission:
    """``submission`` with the job id of each array."""
    tasks = tuple(replace(task, job_id=jobs[task.array]) for task in submission.tasks)
    return replace(submission, jobs=dict(jobs), tasks=tasks)


def shard_id(run_id: str, number: int, array: str, index: int) -> str:
    """A task's shard run id: ``<run>-<n>-<array>-<i>``, unique to the run (its Docker label
    too); the run's id is hashed short where the whole would be too long for a run id."""
    whole = f"{run_id}-{number}-{array}-{index}"
    if RUN_ID.fullmatch(whole):
        return whole
    short = hashlib.sha256(f"{run_id}/{array}".encode()).hexdigest()[:16]
    return f"{short}-{number}-{index}"


@dataclass(frozen=True)
class TaskEnd:
    """What a task writes into its shard when it starts and when it ends (``task.json``)."""

    job: str  # 41_0
    attempt: int
    host: str
    started_at: str
    ended_at: str | None = None
    exit_code: int | None = None  # its `repromatrix run`'s exit status
    signal: str | None = None  # the signal that ended that run, when one did

    def to_json(self) -> dict[str, Any]:
        """task.json."""
        return asdict(self)


def write_task_end(shard: Path, end: TaskEnd) -> None:
    """Write ``task.json`` into the task's shard."""
    body = json.dumps(end.to_json(), indent=1).encode() + b"\n"
    atomic_write(shard / TASK_FILE, body)


def read_task_end(shard: Path) -> TaskEnd | None:
    """What the task wrote of how it went (None: it never started, or wrote nothing)."""
    try:
        return _task_end(load_json(read_file(shard / TASK_FILE, MAX_TASK_BYTES)))
    except (Unreadable, ValueError, TypeError, AttributeError, RecursionError):
        return None


def _task_end(data: Mapping[str, Any]) -> TaskEnd:
    """``task.json`` checked field by field (a task on another node wrote it): text is one
    short printable line, numbers are whole and bounded (``load_json``); else ``ValueError``."""
    kinds = {"job": str, "attempt": int, "host": str, "started_at": str, "ended_at": str,
             "exit_code": int, "signal": str}  # fmt: skip
    values: dict[str, Any] = {key: data.get(key) for key in TaskEnd.__dataclass_fields__}
    for key, value in values.items():
        if value is None and key in ("ended_at", "exit_code", "signal"):
            continue
        if type(value) is not kinds[key]:
            raise ValueError(f"`{key}` is not {kinds[key].__name__}")
        if isinstance(value, str) and (
            len(value) > MAX_TASK_TEXT or not all(ch.isprintable() for ch in value)
        ):
            raise ValueError(f"`{key}` is not one short printable line")
    return TaskEnd(**values)

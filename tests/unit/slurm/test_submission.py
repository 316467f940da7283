"""What a Slurm run keeps in its run folder: submissions numbered in order, shards named
uniquely, each task's own record of how it went."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from repromatrix.errors import UsageError
from repromatrix.grammars import RUN_ID
from repromatrix.slurm.submission import (
    TaskEnd,
    read,
    read_task_end,
    shard_id,
    submissions,
    write,
    write_task_end,
)
from support.slurm import cells, submission_of


def test_a_submission_reads_back_as_it_was_written(tmp_path: Path):
    made = submission_of(tmp_path / "run", cells(2))
    again = read(made.folder)
    assert again == made
    assert [t.slurm_id for t in again.tasks] == ["41_0"]
    assert again.tasks[0].cells == tuple(sorted(c.id for c in cells(2)))
    assert again.job_ids == ("41",)
    finished = write(replace(made, finish_job="43", cancelled=True, finished=True))
    assert read(made.folder) == finished and finished.job_ids == ("41", "43")


def test_submissions_are_numbered_in_order(tmp_path: Path):
    first = submission_of(tmp_path / "run", cells(1))
    second = submission_of(tmp_path / "run", cells(1), job_id="50")
    assert (first.number, second.number) == (1, 2)
    assert [s.number for s in submissions(tmp_path / "run")] == [1, 2]
    assert first.tasks[0].shard != second.tasks[0].shard  # containers of two tasks never share


def test_shard_ids_are_run_ids_unique_to_run_submission_array_and_task():
    ids = {shard_id(run, n, array, i) for run in ("a", "b") for n in (1, 2)
           for array in ("cpu", "h100") for i in (0, 1)}  # fmt: skip
    assert len(ids) == 16 and all(RUN_ID.match(i) for i in ids)
    long_run = "r" * 64
    long_ids = {shard_id(long_run, 1, array, 0) for array in ("cpu", "h100")}
    assert len(long_ids) == 2 and all(RUN_ID.match(i) for i in long_ids)


def test_a_tasks_own_record_of_how_it_went(tmp_path: Path):
    assert read_task_end(tmp_path) is None
    start = TaskEnd(job="41_0", attempt=1, host="node7", started_at="2026-01-01T00:00:00+00:00")
    write_task_end(tmp_path, start)
    assert read_task_end(tmp_path) == start
    (tmp_path / "task.json").write_text("{not json")
    assert read_task_end(tmp_path) is None


@pytest.mark.parametrize(
    "change",
    [
        {"exit_code": 10**4000},  # past a float, near int()'s limit (issue 34, item 7)
        {"attempt": "1"},
        {"host": "node7\n#SBATCH --wrap=x"},  # a line of its own in a reason
        {"signal": ["SIGTERM"]},
        {"host": "n" * 10_000},
    ],
)
def test_a_task_record_of_the_wrong_shape_is_no_record(tmp_path: Path, change: dict[str, object]):
    start = TaskEnd(job="41_0", attempt=1, host="node7", started_at="2026-01-01T00:00:00+00:00")
    write_task_end(tmp_path, start)
    data = json.loads((tmp_path / "task.json").read_text())
    (tmp_path / "task.json").write_text(json.dumps({**data, **change}))
    assert read_task_end(tmp_path) is None


def test_a_task_record_that_is_a_fifo_is_not_waited_on(tmp_path: Path):
    os.mkfifo(tmp_path / "task.json")
    assert read_task_end(tmp_path) is None


def _task(change: dict[str, object]) -> Callable[[dict[str, Any]], None]:
    def damage(data: dict[str, Any]) -> None:
        data["tasks"][0].update(change)

    return damage


SUBMISSION_DAMAGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "a shard that climbs out": _task({"shard": "../../../victim"}),
    "a cell that climbs out": _task({"cells": ["../../x"]}),
    "a job id that is an option": lambda d: d["jobs"].update({"cpu": "--help"}),
    "a finish job that is an option": lambda d: d.update({"finish_job": "-u root"}),
    "a number of 5000 digits": lambda d: d.update({"number": 10**4000}),
    "an array with a slash": _task({"array": "a/b"}),
}


@pytest.mark.parametrize("name", list(SUBMISSION_DAMAGES))
def test_a_submission_record_of_the_wrong_shape_is_refused_naming_it(tmp_path: Path, name: str):
    """Issue 34: values from a Slurm record become paths and arguments; each is checked."""
    made = submission_of(tmp_path / "run", cells(2))
    path = made.folder / "submission.json"
    data = json.loads(path.read_text())
    SUBMISSION_DAMAGES[name](data)
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="not a submission this repromatrix wrote"):
        read(made.folder)


def test_a_long_shard_id_is_hashed_short():
    assert RUN_ID.fullmatch(shard_id("r" * 60, 1, "h100", 0))

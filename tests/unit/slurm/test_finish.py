"""The end of a submission: how each task ended, from scontrol or else its own record, and
the cells a failed task left saved as infra errors naming it (not when the submitter
cancelled it), gathered into the run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.judgement import Outcome
from repromatrix.results import store
from repromatrix.slurm.finish import finish_submission, gather_run, task_end
from repromatrix.slurm.scontrol import JobRecord
from repromatrix.slurm.submission import TaskEnd, read, write_task_end
from support.slurm import cells, finish_cell, submission_of

STARTED = TaskEnd(job="41_0", attempt=0, host="node7", started_at="2026-01-01T00:00:00+00:00")


def ended(state: str, exit_code: int | None = 0) -> JobRecord:
    return JobRecord("42", "41", (0,), state, exit_code=exit_code, node="node3")


@pytest.mark.parametrize(
    "record, written, expected",
    [
        (ended("TIMEOUT", 0), None, ("TIMEOUT", "node3", 0)),
        (ended("CANCELLED by 0", 130), STARTED, ("CANCELLED", "node3", 130)),
        (ended("FAILED", 130), replace(STARTED, ended_at="t", exit_code=130, signal="SIGTERM"),
         ("FAILED after SIGTERM", "node3", 130)),
        (None, replace(STARTED, ended_at="t", exit_code=0), ("COMPLETED", "node7", 0)),
        (None, replace(STARTED, ended_at="t", exit_code=3), ("FAILED", "node7", 3)),
        (None, replace(STARTED, ended_at="t", exit_code=137, signal="SIGKILL"),
         ("by SIGKILL", "node7", 137)),
        (JobRecord("42", "41", (0,), "RUNNING"), replace(STARTED, ended_at="t", exit_code=0),
         ("COMPLETED", "node7", 0)),
    ],
)  # fmt: skip
def test_how_a_task_ended(
    record: JobRecord | None, written: TaskEnd | None, expected: tuple[str, str, int]
):
    assert task_end(record, written) == expected


def test_a_task_killed_hard_says_so_and_one_that_never_started_too():
    state, host, _ = task_end(None, STARTED)
    assert state.startswith("without writing its end (killed") and host == "node7"
    assert task_end(None, None)[0] == "before it started"


def test_a_failed_tasks_unfinished_cells_are_infra_errors_naming_it(tmp_path: Path):
    some = cells(2)
    run_dir = tmp_path / "run"
    submission = submission_of(run_dir, some)
    (task,) = submission.tasks
    finish_cell(submission, task, some[0])
    lines: list[str] = []
    records = {"cpu": {0: ended("TIMEOUT", 0)}}
    (end,) = finish_submission(submission, records, {c.id: c for c in some}, lines.append)
    assert end.unfinished == (some[1].id,)
    gather_run(run_dir)
    found = {r.id: r for r in store.read_results(run_dir)[0]}
    lost = found[some[1].id]
    assert lost.outcome is Outcome.INFRA_ERROR
    assert lost.reason.startswith(
        "Slurm task 41_0 (cpu-0) ended TIMEOUT on node3 before this cell finished"
    )
    assert str(submission.logs / "cpu-0.log") in lost.reason
    assert found[some[0].id].outcome is not Outcome.INFRA_ERROR
    assert "Slurm task 41_0 (cpu-0) ended TIMEOUT on node3: 1/2 cell(s) finished" in lines
    assert read(submission.folder).finished


def test_cells_of_a_submission_the_submitter_cancelled_stay_without_a_result(tmp_path: Path):
    some = cells(2)
    submission = replace(submission_of(tmp_path / "run", some), cancelled=True)
    records = {"cpu": {0: ended("CANCELLED", 130)}}
    finish_submission(submission, records, {c.id: c for c in some}, lambda _line: None)
    gather_run(tmp_path / "run")
    assert store.finished_ids(tmp_path / "run") == set()  # `--resume` runs them


def test_a_task_that_wrote_its_end_is_read_once_scontrol_forgot_it(tmp_path: Path):
    some = cells(1)
    submission = submission_of(tmp_path / "run", some)
    (task,) = submission.tasks
    write_task_end(submission.shard(task), STARTED)  # its start only: it was killed hard
    (end,) = finish_submission(submission, {}, {c.id: c for c in some}, lambda _line: None)
    assert "without writing its end" in end.state and end.host == "node7"
    (result,) = store.read_results(submission.shard(task))[0]
    assert result.outcome is Outcome.INFRA_ERROR and "killed" in result.reason

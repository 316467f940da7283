"""Waiting for a submission: each poll's view of its tasks, and the lines a person reads."""

from __future__ import annotations

from pathlib import Path

from repromatrix.slurm.poll import TaskView, changes, summary, view
from repromatrix.slurm.scontrol import JobRecord, Phase
from support.slurm import cells, finish_cell, submission_of


def record(state: str, tasks: tuple[int, ...], restarts: int = 0) -> JobRecord:
    return JobRecord("42", "41", tasks, state, node="node7", restarts=restarts)


def test_a_poll_sees_each_tasks_phase_node_and_finished_cells(tmp_path: Path):
    some = cells(3)
    submission = submission_of(tmp_path / "run", some)
    (task,) = submission.tasks
    finish_cell(submission, task, some[0])
    (running,) = view(submission, {"cpu": {0: record("RUNNING", (0,))}})
    assert (running.phase, running.node, running.done) == (Phase.RUNNING, "node7", 1)
    assert running.line() == "cpu-0 (41_0) RUNNING on node7: 1/3 cells"
    assert summary([running]) == (
        "slurm: 0 pending, 1 running, 0 done; cells 1/3 (cpu-0 on node7: 1/3)"
    )
    (forgotten,) = view(submission, {"cpu": {}})  # scontrol no longer knows it: it has ended
    assert forgotten.phase is Phase.ENDED


def by_name(views: tuple[TaskView, ...]) -> dict[str, TaskView]:
    return {v.task.name: v for v in views}


def test_lines_for_a_start_a_requeue_and_an_end(tmp_path: Path):
    submission = submission_of(tmp_path / "run", cells(2))
    pending = view(submission, {"cpu": {0: record("PENDING", (0,))}})
    running = view(submission, {"cpu": {0: record("RUNNING", (0,))}})
    requeued = view(submission, {"cpu": {0: record("PENDING", (0,), restarts=1)}})
    ended = view(submission, {"cpu": {0: record("TIMEOUT", (0,), restarts=1)}})
    assert changes({}, pending) == []
    assert changes(by_name(pending), running) == ["cpu-0 (41_0) RUNNING on node7: 0/2 cells"]
    assert changes(by_name(running), running) == []
    assert changes(by_name(running), requeued) == [
        "cpu-0 (41_0) PENDING, attempt 2: 0/2 cells: back in the queue, it resumes its shard"
    ]
    assert changes(by_name(requeued), ended) == [
        "cpu-0 (41_0) TIMEOUT on node7, attempt 2: 0/2 cells"
    ]
    assert summary(ended) == "slurm: 0 pending, 0 running, 1 done; cells 0/2"

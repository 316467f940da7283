"""scontrol's records of an array's tasks, read from what a real Slurm 22.05 printed."""

from __future__ import annotations

import pytest

from repromatrix.slurm.scontrol import (
    JobRecord,
    Phase,
    by_task,
    fields,
    parse_records,
    phase,
    state_word,
    task_indexes,
)
from support import paths

DATA = paths.DATA / "slurm"


def records(name: str) -> tuple[JobRecord, ...]:
    return parse_records((DATA / f"scontrol-{name}.txt").read_text())


def test_the_pending_tasks_of_an_array_share_one_record_with_a_range():
    pending, running = records("pending-running")
    assert (pending.job_id, pending.array_job_id, pending.array_tasks) == ("16", "16", (1, 2, 3))
    assert pending.phase is Phase.WAITING and pending.node is None
    assert running.array_tasks == (0,) and running.phase is Phase.RUNNING
    assert running.node == "vm" and running.job_id != running.array_job_id


def test_each_started_task_has_its_own_record_and_state():
    tasks = by_task(records("mixed"))
    assert {i: t.state for i, t in tasks.items()} == {
        0: "COMPLETED",
        1: "CANCELLED",
        2: "RUNNING",
        3: "PENDING",
    }
    assert [tasks[i].phase for i in range(4)] == [
        Phase.ENDED,
        Phase.ENDED,
        Phase.RUNNING,
        Phase.WAITING,
    ]
    assert tasks[3].reason == "JobArrayTaskLimit"


def test_exit_codes_and_restarts():
    (failed,) = records("failed")
    assert (failed.state, failed.reason, failed.exit_code, failed.signal) == (
        "FAILED",
        "NonZeroExitCode",
        3,
        0,
    )
    assert failed.array_tasks == () and failed.array_job_id is None
    (requeued,) = records("requeued-done")
    assert (requeued.state, requeued.restarts) == ("COMPLETED", 1)
    (cancelled,) = records("cancelled-130")
    assert (cancelled.state, cancelled.exit_code) == ("CANCELLED", 130)


def test_a_requeued_task_waits_again_with_its_restart_counted():
    tasks = by_task(records("requeued-pending"))
    assert tasks[0].phase is Phase.WAITING
    assert (tasks[0].reason, tasks[0].restarts) == ("BeginTime", 1)
    assert tasks[1].phase is Phase.RUNNING


@pytest.mark.parametrize(
    "text, indexes",
    [
        ("3", (3,)),
        ("2-5", (2, 3, 4, 5)),
        ("1,3,7-9%2", (1, 3, 7, 8, 9)),
        ("0-8:4", (0, 4, 8)),
        ("junk", ()),
    ],
)
def test_array_task_ranges(text: str, indexes: tuple[int, ...]):
    assert task_indexes(text) == indexes


@pytest.mark.parametrize(
    "state, expected",
    [
        ("PENDING", Phase.WAITING),
        ("REQUEUED", Phase.WAITING),
        ("RUNNING", Phase.RUNNING),
        ("COMPLETING", Phase.RUNNING),
        ("COMPLETED", Phase.ENDED),
        ("CANCELLED by 0", Phase.ENDED),
        ("TIMEOUT", Phase.ENDED),
        ("NODE_FAIL", Phase.ENDED),
        ("OUT_OF_MEMORY", Phase.ENDED),
    ],
)
def test_phases(state: str, expected: Phase):
    assert phase(state) is expected


def test_a_value_runs_to_the_next_key():
    found = fields("JobId=7 Comment=two words here JobState=RUNNING AllocNode:Sid=h:1")
    assert found == {
        "JobId": "7",
        "Comment": "two words here",
        "JobState": "RUNNING",
        "AllocNode:Sid": "h:1",
    }
    assert state_word("CANCELLED by 0") == "CANCELLED" and state_word("") == "UNKNOWN"

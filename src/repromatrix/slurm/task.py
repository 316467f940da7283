"""What each task of a Slurm run does on its node: ``repromatrix run`` for its cells.

The batch script calls ``run_task``. It runs ``repromatrix run`` for the task's cells
as a child process with the task's shard as its run folder and ``--resume``, so a
task that was preempted and requeued runs only what its earlier attempt left (the
shard's claim passes to the new attempt, which is the same Slurm job). It stays the
child's parent: it hands the signals Slurm sends the batch shell (the warning before
the time limit, a cancel) on to the run, which then stops and removes its containers
(a Docker daemon runs them outside the job, where Slurm's own kill does not reach),
and it writes how the task went, ``task.json``, when it starts and once the run has
ended, however it ended. The run itself reads the job's cores, memory and GPUs from
the environment Slurm gave it (``runner.detect_runner``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import FrameType

from repromatrix.results.store import now_iso
from repromatrix.slurm.submission import TaskEnd, write_task_end

FORWARDED = (signal.SIGTERM, signal.SIGINT)
DOCKERFILES_DIR = "dockerfiles"


def task_argv(
    run_argv: Sequence[str], only: Sequence[str], shards: Path, shard_id: str
) -> list[str]:
    """The task's ``repromatrix run``: the run's arguments, its cells, its shard, resumed.

    Build contexts go to a folder of the task's own, beside the shards: tasks of one
    image on several nodes would otherwise write the same files at once.
    """
    dockerfiles = shards.parent / DOCKERFILES_DIR / shard_id
    return [
        sys.executable,
        "-m",
        "repromatrix",
        "run",
        *run_argv,
        *(arg for glob in only for arg in ("--only", glob)),
        "--results",
        str(shards),
        "--run-id",
        shard_id,
        "--resume",
        "--dockerfiles",
        str(dockerfiles),
    ]


def run_task(
    shards: str,
    shard_ids: Sequence[str],
    run_argv: Sequence[str],
    tasks: Sequence[Sequence[str]],
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run the task ``SLURM_ARRAY_TASK_ID`` names; return its run's exit status."""
    env = os.environ if environ is None else environ
    index = int(env["SLURM_ARRAY_TASK_ID"])
    shard = Path(shards) / shard_ids[index]
    attempt = env.get("SLURM_RESTART_COUNT", "0")
    start = TaskEnd(
        job=f"{env.get('SLURM_ARRAY_JOB_ID', '?')}_{index}",
        attempt=int(attempt) if attempt.isdigit() else 0,
        host=socket.gethostname(),
        started_at=now_iso(),
    )
    shard.mkdir(parents=True, exist_ok=True)
    write_task_end(shard, start)
    status, ended_by = supervise(task_argv(run_argv, tasks[index], Path(shards), shard_ids[index]))
    write_task_end(shard, replace(start, ended_at=now_iso(), exit_code=status, signal=ended_by))
    return status


def supervise(argv: Sequence[str]) -> tuple[int, str | None]:
    """Run ``argv`` as a child that gets the signals this process gets; return its exit
    status (128 + the signal's number when one killed it) and the name of the signal that
    ended it: the one that killed it, else the first one handed on to it."""
    child = subprocess.Popen(list(argv))
    with forwarding(child) as forwarded:
        code = child.wait()
    if code < 0:
        return 128 - code, signal.Signals(-code).name
    return code, forwarded[0] if forwarded else None


@contextmanager
def forwarding(child: subprocess.Popen[bytes]) -> Iterator[list[str]]:
    """Hand SIGTERM and SIGINT on to ``child`` while the block runs; yields the names of
    those handed on."""
    forwarded: list[str] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)
            forwarded.append(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        yield forwarded
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

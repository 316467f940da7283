"""What a task runs: its own ``repromatrix run`` into its shard, resumed, as a child that gets
the signals Slurm sends the batch shell."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from repromatrix.slurm.task import supervise, task_argv

# A child that says when its SIGTERM handler is in place, then exits 7 on SIGTERM.
CHILD = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
pathlib.Path(sys.argv[1]).write_text("ready")
time.sleep(60)
sys.exit(1)
"""


def test_the_task_runs_its_cells_into_its_shard_resumed():
    argv = task_argv(["--matrix", "/m.yaml"], ["a/*", "b/c"], Path("/r/slurm/1/shards"), "s-0")
    assert argv[:4] == [sys.executable, "-m", "repromatrix", "run"]
    assert argv[4:] == [
        "--matrix", "/m.yaml",
        "--only", "a/*", "--only", "b/c",
        "--results", "/r/slurm/1/shards",
        "--run-id", "s-0",
        "--resume",
        "--dockerfiles", "/r/slurm/1/dockerfiles/s-0",
    ]  # fmt: skip


def test_a_signal_to_the_batch_shell_reaches_the_run(tmp_path: Path, sigint_raises: None):
    ready = tmp_path / "ready"

    def signal_when_ready() -> None:
        while not ready.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # as Slurm signals the batch shell (B:TERM)

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=signal_when_ready)
    thread.start()
    status, ended_by = supervise([sys.executable, "-c", CHILD, str(ready)])
    thread.join()
    assert (status, ended_by) == (7, "SIGTERM")  # the child's own handler ran: it could clean up
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back


def test_a_child_killed_by_a_signal_is_named():
    status, ended_by = supervise([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    assert (status, ended_by) == (137, "SIGKILL")

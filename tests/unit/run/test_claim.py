"""The run folder's claim: refused while its holder may run, taken over once it provably cannot,
without flock (the lock file holds who made it)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.errors import UsageError
from repromatrix.run.claim import LOCK_FILE, Holder, claim, gone, this_process


def plant(run_dir: Path, holder: Holder) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    path.write_text(json.dumps(holder.to_json()))
    return path


def ended_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def held_by(run_dir: Path) -> Holder:
    return Holder.from_json(json.loads((run_dir / LOCK_FILE).read_text()))


def test_a_second_claim_is_refused_naming_the_holder_and_free_once_released(tmp_path: Path):
    first = claim(tmp_path / "run")
    with pytest.raises(UsageError, match=rf"another run \(pid {os.getpid()} on "):
        claim(tmp_path / "run")
    first.release()
    assert not (tmp_path / "run" / LOCK_FILE).exists()
    claim(tmp_path / "run").release()


def test_the_lock_file_names_host_boot_pid_and_start_time(tmp_path: Path):
    held = claim(tmp_path / "run")
    me = this_process()
    assert held_by(tmp_path / "run") == me
    assert me.started is not None and me.boot_id
    held.release()


def test_a_claim_whose_process_has_ended_is_taken_over(tmp_path: Path):
    me = this_process()
    plant(tmp_path / "run", replace(me, pid=ended_pid()))
    claim(tmp_path / "run").release()


def test_a_claim_whose_pid_now_belongs_to_another_process_is_taken_over(tmp_path: Path):
    me = this_process()
    assert me.started is not None
    plant(tmp_path / "run", replace(me, started=me.started - 1))  # our pid, an older process
    held = claim(tmp_path / "run")
    assert held_by(tmp_path / "run") == me
    held.release()


def test_a_claim_from_an_earlier_boot_of_this_machine_is_taken_over(tmp_path: Path):
    plant(tmp_path / "run", replace(this_process(), boot_id="another-boot"))
    claim(tmp_path / "run").release()


def test_a_claim_held_on_another_machine_is_refused_with_the_file_to_remove(tmp_path: Path):
    path = plant(tmp_path / "run", replace(this_process(), host="node7", pid=ended_pid()))
    with pytest.raises(UsageError, match=f"on node7\\).*if node7 is gone for good, remove {path}"):
        claim(tmp_path / "run")
    assert held_by(tmp_path / "run").host == "node7"  # left as it was


def test_a_requeued_slurm_task_takes_over_from_its_earlier_attempt_on_any_node(tmp_path: Path):
    env = {"SLURM_JOB_ID": "45", "SLURM_CLUSTER_NAME": "c", "SLURM_RESTART_COUNT": "1"}
    me = this_process(env)
    assert (me.job, me.attempt) == ("c/45", 1)
    earlier = replace(me, host="node7", attempt=0)
    assert gone(earlier, me) is not None
    plant(tmp_path / "run", earlier)
    claim(tmp_path / "run", me).release()


@pytest.mark.parametrize("job, attempt", [("c/45", 1), ("c/46", 0), (None, 0)])
def test_other_slurm_jobs_and_the_same_attempt_prove_nothing(job: str | None, attempt: int):
    me = replace(this_process(), job="c/45", attempt=1)
    other = replace(me, host="node7", job=job, attempt=attempt)
    assert gone(other, me) is None


def test_a_lock_file_of_the_flock_versions_is_taken_over_when_no_flock_holds_it(tmp_path: Path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_FILE).write_text("12345\n")
    claim(tmp_path / "run").release()


def test_a_lock_file_of_the_flock_versions_still_flocked_is_refused(tmp_path: Path):
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / LOCK_FILE
    path.write_text("12345\n")
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(UsageError, match=r"another run \(pid 12345\)"):
            claim(tmp_path / "run")
    finally:
        os.close(fd)


def test_release_leaves_a_claim_another_run_took_over(tmp_path: Path):
    held = claim(tmp_path / "run")
    successor = replace(this_process(), pid=held.holder.pid + 1, started=None)
    plant(tmp_path / "run", successor)  # as if taken over after this run was judged gone
    held.release()
    assert held_by(tmp_path / "run") == successor


def test_no_temporary_file_is_left_beside_the_lock(tmp_path: Path):
    held = claim(tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK_FILE]
    held.release()
    assert list((tmp_path / "run").iterdir()) == []

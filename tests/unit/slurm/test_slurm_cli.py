"""``--executor slurm`` and ``plan --format slurm`` from the command line, without a cluster."""

from __future__ import annotations

import os
import re
from pathlib import Path

from support.cli import repromatrix

ONE = "cpu/0.32.0/cpu/tiny-llama/default/cpu-kv-cache-too-small/trigger"


def test_plan_prints_each_batch_script_a_run_would_submit():
    done = repromatrix("plan", "--format", "slurm", "--lane", "cpu", "--only", "cpu/0.3{1,2}.0/*")
    assert done.returncode == 0, done.stderr
    paths = re.findall(r"^# ==> (.+) <==$", done.stdout, re.M)
    assert [Path(p).name for p in paths] == ["cpu.sbatch", "finish.sbatch", "submission.json"]
    assert "#SBATCH --array=0-1" in done.stdout  # a task per image
    assert "from repromatrix.slurm.task import run_task" in done.stdout


def test_a_dry_run_prints_the_scripts_and_submits_nothing(tmp_path: Path):
    done = repromatrix(
        "run", "--executor", "slurm", "--dry-run", "--only", ONE, "--results", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert f'["{ONE}"],  # task 0: 1 cell(s)' in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_host_without_slurms_commands_is_told_so(tmp_path: Path):
    env = {"PATH": str(tmp_path), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    done = repromatrix(
        "run", "--executor", "slurm", "--only", ONE, "--results", str(tmp_path), env=env
    )
    assert done.returncode == 3
    assert "--executor slurm: sbatch, scontrol, scancel, squeue not found" in done.stderr


def test_detach_and_prepare_only_are_refused_where_they_mean_nothing(tmp_path: Path):
    detach = repromatrix("run", "--detach", "--only", ONE, "--results", str(tmp_path))
    assert detach.returncode == 2 and "--detach is for --executor slurm" in detach.stderr
    prepare = repromatrix(
        "run", "--executor", "slurm", "--prepare-only", "--only", ONE, "--results", str(tmp_path)
    )
    assert prepare.returncode == 2 and "Slurm tasks make their own" in prepare.stderr

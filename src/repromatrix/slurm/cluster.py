"""The one module that runs Slurm's commands: sbatch, scontrol, scancel and squeue.

Every command runs with this process's environment, so the site's ``SBATCH_*``
variables reach ``sbatch`` (and win over the scripts' ``#SBATCH`` lines, as
Slurm orders them). A batch script Slurm refuses (an unknown partition, more GPUs
than any node has) is a ``SlurmRefused`` with Slurm's own words.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from repromatrix.errors import InfraError, UsageError
from repromatrix.slurm.scontrol import JobRecord, parse_records

TIMEOUT_S = 60.0  # a command of a busy controller may take a while; it never takes minutes
UNKNOWN_JOB = "Invalid job id"


class SlurmRefused(UsageError):
    """Slurm refused a batch script: what the matrix asks for does not exist on this cluster."""


def missing() -> str | None:
    """Why this host cannot submit to Slurm (None: it can)."""
    absent = [
        name for name in ("sbatch", "scontrol", "scancel", "squeue") if not shutil.which(name)
    ]
    if absent:
        return f"{', '.join(absent)} not found: this host is no Slurm submit host"
    return None


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise InfraError(f"`{argv[0]}` failed: {exc}") from exc


def _words(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stderr or done.stdout).split()) or f"exit status {done.returncode}"


def check(script: Path) -> None:
    """Ask Slurm whether it would run ``script`` (``sbatch --test-only``: nothing is
    submitted); raise ``SlurmRefused`` in its words when it would not. A held job is not
    checked against the nodes until it is released, so every script is checked first."""
    done = _run(["sbatch", "--test-only", str(script)])
    if done.returncode != 0:
        raise SlurmRefused(f"Slurm refused {script.name}: {_words(done)}")


def submit(script: Path, *, hold: bool = False, dependency: Sequence[str] = ()) -> str:
    """Submit ``script``; return its job id. ``hold`` keeps it from starting until ``release``;
    ``dependency`` is the jobs it starts after, whatever their ends (``afterany``)."""
    argv = ["sbatch", "--parsable"]
    if hold:
        argv.append("--hold")
    if dependency:
        argv.append(f"--dependency=afterany:{':'.join(dependency)}")
    done = _run([*argv, str(script)])
    if done.returncode != 0:
        raise SlurmRefused(f"Slurm refused {script.name}: {_words(done)}")
    job_id = done.stdout.strip().split(";", 1)[0]
    if not job_id.isdigit():
        raise InfraError(f"sbatch gave no job id for {script.name}: {done.stdout.strip()!r}")
    return job_id


def release(job_ids: Sequence[str]) -> None:
    """Let held jobs start."""
    done = _run(["scontrol", "release", ",".join(job_ids)])
    if done.returncode != 0:
        raise InfraError(f"scontrol release {','.join(job_ids)} failed: {_words(done)}")


def cancel(job_ids: Sequence[str]) -> None:
    """Cancel jobs (every task of an array); jobs that have ended already are fine."""
    if job_ids:
        _run(["scancel", *job_ids])


def show(job_id: str) -> tuple[JobRecord, ...] | None:
    """What ``scontrol`` says of a job (an array: each of its tasks); None when it no longer
    knows the job (it forgets ended jobs after ``MinJobAge``)."""
    done = _run(["scontrol", "show", "job", "--oneliner", job_id])
    if done.returncode != 0:
        if UNKNOWN_JOB in done.stderr:
            return None
        raise InfraError(f"scontrol show job {job_id} failed: {_words(done)}")
    return parse_records(done.stdout)


def queued(job_ids: Sequence[str]) -> set[str]:
    """The jobs among ``job_ids`` that still have a task pending, running or ending."""
    if not job_ids:
        return set()
    done = _run(["squeue", "--noheader", "--format=%F", f"--jobs={','.join(job_ids)}"])
    if done.returncode != 0 and UNKNOWN_JOB not in done.stderr:
        raise InfraError(f"squeue failed: {_words(done)}")
    return {line.strip() for line in done.stdout.splitlines() if line.strip()}

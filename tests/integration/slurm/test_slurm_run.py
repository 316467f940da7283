"""``repromatrix run --executor slurm`` against a real one-node Slurm cluster (made by
``.ci/slurm-cluster``): real CPU-lane cells with real vLLM, each task running
``repromatrix run`` in Docker.

One run of three cells in two tasks (an image each) gives the outcomes of the same
cells run directly on this host (``cpu_run``); the site's ``SBATCH_EXCLUSIVE`` makes
its tasks run one at a time on the two cores, and its second task is requeued once its
first cell is saved, so it resumes its shard. Then the faults, each with one cell cut
short: the submitter interrupted (the jobs cancelled, no container left), a task
cancelled from outside (its cell an infra error naming it), scripts Slurm refuses (an
error before anything runs), and a detached run whose merge job writes the reports.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import docker
import pytest

from repromatrix.backends.docker.calls import CELL_LABEL, RUN_LABEL
from repromatrix.judgement import Outcome
from repromatrix.results import store
from repromatrix.results.store import CellResult
from repromatrix.slurm.submission import RECORD_FILE, Submission, TaskEnd, read, read_task_end
from support import paths
from support.cli import ENV, argv
from support.cli import repromatrix_process as repromatrix

ROOT = paths.ROOT
KV = "cpu/{v}/cpu/tiny-llama/default/cpu-kv-cache-too-small/{variant}"
THREE_CELLS = [
    "--only", KV.format(v="0.31.0", variant="trigger"),
    "--only", KV.format(v="0.32.0", variant="{max-model-len-64,trigger}"),
]  # fmt: skip
RUN_S = 1800  # three real engines one after another on two shared cores, with room
UNTIL_S = 600  # the longest any one step waits for the cluster or a container

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.vllm]

T = TypeVar("T")


def until(found: Callable[[], T | None], what: str, timeout: float = UNTIL_S) -> T:
    """Poll ``found`` until it gives a value."""
    deadline = time.monotonic() + timeout
    while (value := found()) is None or value is False:
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.5)
    return value


@dataclass
class Submitter:
    """A ``repromatrix run --executor slurm`` started in the background."""

    proc: subprocess.Popen[bytes]
    log: Path
    run_dir: Path

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def submission(self, number: int = 1) -> Submission:
        folder = self.run_dir / "slurm" / str(number)
        until((folder / RECORD_FILE).is_file, f"submission {number} recorded")
        return read(folder)

    def wait(self, timeout: float = RUN_S) -> int:
        return self.proc.wait(timeout)


def submit(out: Path, run_id: str, *args: str, env: dict[str, str] | None = None) -> Submitter:
    log = out / f"{run_id}.log"
    command = argv(
        "run", "--executor", "slurm", "--backend", "docker",
        "--results", str(out), "--run-id", run_id, *args,
    )  # fmt: skip
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            command, cwd=ROOT, env={**ENV, **(env or {})}, stdout=subprocess.DEVNULL, stderr=stderr
        )
    return Submitter(proc, log, out / run_id)


def cell_containers(shard: str) -> list[docker.models.containers.Container]:
    """The containers running cells (not the tool ones) for a task's shard."""
    client = docker.from_env()
    try:
        # sparse: no inspect of each, which 404s on a tool container gone in between.
        found = client.containers.list(
            all=True, filters={"label": f"{RUN_LABEL}={shard}"}, sparse=True
        )
        return [c for c in found if not c.attrs["Labels"].get(CELL_LABEL, "").startswith("tool:")]
    finally:
        client.close()


def queued(submission: Submission) -> str:
    done = subprocess.run(
        ["squeue", "--noheader", "--format=%i", f"--jobs={','.join(submission.job_ids)}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip()


def results_of(run_dir: Path) -> dict[tuple[str, str, str], CellResult]:
    found, problems = store.read_results(run_dir)
    assert problems == []
    return {(r.image_tag, r.scenario, r.variant): r for r in found}


def moment(text: str) -> datetime:
    return datetime.fromisoformat(text)


def requeue_once_its_first_cell_is_saved(run: Submitter) -> tuple[Submission, int | None]:
    """Requeue the task of two cells once the first is saved (Slurm starts it again after
    its credentials expire: ``AuthInfo=cred_expire`` of .ci/slurm-cluster); return the memory
    limit its cell container had."""
    submission = run.submission()
    (task,) = [t for t in submission.tasks if len(t.cells) == 2]
    shard = submission.shard(task)
    container = until(lambda: cell_containers(task.shard) or None, "the task's first container")
    container[0].reload()  # a cell's container lives for minutes: it is there to inspect
    memory = container[0].attrs["HostConfig"]["Memory"]
    until(lambda: store.finished_ids(shard) or None, "the task's first cell saved")
    subprocess.run(["scontrol", "requeue", task.slurm_id], check=True)
    return submission, memory


@dataclass(frozen=True)
class SlurmRun:
    """What the real Slurm run left."""

    status: int
    output: str
    run_dir: Path
    submission: Submission
    results: dict[tuple[str, str, str], CellResult]
    ends: dict[str, TaskEnd]  # task name -> its task.json
    memory: int | None  # the memory limit a cell container had
    script: str  # the array's batch script


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmRun]:
    out = tmp_path_factory.mktemp("slurm")
    # The site's own environment: every task gets a node to itself, so they run one at a time.
    began = time.monotonic()
    run = submit(out, "ci-slurm", *THREE_CELLS, env={"SBATCH_EXCLUSIVE": ""})
    try:
        submission, memory = requeue_once_its_first_cell_is_saved(run)
        status = run.wait()
    finally:
        run.proc.kill()
    print(f"the Slurm run of three cells took {time.monotonic() - began:.0f} s")
    ends = {t.name: read_task_end(submission.shard(t)) for t in submission.tasks}
    yield SlurmRun(
        status=status,
        output=run.output,
        run_dir=run.run_dir,
        submission=read(submission.folder),
        results=results_of(run.run_dir),
        ends={name: end for name, end in ends.items() if end is not None},
        memory=memory,
        script=(submission.folder / "cpu.sbatch").read_text(),
    )


def test_cells_run_as_slurm_tasks_give_the_outcomes_they_give_run_directly(slurm_run, cpu_run):
    assert slurm_run.status == 0, slurm_run.output[-3000:]
    assert len(slurm_run.results) == 3
    for key, result in slurm_run.results.items():
        direct = cpu_run.results[key]
        assert result.outcome is direct.outcome, (key, result.reason, direct.reason)
        assert result.version == direct.version
        assert (result.root_cause is None) == (direct.root_cause is None)
    outcomes = {key[2]: r.outcome for key, r in slurm_run.results.items()}
    assert outcomes == {"trigger": Outcome.HIT, "max-model-len-64": Outcome.AVOIDED}
    assert "done: 1 avoided, 2 hit" in slurm_run.output


def test_the_run_folder_holds_the_tasks_shards_and_the_reports(slurm_run):
    shards = {r.run_id for r in slurm_run.results.values()}
    assert shards == {t.shard for t in slurm_run.submission.tasks}  # each cell ran in a task
    for report in ("compat.md", "junit.xml"):
        assert (slurm_run.run_dir / report).is_file()
    assert slurm_run.submission.finished and not slurm_run.submission.cancelled


def test_a_requeued_task_resumes_its_shard(slurm_run):
    (task,) = [t for t in slurm_run.submission.tasks if len(t.cells) == 2]
    end = slurm_run.ends[task.name]
    assert end.attempt == 1 and end.exit_code == 0
    kept = [r for r in slurm_run.results.values() if r.run_id == task.shard]
    first = min(kept, key=lambda r: moment(r.started_at))
    assert moment(first.started_at) < moment(end.started_at)  # saved by the first attempt
    log = (slurm_run.submission.logs / f"{task.name}.log").read_text()
    assert "DUE TO JOB REQUEUE" in log
    # The second attempt's first line: its shard resumed with one of its two cells left.
    assert f"run {task.shard} (results in " in log and ", 1 of 2 cells left): 1 cell" in log
    assert "back in the queue, it resumes its shard" in slurm_run.output


def test_the_sites_sbatch_environment_wins_one_task_at_a_time(slurm_run):
    (single,) = [t for t in slurm_run.submission.tasks if len(t.cells) == 1]
    (double,) = [t for t in slurm_run.submission.tasks if len(t.cells) == 2]
    single_ended = slurm_run.ends[single.name].ended_at
    assert single_ended is not None
    started = [moment(r.started_at) for r in slurm_run.results.values() if r.run_id == double.shard]
    # Without SBATCH_EXCLUSIVE both tasks (a core and 3 GiB each) would run side by side.
    assert min(started) > moment(single_ended)
    assert "#SBATCH --cpus-per-task=1" in slurm_run.script  # what the script alone asks


def test_every_container_is_held_to_its_tasks_memory(slurm_run):
    mem = next(line for line in slurm_run.script.splitlines() if line.startswith("#SBATCH --mem="))
    assert slurm_run.memory == int(mem.removeprefix("#SBATCH --mem=").removesuffix("M")) << 20


def test_no_job_and_no_container_is_left(slurm_run):
    assert queued(slurm_run.submission) == ""
    for task in slurm_run.submission.tasks:
        assert cell_containers(task.shard) == []


def test_the_run_folder_is_like_any_other(slurm_run, tmp_path: Path):
    report = repromatrix("report", str(slurm_run.run_dir))
    assert report.returncode == 0, report.stderr
    merged = repromatrix("merge", str(slurm_run.run_dir), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr
    assert len(store.read_results(tmp_path / "merged")[0]) == 3
    again = repromatrix(
        "run", "--executor", "slurm", "--results", str(slurm_run.run_dir.parent),
        "--run-id", slurm_run.run_dir.name, "--resume", *THREE_CELLS,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "0 of 3 cells to run" in again.stderr
    assert not (slurm_run.run_dir / "slurm" / "2").exists()  # nothing was submitted


def test_overhead_per_task_against_its_cells(slurm_run, cpu_run):
    """Not a threshold: each task's wall time against its cells' own, and each cell's time in
    a task against the same cell's run directly, printed for the record."""
    for key, result in sorted(slurm_run.results.items()):
        direct = cpu_run.results[key].timings.total_s
        print(f"{'/'.join(key)}: {result.timings.total_s:.1f} s in a task, {direct:.1f} s directly")
    for task in slurm_run.submission.tasks:
        end = slurm_run.ends[task.name]
        assert end.ended_at is not None
        wall = (moment(end.ended_at) - moment(end.started_at)).total_seconds()
        cells = [r for r in slurm_run.results.values() if r.run_id == task.shard]
        mine = [r for r in cells if moment(r.started_at) >= moment(end.started_at)]
        own = sum(r.timings.total_s for r in mine)
        print(f"{task.name}: attempt wall {wall:.1f} s, its cells {own:.1f} s")
        assert wall >= own


# -- faults ------------------------------------------------------------------------------------


def started_cell(run: Submitter) -> Submission:
    """The run's submission once its one task's cell container runs."""
    submission = run.submission()
    (task,) = submission.tasks
    until(lambda: cell_containers(task.shard) or run.proc.poll() is not None, "a cell container")
    assert run.proc.poll() is None, run.output
    return submission


def test_an_interrupted_submitter_cancels_its_jobs_and_leaves_no_container(tmp_path: Path):
    one = KV.format(v="0.32.0", variant="trigger")
    run = submit(tmp_path, "ci-slurm-cancel", "--only", one)
    submission = started_cell(run)
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(UNTIL_S) == 130, run.output
    assert queued(submission) == ""
    assert cell_containers(submission.tasks[0].shard) == []
    assert store.finished_ids(run.run_dir) == set()
    assert "no job of this run is left in the Slurm queue" in run.output
    # --resume submits the cell that has no result.
    dry = repromatrix(
        "run", "--executor", "slurm", "--dry-run", "--resume", "--results", str(tmp_path),
        "--run-id", "ci-slurm-cancel", "--only", one,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert json.dumps([one]) in dry.stdout


def test_a_task_killed_mid_run_ends_its_cell_as_an_infra_error_naming_it(tmp_path: Path):
    one = KV.format(v="0.31.0", variant="trigger")
    run = submit(tmp_path, "ci-slurm-killed", "--only", one)
    submission = started_cell(run)
    (task,) = submission.tasks
    subprocess.run(["scancel", task.slurm_id], check=True)  # not the submitter: someone else
    assert run.wait(UNTIL_S) == 3, run.output
    (result,) = store.read_results(run.run_dir)[0]
    assert result.outcome is Outcome.INFRA_ERROR
    assert result.reason.startswith(f"Slurm task {task.slurm_id} (cpu-0) ended CANCELLED")
    assert f"{task.name}: 1 cell(s) it left are infra errors naming it" in run.output
    assert cell_containers(task.shard) == []
    resumed = repromatrix(
        "run", "--executor", "slurm", "--resume", "--results", str(tmp_path),
        "--run-id", "ci-slurm-killed", "--only", one,
    )  # fmt: skip
    assert "0 of 1 cells to run" in resumed.stderr  # it has a result: nothing is submitted


def matrix_with(folder: Path, entry: str, slurm: str) -> list[str]:
    """The default matrix with a ``slurm`` mapping under the GPU entry ``entry`` (its name and
    runner lines)."""
    text = (ROOT / "matrix.yaml").read_text()
    assert entry in text
    matrix = folder / "matrix.yaml"
    matrix.write_text(text.replace(entry, f"{entry}        slurm: {slurm}\n"))
    return ["--matrix", str(matrix), "--scenarios", str(ROOT / "scenarios")]


CPU_ENTRY = "      cpu:\n        runner: ubuntu-latest\n"
H100_ENTRY = "      h100:\n        runner: gpu-h100\n"


def test_a_partition_slurm_does_not_know_is_refused_before_anything_runs(tmp_path: Path):
    site = matrix_with(tmp_path, CPU_ENTRY, "{partition: nowhere}")
    one = KV.format(v="0.32.0", variant="trigger")
    run = submit(tmp_path, "ci-slurm-refused", *site, "--only", one)
    assert run.wait(UNTIL_S) == 2
    assert "Slurm refused cpu.sbatch: sbatch: error: invalid partition specified: nowhere" in (
        run.output
    )
    assert not (run.run_dir / "slurm" / "1").exists()


def test_more_gpus_than_a_node_has_is_refused_before_anything_runs(tmp_path: Path):
    run = submit(tmp_path, "ci-slurm-gpus", "--lane", "gpu", "--only", "gpu/v0.17.0/h200x4/*")
    assert run.wait(UNTIL_S) == 2
    assert "Slurm refused h200x4.sbatch" in run.output
    assert "Requested node configuration is not available" in run.output


def test_a_detached_run_is_merged_and_reported_by_its_dependent_job(tmp_path: Path):
    cell = "gpu/v0.32.0/h100/qwen3-30b-a3b/default/healthy-gpu/baseline"
    # The site's names for its H100s: this cluster's stand-in GPUs are GRES gpu:fake.
    site = matrix_with(tmp_path, H100_ENTRY, "{gres: fake, cpus_per_task: 1, mem: 1G}")
    run = submit(tmp_path, "ci-slurm-detach", *site, "--detach", "--only", cell)
    assert run.wait(UNTIL_S) == 0, run.output
    submission = read(run.run_dir / "slurm" / "1")
    assert submission.finish_job is not None
    assert f"detached: job {submission.finish_job} merges the shards" in run.output
    until(lambda: queued(submission) == "", "the tasks and the merge job gone from the queue")
    (result,) = store.read_results(run.run_dir)[0]
    # The task saw the GPU Slurm gave it, by its own numbering and without nvidia-smi: its
    # cell cannot name it to Docker by UUID, and says so.
    assert result.outcome is Outcome.SKIPPED
    assert "numbers its GPUs its own way" in result.reason and "GPU 0" in result.reason
    assert (run.run_dir / "compat.md").is_file()
    log = (submission.logs / "finish.log").read_text()
    assert "done: 1 skipped" in log
    assert read(submission.folder).finished

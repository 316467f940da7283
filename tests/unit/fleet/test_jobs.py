"""CI jobs sized to the runner's time limit: the workflow's plan and split steps run as CI would.

The real ``repromatrix plan`` output goes through the workflow's own split step; each job's
``--only`` globs are then handed to the real ``plan`` again, as the shard step hands them to
``run``, to see exactly which cells each job would run.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from repromatrix.cli import main
from repromatrix.errors import UsageError
from repromatrix.fleet.jobs import IMAGE_SETUP_S, MARGIN, JobBudget, load_durations, plan_jobs
from repromatrix.judgement import Expected, Outcome
from repromatrix.matrix.expand import expand
from repromatrix.results.store import CellResult, Timings, write_result
from support.matrix import GPU_LANE, setup
from support.workflow import (
    ROOT,
    argv_recorder,
    calls,
    load_workflow,
    real_path,
    run_script,
    step,
    workflow_env,
)

USER_MATRIX = ROOT / "tests" / "data" / "fleet" / "matrix.yaml"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return load_workflow()


def planned(matrix: Path, *args: str) -> list[dict[str, Any]]:
    """``repromatrix plan --json`` with the workflow's inputs: the cells, deadlines included."""
    printed = io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(printed):
        assert main(["plan", "--json", "--matrix", str(matrix), *args]) == 0
    cells = json.loads(printed.getvalue())
    assert isinstance(cells, list)
    return cells


def ci_plan(workflow: dict[str, Any], tmp_path: Path, **inputs: str) -> list[dict[str, Any]]:
    """Run the plan job's step; return the jobs of both lanes from ``$GITHUB_OUTPUT``."""
    output, summary = tmp_path / "output", tmp_path / "summary"
    env = {
        **workflow_env(workflow, **inputs),
        "GITHUB_OUTPUT": str(output),
        "GITHUB_STEP_SUMMARY": str(summary),
        "RUNNER_TEMP": str(tmp_path),
        "PATH": real_path(),
    }
    ran = run_script(step(workflow["jobs"]["plan"], "Emit")["run"], env)
    assert ran.returncode == 0, ran.stderr
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    jobs = []
    for lane in ("gpu", "cpu"):
        mine = json.loads(outputs[lane])["include"]
        assert int(outputs[f"{lane}-jobs"]) == len(mine)
        assert {job["lane"] for job in mine} <= {lane}
        jobs += mine
    return jobs


def shard_cells(
    workflow: dict[str, Any], job: dict[str, Any], tmp_path: Path, **inputs: str
) -> list[str]:
    """The ids the shard step would run for ``job``: its argv, given to the real ``plan``."""
    fakes, log = tmp_path / "bin", tmp_path / f"argv-{job['index']}"
    argv_recorder(fakes, "repromatrix", log)
    env = {
        **workflow_env(workflow, **inputs),
        "ONLY_JSON": json.dumps(job["only"]),
        "LANE": job["lane"],
        "RUN_ID": "gh-1-1-x-0",
        "PATH": real_path(fakes),
    }
    lane_job = workflow["jobs"][job["lane"]]
    ran = run_script(step(lane_job, "share of the")["run"], env, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    [argv] = calls(log)
    assert argv[:5] == ["run", "--lane", job["lane"], "--run-id", "gh-1-1-x-0"]
    planned_args = argv[5:]  # --matrix, --scenarios and the --only globs, as the shard gets them
    return [cell["id"] for cell in planned(Path(planned_args[1]), *planned_args[2:])]


def check_jobs(cells: list[dict[str, Any]], jobs: list[dict[str, Any]], minutes: int) -> None:
    """Every cell in exactly one job; each job's deadlines and image set-ups within its budget."""
    by_id = {cell["id"]: cell for cell in cells}
    seen: list[str] = []
    for job in jobs:
        mine = [by_id[i] for i in job["ran"]]
        assert {cell["runner"] for cell in mine} == {job["runner"]}
        images = {cell["image"] for cell in mine}
        seconds = sum(cell["deadline_s"] for cell in mine) + IMAGE_SETUP_S * len(images)
        assert seconds <= minutes * 60 * (1 - MARGIN), job["name"]
        assert job["cells"] == len(mine)
        seen += job["ran"]
    assert sorted(seen) == sorted(by_id)  # each planned cell exactly once


def test_the_default_matrix_fits_six_hour_jobs_as_ci_runs_it(
    workflow: dict[str, Any], tmp_path: Path
) -> None:
    jobs = ci_plan(workflow, tmp_path)
    for index, job in enumerate(jobs):
        job["index"] = index
        job["ran"] = shard_cells(workflow, job, tmp_path)
    everything = planned(ROOT / "matrix.yaml")
    # Cells that cannot fit their GPUs' memory would get no job (test_memory.py); every
    # other cell is in exactly one.
    cells = [cell for cell in everything if (cell["memory"] or {}).get("fit") != "infeasible"]
    check_jobs(cells, jobs, int(workflow["env"]["JOB_MINUTES"]))
    # The h100 runner has 14 cells of 30 minutes per image: two jobs each, one image per job.
    h100 = [job for job in jobs if job["runner"] == "gpu-h100"]
    assert len(h100) == 2 * len({cell["image"] for cell in cells if cell["gpu"] == "h100"})
    assert "longest job estimated at" in (tmp_path / "summary").read_text()


def test_a_user_matrix_and_selection_reach_every_job(
    workflow: dict[str, Any], tmp_path: Path
) -> None:
    inputs = {"matrix": str(USER_MATRIX), "skip": "*/nightly/* */eager/*"}
    jobs = ci_plan(workflow, tmp_path, **inputs)
    assert {job["runner"] for job in jobs} == {"team-l40s", "team-a100x2"}
    for index, job in enumerate(jobs):
        job["index"] = index
        job["ran"] = shard_cells(workflow, job, tmp_path, **inputs)
    cells = planned(USER_MATRIX, "--skip", "*/nightly/*", "--skip", "*/eager/*")
    assert cells and not any("/nightly/" in c["id"] or "/eager/" in c["id"] for c in cells)
    check_jobs(cells, jobs, int(workflow["env"]["JOB_MINUTES"]))


def test_a_shorter_job_limit_makes_more_smaller_jobs(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    cells = list(expand(matrix, scenarios))
    everything = [c.id for c in cells]
    hours = {m: plan_jobs(cells, everything, JobBudget(job_minutes=m)) for m in (60, 360, 24 * 60)}
    assert len(hours[60]) > len(hours[360]) >= len(hours[24 * 60]) == 8
    for minutes, jobs in hours.items():
        assert all(job.estimate_s <= JobBudget(job_minutes=minutes).seconds for job in jobs)
        assert sum(job.cells for job in jobs) == len(cells)


def test_a_cell_longer_than_any_job_is_refused(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path)
    cells = list(expand(matrix, scenarios))
    with pytest.raises(UsageError, match=r"may take 1800 s, more than a 30-minute job holds"):
        plan_jobs(cells, [c.id for c in cells], JobBudget(job_minutes=30))


def test_measured_durations_replace_deadlines(tmp_path: Path) -> None:
    matrix, scenarios = setup(tmp_path / "inputs")
    cells = [c for c in expand(matrix, scenarios) if c.gpu.name == "h100"]
    everything = [c.id for c in cells]
    runs = tmp_path / "results"
    for cell in cells:  # an earlier run measured each cell at two minutes
        result = CellResult(
            id=cell.id, outcome=Outcome.AVOIDED, expected=Expected.AVOIDED, lane="gpu",
            level=cell.level.value, image=cell.image.ref, image_tag=cell.image.tag,
            gpu="h100", model=cell.model.name, flagset=cell.flagset.name,
            scenario=cell.scenario.id, variant=cell.variant.name,
            timings=Timings(total_s=120.0),
        )  # fmt: skip
        write_result(runs / "earlier", result, b"")
    budget = JobBudget(job_minutes=180)  # the cells of one image fit it only once they are short
    by_deadline = plan_jobs(cells, everything, budget)
    measured = load_durations([runs])
    assert measured == dict.fromkeys(everything, 120.0)
    by_measure = plan_jobs(
        cells, everything, budget, estimate=lambda c: measured.get(c.id, c.deadline_s)
    )
    assert len(by_measure) == 4 < len(by_deadline)  # one job per image once cells are short
    assert {job.only for job in by_measure} == {(f"gpu/{t}/h100/*",) for t in IMAGE_TAGS}
    with pytest.raises(UsageError, match="no results here"):
        load_durations([tmp_path / "inputs"])


IMAGE_TAGS = ("v0.31.0", "v0.31.1rc0", "v0.32.0", "nightly")


def test_packing_under_the_job_limit_keeps_each_job_within_budget(tmp_path: Path) -> None:
    text = GPU_LANE.replace("a6000: {runner: gpu-a6000", "a6000: {runner: gpu-h100")
    matrix, scenarios = setup(tmp_path, text)
    cells = list(expand(matrix, scenarios))
    everything = [c.id for c in cells]
    budget = JobBudget(job_minutes=24 * 60)
    jobs = plan_jobs(cells, everything, budget, max_jobs=5)
    assert len(jobs) <= 5
    assert all(job.estimate_s <= budget.seconds for job in jobs)
    assert sum(job.cells for job in jobs) == len(cells)

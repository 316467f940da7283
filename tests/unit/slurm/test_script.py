"""The batch scripts, read back as sbatch reads them: the ``#SBATCH`` lines before the first
line that is not a comment, and the program after them as Python reads it."""

from __future__ import annotations

import ast
from pathlib import Path

from repromatrix.fleet.jobs import Budget, estimator
from repromatrix.model import Gpu, Lane, SlurmOptions
from repromatrix.slurm.arrays import WARNING_S, TaskArray, split
from repromatrix.slurm.script import ScriptContext, array_script, finish_script, time_limit
from repromatrix.slurm.submission import TaskEntry, new_submission
from support import factories

CONTEXT = ScriptContext(
    run_id="20260101-120000",
    python="/opt/venv/bin/python3",
    workdir=Path("/home/me/matrix"),
    submission=Path("/shared/results/20260101-120000/slurm/1"),
    run_argv=("--matrix", "/home/me/matrix/matrix.yaml", "--backend", "auto"),
)


def directives(script: str) -> dict[str, str]:
    """What sbatch takes from ``script``: ``--name=value`` (``--flag``: "") of each ``#SBATCH``
    line before the first line that is not a comment."""
    found: dict[str, str] = {}
    for line in script.splitlines()[1:]:
        if not line.startswith("#"):
            break
        if line.startswith("#SBATCH "):
            name, _, value = line.removeprefix("#SBATCH ").partition("=")
            found[name] = value
    return found


def gpu_arrays(slurm: SlurmOptions, cells: int = 1) -> tuple[TaskArray, ...]:
    gpu = Gpu("h100", Lane.GPU, "gpu-h100", 1, "9.0", 80, slurm=slurm)
    made = [factories.cell(Lane.GPU, gpu=gpu, variant=f"v{i}") for i in range(cells)]
    return split(made, {c.id for c in made}, Budget(), estimator({}))


def tasks_of(arrays: tuple[TaskArray, ...]) -> tuple[TaskEntry, ...]:
    submission = new_submission(CONTEXT.submission.parents[1], CONTEXT.run_id, arrays, Path("m"))
    return submission.tasks


def test_an_arrays_options_are_sbatch_directives_before_the_program():
    site = SlurmOptions(
        partition="gpu,gpu-long", account="vllm", qos="high", gres="h100", constraint="h100&ib",
        exclusive=True,
    )  # fmt: skip
    arrays = gpu_arrays(site)
    script = array_script(arrays[0], tasks_of(arrays), CONTEXT)
    assert script.startswith("#!/opt/venv/bin/python3\n")
    found = directives(script)
    res = arrays[0].resources
    assert found == {
        "--job-name": "repromatrix-20260101-120000-h100",
        "--array": "0-0",
        "--nodes": "1",
        "--ntasks": "1",
        "--time": time_limit(res.minutes),
        "--cpus-per-task": "4",
        "--mem": "80G",
        "--gres": "gpu:h100:1",
        "--partition": "gpu,gpu-long",
        "--account": "vllm",
        "--qos": "high",
        "--constraint": "h100&ib",
        "--exclusive": "",
        "--signal": f"B:TERM@{WARNING_S}",
        "--requeue": "",
        "--open-mode": "append",
        "--output": "/shared/results/20260101-120000/slurm/1/logs/h100-%a.log",
        "--chdir": "/home/me/matrix",
    }


def test_site_options_left_out_stay_the_sites():
    arrays = gpu_arrays(SlurmOptions())
    found = directives(array_script(arrays[0], tasks_of(arrays), CONTEXT))
    assert not {"--partition", "--account", "--qos", "--constraint", "--exclusive"} & set(found)
    assert found["--gres"] == "gpu:1"


def test_the_program_runs_each_tasks_cells_into_its_shard():
    arrays = gpu_arrays(SlurmOptions(), cells=3)
    tasks = tasks_of(arrays)
    script = array_script(arrays[0], tasks, CONTEXT)
    tree = ast.parse(script)  # valid Python
    values = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    assert values["RUN"] == list(CONTEXT.run_argv)
    assert values["SHARDS"] == "/shared/results/20260101-120000/slurm/1/shards"
    assert values["SHARD_IDS"] == [task.shard for task in tasks]
    assert values["TASKS"] == [list(task.only) for task in tasks]
    assert "sys.exit(run_task(SHARDS, SHARD_IDS, RUN, TASKS))" in script


def test_the_merge_job_is_charged_like_the_tasks_but_asks_for_no_gpu():
    arrays = gpu_arrays(SlurmOptions(partition="gpu", account="vllm", exclusive=True))
    run_dir = Path("/shared/results/20260101-120000")
    script = finish_script(arrays, run_dir, CONTEXT)
    found = directives(script)
    assert found["--partition"] == "gpu" and found["--account"] == "vllm"
    assert "--gres" not in found and "--exclusive" not in found and "--array" not in found
    assert f'finish_detached("{run_dir}", "{CONTEXT.submission}")' in script
    ast.parse(script)


def test_time_limits():
    assert [time_limit(m) for m in (1, 59, 60, 361)] == ["0:01:00", "0:59:00", "1:00:00", "6:01:00"]

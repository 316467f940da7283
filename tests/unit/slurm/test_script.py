"""The batch scripts, read back as sbatch reads them: the ``#SBATCH`` lines before the first
line that is not a comment, and the program after them as Python reads it; hostile paths
reach the program as literals and never an ``#SBATCH`` line, and a task is given the
submitter's variables by name, never its tokens."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.errors import UsageError
from repromatrix.fleet.jobs import JobBudget, estimator
from repromatrix.slurm.arrays import WARNING_S, TaskArray, split
from repromatrix.slurm.script import (
    ScriptContext,
    array_script,
    finish_script,
    task_environment,
    time_limit,
)
from repromatrix.slurm.submission import TaskEntry, new_submission
from repromatrix.values import Gpu, Lane, SlurmOptions
from support import factories

CONTEXT = ScriptContext(
    run_id="20260101-120000",
    python="/opt/venv/bin/python3",
    workdir=Path("/home/me/matrix"),
    submission=Path("/shared/results/20260101-120000/slurm/1"),
    run_argv=("--matrix", "/home/me/matrix/matrix.yaml", "--backend", "auto"),
    export=("HOME", "PATH"),
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


def literals(script: str) -> dict[str, object]:
    """The constants the program of ``script`` sets, as Python reads them (it must parse)."""
    tree = ast.parse(script)
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }


def gpu_arrays(slurm: SlurmOptions, cells: int = 1) -> tuple[TaskArray, ...]:
    gpu = Gpu("h100", Lane.GPU, "gpu-h100", 1, "9.0", 80, slurm=slurm)
    made = [factories.cell(Lane.GPU, gpu=gpu, variant=f"v{i}") for i in range(cells)]
    return split(made, {c.id for c in made}, JobBudget(), estimator({}))


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
        "--export": "HOME,PATH",
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
    values = literals(script)
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
    assert literals(script)["RUN_DIR"] == str(run_dir)
    assert literals(script)["SUBMISSION"] == str(CONTEXT.submission)
    assert "sys.exit(finish_detached(RUN_DIR, SUBMISSION))" in script


def test_time_limits():
    assert [time_limit(m) for m in (1, 59, 60, 361)] == ["0:01:00", "0:59:00", "1:00:00", "6:01:00"]


# Paths as an attacker (or an unlucky user) names them: a docstring's end and code after
# it, a Python escape that does not parse, a line break with an option of its own, quotes.
HOSTILE = [
    '/r/x"""\nimport os; os.system("id")\n"""',
    "/r/\\N/x",
    "/r/a\n#SBATCH --uid=0",
    '/r/it\'s "quoted"',
    "/r/\\u0041\\x00",
]


@pytest.mark.parametrize("path", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_path_reaches_the_program_as_the_literal_it_is(path: str):
    context = replace(CONTEXT, run_argv=("--matrix", path, "--lock", path + "/lock.json"))
    arrays = gpu_arrays(SlurmOptions(), cells=2)
    script = array_script(arrays[0], tasks_of(arrays), context)
    assert literals(script)["RUN"] == list(context.run_argv)
    assert set(directives(script)) == set(
        directives(array_script(arrays[0], tasks_of(arrays), CONTEXT))
    )
    finish = finish_script(arrays, Path(path), context)
    assert literals(finish)["RUN_DIR"] == path
    assert [line for line in finish.splitlines() if line.startswith("#SBATCH")] == [
        line
        for line in finish_script(arrays, Path("/r"), CONTEXT).splitlines()
        if line.startswith("#SBATCH")
    ]


@pytest.mark.parametrize(
    "path", [*HOSTILE, "/shared/my results/r", "/shared/100%/r"], ids=range(len(HOSTILE) + 2)
)
def test_a_path_an_sbatch_line_cannot_hold_is_refused_clearly(path: str):
    arrays = gpu_arrays(SlurmOptions())
    for context in (replace(CONTEXT, submission=Path(path)), replace(CONTEXT, workdir=Path(path))):
        with pytest.raises(UsageError, match="cannot hold"):
            array_script(arrays[0], tasks_of(arrays), context)
        with pytest.raises(UsageError, match="cannot hold"):
            finish_script(arrays, Path("/r"), context)


def test_an_interpreter_the_kernel_would_split_is_refused():
    arrays = gpu_arrays(SlurmOptions())
    for python in ("/opt/my venv/bin/python", "/opt/venv/bin/python\nimport os", "python3"):
        with pytest.raises(UsageError, match="cannot start a batch script"):
            array_script(arrays[0], tasks_of(arrays), replace(CONTEXT, python=python))


def test_a_task_gets_the_variables_it_needs_by_name_and_never_a_token():
    environ = {
        "PATH": "/usr/bin", "HOME": "/home/me", "REPROMATRIX_CACHE": "/c", "HF_HOME": "/hf",
        "HF_TOKEN": "hf_x", "HUGGING_FACE_HUB_TOKEN": "hf_y", "GITHUB_TOKEN": "ghs_x",
        "REPROMATRIX_WEBHOOK_SECRET": "s", "REPROMATRIX_API_KEY": "k",
        "AWS_SECRET_ACCESS_KEY": "a", "SSH_AUTH_SOCK": "/tmp/agent", "OLDPWD": "/",
    }  # fmt: skip
    names = task_environment(environ)
    assert names == ("HF_HOME", "HOME", "PATH", "REPROMATRIX_CACHE")
    arrays = gpu_arrays(SlurmOptions())
    context = replace(CONTEXT, export=names)
    for script in (
        array_script(arrays[0], tasks_of(arrays), context),
        finish_script(arrays, Path("/r"), context),
    ):
        assert directives(script)["--export"] == "HF_HOME,HOME,PATH,REPROMATRIX_CACHE"
    assert (
        directives(array_script(arrays[0], tasks_of(arrays), replace(CONTEXT, export=())))[
            "--export"
        ]
        == "NONE"
    )

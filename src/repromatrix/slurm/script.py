"""The batch scripts of a Slurm run, as text: one per array, and the merge job's.

A script is a Python program with its options on ``#SBATCH`` lines: Slurm runs it
as the task's batch shell, so the warning signal before the time limit
(``--signal=B:TERM@...``, sent to the batch shell only) reaches the program that
stops the task's cells. Every option of the tasks is on an ``#SBATCH`` line (only
``--hold`` and ``--dependency``, which belong to one submission, are given to
``sbatch`` itself): the site's ``SBATCH_*`` environment wins over those lines, as
Slurm orders them, so a site can move every task to its own partition or account
without editing the matrix. Pure: ``plan --format slurm`` prints what a run submits.

Values are quoted, never interpolated into code: each one the program uses is a JSON
string (or list of them), which is a Python literal, and the docstring is fixed text; a
value reaches an ``#SBATCH`` line (or the ``#!`` line) only where Slurm reads it back
whole: no space, quote, backslash or control character, and in a path no ``%`` (Slurm's
file name patterns), else ``UsageError`` says which value and why. A task gets of the
submitter's environment only the variables ``task_environment`` names (``--export``),
never its tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix import __version__
from repromatrix.errors import UsageError
from repromatrix.secret_env import is_secret_name
from repromatrix.slurm.arrays import WARNING_S, TaskArray
from repromatrix.slurm.submission import LOGS_DIR, SHARDS_DIR, TaskEntry

FINISH_MINUTES = 30  # merging shards and writing the reports of a large run
FINISH_MEMORY = "2G"
# What a task needs of the submitter's environment (Slurm adds its own SLURM_* variables):
# where programs, the package and the container engine are, the locale and the caches.
TASK_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
    "PYTHONPATH", "VIRTUAL_ENV", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY", "DOCKER_CONTEXT", "HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME",
    "XDG_RUNTIME_DIR",
)  # fmt: skip
TASK_ENV_PREFIXES = ("REPROMATRIX_", "APPTAINER_", "SINGULARITY_", "ENROOT_")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What an #SBATCH line cannot hold as a value: Slurm splits it at white space, reads quotes
# and backslashes as quoting, and a line break would start a line of its own.
_NOT_SBATCH = re.compile(r"[\s\"'\\\x00-\x1f\x7f]")


@dataclass(frozen=True)
class ScriptContext:
    """What every script of a submission shares."""

    run_id: str
    python: str  # the interpreter that has repromatrix installed, on every node
    workdir: Path  # where the tasks start (the submitter's folder, shared with the nodes)
    submission: Path  # <run>/slurm/<n>
    run_argv: tuple[str, ...]  # the arguments every task's `repromatrix run` shares
    export: tuple[str, ...] = ()  # the submitter's variables a task gets (task_environment)


def task_environment(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The names of the variables of ``environ`` a task is given (``--export``): those of
    ``TASK_ENV`` and ``TASK_ENV_PREFIXES`` it sets, never a secret's
    (``secret_env.is_secret_name``)."""
    return tuple(
        sorted(
            name
            for name in environ
            if (name in TASK_ENV or name.startswith(TASK_ENV_PREFIXES))
            and _ENV_NAME.fullmatch(name)
            and not is_secret_name(name)
        )
    )


def time_limit(minutes: int) -> str:
    """``--time`` as hours:minutes:seconds."""
    return f"{minutes // 60}:{minutes % 60:02d}:00"


def array_script(array: TaskArray, tasks: Sequence[TaskEntry], context: ScriptContext) -> str:
    """The batch script of ``array``; ``tasks`` are its entries (the shard each one writes)."""
    res = array.resources
    logs = sbatch_path(context.submission / LOGS_DIR, "the run's Slurm log folder")
    options = [
        f"--job-name=repromatrix-{context.run_id}-{array.name}",
        f"--array=0-{len(tasks) - 1}",
        "--nodes=1",
        "--ntasks=1",
        f"--time={time_limit(res.minutes)}",
        f"--cpus-per-task={res.cpus}",
        f"--mem={res.mem}",
        *([f"--gres={res.gres}"] if res.gres else []),
        *site_options(array),
        f"--signal=B:TERM@{WARNING_S}",
        "--requeue",
        "--open-mode=append",
        f"--output={logs}/{array.name}-%a.log",
        f"--chdir={sbatch_path(context.workdir, 'the working folder')}",
        export_option(context.export),
    ]
    listed = "\n".join(
        f"    {json.dumps(list(task.only))},  # task {task.index}: {len(task.cells)} cell(s)"
        for task in tasks
    )
    what = f"the {array.lane.value} lane's cells on {array.gpu.name}, {len(tasks)} task(s)"
    return f'''{shebang(context.python)}
{directives(options)}
"""A repromatrix run's task array on Slurm (RUN_ID, WHAT).

Each task runs `repromatrix run` for its cells (the --only globs of TASKS[its index])
into its own run folder, a shard: SHARDS/SHARD_IDS[its index].
`repromatrix run --executor slurm` merges the shards into the run.
"""

import sys

from repromatrix.slurm.task import run_task

RUN_ID = {json.dumps(context.run_id)}
WHAT = {json.dumps(what)}
WRITTEN_BY = {json.dumps("repromatrix " + __version__)}
# Every task's arguments, before its own.
RUN = {json.dumps(list(context.run_argv))}
SHARDS = {json.dumps(str(context.submission / SHARDS_DIR))}
SHARD_IDS = {json.dumps([task.shard for task in tasks])}
TASKS = [
{listed}
]

sys.exit(run_task(SHARDS, SHARD_IDS, RUN, TASKS))
'''


def finish_script(arrays: Sequence[TaskArray], run_dir: Path, context: ScriptContext) -> str:
    """The merge job of ``--detach``: submitted to start after every task has ended."""
    first = arrays[0]
    logs = sbatch_path(context.submission / LOGS_DIR, "the run's Slurm log folder")
    options = [
        f"--job-name=repromatrix-{context.run_id}-finish",
        "--nodes=1",
        "--ntasks=1",
        f"--time={time_limit(FINISH_MINUTES)}",
        "--cpus-per-task=1",
        f"--mem={FINISH_MEMORY}",
        *site_options(first, placement=False),
        f"--output={logs}/finish.log",
        f"--chdir={sbatch_path(context.workdir, 'the working folder')}",
        export_option(context.export),
    ]
    return f'''{shebang(context.python)}
{directives(options)}
"""A repromatrix run on Slurm (RUN_ID): merge the tasks' shards and write the reports.

Submitted with --dependency=afterany on the run's arrays: it starts once every task
has ended, however it ended.
"""

import sys

from repromatrix.slurm.finish import finish_detached

RUN_ID = {json.dumps(context.run_id)}
WRITTEN_BY = {json.dumps("repromatrix " + __version__)}
RUN_DIR = {json.dumps(str(run_dir))}
SUBMISSION = {json.dumps(str(context.submission))}

sys.exit(finish_detached(RUN_DIR, SUBMISSION))
'''


def site_options(array: TaskArray, placement: bool = True) -> list[str]:
    """The GPU's ``slurm`` mapping as options; ``placement`` False keeps only who is charged
    (partition, account, QOS), not which nodes (constraint, exclusive)."""
    site = array.options
    named = [("partition", site.partition), ("account", site.account), ("qos", site.qos)]
    if placement:
        named.append(("constraint", site.constraint))
    lines = [f"--{name}={value}" for name, value in named if value]
    return lines + (["--exclusive"] if placement and site.exclusive else [])


def directives(options: Sequence[str]) -> str:
    """``#SBATCH`` lines; ``UsageError`` for an option Slurm would not read back whole."""
    for option in options:
        if _NOT_SBATCH.search(option):
            raise UsageError(
                f"cannot write the Slurm option {option!r}: an #SBATCH line cannot hold a"
                " space, a quote, a backslash or a control character"
            )
    return "\n".join(f"#SBATCH {option}" for option in options)


def sbatch_path(path: Path, what: str) -> str:
    """``path`` for an ``#SBATCH`` line; ``UsageError`` where Slurm would not read it back
    as it is (a space, a quote, a backslash, a control character, or ``%``, which Slurm's
    file name patterns replace)."""
    text = str(path)
    bad = _NOT_SBATCH.search(text) or re.search("%", text)
    if bad:
        raise UsageError(
            f"{what} {text!r} holds {bad.group()!r}, which an #SBATCH line of a batch script"
            " cannot hold (Slurm splits at white space, reads quotes, backslashes and % itself):"
            " use a folder whose path has none (--results, or start from another folder)"
        )
    return text


def shebang(python: str) -> str:
    """The ``#!`` line that runs ``python``; ``UsageError`` where the kernel would split
    its path (white space) or the line would end early."""
    if not python.startswith("/") or _NOT_SBATCH.search(python):
        raise UsageError(
            f"the Python interpreter {python!r} cannot start a batch script: its path must be"
            " absolute, without white space, quotes, backslashes or control characters"
        )
    return f"#!{python}"


def export_option(names: Sequence[str]) -> str:
    """``--export``: exactly these variables of the submitter's environment (``NONE``: only
    Slurm's own), never the whole of it."""
    for name in names:
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"cannot export {name!r} to a Slurm task: not a variable name")
    return f"--export={','.join(names) if names else 'NONE'}"

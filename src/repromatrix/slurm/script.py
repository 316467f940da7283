"""The batch scripts of a Slurm run, as text: one per array, and the merge job's.

A script is a Python program with its options on ``#SBATCH`` lines: Slurm runs it
as the task's batch shell, so the warning signal before the time limit
(``--signal=B:TERM@...``, sent to the batch shell only) reaches the program that
stops the task's cells. Every option of the tasks is on an ``#SBATCH`` line (only
``--hold`` and ``--dependency``, which belong to one submission, are given to
``sbatch`` itself): the site's ``SBATCH_*`` environment wins over those lines, as
Slurm orders them, so a site can move every task to its own partition or account
without editing the matrix. Each value on such a line passed the matrix's grammar
for it (``grammars.check_slurm_*``); the tasks' arguments are JSON strings, which
are Python literals. Pure: ``plan --format slurm`` prints what a run submits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix import __version__
from repromatrix.slurm.arrays import WARNING_S, TaskArray
from repromatrix.slurm.submission import LOGS_DIR, SHARDS_DIR, TaskEntry

FINISH_MINUTES = 30  # merging shards and writing the reports of a large run
FINISH_MEMORY = "2G"


@dataclass(frozen=True)
class ScriptContext:
    """What every script of a submission shares."""

    run_id: str
    python: str  # the interpreter that has repromatrix installed, on every node
    workdir: Path  # where the tasks start (the submitter's folder, shared with the nodes)
    submission: Path  # <run>/slurm/<n>
    run_argv: tuple[str, ...]  # the arguments every task's `repromatrix run` shares


def time_limit(minutes: int) -> str:
    """``--time`` as hours:minutes:seconds."""
    return f"{minutes // 60}:{minutes % 60:02d}:00"


def array_script(array: TaskArray, tasks: Sequence[TaskEntry], context: ScriptContext) -> str:
    """The batch script of ``array``; ``tasks`` are its entries (the shard each one writes)."""
    res = array.resources
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
        f"--output={context.submission / LOGS_DIR}/{array.name}-%a.log",
        f"--chdir={context.workdir}",
    ]
    listed = "\n".join(
        f"    {json.dumps(list(task.only))},  # task {task.index}: {len(task.cells)} cell(s)"
        for task in tasks
    )
    what = f"the {array.lane.value} lane's cells on {array.gpu.name}, {len(tasks)} task(s)"
    return f'''#!{context.python}
{directives(options)}
"""repromatrix run {context.run_id} on Slurm: {what}.

Each task runs `repromatrix run` for its cells (the --only globs of TASKS[its index])
into its own run folder, a shard: {context.submission / SHARDS_DIR}/<SHARD_IDS[index]>.
`repromatrix run --executor slurm` merges the shards into the run.
Written by repromatrix {__version__}.
"""

import sys

from repromatrix.slurm.task import run_task

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
    options = [
        f"--job-name=repromatrix-{context.run_id}-finish",
        "--nodes=1",
        "--ntasks=1",
        f"--time={time_limit(FINISH_MINUTES)}",
        "--cpus-per-task=1",
        f"--mem={FINISH_MEMORY}",
        *site_options(first, placement=False),
        f"--output={context.submission / LOGS_DIR}/finish.log",
        f"--chdir={context.workdir}",
    ]
    return f'''#!{context.python}
{directives(options)}
"""repromatrix run {context.run_id} on Slurm: merge the tasks' shards and write the reports.

Submitted with --dependency=afterany on the run's arrays: it starts once every task
has ended, however it ended. Written by repromatrix {__version__}.
"""

import sys

from repromatrix.slurm.finish import finish_detached

sys.exit(finish_detached({json.dumps(str(run_dir))}, {json.dumps(str(context.submission))}))
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
    """``#SBATCH`` lines."""
    return "\n".join(f"#SBATCH {option}" for option in options)

"""``repromatrix run --executor slurm``, top to bottom, on the submitting host.

The run is planned as on any host (the same matrix, selection and run folder), then
the cells still to run are split into job arrays (``arrays``), one batch script per
array is written into the run folder (``script``) and submitted held, and all are
released only once Slurm has accepted every one: a script it refuses (an unknown
partition, more GPUs than a node has) is a clear error before any task runs. Then
the submitter waits with progress (``watch``), reads how each task ended, gathers the
tasks' shards into the run folder and writes the reports (``finish``), with the exit
codes of any run. ``--detach`` submits a merge job instead, to start after every
task (``afterany``), and returns at once.

Ctrl-C or SIGTERM of the submitter cancels its jobs (``scancel``); each task then
stops and removes its containers before Slurm's kill wait ends, the submitter waits
for the queue to empty, keeps every finished cell and reports them; ``--resume``
submits the rest. A ``--resume`` first settles earlier submissions (refused while
any of their jobs is still in the queue), so it submits only cells without a result.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from repromatrix.errors import InfraError, UsageError
from repromatrix.fleet.jobs import DEFAULT_JOB_MINUTES, JobBudget, estimator
from repromatrix.matrix.expand import expand, plan
from repromatrix.matrix.inputs import apply_lock, load_inputs
from repromatrix.matrix.selector import Selector
from repromatrix.reports.write import write_reports
from repromatrix.run.cell import save_skipped
from repromatrix.run.claim import claimed
from repromatrix.run.folder import RunFolder, pending, record_plan
from repromatrix.run.main import (
    Mode,
    RunOptions,
    RunPlan,
    RunSummary,
    durations_folder,
    infeasible_reasons,
    interrupts_as_keyboard_interrupt,
    lock_of,
    measured_s,
    plan_run,
    uninterruptible,
)
from repromatrix.run.progress import Progress
from repromatrix.slurm import cluster
from repromatrix.slurm.arrays import TaskArray, split
from repromatrix.slurm.finish import (
    cells_by_id,
    finish_submission,
    gather_run,
    outcomes_of,
    records_of,
)
from repromatrix.slurm.poll import POLL_S, wait
from repromatrix.slurm.script import (
    ScriptContext,
    array_script,
    finish_script,
    task_environment,
)
from repromatrix.slurm.submission import (
    FINISH_SCRIPT,
    RECORD_FILE,
    Submission,
    make_folders,
    new_submission,
    submissions,
    submitted,
    write,
)
from repromatrix.values import Cell

CANCEL_WAIT_S = 180.0  # Slurm's kill wait (30 s by default) and the tasks' container removal


@dataclass(frozen=True)
class SlurmRun:
    """What ``--executor slurm`` adds to a run's options."""

    detach: bool = False  # submit a merge job and return, instead of waiting
    job_minutes: int = DEFAULT_JOB_MINUTES  # the longest a task may take (the partition's limit)
    poll_s: float = POLL_S


def execute_slurm_run(options: RunOptions, slurm: SlurmRun, progress: Progress) -> RunSummary:
    """The run on Slurm; SIGTERM is handled like Ctrl-C (see the module doc)."""
    if options.mode is Mode.PREPARE_ONLY:
        raise UsageError("--prepare-only makes images on this host; Slurm tasks make their own")
    if options.gpus is not None:
        raise UsageError("--gpus names this host's GPUs; Slurm gives each task its own")
    if options.mode is Mode.RUN and (why := cluster.missing()):
        raise InfraError(f"--executor slurm: {why}")
    matrix, catalogue = load_inputs(options.matrix, options.scenarios)
    locked = lock_of(matrix, options, progress.note)
    matrix = apply_lock(matrix, locked.lock)
    # Every task reads the lock resolved here, so all of them run the same images.
    options = replace(options, lock=locked.path, relock=False)
    cells = plan(matrix, catalogue, options.lane, Selector(options.only, options.skip))
    everything = frozenset(cell.id for cell in expand(matrix, catalogue))
    budget = budget_of(slurm)
    with interrupts_as_keyboard_interrupt():
        run = plan_run(options, progress, (matrix, cells))
        earlier = durations_folder(options, run.folder)
        estimate = estimator(measured_s(earlier, progress.note) or {})
        if options.mode is Mode.DRY_RUN:
            arrays = split(run.todo, everything, budget, estimate)
            print_scripts(planned_scripts(run.folder, arrays, options))
            return RunSummary(run.folder, run.todo)
        with claimed(run.folder.path):
            settle_earlier(run.folder.path, progress.note)
            todo = pending(run.cells, run.folder.path, options.resume)
            if not todo:
                return report(run, (), progress)
            record_plan(run.folder.path, run.cells, options.matrix)
            infeasible = {} if options.run_infeasible else infeasible_reasons(todo)
            # No task would run these (the arrays leave them out): saved here, as any run does.
            skipped = [cell for cell in todo if cell.id in infeasible]
            save_skipped(skipped, infeasible, run.folder, {}, progress)
            arrays = split(todo, everything, budget, estimate)
            submission = submit(run, arrays, options, slurm.detach, progress.note)
            if slurm.detach:
                return RunSummary(run.folder, todo)
            by_id = {cell.id: cell for cell in todo}
            finish_waiting(submission, by_id, slurm.poll_s, progress.note)
            return report(run, todo, progress)


def budget_of(slurm: SlurmRun) -> JobBudget:
    """How long one task may take: ``--job-minutes`` less the fleet's margin."""
    if slurm.job_minutes < 1:
        raise UsageError("--job-minutes must be at least 1")
    return JobBudget(job_minutes=slurm.job_minutes)


def settle_earlier(run_dir: Path, note: Callable[[str], None]) -> None:
    """Finish each earlier submission that was not (a submitter that died, a detached run whose
    merge job has not run) and gather its shards; refused while any of its jobs is queued."""
    open_ = [sub for sub in submissions(run_dir) if not sub.finished]
    for sub in open_:
        if live := cluster.queued(sub.job_ids):
            raise UsageError(
                f"{run_dir}: submission {sub.number} still has jobs in the Slurm queue "
                f"({', '.join(sorted(live))}); wait for them to end, or scancel them, and "
                "--resume again"
            )
        finish_submission(sub, records_of(sub), cells_by_id(sub), note)
    if open_:
        gather_run(run_dir)


def script_context(folder: RunFolder, options: RunOptions, submission: Submission) -> ScriptContext:
    """What every script of ``submission`` shares."""
    return ScriptContext(
        run_id=folder.run_id,
        python=sys.executable,
        workdir=Path.cwd(),
        submission=submission.folder.resolve(),
        run_argv=tuple(task_run_argv(options)),
        export=task_environment(os.environ),
    )


def task_run_argv(options: RunOptions) -> list[str]:
    """The arguments every task's ``repromatrix run`` shares: the matrix, the backend, how
    images are pulled and cells paced (files as absolute paths: tasks start elsewhere)."""
    scenarios = options.scenarios
    folders = (scenarios,) if isinstance(scenarios, Path) else (scenarios or ())
    argv = ["--matrix", str(options.matrix.resolve())]
    argv += [arg for folder in folders for arg in ("--scenarios", str(folder.resolve()))]
    argv += ["--backend", options.backend, "--image-jobs", str(options.image_jobs)]
    if options.pull:
        argv += ["--pull", options.pull]
    if options.jobs:
        argv += ["--jobs", str(options.jobs)]
    if options.lock is not None:
        argv += ["--lock", str(options.lock.resolve())]
    if options.run_infeasible:
        argv.append("--run-infeasible")
    if options.rehearse:
        argv.append("--rehearse")
    return argv


def scripts_of(
    submission: Submission, arrays: Sequence[TaskArray], context: ScriptContext, run_dir: Path
) -> dict[Path, str]:
    """Each batch script of ``submission`` by its path (the merge job's last)."""
    scripts = {
        submission.folder / f"{array.name}.sbatch": array_script(
            array, [t for t in submission.tasks if t.array == array.name], context
        )
        for array in arrays
    }
    scripts[submission.folder / FINISH_SCRIPT] = finish_script(arrays, run_dir.resolve(), context)
    return scripts


def planned_scripts(
    folder: RunFolder, arrays: Sequence[TaskArray], options: RunOptions
) -> dict[Path, str]:
    """The scripts a submission of ``arrays`` into ``folder`` would write, and its record;
    nothing is written (``plan --format slurm`` and ``run --executor slurm --dry-run`` print
    them)."""
    submission = new_submission(
        folder.path,
        folder.run_id,
        arrays,
        options.matrix,
        scenario_folders(options),
        lock=options.lock,
    )
    context = script_context(folder, options, submission)
    scripts = scripts_of(submission, arrays, context, folder.path)
    # The record the merge job reads, so the scripts can be submitted by hand as they are.
    scripts[submission.folder / RECORD_FILE] = json.dumps(submission.to_json(), indent=1) + "\n"
    return scripts


def scenario_folders(options: RunOptions) -> tuple[Path, ...]:
    """The ``--scenarios`` folders given (none: the shipped ones)."""
    scenarios = options.scenarios
    return (scenarios,) if isinstance(scenarios, Path) else tuple(scenarios or ())


def print_scripts(scripts: dict[Path, str], out: TextIO | None = None) -> None:
    """Every script, each after a ``# ==> path <==`` line (the merge job's is for --detach)."""
    stream = out or sys.stdout
    for path, text in scripts.items():
        stream.write(f"# ==> {path} <==\n{text}\n")


def submit(
    run: RunPlan,
    arrays: Sequence[TaskArray],
    options: RunOptions,
    detach: bool,
    note: Callable[[str], None],
) -> Submission:
    """Write the scripts, have Slurm check each, submit every array held (and the merge job
    with ``detach``), then release them all; a refusal cancels what was accepted and leaves
    nothing behind."""
    submission = new_submission(
        run.folder.path,
        run.folder.run_id,
        arrays,
        options.matrix,
        scenario_folders(options),
        lock=options.lock,
    )
    make_folders(submission)
    context = script_context(run.folder, options, submission)
    scripts = scripts_of(submission, arrays, context, run.folder.path)
    for path, text in scripts.items():
        path.write_text(text, encoding="utf-8")
    jobs: dict[str, str] = {}
    try:
        for path in scripts:
            if detach or path.name != FINISH_SCRIPT:
                cluster.check(path)
        for array in arrays:
            jobs[array.name] = cluster.submit(submission.folder / f"{array.name}.sbatch", hold=True)
        submission = submitted(submission, jobs)
        if detach:
            finish = cluster.submit(
                submission.folder / FINISH_SCRIPT, hold=True, dependency=tuple(jobs.values())
            )
            submission = replace(submission, finish_job=finish)
        write(submission)
        cluster.release(submission.job_ids)
    except BaseException:
        with uninterruptible():
            cluster.cancel(list(jobs.values()))
            shutil.rmtree(submission.folder, ignore_errors=True)
        raise
    for array in arrays:
        note(
            f"submitted {array.name}: job {jobs[array.name]}, {len(array.tasks)} task(s) of "
            f"{array.cells} cell(s), {array.resources.minutes} min each at most"
        )
    if detach:
        note(
            f"detached: job {submission.finish_job} merges the shards and writes the reports "
            f"into {run.folder.path}/ once every task has ended (squeue --jobs="
            f"{','.join(submission.job_ids)})"
        )
    return submission


def finish_waiting(
    submission: Submission, cells: dict[str, Cell], poll_s: float, note: Callable[[str], None]
) -> None:
    """Wait for every task, then finish the submission; on an interrupt cancel the jobs, wait
    for the tasks to stop their containers, keep what finished, and interrupt the run."""
    try:
        records = wait(submission, note, poll_s)
    except KeyboardInterrupt:
        with uninterruptible():
            cancel(submission, note)
            finish_submission(
                replace(submission, cancelled=True), records_of(submission), cells, note
            )
            gather_run(submission.folder.parent.parent)
        raise
    finish_submission(submission, records, cells, note)


def cancel(submission: Submission, note: Callable[[str], None]) -> None:
    """Cancel the submission's jobs and wait until the queue holds none of them."""
    write(replace(submission, cancelled=True))
    note(f"interrupted: cancelling jobs {', '.join(submission.job_ids)} (scancel)")
    cluster.cancel(submission.job_ids)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while (left := cluster.queued(submission.job_ids)) and time.monotonic() < deadline:
        time.sleep(1.0)
    if left:
        note(f"jobs {', '.join(sorted(left))} are still ending after {CANCEL_WAIT_S:.0f} s")
    else:
        note("no job of this run is left in the Slurm queue")


def report(run: RunPlan, todo: Sequence[Cell], progress: Progress) -> RunSummary:
    """Gather every shard into the run folder, write its reports, count ``todo``'s outcomes."""
    merged = gather_run(run.folder.path)
    for line in merged.lines()[1:]:
        progress.note(line)
    write_reports(run.folder.path)
    progress.note(f"reports written to {run.folder.path}/")
    outcomes = outcomes_of(run.folder.path, [cell.id for cell in todo])
    return RunSummary(run.folder, tuple(todo), outcomes=outcomes)

"""The cell stage's cells, run at the same time as the runner allows, each saved as it ends.

Each runnable cell becomes a ``Job`` (``cell_needs``) and a callable that runs
the one-cell code (``cell.run_cell``: its own deadline, live triage, early stop
at the root cause, OOM detection, cleanup, its own log) on the device ids the
``Pool`` lends it, with ``Backend.stop`` as its cancel hook. ``on_done`` runs in
the calling thread: it turns each ended job into a result and writes it at once,
so an interrupted run keeps every finished cell and ``--resume`` runs the rest.
A cell too big for the runner ends as skipped with the pool's reason; a job that
raised (a bug of ours) or whose image job failed ends as an infra error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from repromatrix.backends.base import Backend, Placement
from repromatrix.errors import InfraError
from repromatrix.model import Cell, Lane, Outcome
from repromatrix.results import store
from repromatrix.results.store import CellResult
from repromatrix.run import outcome
from repromatrix.run.cell import NOT_RUN, CellContext, CellRun, cell_result, now_iso, run_cell
from repromatrix.run.cell_needs import cell_jobs
from repromatrix.run.host_resources import HostResources
from repromatrix.run.pool import DependencyFailed, Done, Pool, Skipped, Ticket, Work
from repromatrix.run.progress import Progress
from repromatrix.run.schedule import Allocation, Job, Need


@dataclass(frozen=True)
class Ran:
    """What one cell's job returns: when it started, and what running it gave."""

    started_at: str
    run: CellRun


@dataclass(frozen=True)
class Where:
    """Where the cells run and what they are saved as."""

    backend: Backend
    contexts: Mapping[str, CellContext]
    run_dir: Path
    run_id: str


class BackendDown(Exception):
    """The backend stopped answering: no further cell is started (``--resume`` runs them)."""


def placement_of(allocation: Allocation, resources: HostResources) -> Placement:
    """The pool's allocation as the backend takes it: GPU ids as UUIDs where the host has them."""
    gpus = tuple(resources.uuid_of(i) or i for i in allocation.gpu_ids)
    return Placement(gpu_ids=gpus if allocation.gpu_ids else None, core_ids=allocation.core_ids)


def jobs_for(cells: Sequence[Cell], resources: HostResources, *, rehearse: bool) -> list[Job]:
    """One job per cell; in a rehearsal GPU cells run on the CPU and need the host to themselves."""
    jobs = cell_jobs(cells, resources.free_memory)
    if not rehearse:
        return jobs
    alone = Need(cores=1, memory=resources.free_memory)
    gpu = {cell.id for cell in cells if cell.lane is Lane.GPU}
    return [replace(job, need=alone) if job.key in gpu else job for job in jobs]


def work_for(where: Where, cell: Cell, resources: HostResources) -> Work[Ran]:
    """The callable that runs ``cell`` in a pool thread; cancelling it stops its container."""

    def work(ticket: Ticket) -> Ran:
        ticket.on_cancel(lambda: where.backend.stop(cell.id))
        started_at = now_iso()
        placement = placement_of(ticket.allocation, resources)
        return Ran(started_at, run_cell(where.backend, cell, where.contexts[cell.id], placement))

    return work


def ended_run(done: Done[Ran]) -> Ran:
    """What an ended job stands for: its run, or the outcome of why it did not run."""
    if done.value is not None:
        return done.value
    error = done.error
    if isinstance(error, Skipped):
        decision = outcome.skipped(str(error))
    elif isinstance(error, DependencyFailed):
        decision = outcome.infra_error(f"image not available: {error}")
    else:
        decision = outcome.infra_error(f"internal error: {error!r}")
    return Ran(now_iso(), CellRun(decision, NOT_RUN))


def save(where: Where, cell: Cell, ran: Ran, counts: dict[str, int]) -> CellResult:
    """Write one cell's result and log now, and count its outcome."""
    context = where.contexts[cell.id]
    result = cell_result(
        cell, ran.run, context=context, run_id=where.run_id, started_at=ran.started_at
    )
    try:
        store.write_result(where.run_dir, result, ran.run.execution.log)
    except OSError as exc:
        # A full disk or a read-only folder: the write left nothing half-done (it renames a
        # finished file), and the run must stop here with one clear line.
        why = exc.strerror or str(exc)
        raise InfraError(
            f"cannot save the result of {cell.id} under {where.run_dir}: {why}"
        ) from exc
    counts[result.outcome.value] = counts.get(result.outcome.value, 0) + 1
    return result


def run_pooled(
    where: Where,
    cells: Sequence[Cell],
    resources: HostResources,
    progress: Progress,
    counts: dict[str, int],
    *,
    jobs: int | None = None,
    rehearse: bool = False,
) -> bool:
    """Run ``cells`` through a ``Pool``, counting outcomes in ``counts``; True if interrupted.

    Raises ``BackendDown`` (after stopping the running cells) when a cell failed
    because the backend died; its message says how many cells were not started.
    """
    by_id = {cell.id: cell for cell in cells}
    down: list[str] = []

    def on_done(done: Done[Ran]) -> None:
        cell, ran = by_id[done.key], ended_run(done)
        result = save(where, cell, ran, counts)
        progress.end(
            cell.id, result.outcome.value, _short(result.reason), ran=done.value is not None
        )
        failed = not down and _engine_failed(result, where.contexts[cell.id])
        if failed and not where.backend.alive():
            down.append(cell.id)  # once: ``Pool`` delivers what had ended after this raise
            raise BackendDown(cell.id)

    work = {cell.id: work_for(where, cell, resources) for cell in cells}
    pool = Pool(
        jobs_for(cells, resources, rehearse=rehearse),
        resources.capacity(jobs),
        work,
        on_done,
        on_start=lambda start: progress.start(start.job.key),
    )
    progress.watch(pool.snapshot)
    try:
        report = pool.run()
    finally:
        progress.watch(None)
    return report.interrupted


def _engine_failed(result: CellResult, context: CellContext) -> bool:
    """Whether the cell ran on a ready image and still failed for the machine's reasons."""
    ready = context.prepared is not None and context.prepared.error is None
    return ready and result.outcome is Outcome.INFRA_ERROR


def _short(reason: str, width: int = 160) -> str:
    line = reason.strip().splitlines()[0] if reason.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"

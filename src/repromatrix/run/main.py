"""The main job, top to bottom: plan, the runner, the backend, then one of describe, prepare
or run the cells, then the reports.

``execute_run`` reads like the run itself. Each step takes the narrow values
it uses and returns the value the next one takes; the work is done by the
modules named after each step (``folder``, ``images``, ``cell``, the backend).

The cell stage (``run_cells``) is here too: each runnable cell becomes a pool
``Job`` (what it holds and how long it should take: ``schedule.cell_jobs``)
and the callable of its life (``cell.work_for``: its GPUs idle and its driver
checked, then its container with a live ``Triager`` on its output, so a cell
stops as soon as its root cause is named; its outcome), on the device ids the
``Pool`` lends it, as many at once as the runner's GPUs, cores and memory and
``--jobs`` allow. The images are jobs of the same pool (``images.ImageJobs``):
each cell waits for its own image's job only, so a pull or build overlaps with
the cells of images already made. Each job the pool hands back (``Pool.ended``,
in this thread) is saved at once (``cell.save``), so an interrupted run keeps
everything it finished and ``--resume`` does the rest. Whatever goes wrong
inside one cell becomes that cell's outcome (``cell.run_cell``; a cell too big
for the runner is skipped with the pool's reason, a job that raised is an infra
error); only an interrupt, or a backend that stopped answering, ends a run
early, and then nothing the run started is left behind (the backend and the
claim are context managers).
"""

from __future__ import annotations

import enum
import json
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import TextIO

from repromatrix.backends import kinds
from repromatrix.backends.base import Backend, BackendKind, Setup
from repromatrix.errors import ConfigError, UsageError
from repromatrix.heartbeat import duration
from repromatrix.host.idle import NO_WAIT, IdleWait
from repromatrix.host.runner import Runner, detect_runner
from repromatrix.images.wheelhouse import CACHE_ROOT
from repromatrix.judgement import Outcome
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.config_facts import cells_models, facts_problems
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import apply_lock, load_inputs
from repromatrix.matrix.lanes import Runtime
from repromatrix.matrix.memory import infeasible_reason, memory_warning
from repromatrix.matrix.selector import Selector
from repromatrix.matrix.sources import check_local
from repromatrix.reports.findings import ReportOptions, default_options
from repromatrix.reports.ranges import documented_ranges
from repromatrix.reports.write import write_reports
from repromatrix.results import store
from repromatrix.results.schema import CellResult
from repromatrix.run.cell import CellContext, Ran, ended_run, save, save_skipped, work_for
from repromatrix.run.claim import claimed
from repromatrix.run.environment import EnvironmentReports
from repromatrix.run.folder import (
    RunFolder,
    latest_run,
    pending,
    record_plan,
    resolve_folder,
)
from repromatrix.run.images import ImageJobs, ImageReady, distinct_images, prepare_images
from repromatrix.run.outlook import outlook
from repromatrix.run.pool import Done, Pool, Work
from repromatrix.run.progress import Progress
from repromatrix.run.schedule import (
    Job,
    Need,
    capacity_of,
    cell_jobs,
    estimate_basis,
    measured_durations,
)
from repromatrix.upstream.resolve import Locked, Locking, Online, lock_for
from repromatrix.values import Cell, Image, Lane

REHEARSAL_RUNNER = (
    "rehearsal: GPU cells run on the CPU without a device request; they are not matched "
    "against their GPU entry and no GPU is checked for idleness"
)


class Mode(enum.Enum):
    """What a run does once it is planned: exactly one of these."""

    RUN = "run"  # make the images and run the cells, then the reports
    DRY_RUN = "dry_run"  # describe every build and container; write and start nothing
    PREPARE_ONLY = "prepare_only"  # make the images and tiny models, run no cell


@dataclass(frozen=True)
class RunOptions:
    """What ``repromatrix run`` was asked to do."""

    matrix: Path = Path("matrix.yaml")
    scenarios: Path | tuple[Path, ...] | None = None  # None: the shipped scenarios/ folder
    lane: Lane | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    backend: str = kinds.AUTO  # a backend kind by name (backends.kinds), or auto
    results: Path = Path("results")
    run_id: str | None = None
    resume: bool = False
    mode: Mode = Mode.RUN
    dockerfiles: Path = Path("dockerfiles")
    cache: Path = CACHE_ROOT
    rehearse: bool = False  # GPU-lane cells run without their device request (a rehearsal)
    pull: str | None = None  # always | missing | never for every image, over each one's own
    gpus: str | None = None  # --gpus: the GPUs this runner may use (default: from the env)
    jobs: int | None = None  # --jobs: cells at once at most (None: as the runner's resources allow)
    image_jobs: int = 2  # --image-jobs: image builds and pulls at once, beside the cells
    durations_from: Path | None = None  # an earlier run whose cells' durations guide the packing
    run_infeasible: bool = False  # run cells whose memory estimate rules them out, anyway
    lock: Path | None = None  # the lock of follow rules (None: <matrix>.lock.json)
    relock: bool = False  # resolve follow rules again, whatever the lock says

    @property
    def models_root(self) -> Path:
        """Where the tiny models are cached (mounted read-only at the same path in cells)."""
        return (self.cache / "models").resolve()

    @property
    def reports_cache(self) -> Path:
        """Where each image's environment report on this runner is kept between runs."""
        return self.cache / "environment"


@dataclass(frozen=True)
class RunPlan:
    """The planned run: its matrix, every selected cell, those still to run, its folder."""

    matrix: Matrix
    cells: tuple[Cell, ...]
    todo: tuple[Cell, ...]
    folder: RunFolder


@dataclass(frozen=True)
class RunSummary:
    """What a run did: its folder, the cells it took on, and what they gave."""

    folder: RunFolder
    todo: tuple[Cell, ...]
    outcomes: Mapping[str, int] = field(default_factory=dict)  # outcome -> cells (a real run)
    images: Mapping[str, ImageReady] = field(default_factory=dict)  # image key -> made (prepare)
    infeasible: int = 0  # of the skipped cells, those too big for their GPU's memory
    skipped: int = 0  # a dry run: the cells it shows skipped (a real run counts outcomes)
    answer: tuple[str, ...] = ()  # the last lines: the upgrade answer per image, disagreements


def execute_run(
    options: RunOptions,
    progress: Progress | None = None,
    *,
    planned: tuple[Matrix, Sequence[Cell]] | None = None,
) -> RunSummary:
    """The main job. SIGTERM is handled like Ctrl-C, and cleanup always runs.

    With ``planned`` (a matrix and its cells) the run takes that plan instead of
    reading the matrix file: the cells of a matrix extended in memory (a bisect).
    """
    progress = progress or Progress(0)
    with interrupts_as_keyboard_interrupt():
        run = plan_run(options, progress, planned, announce=False)
        earlier = durations_folder(options, run.folder)  # refused in a dry run too
        if not run.todo:
            return finish_empty(run, options.mode, progress)
        runner = detect_runner(options.gpus, rehearse=options.rehearse)
        if runner.rehearse:
            progress.note(REHEARSAL_RUNNER)
        choice = choose_backend(options, run)
        kind = choice.kind
        progress.note(choice.reason)
        setup = backend_setup(options, run, runner, progress.note, choice.runtimes)
        infeasible = {} if options.run_infeasible else infeasible_reasons(run.todo)
        # An infeasible cell could not decide on any runner: that reason wins over this one's.
        skips = {**skip_reasons(kind, run.todo, runner), **infeasible}
        if options.mode is Mode.DRY_RUN:
            print_calls(kind, setup, run.todo, runner, skips)
            return RunSummary(run.folder, run.todo, skipped=len(skips), infeasible=len(infeasible))
        runnable = [cell for cell in run.todo if cell.id not in skips]
        if missing := check_local(runnable, run.matrix.file):
            raise ConfigError(missing)  # before any image is pulled or any cell started
        if options.mode is Mode.PREPARE_ONLY:
            with opened(kind, setup, distinct_images(runnable)) as backend:
                made = prepare_images(
                    backend,
                    runnable,
                    models_root=options.models_root,
                    progress=progress,
                    image_jobs=options.image_jobs,
                )
            return RunSummary(run.folder, run.todo, images=made)
        measured = measured_s(earlier, progress.note)
        pacing = Pacing(options.jobs, options.image_jobs, measured, idle_wait_of(run.matrix))
        for line in outlook(
            run_words(run, options.resume), runnable, skips, options.cache, kind.footprint
        ):
            progress.note(line)
        with claimed(run.folder.path):
            record_plan(run.folder.path, run.cells, options.matrix)
            with opened(kind, setup, distinct_images(runnable)) as backend:
                counts = run_cells(
                    backend,
                    run.todo,
                    skips,
                    runner,
                    run.folder,
                    models_root=options.models_root,
                    progress=progress,
                    pacing=pacing,
                    reports=EnvironmentReports(run.folder.path, options.reports_cache, runner),
                )
            written = write_reports(run.folder.path, report_options(run))
            progress.note(f"reports written to {run.folder.path}/")
    return RunSummary(
        run.folder, run.todo, outcomes=counts, infeasible=len(infeasible), answer=written.answer
    )


def lock_of(matrix: Matrix, options: RunOptions, note: Callable[[str], None]) -> Locked:
    """The lock of the loaded ``matrix``'s following lanes (read, or resolved now and
    written: ``--lock``, ``--relock``), and a note of what it holds."""
    return lock_for(
        matrix, Locking(options.lock, options.relock), lambda: Online(options.cache, note), note
    )


def plan_run(
    options: RunOptions,
    progress: Progress,
    planned: tuple[Matrix, Sequence[Cell]] | None,
    *,
    announce: bool = True,
) -> RunPlan:
    """Load the matrix, lock it and expand it (unless ``planned``), apply the selection, name
    the run folder and drop the cells a resumed run finished."""
    if planned is None:
        matrix, scenarios = load_inputs(options.matrix, options.scenarios)
        locked = lock_of(matrix, options, progress.note)
        matrix = apply_lock(matrix, locked.lock)
        cells = plan(matrix, scenarios, options.lane, Selector(options.only, options.skip))
    else:
        matrix, cells = planned[0], tuple(planned[1])
    if warning := memory_warning(cells, str(matrix.file)):
        print(f"repromatrix: warning: {warning}", file=sys.stderr)
    for problem in facts_problems(cells_models(cells), str(matrix.file)):
        print(f"repromatrix: warning: {problem}", file=sys.stderr)
    folder = resolve_folder(options.results, options.run_id, options.resume)
    todo = pending(cells, folder.path, options.resume)
    progress.total = len(todo)
    if options.mode is Mode.RUN:
        if announce:  # else the caller says it once it knows what this host can run (outlook)
            left = f"{len(todo)} of {len(cells)}" if options.resume else f"{len(cells)}"
            progress.note(f"run {folder.run_id}: {left} cells to run, results in {folder.path}/")
    else:
        doing = (
            "described, nothing started"
            if options.mode is Mode.DRY_RUN
            else "prepared, no cell is run"
        )
        progress.note(f"{len(cells)} cells planned; their images are {doing}")
    return RunPlan(matrix, cells, todo, folder)


def run_words(run: RunPlan, resume: bool) -> str:
    """``run <id> (results in <folder>/)``, and how many cells a resumed run has left."""
    left = f", {len(run.todo)} of {len(run.cells)} cells left" if resume else ""
    return f"run {run.folder.run_id} (results in {run.folder.path}/{left})"


def finish_empty(run: RunPlan, mode: Mode, progress: Progress) -> RunSummary:
    """Nothing left to run (a resumed run that is complete): a real run rewrites its reports."""
    if mode is Mode.RUN:
        progress.note(f"{run_words(run, resume=True)}: every cell has its result")
        written = write_reports(run.folder.path, report_options(run))
        progress.note(f"reports written to {run.folder.path}/")
        return RunSummary(run.folder, (), answer=written.answer)
    return RunSummary(run.folder, ())


def report_options(run: RunPlan) -> ReportOptions:
    """What the run's reports know of the documents: ./scenarios, and over them the run's own
    scenarios (those of another folder, the zoo's: their ranges and kind)."""
    defaults = default_options(run.folder.path)
    own = documented_ranges({cell.scenario.id: cell.scenario for cell in run.cells}.values())
    return replace(defaults, documents=MappingProxyType({**defaults.documents, **own}))


def backend_setup(
    options: RunOptions,
    run: RunPlan,
    runner: Runner,
    note: Callable[[str], None],
    runtimes: Mapping[Lane, Runtime] | None = None,
) -> Setup:
    """What the backend is given: the run's id, runtimes (as the backend's preflight made them,
    else the matrix's), caches, the runner and a voice."""
    return Setup(
        run_id=run.folder.run_id,
        runtimes=runtimes if runtimes is not None else matrix_runtimes(run.matrix),
        cache=options.cache,
        models_root=options.models_root,
        dockerfiles=options.dockerfiles,
        logs=run.folder.path / "images",
        note=note,
        pull=options.pull,
        runner=runner,
    )


def idle_wait_of(matrix: Matrix) -> IdleWait:
    """How long a GPU cell waits for its GPUs to be idle: the GPU lane's ``gpu_idle_wait_s``."""
    gpu = matrix.lanes.get(Lane.GPU)
    return IdleWait(gpu.runtime.gpu_idle_wait_s) if gpu is not None else NO_WAIT


def matrix_runtimes(matrix: Matrix) -> dict[Lane, Runtime]:
    """Each lane's runtime as the matrix gives it."""
    return {lane: config.runtime for lane, config in matrix.lanes.items()}


def choose_backend(options: RunOptions, run: RunPlan) -> kinds.BackendChoice:
    """The backend, chosen by its preflight before anything is built (a dry run of a named
    backend describes it without asking the host)."""
    runtimes = matrix_runtimes(run.matrix)
    if options.mode is Mode.DRY_RUN and options.backend != kinds.AUTO:
        kind = kinds.named(options.backend)
        return kinds.BackendChoice(kind, runtimes, f"backend {kind.name} (asked for; a dry run)")
    lanes = {cell.lane for cell in run.todo}
    return kinds.choose_for_run(options.backend, runtimes, lanes)


def skip_reasons(kind: BackendKind, cells: Sequence[Cell], runner: Runner) -> dict[str, str]:
    """Why ``kind`` on ``runner`` cannot run each of ``cells`` that it cannot run."""
    return {
        cell.id: reason for cell in cells if (reason := kind.skip_reason(cell, runner)) is not None
    }


def infeasible_reasons(cells: Sequence[Cell]) -> dict[str, str]:
    """Why each of ``cells`` whose memory estimate exceeds its GPUs' budget cannot decide."""
    return {cell.id: reason for cell in cells if (reason := infeasible_reason(cell)) is not None}


def print_calls(
    kind: BackendKind,
    setup: Setup,
    cells: Sequence[Cell],
    runner: Runner,
    skips: Mapping[str, str],
    *,
    out: TextIO | None = None,
) -> None:
    """The dry run: what the run would do, as indented JSON, from the same values a real run
    executes (for Docker: every build, pull and container; secrets by name only); each cell
    in ``skips`` shown with the reason a real run would skip it for."""
    described = {
        "run_id": setup.run_id,
        "backend": kind.name,
        "host_gpus": runner.gpu_count,
        # What each usable id is, as nvidia-smi reported it (an id it did not list: unchecked).
        "runner_gpus": [
            gpu.summary if gpu else f"{gpu_id}: unchecked"
            for gpu_id, gpu in zip(runner.gpu_ids, runner.usable, strict=True)
        ],
        **kind.describe(setup, cells, runner, skips),
    }
    stream = out or sys.stdout
    json.dump(described, stream, indent=2, sort_keys=True)
    stream.write("\n")


LATEST = Path("latest")  # ``--durations-from latest``: the latest earlier run under --results


def durations_folder(options: RunOptions, folder: RunFolder) -> Path | None:
    """The earlier run ``--durations-from`` names (None: not given, or ``latest`` and there is
    no earlier run); ``UsageError`` for a folder that is not a run folder."""
    earlier = options.durations_from
    if earlier == LATEST:
        # A folder without cells (the image logs of a --prepare-only run) measured nothing.
        earlier = latest_run(options.results, besides=folder.path, with_cells=True)
    if earlier is not None and not (earlier / store.CELLS_DIR).is_dir():
        raise UsageError(f"--durations-from {earlier}: not a run folder (no {store.CELLS_DIR}/)")
    return earlier


def measured_s(earlier: Path | None, note: Callable[[str], None]) -> dict[str, float] | None:
    """Each cell's duration in the run folder ``earlier`` (None: no earlier run)."""
    if earlier is None:
        return None
    results, _problems = store.read_results(earlier)  # an unreadable cell is only not measured
    measured = measured_durations(results)
    note(f"cells ordered by the durations measured in {earlier}/ ({len(measured)} cells)")
    return measured


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


@contextmanager
def opened(kind: BackendKind, setup: Setup, images: Sequence[Image]) -> Iterator[Backend]:
    """The backend, open for ``images``; closed at the end, shielded from further interrupts,
    so everything the run started is stopped and removed."""
    backend = kind.open(setup, images)
    try:
        yield backend
    finally:
        with uninterruptible():
            backend.close()


@contextmanager
def interrupts_as_keyboard_interrupt() -> Iterator[None]:
    """Make SIGINT and SIGTERM end the run the same way, so cleanup runs for both.

    SIGINT is handled explicitly too: a run started in the background of a script
    inherits SIGINT as ignored (POSIX shells do that without job control), and an
    explicit ``kill -INT`` must still stop it and remove its containers.
    """

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def uninterruptible() -> Iterator[None]:
    """Hold SIGINT and SIGTERM off while the run cleans up, so a second Ctrl-C cannot cut it."""
    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)

"""The run: plan → backend → (dry run) → open → prepare images and models → cells → reports.

Each stage is a small function from one ``RunState`` to the next, listed in
``STAGES`` in the order they run; the work itself is done by functions that
take the narrow values they need (``prepare.py``, ``cell.py``, the backend).
Cells run as many at once as the runner's GPUs, cores and memory and ``--jobs``
allow (``cell_pool``, ``pool``), each with a live ``Triager`` on its output so a
cell stops as soon as its root cause is named, and each result is written the
moment the cell ends, so an interrupted run keeps everything it finished and
``--resume`` does the rest. Whatever goes wrong inside one cell becomes that
cell's outcome (``cell.run_cell``); only an interrupt ends a run early, and then
nothing the run started is left behind.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from repromatrix.backends import registry
from repromatrix.backends.base import Backend, BackendKind, Host, Setup
from repromatrix.build.wheelhouse import CACHE_ROOT
from repromatrix.errors import ConfigError, UsageError
from repromatrix.grammars import RUN_ID
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import load_inputs
from repromatrix.matrix.selector import Selector
from repromatrix.matrix.sources import check_local
from repromatrix.model import Cell, Lane
from repromatrix.reports.write import write_reports
from repromatrix.results import store
from repromatrix.run import dry_run, host_resources, prepare
from repromatrix.run.cell import CellContext, now_iso, run_cell
from repromatrix.run.cell_needs import measured_durations
from repromatrix.run.cell_pool import BackendDown, Pacing, Ran, Where, run_pooled, save
from repromatrix.run.claim import RunClaim, claim
from repromatrix.run.host import detect_host
from repromatrix.run.host_resources import HostResources
from repromatrix.run.image_jobs import ImageJobs
from repromatrix.run.progress import Progress


@dataclass(frozen=True)
class RunOptions:
    """What ``repromatrix run`` was asked to do."""

    matrix: Path = Path("matrix.yaml")
    scenarios: Path | tuple[Path, ...] | None = None  # None: the shipped scenarios/ folder
    lane: Lane | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    backend: str = registry.AUTO  # a name in the backend registry, or auto
    results: Path = Path("results")
    run_id: str | None = None
    resume: bool = False
    dry_run: bool = False
    prepare_only: bool = False  # build images and models, run no cell (warms CI caches)
    dockerfiles: Path = Path("dockerfiles")
    cache: Path = CACHE_ROOT
    rehearse: bool = False  # GPU-lane cells run without their device request (a rehearsal)
    pull: str | None = None  # always | missing | never for every image, over each one's own
    gpus: str | None = None  # --gpus: the GPUs this runner may use (default: from the env)
    jobs: int | None = None  # --jobs: cells at once at most (None: as the runner's resources allow)
    image_jobs: int = 2  # --image-jobs: image builds and pulls at once, beside the cells
    durations_from: Path | None = None  # an earlier run whose cells' durations guide the packing

    @property
    def models_root(self) -> Path:
        """Where the tiny models are cached (mounted read-only at the same path in cells)."""
        return (self.cache / "models").resolve()


@dataclass(frozen=True)
class RunState:
    """What the stages have established so far; each stage returns a new one."""

    options: RunOptions
    run_id: str = ""
    run_dir: Path = Path()
    matrix: Matrix | None = None
    todo: tuple[Cell, ...] = ()
    planned: tuple[Cell, ...] = ()  # every selected cell, finished earlier or not
    kind: BackendKind | None = None
    host: Host = field(default_factory=Host)
    claim: RunClaim | None = None  # the run folder, held from stage_claim on; released at the end
    backend: Backend | None = None  # open from stage_open on; execute_run closes it
    contexts: Mapping[str, CellContext] = field(default_factory=dict)
    outcomes: Mapping[str, int] = field(default_factory=dict)
    measured: Mapping[str, float] | None = None  # seconds each cell took in an earlier run
    done: bool = False  # nothing further to do (a dry run, or a resumed run already complete)

    def setup(self, progress: Progress) -> Setup:
        """What the backend is given: the run's id, runtimes, caches and a voice."""
        assert self.matrix is not None
        runtimes = {lane: config.runtime for lane, config in self.matrix.lanes.items()}
        return Setup(
            run_id=self.run_id,
            runtimes=runtimes,
            cache=self.options.cache,
            models_root=self.options.models_root,
            dockerfiles=self.options.dockerfiles,
            logs=self.run_dir / "images",
            note=progress.note,
            pull=self.options.pull,
            rehearse=self.options.rehearse,
            gpu_ids=self.host.gpu_ids or None,
        )


Stage = Callable[[RunState, Progress], RunState]


def new_run_id(now: datetime | None = None) -> str:
    """A run id from the UTC time, sortable: ``20250101-120000``."""
    return (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")


def resolve_run_dir(options: RunOptions) -> tuple[str, Path]:
    """The run id and folder; ``--resume`` without an id continues the latest run."""
    run_id = options.run_id
    if run_id is None and options.resume:
        latest = latest_run(options.results)
        if latest is None:
            raise UsageError(f"--resume: no earlier run under {options.results}/ to continue")
        run_id = latest.name
    run_id = run_id or new_run_id()
    return run_id, store.run_folder(options.results, run_id)


def pending(cells: tuple[Cell, ...], run_dir: Path, resume: bool) -> tuple[Cell, ...]:
    """The cells still to run: all of them, or with ``--resume`` those without a result."""
    if not resume:
        return cells
    done = store.finished_ids(run_dir)
    return tuple(cell for cell in cells if cell.id not in done)


def record_plan(run_dir: Path, cells: Sequence[Cell], matrix: Path) -> None:
    """Write ``plan.json`` before any cell runs, so every report of this run, finished or
    not, lists the planned cells that never ran (a resumed run adds to the earlier plan)."""
    earlier, _ = store.read_plan(run_dir)
    ids = {*(earlier or ()), *(cell.id for cell in cells)}
    store.write_plan(run_dir, ids, matrix=matrix.name)


def stage_plan(state: RunState, progress: Progress) -> RunState:
    """Load and expand the matrix, apply the selection, drop cells a resumed run finished."""
    options = state.options
    if state.matrix is None:
        matrix, scenarios = load_inputs(options.matrix, options.scenarios)
        cells = plan(matrix, scenarios, options.lane, Selector(options.only, options.skip))
    else:  # planned in memory (a bisect: a matrix extended with versions its file lacks)
        matrix, cells = state.matrix, state.planned
    run_id, run_dir = resolve_run_dir(options)
    todo = pending(cells, run_dir, options.resume)
    progress.total = len(todo)
    left = f"{len(todo)} of {len(cells)}" if options.resume else f"{len(cells)}"
    if options.prepare_only or options.dry_run:
        progress.note(f"{len(cells)} cells planned; their images are {_doing(options)}")
    else:
        progress.note(f"run {run_id}: {left} cells to run, results in {run_dir}/")
    planned = replace(state, matrix=matrix, run_id=run_id, run_dir=run_dir, todo=todo)
    runs_cells = not (options.dry_run or options.prepare_only)
    if not runs_cells:
        durations_folder(options, run_dir)  # not read, but a wrong folder is refused all the same
    measured = measured_s(options, run_dir, progress.note) if runs_cells else None
    return replace(planned, done=not todo, planned=cells, measured=measured)


def stage_claim(state: RunState, progress: Progress) -> RunState:
    """Hold the run folder for this run (a second run of it is refused), then write the plan."""
    if state.options.prepare_only or state.options.dry_run:
        return state
    held = replace(state, claim=claim(state.run_dir))
    record_plan(state.run_dir, state.planned, state.options.matrix)
    return held


def stage_backend(state: RunState, progress: Progress) -> RunState:
    """The backend kind (by name, or the first available) and what this host offers."""
    host = detect_host(state.options.gpus, rehearse=state.options.rehearse)
    return replace(state, kind=registry.choose(state.options.backend), host=host)


def stage_dry_run(state: RunState, progress: Progress) -> RunState:
    """With ``--dry-run``, print what the run would do, then stop."""
    if not state.options.dry_run:
        return state
    assert state.kind is not None
    dry_run.print_calls(state.kind, state.setup(progress), state.todo, state.host)
    return replace(state, done=True)


def stage_open(state: RunState, progress: Progress) -> RunState:
    """Open the backend for the images of the cells it can run on this host, once every
    local model and adapter folder those cells mount is known to exist."""
    assert state.kind is not None and state.matrix is not None
    runnable = [c for c in state.todo if state.kind.skip_reason(c, state.host) is None]
    if missing := check_local(runnable, state.matrix.file):
        raise ConfigError(missing)  # before any image is pulled or any cell started
    wanted = prepare.runnable_images(state.todo, state.kind, state.host)
    return replace(state, backend=state.kind.open(state.setup(progress), wanted))


def stage_prepare(state: RunState, progress: Progress) -> RunState:
    """Give cells this host cannot run their skip reason; with ``--prepare-only`` make every
    image and tiny model the others need and stop (a run makes them as its cells go)."""
    assert state.kind is not None and state.backend is not None
    kind, host = state.kind, state.host
    contexts = {
        cell.id: CellContext(None, "", None, reason)
        for cell in state.todo
        if (reason := kind.skip_reason(cell, host)) is not None
    }
    if not state.options.prepare_only:
        return replace(state, contexts=contexts)
    runnable = [cell for cell in state.todo if cell.id not in contexts]
    images = image_jobs_for(state, runnable, contexts, progress)
    where = Where(state.backend, contexts, state.run_dir, state.run_id)
    pacing = Pacing(image_jobs=state.options.image_jobs)
    run_pooled(where, (), runner_resources(host), progress, {}, pacing=pacing, images=images)
    built = sum(1 for p in images.prepared.values() if p.built)
    progress.note(f"images ready: {len(images.prepared)} ({built} built)")
    return replace(state, contexts=contexts, done=True)


def image_jobs_for(
    state: RunState,
    cells: Sequence[Cell],
    contexts: dict[str, CellContext],
    progress: Progress,
) -> ImageJobs:
    """The image jobs of ``cells``, which fill in their contexts in ``contexts`` (until its
    image job ends, a cell's image counts as not prepared)."""
    assert state.backend is not None
    contexts.update({cell.id: CellContext(None, "") for cell in cells})
    models = state.options.models_root
    return ImageJobs(
        state.backend, cells, models_root=models, note=progress.note, contexts=contexts
    )


def stage_cells(state: RunState, progress: Progress) -> RunState:
    """Make the images and run the cells, as many at once as the runner and ``--jobs``
    allow, each result written as soon as its cell ends."""
    assert state.backend is not None
    options = state.options
    contexts = dict(state.contexts)
    runnable = [cell for cell in state.todo if cell.id not in contexts]
    images = image_jobs_for(state, runnable, contexts, progress)
    counts = run_cells(
        state.backend,
        state.todo,
        contexts,
        run_dir=state.run_dir,
        run_id=state.run_id,
        progress=progress,
        resources=runner_resources(state.host),
        pacing=Pacing(options.jobs, options.image_jobs, state.measured, options.rehearse),
        images=images,
    )
    return replace(state, outcomes=counts, contexts=contexts)


LATEST = Path("latest")  # ``--durations-from latest``: the latest earlier run under --results


def measured_s(
    options: RunOptions, run_dir: Path, note: Callable[[str], None]
) -> dict[str, float] | None:
    """Each cell's duration in the earlier run ``--durations-from`` names (None: not given,
    or ``latest`` and there is no earlier run)."""
    folder = durations_folder(options, run_dir)
    if folder is None:
        return None
    results, _problems = store.read_results(folder)  # an unreadable cell is only not measured
    measured = measured_durations(results)
    note(f"cells ordered by the durations measured in {folder}/ ({len(measured)} cells)")
    return measured


def durations_folder(options: RunOptions, run_dir: Path) -> Path | None:
    """The earlier run ``--durations-from`` names (None: not given, or ``latest`` and there is
    no earlier run); ``UsageError`` for a folder that is not a run folder."""
    folder = options.durations_from
    if folder == LATEST:
        folder = latest_run(options.results, besides=run_dir)
    if folder is not None and not (folder / store.CELLS_DIR).is_dir():
        raise UsageError(f"--durations-from {folder}: not a run folder (no {store.CELLS_DIR}/)")
    return folder


def latest_run(results: Path, besides: Path | None = None) -> Path | None:
    """The run folder under ``results`` whose id sorts last (run ids are UTC times), other
    than ``besides``; None when there is none."""
    runs = sorted(p.name for p in results.glob("*/") if RUN_ID.fullmatch(p.name) and p != besides)
    return results / runs[-1] if runs else None


def run_cells(
    backend: Backend,
    cells: Sequence[Cell],
    contexts: MutableMapping[str, CellContext],
    *,
    run_dir: Path,
    run_id: str,
    progress: Progress,
    resources: HostResources | None = None,
    pacing: Pacing | None = None,
    images: ImageJobs | None = None,
) -> dict[str, int]:
    """Run ``cells`` on ``backend``, as many at once as ``resources`` and ``pacing`` allow,
    saving each result the moment it ends (``cell_pool``).

    ``contexts`` holds every cell's context; given ``images`` (which write into
    the same mapping), the image jobs make the images as the cells go and fill in
    the contexts of their cells. Cells this host cannot run are saved as skipped
    first and summarised in one line per lane and reason, not one line each. When
    a cell fails because the backend itself died (the Docker engine stopped
    answering), no further cell is started against it: they keep no result, so
    ``--resume`` runs them later.
    An interrupt stops every running cell and re-raises once the pool has ended.
    """
    where = Where(backend, contexts, run_dir, run_id)
    counts: dict[str, int] = {}
    skipped = [cell for cell in cells if contexts[cell.id].skip_reason is not None]
    runnable = [cell for cell in cells if contexts[cell.id].skip_reason is None]
    for cell in skipped:
        save(where, cell, Ran(now_iso(), run_cell(backend, cell, contexts[cell.id])), counts)
    for (lane, reason), count in Counter(
        (cell.lane.value, contexts[cell.id].skip_reason) for cell in skipped
    ).items():
        progress.note(f"{count} {lane} cell(s) skipped: {reason}")
    progress.total = progress.to_run = len(runnable)
    resources = resources or runner_resources(Host())
    try:
        interrupted = run_pooled(
            where, runnable, resources, progress, counts, pacing=pacing, images=images
        )
    except BackendDown:
        left = len(runnable) - (sum(counts.values()) - len(skipped))
        progress.note(
            f"the {backend.name} backend stopped answering: {left} cell(s) not started; "
            "`repromatrix run --resume` runs them once it is back"
        )
        return counts
    if interrupted:
        raise KeyboardInterrupt  # every finished cell is saved; the caller cleans up
    return counts


def runner_resources(host: Host) -> HostResources:
    """What this runner may lend cells: the run's GPUs (``host.gpu_ids``, as every other
    stage sees them: ``--gpus``, the visible-devices variables, MIG ids too), with their
    UUIDs where ``nvidia-smi -L`` lists them, this process's cores and the free memory."""
    found = host_resources.detect(environ={}, gpus_option=None)
    return replace(found, gpu_ids=host.gpu_ids)


def stage_reports(state: RunState, progress: Progress) -> RunState:
    """Write junit.xml and the compatibility table from the results saved in the run folder."""
    if state.options.dry_run or state.options.prepare_only:
        return state
    write_reports(state.run_dir)
    progress.note(f"reports written to {state.run_dir}/")
    return state


STAGES: tuple[Stage, ...] = (
    stage_plan,
    stage_claim,
    stage_backend,
    stage_dry_run,
    stage_open,
    stage_prepare,
    stage_cells,
    stage_reports,
)


def execute_run(
    options: RunOptions,
    progress: Progress | None = None,
    *,
    matrix: Matrix | None = None,
    cells: Sequence[Cell] = (),
) -> RunState:
    """Run the stages in order; SIGTERM is handled like Ctrl-C, and cleanup always runs.

    With ``matrix`` and ``cells`` the run takes that plan instead of reading the
    matrix file (the cells of a matrix extended in memory).
    """
    progress = progress or Progress(0)
    state = RunState(options, matrix=matrix, planned=tuple(cells))
    with interrupts_as_keyboard_interrupt():
        try:
            for stage in STAGES:
                if not state.done or stage is stage_reports:
                    state = stage(state, progress)
        finally:
            if state.backend is not None:
                close_backend(state.backend)
            if state.claim is not None:
                state.claim.release()
    return state


def _doing(options: RunOptions) -> str:
    return "described, nothing started" if options.dry_run else "prepared, no cell is run"


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


def close_backend(backend: Backend) -> None:
    """Stop and remove everything the run started, shielded from further interrupts."""
    with uninterruptible():
        backend.close()

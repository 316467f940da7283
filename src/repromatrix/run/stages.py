"""The run: plan → backend → render → prepare images → make models → run cells → reports.

Each stage is a small function from one ``RunState`` to the next, listed in
``STAGES`` in the order they run. Cells run one at a time (an engine start
takes every core), each with a live ``Triager`` on its output so a cell stops
as soon as its root cause is named, and each result is written the moment the
cell ends, so an interrupted run keeps everything it finished and
``--resume`` does the rest. Whatever goes wrong inside one cell becomes that
cell's outcome (``cell_exec.run_cell``); only an interrupt ends a run early,
and then nothing the run started is left behind.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from repromatrix.backends.base import Backend, Prepared
from repromatrix.backends.oci_container import connect, engine_available
from repromatrix.build.render import RenderedImage, render_all
from repromatrix.errors import UsageError
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import load_inputs
from repromatrix.matrix.selector import Selector
from repromatrix.model import Cell, Lane
from repromatrix.reports import write as reports
from repromatrix.results import store as results
from repromatrix.run import dry_run
from repromatrix.run import prepare as run_setup
from repromatrix.run.cell import CellContext, cell_result, now_iso, run_cell
from repromatrix.run.progress import Progress

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


@dataclass(frozen=True)
class RunOptions:
    """What ``repromatrix run`` was asked to do."""

    matrix: Path = Path("matrix.yaml")
    scenarios: Path = Path("scenarios")
    lane: Lane | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    backend: str = "auto"  # docker | local | auto
    results: Path = Path("results")
    run_id: str | None = None
    resume: bool = False
    dry_run: bool = False
    prepare_only: bool = False  # build images and models, run no cell (warms CI caches)
    dockerfiles: Path = Path("dockerfiles")
    cache: Path = Path(".cache")


@dataclass(frozen=True)
class RunState:
    """What the stages have established so far; each stage returns a new one."""

    options: RunOptions
    progress: Progress
    run_id: str = ""
    run_dir: Path = Path()
    matrix: Matrix | None = None
    todo: tuple[Cell, ...] = ()
    backend_name: str = ""
    gpus: int = 0
    rendered: tuple[RenderedImage, ...] = ()
    backend: Backend | None = None
    prepared: Mapping[str, Prepared] = field(default_factory=dict)
    contexts: Mapping[str, CellContext] = field(default_factory=dict)
    outcomes: Mapping[str, int] = field(default_factory=dict)
    done: bool = False  # nothing further to do (a dry run, or a resumed run already complete)

    @property
    def models_root(self) -> Path:
        """Where the tiny models are cached (mounted read-only at the same path in cells)."""
        return (self.options.cache / "models").resolve()


Stage = Callable[[RunState], RunState]


def new_run_id(now: datetime | None = None) -> str:
    """A run id from the UTC time, sortable: ``20250101-120000``."""
    return (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")


def resolve_run_dir(options: RunOptions) -> tuple[str, Path]:
    """The run id and folder; ``--resume`` without an id continues the latest run."""
    run_id = options.run_id
    if run_id is None and options.resume:
        runs = sorted(p.name for p in options.results.glob("*/") if RUN_ID.match(p.name))
        if not runs:
            raise UsageError(f"--resume: no earlier run under {options.results}/ to continue")
        run_id = runs[-1]
    run_id = run_id or new_run_id()
    if not RUN_ID.match(run_id):
        raise UsageError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-' (64 at most)")
    return run_id, options.results / run_id


def pending(cells: tuple[Cell, ...], run_dir: Path, resume: bool) -> tuple[Cell, ...]:
    """The cells still to run: all of them, or with ``--resume`` those without a result."""
    if not resume:
        return cells
    done = results.finished_ids(run_dir)
    return tuple(cell for cell in cells if cell.id not in done)


def stage_plan(state: RunState) -> RunState:
    """Load and expand the matrix, apply the selection, drop cells a resumed run finished."""
    options = state.options
    matrix, scenarios = load_inputs(options.matrix, options.scenarios)
    cells = plan(matrix, scenarios, options.lane, Selector(options.only, options.skip))
    run_id, run_dir = resolve_run_dir(options)
    todo = pending(cells, run_dir, options.resume)
    results.start_run(run_dir, [c.id for c in cells], dry=options.dry_run or options.prepare_only)
    state.progress.total = len(todo)
    left = f"{len(todo)} of {len(cells)}" if options.resume else f"{len(cells)}"
    if options.prepare_only or options.dry_run:
        state.progress.note(f"{len(cells)} cells planned; their images are {_doing(options)}")
    else:
        state.progress.note(f"run {run_id}: {left} cells to run, results in {run_dir}/")
    return replace(state, matrix=matrix, run_id=run_id, run_dir=run_dir, todo=todo, done=not todo)


def stage_backend(state: RunState) -> RunState:
    """Docker or local, and how many GPUs this host has (GPU cells need enough of them)."""
    requested = state.options.backend
    answers = engine_available() if requested in ("auto", "docker") else False
    name = run_setup.choose_backend(requested, answers)
    if name == "docker" and not answers and not state.options.dry_run:
        connect()  # raises InfraError with the engine's own words
    return replace(state, backend_name=name, gpus=run_setup.host_gpu_count())


def stage_render(state: RunState) -> RunState:
    """Render the build context of every image the remaining cells use (Docker only)."""
    if state.backend_name != "docker" and not state.options.dry_run:
        return state
    assert state.matrix is not None
    rendered: list[RenderedImage] = []
    for lane, config in sorted(state.matrix.lanes.items()):
        cells = [cell for cell in state.todo if cell.lane is lane]
        if cells:
            # GPU runtimes have no base image; rendering never reads it for GPU images.
            runtime = config.runtime
            rendered += render_all(cells, runtime, state.options.dockerfiles)
    return replace(state, rendered=tuple(rendered))


def stage_dry_run(state: RunState) -> RunState:
    """With ``--dry-run``, print every engine call the run would make, then stop."""
    if not state.options.dry_run:
        return state
    dry_run.print_calls(state)
    return replace(state, done=True)


def stage_prepare(state: RunState) -> RunState:
    """Open the backend, then build, pull or find each image the runnable cells need."""
    backend, prepared = run_setup.open_and_prepare(state)
    built = sum(1 for p in prepared.values() if p.built)
    state.progress.note(f"images ready: {len(prepared)} ({built} built)")
    return replace(state, backend=backend, prepared=prepared)


def stage_models(state: RunState) -> RunState:
    """Make each tiny model once, then give every cell its model path and skip reason."""
    contexts = run_setup.cell_contexts(state)
    return replace(state, contexts=contexts, done=state.options.prepare_only)


def stage_cells(state: RunState) -> RunState:
    """Run the cells one at a time, writing each result as soon as it ends."""
    assert state.backend is not None
    counts: dict[str, int] = {}
    state.progress.to_run = sum(state.contexts[c.id].skip_reason is None for c in state.todo)
    for cell in state.todo:
        context = state.contexts[cell.id]
        ran = context.skip_reason is None
        if ran:
            state.progress.start(cell.id)
        started_at = now_iso()
        run = run_cell(state.backend, cell, context)
        result = cell_result(cell, run, context=context, run_id=state.run_id, started_at=started_at)
        results.write_result(state.run_dir, result, run.execution.log)
        state.progress.end(cell.id, result.outcome.value, _short(result.reason), ran=ran)
        counts[result.outcome.value] = counts.get(result.outcome.value, 0) + 1
    return replace(state, outcomes=counts)


def stage_reports(state: RunState) -> RunState:
    """Write junit.xml and the compatibility table from the results saved in the run folder."""
    if state.options.dry_run or state.options.prepare_only:
        return state
    reports.write_reports(state.run_dir)
    state.progress.note(f"reports written to {state.run_dir}/")
    return state


STAGES: tuple[Stage, ...] = (
    stage_plan,
    stage_backend,
    stage_render,
    stage_dry_run,
    stage_prepare,
    stage_models,
    stage_cells,
    stage_reports,
)


def execute_run(options: RunOptions, progress: Progress | None = None) -> RunState:
    """Run the stages in order; SIGTERM is handled like Ctrl-C, and cleanup always runs."""
    state = RunState(options, progress or Progress(0))
    with interrupts_as_keyboard_interrupt():
        try:
            for stage in STAGES:
                if not state.done or stage is stage_reports:
                    state = stage(state)
        finally:
            if state.backend is not None:
                close_backend(state.backend)
    return state


def _doing(options: RunOptions) -> str:
    return "described, nothing started" if options.dry_run else "prepared, no cell is run"


def _short(reason: str, width: int = 160) -> str:
    line = reason.strip().splitlines()[0] if reason.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


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

"""The run folder: its id and path, the cells still to run in it, its plan, and its claim.

One run writes a run folder at a time: a claim held for as long as the run lasts. Two
runs writing the same ``results/<run>/`` (a ``--resume`` started while the run is still
going, two CI steps or two Slurm tasks with one ``--run-id``) would interleave results
and reports. The claim is in ``claim.py``: a lock file made exclusively, holding who
made it, so that it works on the network file systems of clusters, where ``flock`` may
not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from repromatrix.errors import UsageError
from repromatrix.grammars import RUN_ID
from repromatrix.results import store
from repromatrix.values import Cell


@dataclass(frozen=True)
class RunFolder:
    """A run's id and its folder, ``<results>/<run_id>/``."""

    run_id: str
    path: Path


def new_run_id(now: datetime | None = None) -> str:
    """A run id from the UTC time, sortable: ``20250101-120000``."""
    return (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")


def resolve_folder(results: Path, run_id: str | None, resume: bool) -> RunFolder:
    """The run's folder; ``--resume`` without an id continues the latest run."""
    if run_id is None and resume:
        latest = latest_run(results)
        if latest is None:
            raise UsageError(f"--resume: no earlier run under {results}/ to continue")
        run_id = latest.name
    run_id = run_id or new_run_id()
    return RunFolder(run_id, store.run_folder(results, run_id))


def latest_run(
    results: Path, besides: Path | None = None, *, with_cells: bool = False
) -> Path | None:
    """The run folder under ``results`` whose id sorts last (run ids are UTC times), other
    than ``besides`` and, ``with_cells``, holding cells; None when there is none."""
    runs = sorted(
        p.name
        for p in results.glob("*/")
        if RUN_ID.fullmatch(p.name)
        and p != besides
        and (not with_cells or (p / store.CELLS_DIR).is_dir())
    )
    return results / runs[-1] if runs else None


def pending(cells: Sequence[Cell], run_dir: Path, resume: bool) -> tuple[Cell, ...]:
    """The cells still to run: all of them, or with ``--resume`` those without a result."""
    if not resume:
        return tuple(cells)
    done = store.finished_ids(run_dir)
    return tuple(cell for cell in cells if cell.id not in done)


def record_plan(run_dir: Path, cells: Sequence[Cell], matrix: Path) -> None:
    """Write ``plan.json`` before any cell runs, so every report of this run, finished or
    not, lists the planned cells that never ran (a resumed run adds to the earlier plan)."""
    earlier, _ = store.read_plan(run_dir)
    ids = {*(earlier or ()), *(cell.id for cell in cells)}
    store.write_plan(run_dir, ids, matrix=matrix.name)

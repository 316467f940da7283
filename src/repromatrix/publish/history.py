"""``history.json``: every cell's outcome in every published run, and since when it holds.

Pure apart from reading and writing the file. A published site keeps its
history; publishing again adds the new runs' cells (a run id already in the
history is replaced, so republishing a run is idempotent) and every page is
rebuilt from the merged history. ``since`` answers "since when does this
cell behave like this?": the oldest run of the current streak of one outcome,
with its image digest and date.

The history is also what ``watch`` reads to know which tags were graded
(``graded``: a tag, or a tag at one digest) and what a baseline showed
(``published``: its newest run's cells, as results that hold what the history
keeps of them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.model import Expected, Level, Outcome
from repromatrix.results.schema import is_cell_id
from repromatrix.results.store import CellResult
from repromatrix.results.verdicts import Judged, Verdict

HISTORY_FILE = "history.json"
HISTORY_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Point:
    """One cell in one run."""

    run: str
    date: str
    outcome: str
    verdict: str
    version: str | None
    digest: str | None
    cause: str
    page: str

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready form."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class RunInfo:
    """One published run."""

    id: str
    date: str
    title: str
    cells: int


@dataclass(frozen=True)
class History:
    """Every published run (oldest first) and each cell's points (oldest first)."""

    runs: tuple[RunInfo, ...]
    cells: Mapping[str, tuple[Point, ...]]

    @property
    def newest(self) -> RunInfo | None:
        """The newest run, or None for an empty history."""
        return self.runs[-1] if self.runs else None

    def since(self, cell_id: str) -> Point | None:
        """The first point of the cell's current streak of one outcome."""
        points = self.cells.get(cell_id, ())
        if not points:
            return None
        first = points[-1]
        for point in reversed(points):
            if point.outcome != first.outcome:
                break
            first = point
        return first

    def tags(self, lane: str) -> frozenset[str]:
        """Every image tag of ``lane`` the history has cells of."""
        return frozenset(parts[1] for cell in self.cells if (parts := cell.split("/"))[0] == lane)

    def graded(self, lane: str, tag: str, digest: str | None = None) -> bool:
        """Whether a run of ``tag`` is published (at ``digest``, when given: a moved tag is a
        new image, graded once it has run)."""
        return any(
            digest is None or any(same_digest(p.digest, digest) for p in points)
            for cell, points in self.cells.items()
            if cell.startswith(f"{lane}/{tag}/")
        )

    def published(self, lane: str, tag: str) -> tuple[Judged, ...]:
        """The cells of the newest published run of ``tag``, as results holding what the
        history keeps of each (outcome, verdict, cause, version, digest; no flags, no log)."""
        points = [
            (cell, point)
            for cell, cell_points in self.cells.items()
            if cell.startswith(f"{lane}/{tag}/")
            for point in cell_points
        ]
        if not points:
            return ()
        newest = max((p.date, p.run) for _, p in points)
        return tuple(_as_judged(cell, p) for cell, p in sorted(points) if (p.date, p.run) == newest)

    def to_json(self) -> dict[str, Any]:
        """The document written to ``history.json``."""
        return {
            "schema_version": HISTORY_SCHEMA_VERSION,
            "runs": [dict(r.__dict__) for r in self.runs],
            "cells": {
                cell: [p.to_json() for p in points] for cell, points in sorted(self.cells.items())
            },
        }


EMPTY = History((), {})


def read_history(site: Path) -> History:
    """The history of a published site, or an empty one when there is none yet."""
    path = site / HISTORY_FILE
    if not path.is_file():
        return EMPTY
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema_version") != HISTORY_SCHEMA_VERSION:
            raise ValueError(f"schema_version {data.get('schema_version')!r}")
        runs = tuple(RunInfo(**r) for r in data["runs"])
        cells = {c: tuple(Point(**p) for p in pts) for c, pts in data["cells"].items()}
        for cell, points in cells.items():
            _check_points(cell, points)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"{path}: not a history this repromatrix can extend ({exc}); publish into an "
            "empty folder, or give the previous site"
        ) from exc
    return History(runs, cells)


def _check_points(cell: str, points: Sequence[Point]) -> None:
    """``ValueError`` for a cell id or a point no run of this tool would have written."""
    if not is_cell_id(cell):
        raise ValueError(f"{cell!r} is not a cell id")
    for point in points:
        Outcome(point.outcome)
        Verdict(point.verdict)
        if not all(isinstance(v, str) for v in (point.run, point.date, point.cause, point.page)):
            raise ValueError(f"{cell}: a point of run {point.run!r} is not text where it must be")


def same_digest(recorded: str | None, digest: str) -> bool:
    """Whether a recorded digest (``registry/name@sha256:...`` or ``sha256:...``) is
    ``digest``."""
    return recorded is not None and recorded.rpartition("@")[2] == digest.rpartition("@")[2]


def _as_judged(cell: str, point: Point) -> Judged:
    """One published cell as a result: what its point keeps, from its id the rest."""
    base, _, level = cell.partition("@")
    lane, tag, gpu, model, flagset, scenario, variant = base.split("/")
    result = CellResult(
        id=cell,
        outcome=Outcome(point.outcome),
        expected=Expected.UNKNOWN,  # the history keeps the verdict, not what was expected
        lane=lane,
        level=level or Level.ENGINE.value,
        image=point.digest or tag,
        image_tag=tag,
        gpu=gpu,
        model=model,
        flagset=flagset,
        scenario=scenario,
        variant=variant,
        version=point.version,
        image_digest=point.digest,
        reason=point.cause,
        run_id=point.run,
        started_at=point.date,
    )
    return Judged(result, Verdict(point.verdict))


def run_date(judged: Sequence[Judged]) -> str:
    """A run's date: the earliest start time of its cells (ISO 8601, UTC)."""
    return min((j.result.started_at for j in judged if j.result.started_at), default="")


def extend(
    history: History, run: RunInfo, judged: Iterable[Judged], pages: Mapping[str, str]
) -> History:
    """Add one run (replacing an earlier copy of it); ``pages`` maps cell ids to their page."""
    cells = {c: tuple(p for p in pts if p.run != run.id) for c, pts in history.cells.items()}
    for item in judged:
        r = item.result
        point = Point(
            run.id,
            run.date,
            r.outcome.value,
            item.verdict.value,
            r.version,
            r.image_digest,
            item.cause,
            pages.get(r.id, ""),
        )
        cells[r.id] = tuple(sorted((*cells.get(r.id, ()), point), key=_order))
    runs = sorted((*(r for r in history.runs if r.id != run.id), run), key=lambda r: (r.date, r.id))
    return History(tuple(runs), {c: pts for c, pts in cells.items() if pts})


def _order(point: Point) -> tuple[str, str]:
    return (point.date, point.run)

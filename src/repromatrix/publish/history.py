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

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.grammars import check_run_id, check_site_page, load_json
from repromatrix.judgement import Expected, Outcome, Verdict
from repromatrix.results.schema import is_cell_id
from repromatrix.results.store import CellResult, Unreadable, read_file
from repromatrix.results.verdicts import Judged
from repromatrix.values import Level

HISTORY_FILE = "history.json"
HISTORY_SCHEMA_VERSION = 1
MAX_HISTORY_BYTES = 1 << 30  # years of nightly runs of a large matrix


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
    """The history of a published site, or an empty one when there is none yet.

    A site may have been tampered with, so the file is read as a run folder's
    files are (no link followed, no FIFO waited on, bounded) and every field is
    checked (``parse_history``); anything wrong is one ``UsageError`` line.
    """
    path = site / HISTORY_FILE
    if not os.path.lexists(path):
        return EMPTY
    try:
        return parse_history(load_json(read_file(path, MAX_HISTORY_BYTES)))
    except (Unreadable, ValueError, RecursionError) as exc:
        raise UsageError(
            f"{path}: not a history this repromatrix can extend ({exc}); publish into an "
            "empty folder, or give the previous site"
        ) from exc


def parse_history(data: object) -> History:
    """A decoded ``history.json``, each field checked: its type, run and cell ids by their
    grammars, outcomes and verdicts by name, and every page a relative page of the site
    (a link on the site's pages, so never a script or an outside URL). ``ValueError`` says
    what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    version = data.get("schema_version")
    if type(version) is not int or version != HISTORY_SCHEMA_VERSION:
        raise ValueError(f"schema_version {_shown(version)}")
    runs, cells = data.get("runs"), data.get("cells")
    if not isinstance(runs, list) or not isinstance(cells, dict):
        raise ValueError("`runs` must be a list and `cells` an object")
    return History(
        tuple(_run(raw) for raw in runs),
        {_cell_id(cell): _points(cell, points) for cell, points in cells.items()},
    )


_RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "date": (str,),
    "title": (str,),
    "cells": (int,),
}
_POINT_FIELDS: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("run", "date", "outcome", "verdict"), (str,)),
    **dict.fromkeys(("version", "digest"), (str, type(None))),
    **dict.fromkeys(("cause", "page"), (str,)),
}
_OUTCOMES = frozenset(o.value for o in Outcome)
_VERDICTS = frozenset(v.value for v in Verdict)


def _run(raw: object) -> RunInfo:
    values = _record(raw, _RUN_FIELDS, "a run")
    _check(values["id"], check_run_id, "a run's `id`")
    _check(values["date"], _date_problem, "a run's `date`")
    return RunInfo(**values)


def _cell_id(cell: str) -> str:
    if not is_cell_id(cell):
        raise ValueError(f"{_shown(cell)} is not a cell id")
    return cell


def _points(cell: str, raw: object) -> tuple[Point, ...]:
    if not isinstance(raw, list):
        raise ValueError(f"the points of {cell} are not a list")
    return tuple(_point(cell, item) for item in raw)


def _point(cell: str, raw: object) -> Point:
    values = _record(raw, _POINT_FIELDS, f"a point of {cell}")
    _check(values["run"], check_run_id, f"`run` of a point of {cell}")
    _check(values["date"], _date_problem, f"`date` of a point of {cell}")
    _check(values["outcome"], _known(_OUTCOMES), f"`outcome` of a point of {cell}")
    _check(values["verdict"], _known(_VERDICTS), f"`verdict` of a point of {cell}")
    if values["page"]:
        _check(values["page"], check_site_page, f"`page` of a point of {cell}")
    return Point(**values)


def _record(raw: object, kinds: Mapping[str, tuple[type, ...]], what: str) -> dict[str, Any]:
    """``raw`` when it is an object of exactly these fields, each of its types (no booleans)."""
    if not isinstance(raw, dict) or set(raw) != set(kinds):
        raise ValueError(f"{what} is not an object of {', '.join(kinds)}")
    for name, types in kinds.items():
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise ValueError(f"`{name}` of {what} is {_shown(value)}, not of its type")
    return dict(raw)


def _check(value: str, problem: Callable[[str], str | None], what: str) -> None:
    if (why := problem(value)) is not None:
        raise ValueError(f"{what} {_shown(value)} is refused: {why}")


def _date_problem(value: str) -> str | None:
    if not value:
        return None
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return "it is not an ISO 8601 time"
    return None


def _known(names: frozenset[str]) -> Callable[[str], str | None]:
    return lambda value: None if value in names else "it is not a known name"


def _shown(value: object) -> str:
    """A value for a one-line message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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

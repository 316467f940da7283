"""Combine result shards from many runners into one run folder.

Each GPU runner of a fleet runs its share of the matrix and uploads its run
folder; ``merge`` copies every cell (and the environment report its result
points at) into one folder, so the reports of the
merged folder are those of a single run of all the shards' cells. When
several shards hold the same cell (a job retried in a later attempt, or two
runners given the same cell), one copy is kept: a copy that ran over one the
infrastructure stopped or skipped, then the latest attempt by its finish time,
then the first shard given. Every copy left out is listed in ``merge.json``;
when it said something else than the kept one, a problem says which copy
replaced which, and when copies that ran disagree about the outcome, the
conflict is named in every report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.judgement import Outcome
from repromatrix.results.problems import ProblemKind, RunProblem, unique_problems
from repromatrix.results.store import (
    CELLS_DIR,
    PLAN_FILE,
    CellResult,
    copy_cell,
    copy_environment,
    read_plan,
    read_results,
    read_run,
    write_merge_record,
    write_plan,
)

# How much a copy of a cell says: a cell that ran beats one the infrastructure stopped.
_RANK = {Outcome.SKIPPED: 2, Outcome.INFRA_ERROR: 1}


def finish_time(result: CellResult) -> datetime | None:
    """When the attempt ended: ``finished_at``, or for older results its start plus its duration."""
    try:
        if result.finished_at:
            return _utc(datetime.fromisoformat(result.finished_at))
        if result.started_at:
            start = _utc(datetime.fromisoformat(result.started_at))
            return start + timedelta(seconds=result.timings.total_s)
    except (ValueError, OverflowError):
        return None
    return None


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


@dataclass(frozen=True)
class Copy:
    """One shard's copy of a cell."""

    shard: Path
    result: CellResult

    def describe(self) -> str:
        """``hit in shards/a (finished 2026-...)``."""
        moment = finish_time(self.result)
        when = f"finished {moment.isoformat()}" if moment else "finish time unknown"
        return f"{self.result.outcome.value} in {self.shard} ({when})"

    def to_json(self) -> dict[str, Any]:
        """The copy as merge.json lists it."""
        moment = finish_time(self.result)
        return {
            "shard": str(self.shard),
            "outcome": self.result.outcome.value,
            "finished_at": moment.isoformat() if moment else None,
            "run_id": self.result.run_id,
            "host": self.result.host,
        }


@dataclass(frozen=True)
class CellCopies:
    """The copies of one cell: the one kept, the ones it replaced, and whether they conflict."""

    cell_id: str
    kept: Copy
    replaced: tuple[Copy, ...]
    conflict: bool  # copies that ran disagree about the outcome

    def problem(self) -> RunProblem | None:
        """What the reports say: a conflict, a replacement that changed the answer, or nothing."""
        kept = f"kept {self.kept.result.outcome.value} from {self.kept.shard}"
        if self.conflict:
            seen = "; ".join(c.describe() for c in (self.kept, *self.replaced))
            message = f"shards disagree ({seen}); {kept}, the latest attempt that ran"
            return RunProblem(ProblemKind.CONFLICT, self.cell_id, message)
        changed = [c for c in self.replaced if c.result.outcome is not self.kept.result.outcome]
        if not changed:
            return None
        message = f"{self.kept.describe()} replaced {'; '.join(c.describe() for c in changed)}"
        return RunProblem(ProblemKind.REPLACED, self.cell_id, message)

    def to_json(self) -> dict[str, Any]:
        """The choice as merge.json lists it."""
        return {
            "cell": self.cell_id,
            "kept": self.kept.to_json(),
            "replaced": [c.to_json() for c in self.replaced],
            "conflict": self.conflict,
        }


@dataclass(frozen=True)
class MergeResult:
    """What a merge did."""

    out: Path
    shards: tuple[Path, ...]
    cells: int
    choices: tuple[CellCopies, ...]  # cells with more than one copy
    problems: tuple[RunProblem, ...]  # conflicts, replacements and unreadable files

    @property
    def duplicates(self) -> int:
        """Copies left out because another copy of the same cell was kept."""
        return sum(len(c.replaced) for c in self.choices)

    @property
    def conflicts(self) -> tuple[CellCopies, ...]:
        """The cells whose copies that ran disagree."""
        return tuple(c for c in self.choices if c.conflict)

    def lines(self) -> list[str]:
        """A few lines for a terminal."""
        out = [
            f"merged {len(self.shards)} shards into {self.out}: {self.cells} cells, "
            f"{self.duplicates} duplicates dropped, {len(self.conflicts)} conflicts"
        ]
        return out + [f"problem: {p}" for p in self.problems]


def choose(copies: Sequence[Copy]) -> CellCopies:
    """Keep a copy that ran, then the latest to finish, then the first shard's."""

    def order(index: int) -> tuple[int, float, int]:
        result = copies[index].result
        moment = finish_time(result)
        latest = -moment.timestamp() if moment else math.inf
        return (_RANK.get(result.outcome, 0), latest, index)

    best = min(range(len(copies)), key=order)
    kept = copies[best]
    replaced = tuple(c for i, c in enumerate(copies) if i != best)
    ran = {c.result.outcome for c in copies if c.result.outcome not in _RANK}
    return CellCopies(kept.result.id, kept, replaced, len(ran) > 1)


def group_copies(shards: Sequence[tuple[Path, Sequence[CellResult]]]) -> dict[str, list[Copy]]:
    """Every cell id with its copies, in shard order."""
    copies: dict[str, list[Copy]] = {}
    for shard, results in shards:
        for result in results:
            copies.setdefault(result.id, []).append(Copy(shard, result))
    return copies


def check_folders(shards: Sequence[Path], out: Path) -> None:
    """Refuse shards that are not run folders and an output that would mix runs."""
    if not shards:
        raise UsageError("merge: give at least one results folder to merge")
    for shard in shards:
        if not (shard / "cells").is_dir():
            raise UsageError(f"merge: {shard} is not a results folder (it has no cells/ folder)")
        if shard.resolve() == out.resolve():
            raise UsageError(f"merge: --out {out} is also one of the shards")
        if out.resolve().is_relative_to(shard.resolve()):  # its cells would be read as the shard's
            raise UsageError(f"merge: --out {out} is inside the shard {shard}; choose a new folder")
    if out.exists() and not out.is_dir():
        raise UsageError(f"merge: --out {out} is a file, not a folder")
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"merge: --out {out} is not empty; choose a new one")


def merge(shards: Sequence[Path], out: Path) -> MergeResult:
    """Copy every cell of ``shards`` into ``out``; record what was chosen in ``merge.json``."""
    check_folders(shards, out)
    loaded = [(shard, read_run(shard)) for shard in shards]
    problems = [
        RunProblem(p.kind, f"{shard}/{p.where}", p.message)
        for shard, run in loaded
        for p in run.problems
        if p.kind is not ProblemKind.INCOMPLETE or p.where != PLAN_FILE  # judged again on `out`
    ]
    out.mkdir(parents=True, exist_ok=True)
    copies = [(shard, run.results) for shard, run in loaded]
    return _combine(copies, out, problems, [run.planned for _, run in loaded])


def gather(shards: Sequence[Path], run_dir: Path) -> MergeResult:
    """Merge ``shards`` into the run folder ``run_dir`` itself: the shards a run's tasks wrote
    (a Slurm run's), gathered again after each submission of the run.

    The folder's own results are one more copy of each cell, first (a tie keeps it), so
    gathering again changes nothing and a cell resumed elsewhere keeps its newer copy. The
    folder is judged on its own plan: a shard's unfinished cells are no problem of it.
    """
    present = [shard for shard in shards if (shard / CELLS_DIR).is_dir()]
    own, own_problems = read_results(run_dir)
    loaded = [(shard, read_run(shard)) for shard in present]
    problems = [
        RunProblem(p.kind, f"{shard}/{p.where}", p.message)
        for shard, run in loaded
        for p in run.problems
        if p.kind is not ProblemKind.INCOMPLETE
    ]
    copies = [(run_dir, tuple(own)), *((shard, run.results) for shard, run in loaded)]
    plans = [read_plan(run_dir)[0], *(run.planned for _, run in loaded)]
    return _combine(copies, run_dir, own_problems + problems, plans)


def _combine(
    copies_by_shard: Sequence[tuple[Path, Sequence[CellResult]]],
    out: Path,
    problems: list[RunProblem],
    plans: Sequence[frozenset[str] | None],
) -> MergeResult:
    """Keep one copy of each cell in ``out`` (copied unless it is ``out``'s own), merge the
    plans, and write ``merge.json``."""
    copies = group_copies(copies_by_shard)
    choices = []
    for cell_id in sorted(copies):
        choice = choose(copies[cell_id])
        if choice.kept.shard != out:
            for left_out in copy_cell(choice.kept.shard, out, cell_id):
                where = f"{choice.kept.shard}/cells/{cell_id}"
                problems.append(RunProblem(ProblemKind.CORRUPT, where, left_out))
            if (report := choice.kept.result.environment) is not None:
                for left_out in copy_environment(choice.kept.shard, out, report):
                    problems.append(
                        RunProblem(ProblemKind.CORRUPT, str(choice.kept.shard), left_out)
                    )
        if len(copies[cell_id]) > 1:
            choices.append(choice)
    problems += [p for c in choices if (p := c.problem()) is not None]
    merge_plans(plans, out)
    shards = tuple(shard for shard, _ in copies_by_shard if shard != out)
    write_merge_record(
        out,
        {
            "shards": [str(s) for s in shards],
            "replaced": [c.to_json() for c in choices],
            "problems": [p.to_json() for p in unique_problems(problems)],
        },
    )
    return MergeResult(out, shards, len(copies), tuple(choices), unique_problems(problems))


def merge_plans(plans: Sequence[frozenset[str] | None], out: Path) -> None:
    """The merged plan is the union of the shards' plans, so it names cells no shard ran."""
    known = [plan for plan in plans if plan is not None]
    if known:
        write_plan(out, set().union(*known))

"""Combine result shards from many runners into one run folder.

Each GPU runner of a fleet runs its share of the matrix and uploads its run
folder; ``merge`` copies every cell into one folder, so the reports of the
merged folder are those of a single run of all the shards' cells. When
several shards hold the same cell, one copy is kept: the one that decided
most (a real outcome over an infrastructure error over a skip, then the first
shard given), and if their outcomes differ the conflict is recorded in
``merge.json`` so that every report names it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix.errors import UsageError
from repromatrix.model import Outcome
from repromatrix.reports.write import (
    MERGE_FILE,
    load_run,
    merge_problems,
    read_plan,
    unfinished_cells,
    write_plan,
)
from repromatrix.results.store import (
    RESULT_FILE,
    SCHEMA_VERSION,
    CellResult,
    atomic_write,
    cell_dir,
)
from repromatrix.results.verdicts import ProblemKind, RunProblem, unique_problems

# How much a copy of a cell says: a cell that ran beats one the infrastructure stopped.
_RANK = {Outcome.SKIPPED: 2, Outcome.INFRA_ERROR: 1}


@dataclass(frozen=True)
class Copy:
    """One shard's copy of a cell."""

    shard: Path
    result: CellResult


@dataclass(frozen=True)
class Conflict:
    """Shards that disagree about one cell, and the copy that was kept."""

    cell_id: str
    kept: Copy
    others: tuple[Copy, ...]

    def problem(self) -> RunProblem:
        """The conflict as a problem every report names."""
        seen = ", ".join(
            f"{c.result.outcome.value} in {c.shard}" for c in (self.kept, *self.others)
        )
        kept = f"{self.kept.result.outcome.value} from {self.kept.shard}"
        return RunProblem(
            ProblemKind.CONFLICT, self.cell_id, f"shards disagree ({seen}); kept {kept}"
        )


@dataclass(frozen=True)
class MergeResult:
    """What a merge did."""

    out: Path
    shards: tuple[Path, ...]
    cells: int
    duplicates: int
    conflicts: tuple[Conflict, ...]
    problems: tuple[RunProblem, ...]  # conflicts and unreadable files of every shard

    def lines(self) -> list[str]:
        """A few lines for a terminal."""
        out = [
            f"merged {len(self.shards)} shards into {self.out}: {self.cells} cells, "
            f"{self.duplicates} duplicates dropped, {len(self.conflicts)} conflicts"
        ]
        return out + [f"problem: {p}" for p in self.problems]


def choose(copies: Sequence[Copy]) -> tuple[Copy, Conflict | None]:
    """Pick the copy to keep; a conflict when the copies' outcomes differ."""
    kept = min(copies, key=lambda c: _RANK.get(c.result.outcome, 0))  # stable: first shard wins
    others = tuple(c for c in copies if c is not kept)
    if all(c.result.outcome is kept.result.outcome for c in others):
        return kept, None
    return kept, Conflict(kept.result.id, kept, others)


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
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"merge: --out {out} is not empty; choose a new folder")


def merge(shards: Sequence[Path], out: Path) -> MergeResult:
    """Copy every cell of ``shards`` into ``out`` and record conflicts in ``out/merge.json``."""
    check_folders(shards, out)
    loaded = [(shard, load_run(shard)) for shard in shards]
    problems = [
        RunProblem(p.kind, f"{shard}/{p.where}", p.message)
        for shard, run in loaded
        for p in (*run.problems, *unfinished_cells(shard), *merge_problems(shard))
    ]
    copies = group_copies([(shard, run.results) for shard, run in loaded])
    conflicts = []
    out.mkdir(parents=True, exist_ok=True)
    for cell_id in sorted(copies):
        kept, conflict = choose(copies[cell_id])
        copy_cell(kept.shard, out, cell_id)
        if conflict is not None:
            conflicts.append(conflict)
    problems += [c.problem() for c in conflicts]
    merge_plans(shards, out)
    record(out, shards, problems)
    total = sum(len(c) for c in copies.values())
    return MergeResult(
        out,
        tuple(shards),
        len(copies),
        total - len(copies),
        tuple(conflicts),
        unique_problems(problems),
    )


def copy_cell(shard: Path, out: Path, cell_id: str) -> None:
    """Copy one cell folder; its result.json last, so a cut-off merge leaves no false result."""
    source, target = cell_dir(shard, cell_id), cell_dir(out, cell_id)
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir(), key=lambda p: p.name == RESULT_FILE):
        if entry.is_file() and not entry.name.startswith("."):
            _copy_atomic(entry, target / entry.name)


def _copy_atomic(source: Path, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def merge_plans(shards: Sequence[Path], out: Path) -> None:
    """The merged plan is the union of the shards' plans (when every shard has one)."""
    plans = [read_plan(shard)[0] for shard in shards]
    if plans and all(plan is not None for plan in plans):
        write_plan(out, set().union(*(p for p in plans if p is not None)))


def record(out: Path, shards: Sequence[Path], problems: Sequence[RunProblem]) -> None:
    """Write merge.json: the shards merged and every problem found."""
    body = {
        "schema_version": SCHEMA_VERSION,
        "shards": [str(s) for s in shards],
        "problems": [p.to_json() for p in unique_problems(problems)],
    }
    atomic_write(out / MERGE_FILE, json.dumps(body, indent=1).encode() + b"\n")

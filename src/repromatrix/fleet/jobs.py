"""The plan split into CI jobs, each sized to fit the runner's time limit.

Cells are grouped by runner label and, within a runner, by image and GPU
(``lane/image/gpu``): a job pulls or builds its image once, so a group stays
one job while it fits. A group too long for one job is cut into consecutive
chunks (in id order, so a model's cells stay together), each paying for the
image again. Each job says which cells it runs as ``--only`` globs: a group
the selection kept whole is one glob (``gpu/v0.31.0/h100/*``), anything else
its ids in one brace glob, so every planned cell lands in exactly one job.

A cell is estimated at its measured duration from earlier results when one
is given, else at its deadline (the longest it may take). A job's estimate is
one image set-up per image plus its cells; it must stay within the budget,
the job limit less a margin for checkout, installation, slow pulls and
reports. Above the CI system's limit on jobs per matrix, jobs of one runner
are packed together (first fit, longest first), never jobs of two runners.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.matrix.memory import infeasible_reason
from repromatrix.results.store import read_results
from repromatrix.values import Cell

DEFAULT_JOB_MINUTES = 360  # the workflow's `timeout-minutes` (GitHub's own maximum, 6 hours)
MAX_JOBS = 256  # GitHub Actions' limit on jobs per matrix
MARGIN = 0.2  # share of each job kept free: checkout, install, reports, a slow pull
IMAGE_SETUP_S = 600.0  # pulling a vLLM image (~10 GB) or building a CPU one, once per job


@dataclass(frozen=True)
class JobBudget:
    """How long one job may take: the runner's limit less the margin, and what an image costs."""

    job_minutes: float = DEFAULT_JOB_MINUTES
    margin: float = MARGIN
    image_setup_s: float = IMAGE_SETUP_S

    @property
    def seconds(self) -> float:
        """The time cells and image set-ups of one job may fill."""
        return self.job_minutes * 60 * (1 - self.margin)


@dataclass(frozen=True)
class FleetJob:
    """One CI job: a runner label, the globs of the cells it runs, and how long it should take."""

    runner: str
    lane: str
    name: str
    only: tuple[str, ...]
    cells: int
    estimate_s: float
    images: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        """Return the matrix entry (``args`` is ready for ``repromatrix run``)."""
        return {
            "runner": self.runner,
            "lane": self.lane,
            "name": self.name,
            "cells": self.cells,
            "estimate_minutes": math.ceil(self.estimate_s / 60),
            "only": list(self.only),
            "args": run_arguments(self.only),
        }


def run_arguments(only: Iterable[str]) -> str:
    """Return ``--only 'glob' ...``, quoted for a POSIX shell."""
    return " ".join(f"--only {shlex.quote(glob)}" for glob in only)


Estimate = Callable[[Cell], float]


def load_durations(folders: Iterable[Path]) -> dict[str, float]:
    """Return each cell's longest measured duration in earlier results (run folders or parents)."""
    measured: dict[str, float] = {}
    for folder in folders:
        runs = [folder] if (folder / "cells").is_dir() else sorted(folder.glob("*/"))
        if not any((run / "cells").is_dir() for run in runs):
            raise UsageError(f"{folder}: no results here (a run folder holds cells/)")
        for run in runs:
            results, _unreadable = read_results(run)
            for result in results:
                seconds = result.timings.total_s
                if seconds > 0:
                    measured[result.id] = max(seconds, measured.get(result.id, 0.0))
    return measured


def estimator(durations: Mapping[str, float]) -> Estimate:
    """Return the estimate of a cell: measured where known, else its deadline."""
    return lambda cell: durations.get(cell.id, cell.deadline_s)


def plan_jobs(
    cells: Sequence[Cell],
    everything: Collection[str],
    budget: JobBudget = JobBudget(),
    estimate: Estimate | None = None,
    max_jobs: int = MAX_JOBS,
) -> list[FleetJob]:
    """Return jobs covering exactly ``cells`` that can decide, each within ``budget``, at most
    ``max_jobs``: cells whose memory is infeasible (``memory.infeasible_reason``) get no job.

    ``everything`` is the ids of the unselected plan, to tell whole groups from partial ones.
    """
    estimate = estimate or estimator({})
    groups: dict[tuple[str, str, str], list[Cell]] = {}
    for cell in (cell for cell in cells if infeasible_reason(cell) is None):
        key = (cell.gpu.runner_label, cell.lane.value, group_prefix(cell.id))
        groups.setdefault(key, []).append(cell)
    whole = _group_sizes(everything)
    jobs: list[FleetJob] = []
    for key, members in groups.items():
        jobs.extend(_group_jobs(key, members, whole[key[2]], budget, estimate))
    return _fit(jobs, max_jobs, budget)


def _group_sizes(everything: Collection[str]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for cell_id in everything:
        prefix = group_prefix(cell_id)
        sizes[prefix] = sizes.get(prefix, 0) + 1
    return sizes


def group_prefix(cell_id: str) -> str:
    """``lane/image/gpu``: the cells one job runs while they fit its budget."""
    return "/".join(cell_id.split("/")[:3])


def _group_jobs(
    key: tuple[str, str, str],
    members: Sequence[Cell],
    whole: int,
    budget: JobBudget,
    estimate: Estimate,
) -> list[FleetJob]:
    """One job for a group that fits, else consecutive chunks that each fit."""
    runner, lane, prefix = key
    ordered = sorted(members, key=lambda cell: cell.id)
    chunks = _chunks(ordered, budget.seconds - budget.image_setup_s, estimate, budget)
    label = f"{runner} {prefix.split('/', 1)[1].replace('/', ' ')}"
    jobs = []
    for number, chunk in enumerate(chunks, start=1):
        ids = [cell.id for cell in chunk]
        glob = f"{prefix}/*" if len(ids) == whole else brace_glob(ids)
        name = label if len(chunks) == 1 else f"{label} ({number}/{len(chunks)})"
        seconds = budget.image_setup_s + sum(estimate(cell) for cell in chunk)
        images = frozenset(cell.image.key for cell in chunk)
        jobs.append(FleetJob(runner, lane, name, (glob,), len(ids), seconds, images))
    return jobs


def _chunks(
    cells: Sequence[Cell], room: float, estimate: Estimate, budget: JobBudget
) -> list[list[Cell]]:
    chunks: list[list[Cell]] = [[]]
    used = 0.0
    for cell in cells:
        seconds = estimate(cell)
        if seconds > room:
            raise UsageError(
                f"cell {cell.id} may take {seconds:.0f} s, more than a "
                f"{budget.job_minutes:g}-minute job holds after its margin and image set-up "
                f"({room:.0f} s): raise --job-minutes or lower the cell's deadline_s"
            )
        if chunks[-1] and used + seconds > room:
            chunks.append([])
            used = 0.0
        chunks[-1].append(cell)
        used += seconds
    return chunks


def brace_glob(ids: Sequence[str]) -> str:
    """Return one glob matching exactly ``ids``: their common folder prefix and a brace list."""
    if len(ids) == 1:
        return ids[0]
    first, last = min(ids), max(ids)
    common = 0
    while common < min(len(first), len(last)) and first[common] == last[common]:
        common += 1
    cut = first.rfind("/", 0, common) + 1
    return first[:cut] + "{" + ",".join(i[cut:] for i in ids) + "}"


def _fit(jobs: Sequence[FleetJob], max_jobs: int, budget: JobBudget) -> list[FleetJob]:
    """Pack jobs of the same runner together until at most ``max_jobs`` remain."""
    if len(jobs) <= max_jobs:
        return list(jobs)
    by_runner: dict[str, list[FleetJob]] = {}
    for job in jobs:
        by_runner.setdefault(job.runner, []).append(job)
    packed = [merged for group in by_runner.values() for merged in _pack(group, budget)]
    if len(packed) > max_jobs:
        raise UsageError(
            f"the plan needs {len(packed)} jobs of at most {budget.job_minutes:g} minutes on "
            f"{len(by_runner)} runner labels, above the {max_jobs}-job limit: raise "
            "--job-minutes or narrow the selection"
        )
    return packed


def _pack(group: Sequence[FleetJob], budget: JobBudget) -> list[FleetJob]:
    """First fit, longest first: each bin one job of one runner within the budget."""
    bins: list[list[FleetJob]] = []
    for job in sorted(group, key=lambda job: -job.estimate_s):
        for chosen in bins:
            if _seconds([*chosen, job], budget) <= budget.seconds:
                chosen.append(job)
                break
        else:
            bins.append([job])
    return [_join(chosen, budget) for chosen in bins]


def _seconds(jobs: Sequence[FleetJob], budget: JobBudget) -> float:
    """Cells' time plus one set-up per distinct image (two chunks of one image share it)."""
    setups = sum(len(job.images) for job in jobs) * budget.image_setup_s
    images = len(frozenset().union(*(job.images for job in jobs)))
    return sum(job.estimate_s for job in jobs) - setups + images * budget.image_setup_s


def _join(chunk: Sequence[FleetJob], budget: JobBudget) -> FleetJob:
    if len(chunk) == 1:
        return chunk[0]
    first = chunk[0]
    name = f"{first.runner} ({len(chunk)} groups from {first.name.split(' ', 1)[1]})"
    only = tuple(glob for job in chunk for glob in job.only)
    images = frozenset().union(*(job.images for job in chunk))
    cells = sum(job.cells for job in chunk)
    return FleetJob(first.runner, first.lane, name, only, cells, _seconds(chunk, budget), images)


def github_matrix(
    cells: Sequence[Cell],
    everything: Collection[str],
    budget: JobBudget = JobBudget(),
    estimate: Estimate | None = None,
    max_jobs: int = MAX_JOBS,
) -> dict[str, list[dict[str, Any]]]:
    """Return ``{"include": [job, ...]}``: the GitHub Actions job matrix of the plan."""
    jobs = plan_jobs(cells, everything, budget, estimate, max_jobs)
    return {"include": [job.to_json() for job in jobs]}

"""What ``repromatrix plan`` prints: a table, JSON, or a GitHub Actions job matrix.

The GitHub form groups cells by runner label and, within a runner, by image
and GPU, one job per group; each job says which cells it runs as ``--only``
globs, so a workflow step is just ``repromatrix run ${{ matrix.args }}``.
A group the selection kept whole is one glob (``gpu/v0.31.0/h100/*``); a
partial group lists its ids, factored into one brace glob. Above the job
limit, groups of the same runner are merged, never groups of two runners.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.model import Cell, Lane

GITHUB_MAX_JOBS = 256  # GitHub Actions' limit on jobs per matrix
TABLE_COLUMNS = ("lane", "image", "gpu", "model", "flagset", "scenario", "variant", "level")
# How the table marks where an effective flag came from (``matrix.effective``).
SOURCE_MARKS = {"flagset": "f", "include": "i", "scenario": "s", "variant": "v"}
SOURCE_LEGEND = "flag sources: [f] flag set, [i] include, [s] scenario launch, [v] variant"


def cell_json(cell: Cell) -> dict[str, Any]:
    """Return one cell as the JSON object ``plan --json`` prints."""
    return {
        "id": cell.id,
        "lane": cell.lane.value,
        "level": cell.level.value,
        "image": cell.image.ref,
        "image_tag": cell.image.tag,
        "image_pull": cell.image.pull.value if cell.lane is Lane.GPU else None,
        "version": str(cell.image.version) if cell.image.version is not None else None,
        "gpu": cell.gpu.name,
        "runner": cell.gpu.runner_label,
        "model": cell.model.name,
        "model_source": cell.model.source,
        "model_path": cell.model.path,
        "adapter": _adapter_json(cell),
        "flagset": cell.flagset.name,
        "scenario": cell.scenario.id,
        "variant": cell.variant.name,
        "variant_kind": cell.variant.kind,
        "expected": cell.expected.value,
        "expected_scenario": cell.expected_scenario,
        "predicted": [scenario.id for scenario in cell.predicted],
        "flags": dict(cell.flags),
        "flag_sources": dict(cell.flag_sources),
        "same_as": list(cell.same_as),
        "env": dict(cell.env),
        "deadline_s": cell.deadline_s,
        "interrupt_after_s": cell.interrupt_after_s,
    }


def _adapter_json(cell: Cell) -> dict[str, str | None] | None:
    adapter = cell.adapter
    if adapter is None:
        return None
    return {"name": adapter.name, "source": adapter.source, "path": adapter.path}


def format_json(cells: Iterable[Cell]) -> str:
    """Return the cells as a JSON list."""
    return json.dumps([cell_json(cell) for cell in cells], indent=2) + "\n"


def _row(cell: Cell) -> tuple[str, ...]:
    parts = cell.id.removesuffix("@probe").split("/")
    expected = cell.expected.value
    if cell.scenario.baseline and cell.expected_scenario:
        expected += f":{cell.expected_scenario}"  # the crash the baseline's flags trigger
    return (*parts, cell.level.value, expected, flags_text(cell))


def flags_text(cell: Cell) -> str:
    """The effective flags, each marked with its source: ``max_lora_rank=256[f]``."""
    return " ".join(
        f"{name}={json.dumps(value)}[{SOURCE_MARKS.get(cell.flag_sources.get(name, ''), '?')}]"
        for name, value in cell.flags.items()
    )


def format_table(cells: Sequence[Cell]) -> str:
    """Return an aligned text table of the cells, the flag-source legend and a summary."""
    header = (*TABLE_COLUMNS, "expected", "flags")
    rows = [header, *(_row(cell) for cell in cells)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join([*lines, "", SOURCE_LEGEND, summary(cells)]) + "\n"


def summary(cells: Sequence[Cell]) -> str:
    """Return e.g. ``273 cells: 60 hit, 190 avoided, 23 unknown (gpu 249, cpu 24)``."""
    expected = Counter(cell.expected.value for cell in cells)
    lanes = Counter(cell.lane.value for cell in cells)
    counts = ", ".join(f"{expected[name]} {name}" for name in ("hit", "avoided", "unknown"))
    per_lane = ", ".join(f"{lane} {n}" for lane, n in sorted(lanes.items()))
    noun = "cell" if len(cells) == 1 else "cells"
    twins = sum(len(cell.same_as) for cell in cells)
    once = f"; {twins} identical cells planned once" if twins else ""
    return f"{len(cells)} {noun}: {counts} ({per_lane}){once}"


@dataclass(frozen=True)
class Job:
    """One GitHub Actions job: a runner label and the globs of the cells it runs."""

    runner: str
    lane: str
    name: str
    only: tuple[str, ...]
    cells: int

    def to_json(self) -> dict[str, Any]:
        """Return the matrix entry (``args`` is ready for ``repromatrix run``)."""
        args = " ".join(f"--only {shlex.quote(glob)}" for glob in self.only)
        return {
            "runner": self.runner,
            "lane": self.lane,
            "name": self.name,
            "cells": self.cells,
            "only": list(self.only),
            "args": args,
        }


def github_matrix(
    cells: Sequence[Cell], everything: Collection[str], max_jobs: int = GITHUB_MAX_JOBS
) -> dict[str, list[dict[str, Any]]]:
    """Return ``{"include": [job, ...]}`` covering exactly ``cells``, in at most ``max_jobs`` jobs.

    ``everything`` is the ids of the unselected plan, to tell whole groups from partial ones.
    """
    groups: dict[tuple[str, str, str], list[Cell]] = {}
    for cell in cells:
        key = (cell.gpu.runner_label, cell.lane.value, _group_prefix(cell.id))
        groups.setdefault(key, []).append(cell)
    sizes = Counter(_group_prefix(cell_id) for cell_id in everything)
    jobs = [_group_job(key, members, sizes[key[2]]) for key, members in groups.items()]
    return {"include": [job.to_json() for job in _fit(jobs, max_jobs)]}


def _group_prefix(cell_id: str) -> str:
    """``lane/image/gpu``: the cells one job runs unless the job limit merges groups."""
    return "/".join(cell_id.split("/")[:3])


def _group_job(key: tuple[str, str, str], members: Sequence[Cell], whole: int) -> Job:
    """One job for a group: one glob if the selection kept the group whole, else its ids."""
    runner, lane, prefix = key
    ids = sorted(cell.id for cell in members)
    glob = f"{prefix}/*" if len(ids) == whole else brace_glob(ids)
    name = f"{runner} {prefix.split('/', 1)[1].replace('/', ' ')}"
    return Job(runner, lane, name, (glob,), len(ids))


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


def _fit(jobs: Sequence[Job], max_jobs: int) -> list[Job]:
    """Merge jobs of the same runner until at most ``max_jobs`` remain."""
    by_runner: dict[str, list[Job]] = {}
    for job in jobs:
        by_runner.setdefault(job.runner, []).append(job)
    if len(by_runner) > max_jobs:
        raise UsageError(
            f"the plan needs {len(by_runner)} runner labels, above the {max_jobs}-job limit"
        )
    if len(jobs) <= max_jobs:
        return list(jobs)
    quotas = _quotas({runner: len(group) for runner, group in by_runner.items()}, max_jobs)
    merged: list[Job] = []
    for runner, group in by_runner.items():
        merged.extend(_merge(group, quotas[runner]))
    return merged


def _quotas(sizes: Mapping[str, int], total: int) -> dict[str, int]:
    """Share ``total`` jobs among runners in proportion to their groups (at least one each)."""
    quotas = dict.fromkeys(sizes, 1)
    spare = total - len(sizes)
    weight = sum(sizes.values())
    for runner, size in sorted(sizes.items(), key=lambda item: -item[1]):
        extra = min(size - 1, spare * size // weight)
        quotas[runner] += extra
    return quotas


def _merge(group: Sequence[Job], count: int) -> list[Job]:
    """Split one runner's jobs into ``count`` contiguous chunks, each one job."""
    count = max(1, min(count, len(group)))
    size, rest = divmod(len(group), count)
    chunks, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < rest else 0)
        chunks.append(group[start:end])
        start = end
    return [_join(chunk) for chunk in chunks]


def _join(chunk: Sequence[Job]) -> Job:
    if len(chunk) == 1:
        return chunk[0]
    first = chunk[0]
    name = f"{first.runner} ({len(chunk)} groups from {first.name.split(' ', 1)[1]})"
    only = tuple(glob for job in chunk for glob in job.only)
    return Job(first.runner, first.lane, name, only, sum(job.cells for job in chunk))


def format_github(
    cells: Sequence[Cell], everything: Collection[str], max_jobs: int = GITHUB_MAX_JOBS
) -> str:
    """Return the GitHub matrix as compact JSON (for ``$GITHUB_OUTPUT``)."""
    return json.dumps(github_matrix(cells, everything, max_jobs), separators=(",", ":")) + "\n"

"""What the reports say above the detailed table: title, upgrade view, move, ranges, skips, and
where the cells ran.

Pure once the documents are loaded: ``build_findings`` turns judged cells and
``ReportOptions`` into ``Findings``, which compat.md, compat.html,
compat.json and the published site share, so they never tell different
stories.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from repromatrix.judgement import Expected, Outcome, label
from repromatrix.reports.move import MoveSummary, build_move, move_json
from repromatrix.reports.ranges import Documented, RangeEvidence, load_documents, range_evidence
from repromatrix.reports.runners import RunnerSummary, runner_summaries, runners_json
from repromatrix.reports.table import tag_key
from repromatrix.reports.upgrade import UpgradeView, build_upgrade, upgrade_json
from repromatrix.results.store import plan_matrix
from repromatrix.results.verdicts import Judged, one_line
from repromatrix.values import STAGED_KINDS

MAX_RUNS_NAMED = 3
MIN_PREFIX = 3  # a shorter common prefix of run ids names nothing


@dataclass(frozen=True)
class ReportOptions:
    """What a report knows beyond the cell results."""

    documents: Mapping[str, Documented] = field(default_factory=lambda: MappingProxyType({}))
    baseline: str | None = None
    candidate: str | None = None
    matrix: str | None = None  # the matrix file the run expanded, when known


@dataclass(frozen=True)
class SkipGroup:
    """Cells of one lane that could not run on this host, for one reason."""

    lane: str
    reason: str
    count: int


@dataclass(frozen=True)
class PlannedLane:
    """What the plan expects of one lane's cells that did not run here: per image tag and
    scenario, how many cells expect each outcome (``{"hit": 3, "avoided": 2}``)."""

    lane: str
    tags: tuple[str, ...]
    scenarios: tuple[str, ...]
    expected: Mapping[tuple[str, str], Mapping[str, int]]

    def words(self, tag: str, scenario: str) -> str:
        """``3 hit, 2 avoided`` for a row and column; empty where no cell is planned."""
        counts = self.expected.get((tag, scenario), {})
        return ", ".join(f"{n} {label(Expected(expected))}" for expected, n in counts.items())


@dataclass(frozen=True)
class Findings:
    """Everything the reports say above the detailed table."""

    title: str
    runs: tuple[str, ...]
    upgrade: UpgradeView
    move: MoveSummary | None
    ranges: tuple[RangeEvidence, ...]
    skipped: tuple[SkipGroup, ...]
    runners: tuple[RunnerSummary, ...] = ()
    planned: tuple[PlannedLane, ...] = ()  # expectations of the cells that did not run here


def default_options(run_dir: Path) -> ReportOptions:
    """Options for a report nobody configured: ``./scenarios`` and plan.json's matrix name."""
    return ReportOptions(
        documents=MappingProxyType(load_documents(None)), matrix=plan_matrix(run_dir)
    )


def build_findings(judged: Sequence[Judged], folder: str, options: ReportOptions) -> Findings:
    """Derive the findings; ``folder`` names the run when no cell says its run id."""
    view = build_upgrade(judged, staged_scenarios(options.documents))
    move = None
    if options.baseline and options.candidate:
        move = build_move(judged, view, options.baseline, options.candidate)
    runs = tuple(sorted({j.result.run_id for j in judged if j.result.run_id}))
    return Findings(
        title(options.matrix, runs, folder),
        runs,
        view,
        move,
        range_evidence(judged, options.documents),
        skip_groups(judged),
        runner_summaries(judged),
        planned_lanes(judged),
    )


def staged_scenarios(documents: Mapping[str, Documented]) -> frozenset[str]:
    """The scenarios the matrix stages (a start-up interruption, a deliberate
    misconfiguration): never held against an image."""
    return frozenset(
        scenario for scenario, documented in documents.items() if documented.kind in STAGED_KINDS
    )


def title(matrix: str | None, runs: Sequence[str], folder: str) -> str:
    """``vLLM compatibility: matrix.yaml · run 20260101-000000``, also after a merge.

    The shards of one fleet run share a prefix (``gh-42-1-gpu-0``, ``gh-42-1-cpu-0``):
    such a merge is ``run gh-42-1 (2 shards)``; unrelated runs are named each.
    """
    name = run_name(runs, folder)
    if len(runs) <= 1:
        named = f"run {name}"
    elif name != folder:
        named = f"run {name} ({len(runs)} shards)"
    elif len(runs) <= MAX_RUNS_NAMED:
        named = "runs " + ", ".join(runs)
    else:
        named = f"{len(runs)} runs, {runs[0]} to {runs[-1]}"
    return "vLLM compatibility: " + (f"{matrix} · " if matrix else "") + named


def run_name(runs: Sequence[str], folder: str) -> str:
    """The name of a folder's cells: their run id, the shards' common prefix, or the folder."""
    if len(runs) == 1:
        return runs[0]
    prefix = ""
    for letters in zip(*runs, strict=False):
        if len(set(letters)) > 1:
            break
        prefix += letters[0]
    prefix = prefix.rstrip("-_.")
    return prefix if runs and len(prefix) >= MIN_PREFIX else folder


def skip_groups(judged: Sequence[Judged]) -> tuple[SkipGroup, ...]:
    """Skipped cells counted per lane and reason, largest group first."""
    counts = Counter(
        (j.result.lane, one_line(j.result.reason or "no reason recorded", 200))
        for j in judged
        if j.result.outcome is Outcome.SKIPPED
    )
    return tuple(
        SkipGroup(lane, reason, n)
        for (lane, reason), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )


def planned_lanes(judged: Sequence[Judged]) -> tuple[PlannedLane, ...]:
    """Per lane, what the plan expects of the cells that were skipped here (a GPU lane on a
    host without GPUs): the reports show it where no result can."""
    by_lane: dict[str, dict[tuple[str, str], Counter[str]]] = {}
    for item in judged:
        r = item.result
        if r.outcome is Outcome.SKIPPED:
            cells = by_lane.setdefault(r.lane, {})
            cells.setdefault((r.image_tag, r.scenario), Counter())[r.expected.value] += 1
    return tuple(
        PlannedLane(
            lane,
            tuple(sorted({tag for tag, _ in cells}, key=tag_key)),
            tuple(sorted({scenario for _, scenario in cells})),
            MappingProxyType({key: dict(sorted(n.items())) for key, n in cells.items()}),
        )
        for lane, cells in sorted(by_lane.items())
    )


def findings_json(findings: Findings) -> dict[str, Any]:
    """The keys compat.json adds for the findings."""
    return {
        "title": findings.title,
        "runs": list(findings.runs),
        "upgrade": upgrade_json(findings.upgrade),
        "move": move_json(findings.move) if findings.move else None,
        "ranges": [r.to_json() for r in findings.ranges],
        "skipped": [
            {"lane": g.lane, "reason": g.reason, "cells": g.count} for g in findings.skipped
        ],
        "runners": runners_json(findings.runners),
    }

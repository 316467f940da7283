"""The answer for one new tag: the upgrade view's own verdict, and what changes against the
baseline, as a versioned JSON payload and as Markdown.

Pure: the candidate's judged cells, the baseline's published cells and where the
evidence is published in, a ``TagAnswer`` out. Its words are the reports' own
(``judgement``): the upgrade view's ``Safety`` per configuration (safe, safe
with a flag change, not safe, unknown) with the crashes it hits and the
verified flag change that avoids each, and the move from the baseline, each
crash's safety before and after (``SafetyMove``).

A ``preliminary`` answer is sent as soon as the probe cells have decided, while
engine cells still run here or on the fleet; the ``final`` one once every cell
has a result (or the fleet's time is up), and only the final one is published.
The payload's shape is ``ANSWER_SCHEMA`` version ``ANSWER_SCHEMA_VERSION``
(docs/watch.md); a change that removes or renames a key or a value raises the version.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.judgement import DECISIVE, Safety, label, worst
from repromatrix.reports.markdown import escape
from repromatrix.reports.move import MoveSummary, build_move
from repromatrix.reports.table import Configuration
from repromatrix.reports.upgrade import ImageSafety, UpgradeView, build_upgrade
from repromatrix.results.verdicts import Judged
from repromatrix.watch.candidates import Candidate

ANSWER_SCHEMA = "repromatrix.watch.answer"
# 2: the safety words of ``judgement`` under their own key (``safety``: ``not_safe``,
# ``safe_with_flag_change`` where 1's ``answer`` said ``unsafe``, ``workaround``; its label
# ``safety_words`` for 1's ``answer_words``), and each change a safety move (``safety``: its
# ``baseline`` and ``candidate`` safety) where 1 had a ``change`` word; ``counts`` lists the
# moves.
ANSWER_SCHEMA_VERSION = 2


class Stage(enum.StrEnum):
    """How far the answer is."""

    PRELIMINARY = "preliminary"  # probe cells decided; engine cells still to come
    FINAL = "final"  # every cell has a result, or the fleet's time is up: published


@dataclass(frozen=True)
class Counts:
    """The candidate's cells: planned, with a result, decided (hit or avoided), still out."""

    planned: int
    ran: int
    decided: int
    pending: int  # handed to the fleet or still to run here, no result yet


@dataclass(frozen=True)
class SiteLinks:
    """Where the answer can be checked: the site's front page and each cell's page."""

    index: str | None = None
    pages: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def of(self, cell_id: str) -> str | None:
        """The page of one cell, where published."""
        return self.pages.get(cell_id)


@dataclass(frozen=True)
class TagAnswer:
    """What a team is told about one new tag."""

    candidate: Candidate
    stage: Stage
    safety: Safety
    configurations: tuple[tuple[Configuration, ImageSafety], ...]
    baseline: str | None
    move: MoveSummary | None
    no_move: str  # why there is no move ("" when there is one)
    counts: Counts
    run: str
    evidence: SiteLinks = field(default_factory=SiteLinks)
    version: str | None = None  # the vLLM version the image reported

    @property
    def worse(self) -> bool:
        """Whether the tag hits something the baseline avoided (the upgrade gate's rule)."""
        return self.move is not None and self.move.worse

    @property
    def headline(self) -> str:
        """``vLLM v0.32.0 (gpu lane, sha256:0123456789ab): safe with a flag change``."""
        candidate = self.candidate
        short = f", sha256:{candidate.key.rpartition('-')[2]}" if candidate.digest else ""
        stage = " (preliminary: probe cells)" if self.stage is Stage.PRELIMINARY else ""
        where = f"{candidate.lane.value} lane{short}"
        return f"vLLM {candidate.tag} ({where}): {label(self.safety)}{stage}"


def build_answer(
    candidate: Candidate,
    judged: Sequence[Judged],
    baseline: tuple[str, Sequence[Judged]] | None,
    *,
    stage: Stage,
    counts: Counts,
    run: str,
    evidence: SiteLinks | None = None,
    staged: Collection[str] = (),
) -> TagAnswer:
    """The answer from the candidate's judged cells and, unless it is the baseline itself,
    the baseline's tag and published cells (a moved baseline tag is its earlier digest).
    The ``staged`` scenarios (the matrix stages their crash) decide no safety."""
    view = build_upgrade(judged, staged)
    cells = _configurations(view, candidate)
    found = {one.safety for _, one in cells}
    safety = worst(found)
    move, no_move = None, "this is the baseline"
    if baseline is not None:
        move, no_move = _move(candidate, judged, view, *baseline)
    version = next((j.result.version for j in judged if j.result.version), None)
    return TagAnswer(
        candidate,
        stage,
        safety,
        cells,
        baseline[0] if baseline else None,
        move,
        no_move,
        counts,
        run,
        evidence or SiteLinks(),
        version,
    )


def _configurations(
    view: UpgradeView, candidate: Candidate
) -> tuple[tuple[Configuration, ImageSafety], ...]:
    """The candidate's image in each configuration it ran in."""
    for lane in view.lanes:
        if lane.lane == candidate.lane.value:
            return tuple(
                (configuration, found)
                for configuration in lane.configurations
                if (found := lane.at(candidate.tag, configuration)) is not None
            )
    return ()


def _move(
    candidate: Candidate,
    judged: Sequence[Judged],
    view: UpgradeView,
    baseline: str,
    published: Sequence[Judged],
) -> tuple[MoveSummary | None, str]:
    """The move from the baseline; a baseline with no cell in common says why there is none."""
    if not published:
        return None, f"the history holds no cell of {baseline}"
    label = baseline
    if baseline == candidate.tag:  # the baseline's own tag moved: compare with its last digest
        digest = published[0].result.image_digest or ""
        label = f"{baseline}@{digest.rpartition('@')[2].removeprefix('sha256:')[:12]}"
        published = [_relabelled(j, label) for j in published]
    try:
        return build_move([*published, *judged], view, label, candidate.tag), ""
    except UsageError as exc:
        return None, str(exc)


def _relabelled(item: Judged, tag: str) -> Judged:
    return dataclasses.replace(item, result=dataclasses.replace(item.result, image_tag=tag))


def counts_of(planned: int, judged: Sequence[Judged], pending: int) -> Counts:
    """The cell counts of an answer."""
    decided = sum(1 for j in judged if j.result.outcome in DECISIVE)
    return Counts(planned, len(judged), decided, pending)


def answer_json(answer: TagAnswer) -> dict[str, Any]:
    """The payload a webhook receives (``ANSWER_SCHEMA``, version ``ANSWER_SCHEMA_VERSION``)."""
    candidate = answer.candidate
    return {
        "schema": ANSWER_SCHEMA,
        "schema_version": ANSWER_SCHEMA_VERSION,
        "stage": answer.stage.value,
        "lane": candidate.lane.value,
        "tag": candidate.tag,
        "digest": candidate.digest,
        "image": candidate.image.ref,
        "version": answer.version,
        "safety": answer.safety.value,
        "safety_words": label(answer.safety),
        "headline": answer.headline,
        "worse": answer.worse,
        "baseline": answer.baseline,
        "configurations": [
            _configuration_json(c, found, answer) for c, found in answer.configurations
        ],
        "changes": _changes_json(answer),
        "cells": dataclasses.asdict(answer.counts),
        "run": answer.run,
        "evidence": answer.evidence.index,
    }


def _configuration_json(
    configuration: Configuration, found: ImageSafety, answer: TagAnswer
) -> dict[str, Any]:
    return {
        "gpu": configuration.gpu,
        "model": configuration.model,
        "flagset": configuration.flagset,
        "safety": found.safety.value,
        "words": found.words,
        "crashes": [
            {
                "scenario": crash.scenario,
                "cause": crash.cause,
                "level": crash.level,
                "cell": crash.cell,
                "evidence": answer.evidence.of(crash.cell),
                "flag_changes": [
                    {"variant": w.variant, "change": w.change, "cell": w.cell}
                    for w in crash.workarounds
                ],
            }
            for crash in found.crashes
        ],
        "other_failures": [
            {"cell": cell_id, "evidence": answer.evidence.of(cell_id)} for cell_id in found.failures
        ],
    }


def _changes_json(answer: TagAnswer) -> dict[str, Any] | None:
    move = answer.move
    if move is None:
        return {"baseline": answer.baseline, "compared": False, "why": answer.no_move}
    return {
        "baseline": move.baseline,
        "compared": True,
        "counts": [{**m.to_json(), "crashes": move.count(m)} for m in move.moves],
        "items": [
            {
                "safety": item.move.to_json(),
                "scenario": item.scenario,
                "gpu": item.configuration.gpu,
                "model": item.configuration.model,
                "flagset": item.configuration.flagset,
                "level": item.level,
                "detail": item.detail,
            }
            for item in move.items
        ],
    }


def answer_markdown(answer: TagAnswer) -> str:
    """The answer for a job summary, an annotation or an issue."""
    lines = [f"### {escape(answer.headline)}", ""]
    lines.append(_cells_line(answer))
    if answer.move is not None:
        move = answer.move
        counts = ", ".join(f"{move.count(m)} {m.label}" for m in move.moves if move.count(m))
        lines.append(f"Against {escape(move.baseline)}: {counts or 'no cell in common'}.")
        lines += [
            f"- {i.move.label}: {escape(i.scenario)} [{i.level}] "
            f"{escape(i.configuration.label)}: {escape(i.detail)}"
            for i in move.items
        ]
    elif answer.baseline is not None or answer.no_move:
        lines.append(f"No comparison: {escape(answer.no_move)}.")
    if answer.configurations:
        lines += ["", "| configuration | answer |", "|---|---|"]
        lines += [
            f"| {escape(c.label)} | {escape(found.words)} |" for c, found in answer.configurations
        ]
    if answer.evidence.index:
        lines += ["", f"SiteLinks: {answer.evidence.index}"]
    return "\n".join(lines) + "\n"


def _cells_line(answer: TagAnswer) -> str:
    c = answer.counts
    pending = f"; {c.pending} still to come" if c.pending else ""
    return f"{c.decided} of {c.planned} cells decided ({c.ran} ran{pending}); run {answer.run}."

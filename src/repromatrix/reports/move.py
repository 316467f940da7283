"""What changes if we move from one image tag to another: the upgrade view's short answer.

Pure: judged cells and two tags in, a ``MoveSummary`` out. It reuses
``reports.diff`` to pair the cells of the two tags and for its words (one
``judgement.SafetyMove`` per item), keeps the documented crashes (triggers) and
the healthy baselines, prefers the engine level where both levels ran, and
names for each crash still not safe whether the candidate has a verified
workaround on the same configuration (``not safe → safe with a flag change``).
A crash the matrix stages (``UpgradeView.staged``) hits every image it is given:
its trigger makes no move (the upgrade view lists it as staged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from repromatrix.judgement import MOVES_SHOWN, STILL_SAFE, Outcome, Safety, SafetyMove
from repromatrix.reports import diff
from repromatrix.reports.table import Configuration
from repromatrix.reports.upgrade import BASELINE, TRIGGER, UpgradeView
from repromatrix.results.verdicts import Judged, cause_line, shorten


@dataclass(frozen=True)
class MoveItem:
    """One crash (or baseline) in one configuration, and what the move does to it."""

    move: SafetyMove
    scenario: str
    configuration: Configuration
    level: str
    detail: str


@dataclass(frozen=True)
class MoveSummary:
    """The answer to "what changes if we move from ``baseline`` to ``candidate``?"."""

    baseline: str
    candidate: str
    items: tuple[MoveItem, ...]  # every move but ``safe → safe``
    still_avoided: int  # crashes avoided on both sides: ``safe → safe``

    def of(self, move: SafetyMove) -> tuple[MoveItem, ...]:
        """The items of one move (none for ``safe → safe``: those are only counted)."""
        return tuple(i for i in self.items if i.move == move)

    def count(self, move: SafetyMove) -> int:
        """How many crashes (or baselines) make one move, ``safe → safe`` included."""
        return self.still_avoided if move == STILL_SAFE else len(self.of(move))

    @property
    def listed(self) -> tuple[SafetyMove, ...]:
        """The moves listed one by one, in report order: ``MOVES_SHOWN`` and any other made."""
        found = {*MOVES_SHOWN, *(i.move for i in self.items)}
        return tuple(sorted(found, key=lambda m: m.rank))

    @property
    def moves(self) -> tuple[SafetyMove, ...]:
        """Every move counted: the listed ones and ``safe → safe``."""
        return (*self.listed, STILL_SAFE)

    @property
    def worse(self) -> bool:
        """Whether the candidate is not safe where the baseline was."""
        return any(i.move.worse for i in self.items)


def build_move(
    judged: Sequence[Judged], view: UpgradeView, baseline: str, candidate: str
) -> MoveSummary:
    """Pair the two tags' cells (a ``UsageError`` names unknown tags) and say what changes."""
    upgrade = diff.diff((j.result for j in judged), baseline, candidate)
    chosen: dict[tuple[Configuration, str, str], diff.Pair] = {}
    for pair in upgrade.pairs:
        k = pair.key
        if k.variant not in (TRIGGER, BASELINE) or _not_run(pair):
            continue
        if k.variant == TRIGGER and k.scenario in view.staged:
            continue
        where = (Configuration(k.lane, k.gpu, k.model, k.flagset), k.scenario, k.variant)
        if where not in chosen or k.level == "engine":
            chosen[where] = pair
    items = []
    still_avoided = 0
    for (configuration, scenario, _), pair in sorted(chosen.items()):
        if pair.move == STILL_SAFE:
            still_avoided += 1
            continue
        move, detail = pair.move, _detail(pair)
        if move == SafetyMove(Safety.NOT_SAFE, Safety.NOT_SAFE):
            fix = _workaround(view, candidate, configuration, scenario)
            if fix:
                move, detail = replace(move, after=Safety.SAFE_WITH_FLAG_CHANGE), fix
        items.append(MoveItem(move, scenario, configuration, pair.key.level, detail))
    items.sort(key=lambda i: (i.move.rank, i.scenario, i.configuration))
    return MoveSummary(baseline, candidate, tuple(items), still_avoided)


def _not_run(pair: diff.Pair) -> bool:
    """Whether neither side ran here (no such hardware): the skips are summarised elsewhere."""
    sides = [r for r in (pair.baseline, pair.candidate) if r is not None]
    return all(r.outcome is Outcome.SKIPPED for r in sides)


def _detail(pair: diff.Pair) -> str:
    before, after = pair.outcomes
    shown = pair.explained_by
    cause = shorten(cause_line(shown), 90) if shown else ""
    return f"{before} → {after}" + (f": {cause}" if cause else "")


def _workaround(
    view: UpgradeView, tag: str, configuration: Configuration, scenario: str
) -> str | None:
    for lane in view.lanes:
        found = lane.at(tag, configuration)
        if found is None:
            continue
        for crash in found.crashes:
            if crash.scenario == scenario and crash.workarounds:
                return "; ".join(f"{w.change} ({w.variant})" for w in crash.workarounds)
    return None


def move_json(summary: MoveSummary) -> dict[str, Any]:
    """The machine form, for ``compat.json``."""
    return {
        "baseline": summary.baseline,
        "candidate": summary.candidate,
        "worse": summary.worse,
        "counts": [{**m.to_json(), "crashes": summary.count(m)} for m in summary.moves],
        "items": [
            {
                "safety": i.move.to_json(),
                "scenario": i.scenario,
                "lane": i.configuration.lane,
                "gpu": i.configuration.gpu,
                "model": i.configuration.model,
                "flagset": i.configuration.flagset,
                "level": i.level,
                "detail": i.detail,
            }
            for i in summary.items
        ],
    }

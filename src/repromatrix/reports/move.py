"""What changes if we move from one image tag to another: the upgrade view's short answer.

Pure: judged cells and two tags in, a ``MoveSummary`` out. It reuses
``reports.diff`` to pair the cells of the two tags and for its words (one
``diff.Change`` per item), keeps the documented crashes (triggers) and the
healthy baselines, prefers the engine level where both levels ran, and names
for each crash still hit whether the candidate has a verified workaround on
the same configuration (``still_hit_with_workaround``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from repromatrix.reports import diff
from repromatrix.reports.diff import Change
from repromatrix.reports.table import Configuration
from repromatrix.reports.upgrade import BASELINE, TRIGGER, UpgradeView
from repromatrix.results.verdicts import Judged, cause_line, shorten
from repromatrix.values import Outcome

# The changes a move lists one by one; the crashes still avoided are only counted.
LISTED: tuple[Change, ...] = tuple(c for c in Change if c is not Change.STILL_AVOIDED)


@dataclass(frozen=True)
class MoveItem:
    """One crash (or baseline) in one configuration, and what the move does to it."""

    change: Change
    scenario: str
    configuration: Configuration
    level: str
    detail: str


@dataclass(frozen=True)
class MoveSummary:
    """The answer to "what changes if we move from ``baseline`` to ``candidate``?"."""

    baseline: str
    candidate: str
    items: tuple[MoveItem, ...]  # one of ``LISTED`` each
    still_avoided: int  # crashes avoided on both sides

    def of(self, change: Change) -> tuple[MoveItem, ...]:
        """The items of one kind (none for ``still_avoided``: those are only counted)."""
        return tuple(i for i in self.items if i.change is change)

    def count(self, change: Change) -> int:
        """How many crashes (or baselines) one kind of change has, ``still_avoided`` included."""
        return self.still_avoided if change is Change.STILL_AVOIDED else len(self.of(change))

    @property
    def worse(self) -> bool:
        """Whether the candidate hits anything the baseline avoided."""
        return bool(self.of(Change.NEWLY_HIT))


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
        where = (Configuration(k.lane, k.gpu, k.model, k.flagset), k.scenario, k.variant)
        if where not in chosen or k.level == "engine":
            chosen[where] = pair
    items = []
    still_avoided = 0
    for (configuration, scenario, _), pair in sorted(chosen.items()):
        if pair.change is Change.STILL_AVOIDED:
            still_avoided += 1
            continue
        change, detail = pair.change, _detail(pair)
        if change is Change.STILL_HIT:
            fix = _workaround(view, candidate, configuration, scenario)
            if fix:
                change, detail = Change.STILL_HIT_WITH_WORKAROUND, fix
        items.append(MoveItem(change, scenario, configuration, pair.key.level, detail))
    items.sort(key=lambda i: (LISTED.index(i.change), i.scenario, i.configuration))
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
        cell = lane.cell(tag, configuration)
        if cell is None:
            continue
        for crash in cell.crashes:
            if crash.scenario == scenario and crash.workarounds:
                return "; ".join(f"{w.change} ({w.variant})" for w in crash.workarounds)
    return None


def move_json(summary: MoveSummary) -> dict[str, Any]:
    """The machine form, for ``compat.json``."""
    return {
        "baseline": summary.baseline,
        "candidate": summary.candidate,
        "worse": summary.worse,
        "counts": {c.value: summary.count(c) for c in Change},
        "items": [
            {
                "change": i.change.value,
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

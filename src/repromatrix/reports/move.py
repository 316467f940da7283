"""What changes if we move from one image tag to another: the upgrade view's short answer.

Pure: judged cells and two tags in, a ``MoveSummary`` out. It reuses
``reports.diff`` to pair the cells of the two tags, keeps the documented
crashes (triggers) and the healthy baselines, prefers the engine level where
both levels ran, and names for each crash still hit whether the candidate has
a verified workaround on the same configuration.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from repromatrix.model import Outcome
from repromatrix.reports import diff
from repromatrix.reports.upgrade import BASELINE, TRIGGER, Configuration, UpgradeView
from repromatrix.results.verdicts import Judged, cause_line, shorten


class Move(enum.StrEnum):
    """What moving does to one documented crash in one configuration."""

    NEWLY_HIT = "newly_hit"
    STILL_HIT = "still_hit"
    WORKAROUND = "still_hit_with_workaround"
    UNKNOWN = "unknown"
    FIXED = "fixed"


MOVE_TITLES: Mapping[Move, str] = {
    Move.NEWLY_HIT: "newly hit",
    Move.STILL_HIT: "still hit, no verified workaround",
    Move.WORKAROUND: "still hit, with a verified workaround",
    Move.UNKNOWN: "unknown",
    Move.FIXED: "fixed",
}
_CHANGES = {
    diff.Change.NEWLY_FAILING: Move.NEWLY_HIT,
    diff.Change.FIXED: Move.FIXED,
    diff.Change.STILL_HIT: Move.STILL_HIT,
    diff.Change.UNKNOWN: Move.UNKNOWN,
}


@dataclass(frozen=True)
class MoveItem:
    """One crash (or baseline) in one configuration, and what the move does to it."""

    move: Move
    scenario: str
    configuration: Configuration
    level: str
    detail: str


@dataclass(frozen=True)
class MoveSummary:
    """The answer to "what changes if we move from ``baseline`` to ``candidate``?"."""

    baseline: str
    candidate: str
    items: tuple[MoveItem, ...]
    unchanged: int  # crashes avoided on both sides

    def of(self, move: Move) -> tuple[MoveItem, ...]:
        """The items of one kind."""
        return tuple(i for i in self.items if i.move is move)

    @property
    def worse(self) -> bool:
        """Whether the candidate hits anything the baseline avoided."""
        return bool(self.of(Move.NEWLY_HIT))


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
    unchanged = 0
    for (configuration, scenario, _), pair in sorted(chosen.items()):
        if pair.change is diff.Change.STILL_AVOIDED:
            unchanged += 1
            continue
        move = _CHANGES[pair.change]
        detail = _detail(pair)
        if move is Move.STILL_HIT:
            fix = _workaround(view, candidate, configuration, scenario)
            if fix:
                move, detail = Move.WORKAROUND, fix
        items.append(MoveItem(move, scenario, configuration, pair.key.level, detail))
    order = list(Move)
    items.sort(key=lambda i: (order.index(i.move), i.scenario, i.configuration))
    return MoveSummary(baseline, candidate, tuple(items), unchanged)


def _not_run(pair: diff.Pair) -> bool:
    """Whether neither side ran here (no such hardware): the skips are summarised elsewhere."""
    sides = [r for r in (pair.baseline, pair.candidate) if r is not None]
    return all(r.outcome is Outcome.SKIPPED for r in sides)


def _detail(pair: diff.Pair) -> str:
    shown = pair.baseline if pair.change is diff.Change.FIXED else pair.candidate
    before = pair.baseline.outcome.value if pair.baseline else "no cell"
    after = pair.candidate.outcome.value if pair.candidate else "no cell"
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
        "counts": {m.value: len(summary.of(m)) for m in Move},
        "still_avoided": summary.unchanged,
        "items": [
            {
                "change": i.move.value,
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

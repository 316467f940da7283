"""The upgrade view: per image and configuration, is it safe, and what do we change if not?

Pure: judged cells in, an ``UpgradeView`` out. A configuration is what a user
runs (lane, GPU, model, flag set); an image is a row. Each image in each
configuration gets an ``ImageSafety``: its ``judgement.Safety``, rather than its
agreement with the documents:

- ``safe``: no documented crash was hit and the healthy baseline (where there
  is one) served;
- ``safe_with_flag_change``: documented crashes were hit, and for each one a
  variant with a flag change was observed ``avoided`` on the same image and
  configuration;
- ``not_safe``: a documented crash was hit with no verified workaround, or the
  healthy baseline failed;
- ``unknown``: nothing was decided (errors, timeouts, unreachable probes), or a
  documented crash was not tested: every one of its trigger cells served without
  its code path shown entered (``not_reached``), so neither ``safe`` nor
  ``safe with a flag change`` can be said; those cells are listed (``not_reached``).

A scenario the matrix stages (kind ``startup-interruption``, seed 004: the
matrix itself interrupts the start; kind ``misconfiguration``: its trigger is a
deliberate configuration error, such as a KV-cache budget too small for one
request) hits every image it is given, so its trigger cells never decide a
safety: they are listed as staged, and the rest decides (its variants are
ordinary starts).

Agreement with the documents stays a second dimension (``disagreements``).
Cells that were only skipped (no such hardware here) are left out: the
reports summarise them per lane and reason instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from repromatrix.judgement import BROKEN, DECISIVE, FAILING, Outcome, Safety, label
from repromatrix.reports.table import Configuration, tag_key
from repromatrix.results.verdicts import Judged, shorten
from repromatrix.values import Level

TRIGGER, BASELINE = "trigger", "baseline"
CAUSE_CHARS = 90


@dataclass(frozen=True)
class Workaround:
    """A variant observed ``avoided`` where the trigger hit: its exact flag change."""

    variant: str
    change: str
    cell: str


@dataclass(frozen=True)
class Crash:
    """A documented crash hit on one image and configuration."""

    scenario: str
    cause: str
    cell: str
    level: str
    workarounds: tuple[Workaround, ...]


@dataclass(frozen=True)
class ImageSafety:
    """One image in one configuration."""

    safety: Safety
    crashes: tuple[Crash, ...]
    failures: tuple[str, ...]  # cell ids of failures that are not a documented crash
    disagreements: int  # cells whose verdict disagrees with the documents
    cells: int
    # Crashes the matrix staged (``model.STAGED_KINDS``) and saw hit here: not held against it.
    staged: tuple[str, ...] = ()
    # Trigger (or baseline) cells of crashes no cell decided here, that did not reach the
    # crash's code path: those crashes were not tested on this image and configuration.
    not_reached: tuple[str, ...] = ()

    @property
    def words(self) -> str:
        """One line for people: the safety, then each crash and its fix."""
        parts = [label(self.safety)]
        for crash in self.crashes:
            fix = "; ".join(f"{w.change} ({w.variant})" for w in crash.workarounds)
            parts.append(f"hits {crash.scenario}" + (f", avoided with {fix}" if fix else ""))
        if self.failures:
            parts.append(f"{len(self.failures)} other failure(s)")
        if self.staged:
            parts.append(f"staged crash shown (not held against it): {', '.join(self.staged)}")
        if self.not_reached:
            parts.append(f"{len(self.not_reached)} crash check(s) not reached, so not tested")
        return "; ".join(parts)

    @property
    def docs(self) -> str:
        """Agreement with the documents, the second dimension."""
        if not self.disagreements:
            return "as documented"
        return f"{self.disagreements} cell(s) differ from the documents"


@dataclass(frozen=True)
class LaneView:
    """The upgrade view of one lane: image rows against configuration columns."""

    lane: str
    tags: tuple[str, ...]
    configurations: tuple[Configuration, ...]
    safeties: Mapping[tuple[str, Configuration], ImageSafety]
    versions: Mapping[str, str]

    def at(self, tag: str, configuration: Configuration) -> ImageSafety | None:
        """The image's safety at a row and column, or None where nothing ran."""
        return self.safeties.get((tag, configuration))

    def row_label(self, tag: str) -> str:
        """The tag, with the vLLM version inside when the tag does not say it."""
        version = self.versions.get(tag)
        return f"{tag} ({version})" if version and tag_key(tag)[0] == 1 else tag

    def row_safeties(self, tag: str) -> str:
        """The safeties in a row, space-separated (what the page's safety filter matches)."""
        found = {one.safety.value for (t, _), one in self.safeties.items() if t == tag}
        return " ".join(sorted(found))


@dataclass(frozen=True)
class UpgradeView:
    """Every lane's view."""

    lanes: tuple[LaneView, ...]
    staged: frozenset[str] = frozenset()  # the scenarios the matrix stages: they decide nothing


def build_upgrade(judged: Iterable[Judged], staged: Collection[str] = ()) -> UpgradeView:
    """Arrange judged cells by lane, image tag and configuration, and decide each one's safety.

    ``staged`` names the scenarios the matrix stages, which decide no safety.
    """
    grouped: dict[str, dict[tuple[str, Configuration], list[Judged]]] = defaultdict(
        lambda: defaultdict(list)
    )
    versions: dict[str, dict[str, str]] = defaultdict(dict)
    for item in judged:
        r = item.result
        if r.outcome is Outcome.SKIPPED:
            continue
        configuration = Configuration(r.lane, r.gpu, r.model, r.flagset)
        grouped[r.lane][r.image_tag, configuration].append(item)
        if r.version:
            versions[r.lane].setdefault(r.image_tag, r.version)
    staged_ids = frozenset(staged)
    return UpgradeView(
        tuple(_lane(lane, grouped[lane], versions[lane], staged_ids) for lane in sorted(grouped)),
        staged_ids,
    )


def _lane(
    lane: str,
    cells: Mapping[tuple[str, Configuration], list[Judged]],
    versions: dict[str, str],
    staged: frozenset[str],
) -> LaneView:
    return LaneView(
        lane,
        tuple(sorted({tag for tag, _ in cells}, key=tag_key)),
        tuple(sorted({c for _, c in cells})),
        MappingProxyType({key: image_safety(items, staged) for key, items in cells.items()}),
        MappingProxyType(versions),
    )


def image_safety(everything: Sequence[Judged], staged: Collection[str] = ()) -> ImageSafety:
    """Decide the safety of one image in one configuration from all its cells; the interrupted
    starts of the ``staged`` start-up interruptions (their triggers) are only listed."""
    interrupted = [
        j for j in everything if j.result.scenario in staged and j.result.variant == TRIGGER
    ]
    items = [j for j in everything if j not in interrupted]
    shown = sorted({j.result.scenario for j in interrupted if j.result.outcome is Outcome.HIT})
    by_scenario: dict[str, list[Judged]] = defaultdict(list)
    for item in items:
        by_scenario[item.result.scenario].append(item)
    crashes = tuple(
        crash for scenario in sorted(by_scenario) if (crash := _crash(by_scenario[scenario]))
    )
    failures = tuple(
        sorted(
            j.result.id
            for j in items
            if j.result.variant in (TRIGGER, BASELINE)
            and j.level is Level.ENGINE
            and j.result.outcome in BROKEN
            and not (j.result.variant == TRIGGER and j.result.outcome is Outcome.HIT)
        )
    )
    untested = tuple(
        sorted(cell for scenario in by_scenario for cell in _not_reached(by_scenario[scenario]))
    )
    decided = any(j.result.outcome in DECISIVE for j in items)
    if failures or any(not c.workarounds for c in crashes):
        safety = Safety.NOT_SAFE
    elif untested:
        safety = Safety.UNKNOWN
    elif crashes:
        safety = Safety.SAFE_WITH_FLAG_CHANGE
    else:
        safety = Safety.SAFE if decided else Safety.UNKNOWN
    disagreements = sum(1 for j in everything if j.verdict in FAILING)
    return ImageSafety(
        safety,
        crashes,
        failures,
        disagreements,
        len(everything),
        staged=tuple(shown),
        not_reached=untested,
    )


def _not_reached(items: Sequence[Judged]) -> tuple[str, ...]:
    """One scenario's trigger cells that did not reach its code path, when none decided it."""
    triggers = [j for j in items if j.result.variant in (TRIGGER, BASELINE)]
    if any(j.result.outcome in DECISIVE for j in triggers):
        return ()
    return tuple(j.result.id for j in triggers if j.result.outcome is Outcome.NOT_REACHED)


def _crash(items: Sequence[Judged]) -> Crash | None:
    triggers = sorted(
        (j for j in items if j.result.variant == TRIGGER and j.result.outcome is Outcome.HIT),
        key=lambda j: j.level is not Level.ENGINE,
    )
    if not triggers:
        return None
    hit = triggers[0]
    workarounds = {
        j.result.variant: Workaround(
            j.result.variant, flag_change(hit.result.flags, j.result.flags), j.result.id
        )
        for j in sorted(items, key=lambda j: j.level is not Level.ENGINE)
        if j.result.variant not in (TRIGGER, BASELINE) and j.result.outcome is Outcome.AVOIDED
    }
    return Crash(
        hit.result.scenario,
        shorten(hit.cause, CAUSE_CHARS),
        hit.result.id,
        hit.level.value,
        tuple(workarounds[name] for name in sorted(workarounds)),
    )


def flag_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """The exact flag change from ``before`` to ``after``, as server arguments."""
    parts = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        flag = "--" + name.replace("_", "-")
        if new is None or new is False:
            parts.append(f"without {flag}")
        elif new is True:
            parts.append(flag)
        else:
            was = f" (was {old})" if old is not None and old is not True else ""
            parts.append(f"{flag} {new}{was}")
    return ", ".join(parts) or "same flags"


def upgrade_json(view: UpgradeView) -> list[dict[str, Any]]:
    """The machine form: one entry per image and configuration."""
    return [
        {
            "lane": lane.lane,
            "image_tag": tag,
            "version": lane.versions.get(tag),
            "gpu": c.gpu,
            "model": c.model,
            "flagset": c.flagset,
            "safety": found.safety.value,
            "words": found.words,
            "documents": found.docs,
            "crashes": [
                {
                    "scenario": crash.scenario,
                    "cause": crash.cause,
                    "cell": crash.cell,
                    "level": crash.level,
                    "workarounds": [
                        {"variant": w.variant, "change": w.change, "cell": w.cell}
                        for w in crash.workarounds
                    ],
                }
                for crash in found.crashes
            ],
            "other_failures": list(found.failures),
            "staged_interruptions": list(found.staged),
            "not_reached": list(found.not_reached),
        }
        for lane in view.lanes
        for tag in lane.tags
        for c in lane.configurations
        if (found := lane.at(tag, c)) is not None
    ]

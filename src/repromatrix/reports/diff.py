"""The upgrade question: what changes for us if we move from one image tag to another?

Pure: saved results in, a ``UpgradeDiff`` out. Cells of the two tags are
paired when everything but the tag is the same (lane, GPU, model, flag set,
scenario, variant, level), and each pair says what the upgrade does, in the
words every upgrade answer uses (``diff``, and the move of ``reports.move``
in compat.md, compat.html and compat.json):

- ``newly_hit``: the baseline avoided it, the candidate hits it or fails;
- ``fixed``: a crash or failure on the baseline is avoided on the candidate;
- ``still_hit``: it fails on both (the failure may have changed kind);
- ``still_hit_with_workaround``: still hit, and the candidate has a verified
  workaround in the same configuration (only the move looks workarounds up);
- ``unknown``: one side did not decide (infrastructure error, skip,
  unreachable probe, an engine that did not reach the crash's code path) or has
  no such cell: never a fix, and counted by why (``undecided``);
- ``still_avoided``: fine on both.

The candidate is worse when any pair is newly hit: ``repromatrix diff``
then exits 1, so CI can gate an upgrade on it. The gate names what it could not
decide too: a candidate whose cells did not test the crash is not "fixed".
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from repromatrix.errors import UsageError, suggest
from repromatrix.results.store import CellResult
from repromatrix.results.verdicts import cause_line, one_line
from repromatrix.values import Outcome

DIFF_SCHEMA_VERSION = 3  # 3: ``undecided``, the unknown pairs counted by why
# The outcomes of an image that did not serve: the upgrade gate and the upgrade view agree.
BROKEN = frozenset({Outcome.HIT, Outcome.OTHER_FAILURE, Outcome.TIMEOUT})
NO_CELL = "no cell"


class Change(enum.StrEnum):
    """What moving from the baseline to the candidate does to one cell, in report order."""

    NEWLY_HIT = "newly_hit"
    FIXED = "fixed"
    STILL_HIT = "still_hit"
    STILL_HIT_WITH_WORKAROUND = "still_hit_with_workaround"
    UNKNOWN = "unknown"
    STILL_AVOIDED = "still_avoided"


CHANGE_TITLES: Mapping[Change, str] = MappingProxyType(
    {
        Change.NEWLY_HIT: "newly hit",
        Change.FIXED: "fixed",
        Change.STILL_HIT: "still hit",
        Change.STILL_HIT_WITH_WORKAROUND: "still hit, with a verified workaround",
        Change.UNKNOWN: "unknown",
        Change.STILL_AVOIDED: "still avoided",
    }
)
# What two outcomes decide on their own (``classify``), so what ``diff`` reports: a verified
# workaround is a fact of the upgrade view, which only the move consults.
OUTCOME_CHANGES: tuple[Change, ...] = tuple(
    c for c in Change if c is not Change.STILL_HIT_WITH_WORKAROUND
)


@dataclass(frozen=True, order=True)
class PairKey:
    """What a baseline cell and its candidate twin share: everything but the image tag."""

    lane: str
    gpu: str
    model: str
    flagset: str
    scenario: str
    variant: str
    level: str

    @classmethod
    def of(cls, r: CellResult) -> PairKey:
        """The key of one result."""
        return cls(r.lane, r.gpu, r.model, r.flagset, r.scenario, r.variant, r.level)

    @property
    def label(self) -> str:
        """``scenario/variant [level] lane/gpu/model/flagset``."""
        where = f"{self.lane}/{self.gpu}/{self.model}/{self.flagset}"
        return f"{self.scenario}/{self.variant} [{self.level}] {where}"


@dataclass(frozen=True)
class Pair:
    """One cell on both sides of the upgrade, and what the upgrade does to it."""

    key: PairKey
    baseline: CellResult | None
    candidate: CellResult | None
    change: Change

    @property
    def outcomes(self) -> tuple[str, str]:
        """The baseline's and the candidate's outcome in words, ``no cell`` for a missing side."""
        return _outcome(self.baseline), _outcome(self.candidate)

    @property
    def explained_by(self) -> CellResult | None:
        """The cell whose cause explains the change: the baseline for a fix, else the candidate."""
        return self.baseline if self.change is Change.FIXED else self.candidate


@dataclass(frozen=True)
class UpgradeDiff:
    """Every pair of an upgrade from ``baseline`` to ``candidate``."""

    baseline: str
    candidate: str
    pairs: tuple[Pair, ...]

    @property
    def worse(self) -> bool:
        """Whether anything that worked on the baseline fails on the candidate."""
        return any(p.change is Change.NEWLY_HIT for p in self.pairs)

    @property
    def evidence(self) -> bool:
        """Whether any pair was decided on both tags (hit or avoided): without one, the gate
        has no evidence either way (every cell skipped, failed to start or never ran)."""
        return any(p.change is not Change.UNKNOWN for p in self.pairs)

    def of(self, change: Change) -> tuple[Pair, ...]:
        """The pairs with one kind of change."""
        return tuple(p for p in self.pairs if p.change is change)

    @property
    def undecided(self) -> dict[str, int]:
        """The unknown pairs counted by why: the outcome (or ``no cell``) of the side that
        did not decide, the candidate's when neither did; most first."""
        found = Counter(_undecided_side(p) for p in self.of(Change.UNKNOWN))
        return dict(found.most_common())


def classify(baseline: CellResult | None, candidate: CellResult | None) -> Change:
    """What two outcomes alone say the upgrade does to one pair (one of ``OUTCOME_CHANGES``)."""
    before = baseline.outcome if baseline else None
    after = candidate.outcome if candidate else None
    decided = {Outcome.AVOIDED, *BROKEN}
    if before not in decided or after not in decided:
        return Change.UNKNOWN
    if before is Outcome.AVOIDED:
        return Change.STILL_AVOIDED if after is Outcome.AVOIDED else Change.NEWLY_HIT
    return Change.FIXED if after is Outcome.AVOIDED else Change.STILL_HIT


def diff(results: Iterable[CellResult], baseline: str, candidate: str) -> UpgradeDiff:
    """Pair the cells of two image tags and classify each pair; unknown tags are usage errors."""
    everything = tuple(results)
    tags = {r.image_tag for r in everything}
    for option, tag in (("--baseline", baseline), ("--candidate", candidate)):
        if tag not in tags:
            known = ", ".join(sorted(tags)) or "none"
            hint = suggest(tag, tags)
            raise UsageError(
                f"{option} {tag}: no results for this image tag (tags: {known}).{hint}"
            )
    before = _by_key(r for r in everything if r.image_tag == baseline)
    after = _by_key(r for r in everything if r.image_tag == candidate)
    if not before.keys() & after.keys():
        raise UsageError(
            f"{baseline} and {candidate} have no cell in common (same lane, GPU, model, flag "
            "set, scenario, variant and level): there is nothing to compare"
        )
    pairs = tuple(
        Pair(key, before.get(key), after.get(key), classify(before.get(key), after.get(key)))
        for key in sorted(before.keys() | after.keys())
    )
    return UpgradeDiff(baseline, candidate, pairs)


def _by_key(results: Iterable[CellResult]) -> dict[PairKey, CellResult]:
    keyed: dict[PairKey, CellResult] = {}
    for result in results:
        keyed.setdefault(PairKey.of(result), result)
    return keyed


def _outcome(result: CellResult | None) -> str:
    return result.outcome.value if result else NO_CELL


def _undecided_side(pair: Pair) -> str:
    decided = {Outcome.AVOIDED, *BROKEN}
    after = pair.candidate
    if after is None or after.outcome not in decided:
        return _outcome(after)
    return _outcome(pair.baseline)


def format_diff(upgrade: UpgradeDiff) -> str:
    """The answer for a person: the verdict first, then each kind of change with its cells."""
    verdict = "WORSE" if upgrade.worse else "not worse"
    head = f"upgrade {upgrade.baseline} -> {upgrade.candidate}: the candidate is {verdict}"
    if undecided := upgrade.undecided:
        why = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in undecided.items())
        head += f"; {sum(undecided.values())} pair(s) undecided ({why})"
    lines = [head]
    for change in OUTCOME_CHANGES:
        pairs = upgrade.of(change)
        lines += ["", f"{CHANGE_TITLES[change]} ({len(pairs)})"]
        if change is Change.STILL_AVOIDED:
            continue  # the count is enough; nobody needs the list of what keeps working
        lines += [f"  {_pair_line(p)}" for p in pairs]
    return "\n".join(lines) + "\n"


def _pair_line(pair: Pair) -> str:
    before, after = pair.outcomes
    line = f"{pair.key.label}: {before} -> {after}"
    shown = pair.explained_by
    cause = cause_line(shown) if shown else ""
    return line + (f" ({one_line(cause, 120)})" if cause else "")


def to_json(upgrade: UpgradeDiff) -> dict[str, Any]:
    """The machine form of the answer, for ``--json``."""
    return {
        "schema_version": DIFF_SCHEMA_VERSION,
        "baseline": upgrade.baseline,
        "candidate": upgrade.candidate,
        "worse": upgrade.worse,
        "counts": {c.value: len(upgrade.of(c)) for c in OUTCOME_CHANGES},
        "undecided": upgrade.undecided,
        "pairs": [_pair_json(p) for p in upgrade.pairs],
    }


def _pair_json(pair: Pair) -> dict[str, Any]:
    return {
        **{name: getattr(pair.key, name) for name in pair.key.__dataclass_fields__},
        "change": pair.change.value,
        "baseline": _side_json(pair.baseline),
        "candidate": _side_json(pair.candidate),
    }


def _side_json(result: CellResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    return {
        "id": result.id,
        "observed": result.outcome.value,
        "expected": result.expected.value,
        "version": result.version,
        "cause": cause_line(result),
    }

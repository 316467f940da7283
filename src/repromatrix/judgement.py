"""The words that judge one result, and the one table of their labels.

Three concepts judge a cell, and every report (compat.md, compat.html,
compat.json, JUnit), the diff and its gate, bisect, watch and the published
site use these words and no others:

- its ``Outcome``: what the cell showed when it ran (``hit``, ``avoided``, ...);
- its ``Expected``: what the scenario's documents predict for it;
- its ``Safety``: what that means for an upgrade, ``safe``, ``safe with a flag
  change``, ``not safe`` or ``unknown``. One cell's outcome alone says ``safe``
  (avoided), ``not safe`` (hit or another failure) or ``unknown``
  (``outcome_safety``); an image in one configuration is judged from all its
  cells (``reports.upgrade``), where a verified flag change makes a crash
  ``safe with a flag change``.

What an upgrade does to a cell is a ``SafetyMove``: its safety on the baseline
and on the candidate (``safe → not safe`` is what the upgrade gate refuses),
beside the two outcomes that moved.

The ``Verdict`` is not a fourth judgement but the comparison of the first two:
does the outcome agree with what the documents expected? ``pass`` when it
does; ``outside_range`` (hit where avoided was expected), ``regression`` (the
same, after an older version was seen fixed) and ``unexpected_fix`` (avoided
where hit was expected) when it does not; and, where nothing can be compared,
the reason why, named after the outcome that prevented it (``fail``,
``error``, ``skipped``, ``unreachable``) or ``unknown`` (no expectation, or the
code path not reached). ``results.verdicts`` computes it; its values are
written in ``result.json``, ``compat.json`` and the site's history, so they are
kept.

Only this module spells a label (``label``); the reports format the words,
never name them again.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeAlias


class Expected(enum.StrEnum):
    """What the scenario's documented version ranges predict for a cell."""

    HIT = "hit"
    AVOIDED = "avoided"
    UNKNOWN = "unknown"
    # The scenario's ``path`` says this configuration does not take the crash's code path on
    # this version: the cell can at best show it not reached, and decides nothing.
    NOT_REACHED = "not_reached"


class Outcome(enum.StrEnum):
    """What really happened when a cell ran."""

    HIT = "hit"
    AVOIDED = "avoided"
    OTHER_FAILURE = "other_failure"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"
    SKIPPED = "skipped"
    # A probe that could not reach the decisive code path on this vLLM version.
    UNREACHABLE = "unreachable"
    # An engine that served without the crash while none of the scenario's evidence that its
    # code path was entered showed: the cell did not test the crash.
    NOT_REACHED = "not_reached"


class Safety(enum.StrEnum):
    """What a result means for an upgrade, in order from worst to best but ``unknown``."""

    NOT_SAFE = "not_safe"
    SAFE_WITH_FLAG_CHANGE = "safe_with_flag_change"
    UNKNOWN = "unknown"
    SAFE = "safe"


# The safeties from worst to best: where several configurations answer for one image, the
# image's answer is the worst of them (one unknown configuration keeps it from "safe with a
# flag change": nobody knows that flag change is enough). The end-of-run lines and watch's
# answer both read it, so they never disagree on the same image.
WORST_FIRST = (Safety.NOT_SAFE, Safety.UNKNOWN, Safety.SAFE_WITH_FLAG_CHANGE, Safety.SAFE)


def worst(safeties: Iterable[Safety]) -> Safety:
    """The worst of ``safeties`` (``unknown`` where there are none)."""
    return min(safeties, key=WORST_FIRST.index, default=Safety.UNKNOWN)


class Verdict(enum.StrEnum):
    """Whether a cell's outcome agrees with what the documents expected (see the module)."""

    PASS = "pass"
    REGRESSION = "regression"  # hit again after a newer-than-hit older version avoided it
    OUTSIDE_RANGE = "outside_range"  # hit where the documents say unaffected: range too narrow
    UNEXPECTED_FIX = "unexpected_fix"
    FAIL = "fail"
    ERROR = "error"
    SKIPPED = "skipped"
    UNKNOWN = "unknown"  # ran, but nothing decided: no expectation, or the path not reached
    UNREACHABLE = "unreachable"  # a probe that could not reach the decisive code path


# Outcomes that decide a scenario one way or the other.
DECISIVE = frozenset({Outcome.HIT, Outcome.AVOIDED})
# The outcomes of an image that did not serve: not safe, for the upgrade gate and view alike.
BROKEN = frozenset({Outcome.HIT, Outcome.OTHER_FAILURE, Outcome.TIMEOUT})
# Most urgent first: the order of summaries, and who gets log excerpts when space is short.
SEVERITY: tuple[Verdict, ...] = (
    Verdict.REGRESSION,
    Verdict.FAIL,
    Verdict.OUTSIDE_RANGE,
    Verdict.UNEXPECTED_FIX,
    Verdict.ERROR,
    Verdict.UNKNOWN,
    Verdict.UNREACHABLE,
    Verdict.SKIPPED,
    Verdict.PASS,
)
# Verdicts that are a mismatch with the documents or a failure of the image.
FAILING = frozenset(
    {Verdict.REGRESSION, Verdict.OUTSIDE_RANGE, Verdict.UNEXPECTED_FIX, Verdict.FAIL}
)

Word: TypeAlias = Outcome | Expected | Safety | Verdict

# The one label table: how a person reads each word. Where a word is in several
# vocabularies (``hit``, ``unknown``) it reads the same in each.
LABELS: Mapping[tuple[type[Word], str], str] = MappingProxyType(
    {
        **{(Outcome, o.value): o.value.replace("_", " ") for o in Outcome},
        **{(Expected, e.value): e.value.replace("_", " ") for e in Expected},
        **{(Verdict, v.value): v.value.replace("_", " ") for v in Verdict},
        (Safety, Safety.SAFE.value): "safe",
        (Safety, Safety.SAFE_WITH_FLAG_CHANGE.value): "safe with a flag change",
        (Safety, Safety.NOT_SAFE.value): "not safe",
        (Safety, Safety.UNKNOWN.value): "unknown",
    }
)
NO_CELL = "no cell"  # the side of a comparison where no cell ran


def label(word: Word | None) -> str:
    """How a person reads ``word`` (``safe with a flag change``); ``no cell`` for None."""
    return NO_CELL if word is None else LABELS[type(word), word.value]


def as_expected(outcome: Outcome, expected: Expected) -> bool:
    """Whether a cell showed what the documents expected of it (the same word in both)."""
    return outcome.value == expected.value


def contradicts(outcome: Outcome, expected: Expected) -> bool:
    """Whether a decisive outcome is not what the documents expected, where they expected
    something (a hit where ``not_reached`` was planned contradicts them too)."""
    return (
        outcome in DECISIVE
        and expected is not Expected.UNKNOWN
        and not as_expected(outcome, expected)
    )


def outcome_safety(outcome: Outcome | None) -> Safety:
    """What one cell's outcome alone means for an upgrade: ``safe`` where it avoided the
    crash, ``not safe`` where the image did not serve, else (or with no cell) ``unknown``."""
    if outcome is Outcome.AVOIDED:
        return Safety.SAFE
    if outcome in BROKEN:
        return Safety.NOT_SAFE
    return Safety.UNKNOWN


@dataclass(frozen=True)
class SafetyMove:
    """What an upgrade does to one cell (or one crash): its safety before and after."""

    before: Safety
    after: Safety

    @property
    def label(self) -> str:
        """``safe → not safe``."""
        return f"{label(self.before)} → {label(self.after)}"

    @property
    def worse(self) -> bool:
        """Whether what was safe is not (the upgrade gate's refusal)."""
        return self.before is Safety.SAFE and self.after is Safety.NOT_SAFE

    @property
    def decided(self) -> bool:
        """Whether both sides are known."""
        return Safety.UNKNOWN not in (self.before, self.after)

    @property
    def rank(self) -> tuple[int, int, int]:
        """Report order: ``MOVES_SHOWN`` first, then the undecided, ``safe → safe`` last."""
        if self in MOVES_SHOWN:
            return (0, MOVES_SHOWN.index(self), 0)
        order = tuple(Safety)
        last = 2 if self == STILL_SAFE else 1
        return (last, order.index(self.before), order.index(self.after))

    def to_json(self) -> dict[str, str]:
        """``{"baseline": "safe", "candidate": "not_safe"}``."""
        return {"baseline": self.before.value, "candidate": self.after.value}


STILL_SAFE = SafetyMove(Safety.SAFE, Safety.SAFE)
# The moves every comparison lists, even with no cell: worse, fixed, still not safe, and
# still not safe but safe with a verified flag change (only where workarounds are looked up).
MOVES_SHOWN: tuple[SafetyMove, ...] = (
    SafetyMove(Safety.SAFE, Safety.NOT_SAFE),
    SafetyMove(Safety.NOT_SAFE, Safety.SAFE),
    SafetyMove(Safety.NOT_SAFE, Safety.NOT_SAFE),
    SafetyMove(Safety.NOT_SAFE, Safety.SAFE_WITH_FLAG_CHANGE),
)

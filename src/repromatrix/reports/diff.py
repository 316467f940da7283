"""The upgrade question: what changes for us if we move from one image tag to another?

Pure: saved results in, a ``UpgradeDiff`` out. Cells of the two tags are
paired when everything but the tag is the same (lane, GPU, model, flag set,
scenario, variant, level), and each pair says what the upgrade does in the
words of ``judgement``: the outcome on each side, and its ``SafetyMove``, the
safety each outcome alone means (``outcome_safety``) before and after:

- ``safe → not safe``: the baseline avoided it, the candidate hits it or fails;
- ``not safe → safe``: a crash or failure on the baseline is avoided on the
  candidate;
- ``not safe → not safe``: it fails on both (the failure may have changed kind);
- a move with an ``unknown`` side: that side did not decide (infrastructure
  error, skip, unreachable probe, an engine that did not reach the crash's code
  path) or has no such cell: never a fix, and counted by why (``undecided``);
- ``safe → safe``: fine on both.

The move of ``reports.move`` (in compat.md, compat.html and compat.json) uses
the same pairs, and turns ``not safe → not safe`` into ``not safe → safe with a
flag change`` where the candidate has a verified workaround.

The candidate is worse when any pair moves from safe to not safe:
``repromatrix diff`` then exits 1, so CI can gate an upgrade on it. The gate
names what it could not decide too: a candidate whose cells did not test the
crash is not "fixed".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from repromatrix.errors import UsageError, suggest
from repromatrix.judgement import (
    MOVES_SHOWN,
    NO_CELL,
    STILL_SAFE,
    Outcome,
    Safety,
    SafetyMove,
    label,
    outcome_safety,
)
from repromatrix.results.store import CellResult
from repromatrix.results.verdicts import cause_line, one_line

# 3: ``undecided``, the unknown pairs counted by why. 4: each pair's ``safety`` move (its
# safety on the baseline and on the candidate) replaces its ``change``, and ``counts`` lists
# the moves with their pairs.
DIFF_SCHEMA_VERSION = 4
# What the diff lists even with no pair: the moves two outcomes can make on their own (a
# verified flag change is a fact of the upgrade view, which only the move consults).
DIFF_MOVES: tuple[SafetyMove, ...] = (*MOVES_SHOWN[:3], STILL_SAFE)


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
    move: SafetyMove

    @property
    def outcomes(self) -> tuple[str, str]:
        """The baseline's and the candidate's outcome in words, ``no cell`` for a missing side."""
        return _outcome(self.baseline), _outcome(self.candidate)

    @property
    def explained_by(self) -> CellResult | None:
        """The cell whose cause explains the move: the baseline's where the candidate became
        safe, else the candidate's."""
        fixed = self.move.before is Safety.NOT_SAFE and self.move.after is Safety.SAFE
        return self.baseline if fixed else self.candidate


@dataclass(frozen=True)
class UpgradeDiff:
    """Every pair of an upgrade from ``baseline`` to ``candidate``."""

    baseline: str
    candidate: str
    pairs: tuple[Pair, ...]

    @property
    def worse(self) -> bool:
        """Whether anything that worked on the baseline fails on the candidate."""
        return any(p.move.worse for p in self.pairs)

    @property
    def evidence(self) -> bool:
        """Whether any pair was decided on both tags (hit or avoided): without one, the gate
        has no evidence either way (every cell skipped, failed to start or never ran)."""
        return any(p.move.decided for p in self.pairs)

    def of(self, move: SafetyMove) -> tuple[Pair, ...]:
        """The pairs that make one move."""
        return tuple(p for p in self.pairs if p.move == move)

    @property
    def moves(self) -> tuple[SafetyMove, ...]:
        """The moves to report, in report order: ``DIFF_MOVES`` and every other one made."""
        return tuple(sorted({*DIFF_MOVES, *(p.move for p in self.pairs)}, key=lambda m: m.rank))

    @property
    def undecided(self) -> dict[Outcome | None, int]:
        """The pairs with an unknown side counted by why: the outcome (None: no cell) of the
        side that did not decide, the candidate's when neither did; most first."""
        found = Counter(_undecided_side(p) for p in self.pairs if not p.move.decided)
        return dict(found.most_common())


def classify(baseline: CellResult | None, candidate: CellResult | None) -> SafetyMove:
    """What two outcomes alone say the upgrade does to one pair: the safety of each."""
    before = outcome_safety(baseline.outcome if baseline else None)
    return SafetyMove(before, outcome_safety(candidate.outcome if candidate else None))


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


def _undecided_side(pair: Pair) -> Outcome | None:
    side = pair.candidate if pair.move.after is Safety.UNKNOWN else pair.baseline
    return side.outcome if side else None


def format_diff(upgrade: UpgradeDiff) -> str:
    """The answer for a person: the verdict first, then each kind of change with its cells."""
    verdict = "WORSE" if upgrade.worse else "not worse"
    head = f"upgrade {upgrade.baseline} -> {upgrade.candidate}: the candidate is {verdict}"
    if undecided := upgrade.undecided:
        why = ", ".join(f"{n} {label(outcome)}" for outcome, n in undecided.items())
        head += f"; {sum(undecided.values())} pair(s) undecided ({why})"
    lines = [head]
    for move in upgrade.moves:
        pairs = upgrade.of(move)
        lines += ["", f"{move.label} ({len(pairs)})"]
        if move == STILL_SAFE:
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
        "counts": [{**m.to_json(), "pairs": len(upgrade.of(m))} for m in upgrade.moves],
        "undecided": {(o.value if o else NO_CELL): n for o, n in upgrade.undecided.items()},
        "pairs": [_pair_json(p) for p in upgrade.pairs],
    }


def _pair_json(pair: Pair) -> dict[str, Any]:
    return {
        **{name: getattr(pair.key, name) for name in pair.key.__dataclass_fields__},
        "safety": pair.move.to_json(),
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

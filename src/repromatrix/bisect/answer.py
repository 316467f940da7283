"""The answer of a bisect: transitions with their evidence, cost, and the suggested ranges.

The suggested ``affected`` range of a hit run is ``>=`` its first hit version
and ``<`` the first avoided version after it (the change lies somewhere after
the last hit: versions between were not released, not searched, or set
aside); ``fixed`` is ``>=`` the first avoided version after the last hit, when
the search ends avoided. Several hit runs give several ranges, joined by
`` || `` (a scenario file takes one specifier set: pick, or split the scenario).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet

from repromatrix.bisect.search import Search
from repromatrix.judgement import DECISIVE, Expected, Outcome, contradicts
from repromatrix.matrix.scenarios import ALL_VERSIONS
from repromatrix.upstream.versions import Refusal
from repromatrix.values import Scenario


@dataclass(frozen=True)
class Ranges:
    """An ``affected`` and a ``fixed`` specifier set as text (None: none)."""

    affected: str | None
    fixed: str | None


@dataclass(frozen=True)
class VersionEvidence:
    """The cell behind one version's outcome, and the run folder holding it."""

    cell_id: str
    outcome: Outcome
    run_dir: str
    reason: str = ""
    expected: Expected = Expected.UNKNOWN


@dataclass(frozen=True)
class Bisection:
    """Everything ``repromatrix bisect`` prints."""

    scenario: str
    variant: str
    search: Search
    evidence: Mapping[str, VersionEvidence]  # by version
    suggested: Ranges
    documented: Ranges
    refused: tuple[Refusal, ...] = ()

    @property
    def full_scan_cells(self) -> int:
        """The cells a scan of every searched version would have run."""
        return len(self.search.versions)

    @property
    def contradictions(self) -> tuple[str, ...]:
        """Decisive versions whose outcome the documented ranges do not predict."""
        return tuple(
            version
            for version, seen in self.evidence.items()
            if contradicts(seen.outcome, seen.expected)
        )


def suggest_ranges(versions: Sequence[str], outcomes: Mapping[str, Outcome]) -> Ranges:
    """The ``affected`` and ``fixed`` ranges the decisive outcomes support (see the module)."""
    decisive = [(v, outcomes[v]) for v in versions if outcomes.get(v) in DECISIVE]
    ranges: list[str] = []
    start: str | None = None
    for version, outcome in decisive:
        if outcome is Outcome.HIT and start is None:
            start = version
        elif outcome is Outcome.AVOIDED and start is not None:
            ranges.append(f">={start},<{version}")
            start = None
    if start is not None:
        ranges.append(f">={start}")
    fixed = None
    if ranges and start is None:
        fixed = ranges[-1].split(",<", 1)[1]
        fixed = f">={fixed}"
    return Ranges(" || ".join(ranges) or None, fixed)


def documented_ranges(scenario: Scenario) -> Ranges:
    """The scenario file's ``affected`` and ``fixed`` as written there."""
    return Ranges(_spec_text(scenario.affected), _spec_text(scenario.fixed))


def _spec_text(spec: SpecifierSet | None) -> str | None:
    if spec is None:
        return None
    if spec == ALL_VERSIONS:
        return "all"
    # Lower bounds first, as people write a range (str() of a set sorts alphabetically).
    return ",".join(sorted(map(str, spec), key=lambda item: (not item.startswith(">"), item)))


def to_json(answer: Bisection) -> dict[str, Any]:
    """The ``--json`` form: exactly the keys the command documents."""
    search = answer.search
    return {
        "scenario": answer.scenario,
        "variant": answer.variant,
        "versions": list(search.versions),
        "transitions": [
            {
                "last": t.last,
                "last_outcome": t.last_outcome.value,
                "first": t.first,
                "first_outcome": t.first_outcome.value,
            }
            for t in search.transitions
        ],
        "cells_run": len(search.ran),
        "full_scan_cells": answer.full_scan_cells,
        "skipped": [_skipped_json(answer, version) for version in search.skipped],
        "suggested": {"affected": answer.suggested.affected, "fixed": answer.suggested.fixed},
        "documented": {"affected": answer.documented.affected, "fixed": answer.documented.fixed},
    }


def _skipped_json(answer: Bisection, version: str) -> dict[str, str]:
    seen = answer.evidence.get(version)
    outcome = answer.search.outcomes[version].value
    return {"version": version, "outcome": outcome, "reason": seen.reason if seen else ""}


def format_answer(answer: Bisection) -> str:
    """The answer for a person: transitions with their cells, cost, ranges, what was set aside."""
    search = answer.search
    lines = [f"{answer.scenario} / {answer.variant}: {len(search.versions)} versions searched"]
    if not search.transitions:
        outcomes = {o.value for o in search.outcomes.values() if o in DECISIVE}
        lines.append(f"  no transition: {' and '.join(sorted(outcomes)) or 'nothing decisive'}")
    for t in search.transitions:
        lines.append(f"  {t.last} {t.last_outcome.value} -> {t.first} {t.first_outcome.value}")
        for version in (t.last, t.first):
            seen = answer.evidence.get(version)
            if seen is not None:
                lines.append(f"    {seen.cell_id}  ({seen.run_dir})")
        if t.between:
            lines.append(f"    set aside between them: {', '.join(t.between)}")
    lines.append(
        f"  cells run: {len(search.ran)} (a full scan: {answer.full_scan_cells}); "
        f"rounds: {search.rounds}; results reused: {len(search.outcomes) - len(search.ran)}"
    )
    lines += _ranges_lines(answer)
    for version in search.skipped:
        seen = answer.evidence.get(version)
        why = f": {seen.reason}" if seen and seen.reason else ""
        lines.append(f"  set aside: {version} {search.outcomes[version].value}{why}")
    for refusal in answer.refused:
        lines.append(f"  not searched: {refusal.version}: {refusal.reason}")
    return "\n".join(lines) + "\n"


def _ranges_lines(answer: Bisection) -> list[str]:
    suggested, documented = answer.suggested, answer.documented
    lines = [
        f"  {label:<11} affected {_or_none(ranges.affected)}  fixed {_or_none(ranges.fixed)}"
        for label, ranges in (("suggested:", suggested), ("documented:", documented))
    ]
    for version in answer.contradictions:
        seen = answer.evidence[version]
        lines.append(
            f"  contradicts the documents: {version} is {seen.outcome.value}, "
            f"documented {seen.expected.value}"
        )
    return lines


def _or_none(text: str | None) -> str:
    return text or "(none)"

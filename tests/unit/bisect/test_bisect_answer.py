"""The answer: suggested ranges from the outcomes, the documented ones, the --json shape."""

from __future__ import annotations

from repromatrix.bisect.answer import (
    Bisection,
    Ranges,
    VersionEvidence,
    format_answer,
    suggest_ranges,
    to_json,
)
from repromatrix.bisect.search import Search, find_transitions
from repromatrix.judgement import Expected, Outcome

HIT, AVOIDED, ASIDE = Outcome.HIT, Outcome.AVOIDED, Outcome.UNREACHABLE
VERSIONS = ("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0")


def outcomes(*seen: Outcome) -> dict[str, Outcome]:
    return dict(zip(VERSIONS, seen, strict=False))


def test_a_hit_range_then_a_fix() -> None:
    found = suggest_ranges(VERSIONS, outcomes(HIT, HIT, AVOIDED, AVOIDED, AVOIDED))
    assert found == Ranges(">=0.27.0,<0.28.0", ">=0.28.0")


def test_hit_to_the_end_has_no_fix() -> None:
    found = suggest_ranges(VERSIONS, outcomes(AVOIDED, ASIDE, HIT, HIT, HIT))
    assert found == Ranges(">=0.28.0", None)


def test_set_aside_and_unknown_versions_do_not_bound_a_range() -> None:
    seen = {"0.27.0": HIT, "0.28.0": ASIDE, "0.30.0": AVOIDED}
    assert suggest_ranges(VERSIONS, seen) == Ranges(">=0.27.0,<0.30.0", ">=0.30.0")


def test_two_hit_ranges_are_both_given() -> None:
    found = suggest_ranges(VERSIONS, outcomes(HIT, AVOIDED, HIT, AVOIDED, AVOIDED))
    assert found == Ranges(">=0.27.0,<0.27.1 || >=0.28.0,<0.29.0", ">=0.29.0")


def test_never_hit_suggests_nothing() -> None:
    assert suggest_ranges(VERSIONS, outcomes(AVOIDED, AVOIDED)) == Ranges(None, None)


def make_answer() -> Bisection:
    seen = outcomes(Outcome.INFRA_ERROR, HIT, AVOIDED, AVOIDED, AVOIDED)
    ran = ("0.27.0", "0.27.1", "0.30.0", "0.28.0")
    known = {v: o for v, o in seen.items() if v in ran}
    search = Search(VERSIONS, known, ran, 2, find_transitions(VERSIONS, known))
    expected = {"0.27.1": Expected.HIT, "0.28.0": Expected.HIT, "0.30.0": Expected.AVOIDED}
    evidence = {
        v: VersionEvidence(
            f"cpu/{v}/cpu/m/default/s/trigger@probe",
            o,
            "results/b",
            f"why {v}",
            expected.get(v, Expected.AVOIDED),
        )
        for v, o in known.items()
    }
    return Bisection(
        "s",
        "trigger",
        search,
        evidence,
        suggest_ranges(VERSIONS, known),
        Ranges(">=0.22.1,<=0.28.0", None),
    )


def test_json_has_exactly_the_documented_keys() -> None:
    data = to_json(make_answer())
    assert data == {
        "scenario": "s",
        "variant": "trigger",
        "versions": list(VERSIONS),
        "transitions": [
            {"last": "0.27.1", "last_outcome": "hit", "first": "0.28.0", "first_outcome": "avoided"}
        ],
        "cells_run": 4,
        "full_scan_cells": 5,
        "skipped": [{"version": "0.27.0", "outcome": "infra_error", "reason": "why 0.27.0"}],
        "suggested": {"affected": ">=0.27.1,<0.28.0", "fixed": ">=0.28.0"},
        "documented": {"affected": ">=0.22.1,<=0.28.0", "fixed": None},
    }


def test_text_names_the_evidence_cells_the_cost_and_the_contradiction() -> None:
    text = format_answer(make_answer())
    assert "0.27.1 hit -> 0.28.0 avoided" in text
    assert "cpu/0.28.0/cpu/m/default/s/trigger@probe  (results/b)" in text
    assert "cells run: 4 (a full scan: 5)" in text
    assert "contradicts the documents: 0.28.0 is avoided, documented hit" in text
    assert "set aside: 0.27.0 infra_error: why 0.27.0" in text

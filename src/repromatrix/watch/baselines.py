"""The baselines a round compares with: one per lane, in the history or offered now (then
graded first), and what the history says each showed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from repromatrix.errors import UsageError, suggest
from repromatrix.publish.history import History
from repromatrix.results.verdicts import Judged
from repromatrix.values import Lane
from repromatrix.watch.candidates import Candidate


def baselines_of(
    given: Sequence[str], found: Sequence[Candidate], history: History, site: Path
) -> dict[Lane, str]:
    """Each lane's baseline among ``given``: in the history, or offered now (then graded
    first); ``UsageError`` for one that is neither or for a lane given two."""
    if not given:
        raise UsageError("give the tag in use today: --baseline TAG (one per lane watched)")
    chosen: dict[Lane, str] = {}
    lanes = sorted({c.lane for c in found})
    for tag in given:
        where = [lane for lane in lanes if _has(history, found, lane, tag)]
        if not where:
            graded = sorted({t for lane in lanes for t in history.tags(lane.value)})
            listed = sorted({c.tag for c in found})
            raise UsageError(
                f"--baseline {tag}: not in the history of {site} (graded: "
                f"{', '.join(graded) or 'none'}) nor among the tags the matrix gives now "
                f"({', '.join(listed) or 'none'}).{suggest(tag, [*graded, *listed])}"
            )
        for lane in where:
            if lane in chosen:
                raise UsageError(f"--baseline {chosen[lane]} and {tag}: one baseline per lane")
            chosen[lane] = tag
    return chosen


def check_baselines(new: Sequence[Candidate], baselines: Mapping[Lane, str]) -> None:
    """Every lane with new images has a baseline to compare them with."""
    for lane in sorted({c.lane for c in new} - set(baselines)):
        tags = ", ".join(c.tag for c in new if c.lane is lane)
        raise UsageError(
            f"lane {lane} has new images ({tags}) but no --baseline of its own: give the "
            f"{lane} tag in use today, or watch one lane (--lane)"
        )


def _has(history: History, found: Sequence[Candidate], lane: Lane, tag: str) -> bool:
    """Whether ``tag`` of ``lane`` is graded in the history or offered now."""
    graded = tag in history.tags(lane.value)
    return graded or any(c.lane is lane and c.tag == tag for c in found)


def baselines_first(
    new: Sequence[Candidate], baselines: Mapping[Lane, str]
) -> tuple[Candidate, ...]:
    return tuple(sorted(new, key=lambda c: baselines.get(c.lane) != c.tag))


def baseline_side(
    baselines: Mapping[Lane, str], candidate: Candidate, history: History
) -> tuple[str, Sequence[Judged]] | None:
    """The baseline's tag and published cells; None for the baseline's own first grading."""
    baseline = baselines.get(candidate.lane)
    if baseline is None:
        return None
    if baseline == candidate.tag and not history.graded(candidate.lane.value, baseline):
        return None
    return baseline, history.published(candidate.lane.value, baseline)

"""Each cell's observed outcome judged against its expected one, and problems with a run's files.

Pure functions over saved ``CellResult`` values. A verdict answers "does this
cell behave as the scenario's documents say?": ``pass`` when it does,
``regression`` when a crash documented as fixed is hit, ``unexpected_fix``
when a crash documented as present is avoided (the scenario's version range
may be wrong), ``fail`` for a failure of another kind, ``error`` when the
infrastructure never let the cell run. Cells whose expectation is unknown
(``nightly``) and probes that cannot reach their decisive code path get
verdicts of their own: they are reported, never counted against an image.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from repromatrix.model import Expected, Level, Outcome
from repromatrix.results.problems import ProblemKind, RunProblem, unique_problems
from repromatrix.results.schema import CellResult

# The problem values live in ``problems``; reports have always found them here.
__all__ = [
    "DECISIVE",
    "FAILING",
    "SEVERITY",
    "Judged",
    "ProblemKind",
    "RunProblem",
    "Verdict",
    "cause_line",
    "explain",
    "judge",
    "judge_all",
    "one_line",
    "tally",
    "unique_problems",
]


class Verdict(enum.StrEnum):
    """What a report says about one cell."""

    PASS = "pass"
    REGRESSION = "regression"
    UNEXPECTED_FIX = "unexpected_fix"
    FAIL = "fail"
    ERROR = "error"
    SKIPPED = "skipped"
    UNKNOWN = "unknown"  # ran, but the documents say nothing for this version
    UNREACHABLE = "unreachable"  # a probe that could not reach the decisive code path


# Most urgent first: the order of summaries, and who gets log excerpts when space is short.
SEVERITY: tuple[Verdict, ...] = (
    Verdict.REGRESSION,
    Verdict.FAIL,
    Verdict.UNEXPECTED_FIX,
    Verdict.ERROR,
    Verdict.UNKNOWN,
    Verdict.UNREACHABLE,
    Verdict.SKIPPED,
    Verdict.PASS,
)
# Verdicts that are a mismatch with the documents or a failure of the image.
FAILING = frozenset({Verdict.REGRESSION, Verdict.UNEXPECTED_FIX, Verdict.FAIL})
# Outcomes that decide a scenario one way or the other.
DECISIVE = frozenset({Outcome.HIT, Outcome.AVOIDED})

_OUTCOME_VERDICTS: Mapping[Outcome, Verdict] = MappingProxyType(
    {
        Outcome.SKIPPED: Verdict.SKIPPED,
        Outcome.INFRA_ERROR: Verdict.ERROR,
        Outcome.UNREACHABLE: Verdict.UNREACHABLE,
        Outcome.OTHER_FAILURE: Verdict.FAIL,
        Outcome.TIMEOUT: Verdict.FAIL,
    }
)
_CAUSE_LIMIT = 300


def judge(result: CellResult) -> Verdict:
    """Return the verdict for one cell result."""
    verdict = _OUTCOME_VERDICTS.get(result.outcome)
    if verdict is not None:
        return verdict
    if result.expected is Expected.UNKNOWN:
        return Verdict.UNKNOWN
    if result.outcome.value == result.expected.value:
        return Verdict.PASS
    if result.outcome is Outcome.HIT:
        return Verdict.REGRESSION
    return Verdict.UNEXPECTED_FIX


@dataclass(frozen=True)
class Judged:
    """A cell result with its verdict."""

    result: CellResult
    verdict: Verdict

    @property
    def level(self) -> Level:
        """Engine start or probe of vLLM's own code (unknown values read as engine)."""
        return Level.PROBE if self.result.level == Level.PROBE.value else Level.ENGINE

    @property
    def cause(self) -> str:
        """One line: the root cause, else the recorded reason (empty for a clean pass)."""
        return cause_line(self.result)

    @property
    def explanation(self) -> str:
        """One sentence on why this verdict: expected vs observed, in words."""
        return explain(self)


def judge_all(results: Iterable[CellResult]) -> tuple[Judged, ...]:
    """Judge every result, in the order given."""
    return tuple(Judged(r, judge(r)) for r in results)


def cause_line(result: CellResult) -> str:
    """Return the root cause as ``Exception: message`` or its verbatim line, else the reason."""
    cause = result.root_cause
    if cause is not None and cause.exception and cause.message:
        text = f"{cause.exception}: {cause.message}"
    elif cause is not None and cause.line.strip():
        text = cause.line
    elif result.outcome is Outcome.AVOIDED and result.expected is not Expected.HIT:
        text = ""
    else:
        text = result.reason
    return one_line(text, _CAUSE_LIMIT)


def one_line(text: str, limit: int) -> str:
    """Collapse whitespace to single spaces and cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def explain(judged: Judged) -> str:
    """Say in one sentence why a cell got its verdict."""
    result = judged.result
    observed, expected = result.outcome.value, result.expected.value
    match judged.verdict:
        case Verdict.PASS:
            return f"expected {expected}, observed {observed}"
        case Verdict.REGRESSION:
            cause = judged.cause or result.reason
            return f"expected avoided, observed hit: {cause}{_evidence(judged)}"
        case Verdict.UNEXPECTED_FIX:
            return (
                "expected hit, observed avoided: the scenario's documented version range "
                "may be wrong for this version" + _evidence(judged)
            )
        case Verdict.UNKNOWN:
            return f"observed {observed}; the documents give no expectation for this version"
        case Verdict.UNREACHABLE:
            return f"the probe could not reach the decisive code path: {result.reason}"
        case _:
            return f"expected {expected}, observed {observed}: {judged.cause or result.reason}"


def _evidence(judged: Judged) -> str:
    """The recorded reason, when it says more than the cause (a probe's evidence, say)."""
    reason = one_line(judged.result.reason, _CAUSE_LIMIT)
    return f" (evidence: {reason})" if reason and reason not in judged.cause else ""


def tally(judged: Iterable[Judged]) -> dict[Verdict, int]:
    """Count cells per verdict, in ``SEVERITY`` order, omitting verdicts with no cell."""
    counts = Counter(j.verdict for j in judged)
    return {v: counts[v] for v in SEVERITY if counts[v]}

"""Each cell's observed outcome judged against its expected one, and problems with a run's files.

Pure functions over saved ``CellResult`` values. The ``judgement.Verdict`` is no
judgement of its own but the comparison of a cell's ``Outcome`` with its
``Expected`` one (see ``judgement``); this module computes it. A verdict answers "does this
cell behave as the scenario's documents say?": ``pass`` when it does,
``outside_range`` when a crash is hit on a version the documents say is not
affected (evidence that the documented range is too narrow, not that the
image regressed), ``regression`` only when the same cell was seen fixed on an
older version after being hit on an even older one (fixed, then broken
again), ``unexpected_fix`` when a crash documented as present is avoided (the
scenario's version range may be wrong), ``fail`` for a failure of another kind, ``error`` when the
infrastructure never let the cell run. Cells whose expectation is unknown
(``nightly``), engines whose scenario's code path was not shown reached
(``not_reached``: ``unknown``) and probes that cannot reach their decisive code
path get verdicts of their own: they are reported, never counted against an image.
A cell planned ``not_reached`` (its scenario's ``path`` not taken) decides nothing
either way; only a hit there is a mismatch (``outside_range``: the path too narrow).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from packaging.version import InvalidVersion, Version

from repromatrix.judgement import DECISIVE, SEVERITY, Expected, Outcome, Verdict, as_expected
from repromatrix.results.problems import ProblemKind, RunProblem, unique_problems
from repromatrix.results.schema import CellResult
from repromatrix.values import Level

# The problem values live in ``problems``; reports have always found them here.
__all__ = [
    "Judged",
    "ProblemKind",
    "RunProblem",
    "cause_line",
    "explain",
    "judge",
    "judge_all",
    "one_line",
    "tally",
    "unique_problems",
]


_OUTCOME_VERDICTS: Mapping[Outcome, Verdict] = MappingProxyType(
    {
        Outcome.SKIPPED: Verdict.SKIPPED,
        Outcome.INFRA_ERROR: Verdict.ERROR,
        Outcome.UNREACHABLE: Verdict.UNREACHABLE,
        Outcome.NOT_REACHED: Verdict.UNKNOWN,
        Outcome.OTHER_FAILURE: Verdict.FAIL,
        Outcome.TIMEOUT: Verdict.FAIL,
    }
)
_CAUSE_LIMIT = 300


def judge(result: CellResult) -> Verdict:
    """Return the verdict for one cell result on its own (``judge_all`` adds the history)."""
    verdict = _OUTCOME_VERDICTS.get(result.outcome)
    if verdict is not None:
        return verdict
    if result.expected is Expected.UNKNOWN:
        return Verdict.UNKNOWN
    if result.expected is Expected.NOT_REACHED and result.outcome is Outcome.AVOIDED:
        return Verdict.UNKNOWN  # the path was taken where the plan said it could not be
    if as_expected(result.outcome, result.expected):
        return Verdict.PASS
    if result.outcome is Outcome.HIT:
        return Verdict.OUTSIDE_RANGE
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
    """Judge every result, in the order given; a hit outside the range that an older
    version was seen fixed of (after an even older one hit it) is a ``regression``."""
    everything = tuple(results)
    history: dict[tuple[str, ...], list[tuple[Version, Outcome]]] = defaultdict(list)
    for r in everything:
        version = result_version(r)
        if version is not None and r.outcome in DECISIVE:
            history[_lineage(r)].append((version, r.outcome))
    return tuple(Judged(r, _with_history(r, judge(r), history[_lineage(r)])) for r in everything)


def result_version(result: CellResult) -> Version | None:
    """The vLLM version of a result: the one seen inside the image, else its tag's."""
    for text in (result.version, result.image_tag.removeprefix("v")):
        try:
            if text:
                return Version(text)
        except InvalidVersion:
            continue
    return None


def _lineage(r: CellResult) -> tuple[str, ...]:
    return (r.lane, r.gpu, r.model, r.flagset, r.scenario, r.variant, r.level)


def _with_history(
    result: CellResult, verdict: Verdict, seen: Sequence[tuple[Version, Outcome]]
) -> Verdict:
    version = result_version(result)
    if verdict is not Verdict.OUTSIDE_RANGE or version is None:
        return verdict
    fixed = [v for v, outcome in seen if outcome is Outcome.AVOIDED and v < version]
    broken = [v for v, outcome in seen if outcome is Outcome.HIT]
    if any(hit < fix for fix in fixed for hit in broken):
        return Verdict.REGRESSION
    return verdict


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


_ELLIPSIS = "…"
_CLAUSE_ENDS = ".;:,"


def shorten(text: str, limit: int) -> str:
    """Shorten ``text`` to ``limit`` characters by cutting its tail, never inside a word or a
    phrase: every word kept is the text's own and in its place, the cut falls at the end of a
    clause (``,`` ``;`` ``:`` ``.``) where one is in the second half of what fits, else at a
    word boundary, and never inside parentheses; the cut is marked ``…``.
    """
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    fits = flat[: max(limit - 1, 1)]  # room for " …" once the space before the cut goes
    boundary = fits.rfind(" ")
    if boundary <= 0:
        return flat[: max(limit - 1, 1)] + _ELLIPSIS
    head = fits[:boundary]
    clause = max(head.rfind(f"{end} ") for end in _CLAUSE_ENDS)
    if head[-1] in _CLAUSE_ENDS:
        clause = len(head) - 1
    if clause >= len(head) // 2:
        head = head[: clause + 1]
    while head.count("(") > head.count(")") and (opened := head.rfind(" (")) > 0:
        head = head[:opened]
    return head.rstrip(",;:") + " " + _ELLIPSIS


def explain(judged: Judged) -> str:
    """Say in one sentence why a cell got its verdict."""
    result = judged.result
    observed, expected = result.outcome.value, result.expected.value
    match judged.verdict:
        case Verdict.PASS:
            return f"expected {expected}, observed {observed}"
        case Verdict.REGRESSION:
            cause = judged.cause or result.reason
            return (
                f"expected avoided, observed hit: {cause}{_evidence(judged)}; an older "
                "version was seen avoiding it after an even older one hit it"
            )
        case Verdict.OUTSIDE_RANGE if result.expected is Expected.NOT_REACHED:
            cause = judged.cause or result.reason
            return (
                f"expected not_reached, observed hit: {cause}{_evidence(judged)}; the "
                "scenario's `path` (the ways it says vLLM takes the crash's code) looks too "
                "narrow"
            )
        case Verdict.OUTSIDE_RANGE:
            cause = judged.cause or result.reason
            return (
                f"expected avoided, observed hit: {cause}{_evidence(judged)}; the documented "
                "version range looks too narrow"
            )
        case Verdict.UNEXPECTED_FIX:
            return (
                "expected hit, observed avoided: the scenario's documented version range "
                "may be wrong for this version" + _evidence(judged)
            )
        case Verdict.UNKNOWN if result.outcome is Outcome.NOT_REACHED:
            return f"the cell did not test the crash (expected {expected}): {result.reason}"
        case Verdict.UNKNOWN if result.expected is Expected.NOT_REACHED:
            return (
                f"observed {observed} where the scenario's `path` says the crash's code is not "
                "taken: the path may be wrong; nothing decided" + _evidence(judged)
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

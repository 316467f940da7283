"""Root cause versus consequences: which finding started the cascade.

vLLM's last words are almost never the cause. A worker raises, the EngineCore
logs ``EngineCore failed to start`` and re-raises, the API server reports
``Engine core initialization failed. See root cause above``, workers are sent
SIGTERM and print ``KeyboardInterrupt``. The rules, in order:

1. Consequences (re-raises, "see root cause above", shutdown noise) are never
   the root cause, nor is an ERROR line that only introduces its traceback.
2. Findings are ranked in tiers (``Tier``): exceptions and catalogued causes,
   then other ERROR lines, then exceptions logged as warnings, then weak
   evidence (interrupts, timeouts, masking messages). The best tier present wins.
3. Within a tier the earliest finding wins: the log is in time order, and a
   chained exception prints its direct cause first, so the first exception of
   the causal chain in the earliest failing process comes first.
4. A lookup error (``KeyError``...) caught and replaced "during handling" by
   another exception is control flow; the replacement states the cause, and when
   it is a lookup error too, its own replacement, to the end of the chain however
   long (the triager keeps a chain's first exception and its latest lookup error).
5. A bare ``AssertionError`` is reported at its ``assert ...`` source line (the
   traceback reader does that), a pydantic ``ValidationError`` at the line that
   states the error it wraps, and an exception whose message quotes a compiler's
   output (Inductor's ``CppCompileError``) at the compiler's own error.

Requests the running server refused are request errors (``LogFacts.request_errors``):
never candidates, reported apart from the root cause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from repromatrix.triage.catalogue import Catalogue, Cause, Role
from repromatrix.triage.diagnosis import CONTAINER_OOM, Diagnosis, OomKill, RequestError, RootCause
from repromatrix.triage.evidence import Finding, Kind, Relation, Tier
from repromatrix.triage.facts import NO_FACTS, EngineFacts
from repromatrix.triage.logmodel import Line, is_compiler_error
from repromatrix.triage.signatures import ScenarioSignatures
from repromatrix.values import Scenario

MAX_EXCERPT = 16
MAX_EXCERPT_LINE = 2000
_LOOKUP_ERRORS = frozenset(
    {"KeyError", "AttributeError", "IndexError", "StopIteration", "ModuleNotFoundError"}
)
_PYDANTIC_ERROR = re.compile(r"\s*(?:Value error|Assertion failed), (.*?)(?: \[type=.*)?$")
_TIER_OF_ROLE = {
    Role.CONSEQUENCE: Tier.CONSEQUENCE,
    Role.NOISE: Tier.CONSEQUENCE,
    Role.REQUEST: Tier.REQUEST,
    Role.WAITING: Tier.WAITING,
    Role.WEAK: Tier.WEAK,
    Role.CAUSE: Tier.STRONG,
}
_NO_CAUSE = (
    "No line in this log states a cause. vLLM's generic errors (Engine core initialization "
    "failed, EngineDeadError, a worker that died) say only that another process failed, and "
    "that process's own output is not in this log."
)
_NO_CAUSE_FIX = (
    "Capture the complete output of every process (stdout and stderr of the server, "
    "including the EngineCore and worker lines) and run triage on it; the cause is the first "
    "error those processes print."
)
_REFUSED_FIX = (
    "Nothing failed in the server. Change the refused requests (each message says what the "
    "server does not accept, such as a prompt or max_tokens beyond max_model_len), or serve "
    "them with a configuration that accepts them."
)


@dataclass(frozen=True)
class LogReading:
    """What the reader learnt about the log besides its findings."""

    lines_read: int = 0
    ready_line: int | None = None  # first line showing the server ready (uvicorn started...)
    final_error: str | None = None  # the last consequence line vLLM printed
    last_errors: tuple[str, ...] = ()
    signature_seen: bool = False
    scenarios_seen: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    request_errors: tuple[RequestError, ...] = ()  # the first requests the server refused
    requests_refused: int = 0  # how many it refused in all
    facts: EngineFacts = field(default_factory=lambda: NO_FACTS)  # what the engine stated
    reached_seen: tuple[str, ...] = ()  # scenarios whose reached evidence was seen
    serving_line: int | None = None  # the server said it serves (Application startup complete)
    died_line: int | None = None  # the engine's first fatal end (or a 5xx answer) after it
    binary: bool = False  # the input is no text log: nothing of it was read
    nul_bytes: int = 0  # NUL bytes skipped
    ends_in_traceback: bool = False  # the log ends inside a traceback (cut off)


def rank(finding: Finding, catalogue: Catalogue) -> Tier:
    """The tier of one finding: how strongly it can be a root cause.

    The headline decides whether it is a consequence or weak evidence; the
    continuation lines may only add a cause (they often quote boilerplate).
    """
    warning = finding.line.level == "WARNING"
    frames = frame_texts(finding)
    cause = catalogue.match(finding.headline(), finding.exception, frames, warning=warning)
    if cause is None and finding.detail:
        cause = catalogue.match(finding.statement(), finding.exception, frames, warning=warning)
        cause = cause if cause is not None and cause.role is Role.CAUSE else None
    if cause is not None:
        return _TIER_OF_ROLE[cause.role]
    if finding.signature or is_compiler_error(finding.message):
        return Tier.STRONG
    if finding.kind is Kind.ERROR:
        return Tier.ERROR
    if finding.kind is Kind.MATCH:
        return Tier.STRONG  # recognised by a scenario signature
    return Tier.SOFT if warning else Tier.STRONG


def choose(findings: Sequence[Finding], catalogue: Catalogue) -> Finding | None:
    """The root cause among ``findings`` (in any order), or None when none can be named."""
    ranked = [(rank(f, catalogue), f) for f in findings if not f.header]
    live = [(tier, f) for tier, f in ranked if tier < Tier.CONSEQUENCE]
    live = _warnings_give_way(live, catalogue)
    if not live:
        return None
    best = min(tier for tier, _ in live)
    contenders = sorted((f for tier, f in live if tier == best), key=_when)
    root = _past_lookups(contenders[0], [f for tier, f in live if tier <= best])
    if best is Tier.WEAK:
        return _waited_for(root, [f for tier, f in ranked if tier is Tier.WAITING]) or root
    return root


def _waited_for(end: Finding, waiting: Sequence[Finding]) -> Finding | None:
    """What a start ended from outside was waiting for, when the log states it.

    Weak evidence (an interrupt, a signal, a time-out) says only how the start ended.
    When the engine said before it what it was waiting for (Ray's placement group asking
    for more GPUs than the cluster has, a download, a lock), that statement says why it
    never went on: the latest such statement before the end is the cause.
    """
    before = [f for f in waiting if _when(f) < _when(end)]
    return max(before, key=_when, default=None)


def _warnings_give_way(
    live: list[tuple[Tier, Finding]], catalogue: Catalogue
) -> list[tuple[Tier, Finding]]:
    """A warning is the cause only if no later fatal error explains the end on its own.

    vLLM warns about much that does not stop it. A catalogued warning keeps its
    rank when nothing fatal follows it, or when what follows is the same failure
    (the worker that dies on the kernel a warned-about library would provide).
    Fatal here means an exception that ended a traceback, not at warning level.
    """
    fatal = [
        (f, _category(f, catalogue))
        for tier, f in live
        if tier is Tier.STRONG and f.frames and f.line.level != "WARNING"
    ]
    if not fatal:
        return live

    def outranked(tier: Tier, warning: Finding) -> bool:
        if tier is not Tier.STRONG or warning.line.level != "WARNING":
            return False
        warned = _category(warning, catalogue)
        return any(_when(f) > _when(warning) and c != warned for f, c in fatal)

    return [(Tier.SOFT if outranked(t, f) else t, f) for t, f in live]


def _when(finding: Finding) -> tuple[int, int]:
    # The log is in time order; a cut-off traceback's assert is found only at the end.
    return (finding.line.number, finding.seq)


def is_lookup_error(finding: Finding) -> bool:
    """Whether ``finding`` is a lookup error (``KeyError``...), control flow when replaced."""
    return (finding.exception or "").rsplit(".", 1)[-1] in _LOOKUP_ERRORS


def _past_lookups(first: Finding, live: Sequence[Finding]) -> Finding:
    current = first
    while is_lookup_error(current):
        later = (f for f in live if f.chain == current.chain and _when(f) > _when(current))
        successor = min(later, key=_when, default=None)
        if successor is None or successor.relation is not Relation.CONTEXT:
            break
        current = successor
    return current


def diagnose(
    findings: Sequence[Finding],
    reading: LogReading,
    catalogue: Catalogue,
    signatures: ScenarioSignatures,
) -> Diagnosis:
    """Name the root cause of the log described by ``findings`` and ``reading``."""
    root = choose(_after_a_good_start(findings, reading), catalogue)
    if root is None:
        return _without_cause(reading)
    cause = _category(root, catalogue)
    scenario = signatures.scenario_of(root.evidence(), root.process)
    layer = cause.layer if cause and cause.layer else _phase(root, reading)
    line, message = stated_by(root)
    root_cause = RootCause(
        line=line.raw,
        process=root.process,
        exception=root.exception,
        message=message,
        category=cause.category if cause else None,
        scenario=scenario.id if scenario else None,
        layer=layer,
    )
    explanation, fix = _advice(root, cause, scenario)
    return Diagnosis(
        root_cause=root_cause,
        explanation=explanation,
        fix=fix,
        fix_flags=cause.fix_flags if cause else (),
        workarounds=_workarounds(scenario),
        excerpt=excerpt(root),
        last_errors=reading.last_errors,
        signature_seen=reading.signature_seen,
        title=cause.title if cause else None,
        scenario_title=scenario.title if scenario else None,
        line_number=line.number,
        scenarios_seen=reading.scenarios_seen,
        final_error=reading.final_error,
        lines_read=reading.lines_read,
        notes=reading.notes,
        facts=reading.facts,
        reached_seen=reading.reached_seen,
        request_errors=reading.request_errors,
        requests_refused=reading.requests_refused,
    )


def _after_a_good_start(findings: Sequence[Finding], reading: LogReading) -> list[Finding]:
    """The findings that may be the cause, once the server said it serves.

    A start that reached readiness succeeded: nothing before it stopped it, so nothing
    before it is a start-up cause. After it, a failure is a cause only when the engine
    died (a fatal end of the engine followed, or the server answered a request with a
    5xx); otherwise it belonged to a request or to nothing, and an external end (a Slurm
    time limit, a supervisor's SIGTERM) ended a server that worked.
    """
    if reading.serving_line is None:
        return list(findings)
    if reading.died_line is None:
        return []
    return [f for f in findings if f.line.number > reading.serving_line]


def with_oom_kill(
    diagnosis: Diagnosis, catalogue: Catalogue, kill: OomKill, shown: tuple[str, ...] = ()
) -> Diagnosis:
    """Fold in an OOM kill (data: the harness's records, the container's state), and the
    scenarios its words ``shown``: it is the cause unless a strong one was found (a weak one,
    a process that died without saying why, is what a kill looks like from outside)."""
    seen = tuple(dict.fromkeys((*diagnosis.scenarios_seen, *shown)))
    diagnosis = replace(diagnosis, scenarios_seen=seen, signature_seen=bool(seen))
    found = catalogue.category(diagnosis.category) if diagnosis.category else None
    if diagnosis.root_cause is not None and found is not None and found.role is not Role.WEAK:
        return diagnosis
    entry = catalogue.category("host_oom")
    cause = replace(
        CONTAINER_OOM,
        line=kill.lines[0] if kill.lines else CONTAINER_OOM.line,
        message="the kernel's OOM killer ended the container"
        if not kill.lines
        else "the kernel's OOM killer ended a process of the container",
        scenario=shown[0] if shown else None,
        layer=diagnosis.layer or CONTAINER_OOM.layer,
    )
    return replace(
        diagnosis,
        root_cause=cause,
        explanation=entry.explanation if entry else "",
        fix=entry.fix if entry else "",
        fix_flags=entry.fix_flags if entry else (),
        workarounds=(),
        title=entry.title if entry else None,
        scenario_title=None,
        line_number=None,
    )


def stated_by(finding: Finding) -> tuple[Line, str]:
    """The line that states the cause, and what it says.

    Usually the finding's own line. A pydantic ``ValidationError`` (vLLM's
    configuration classes raise them) only counts errors on its own line; the
    cause is on the next lines: ``  Value error, <the message> [type=...]``. An
    exception that quotes a compiler's output is stated by the compiler's error.
    """
    if finding.diagnostic is not None:
        return finding.diagnostic, finding.diagnostic.text.strip()
    if (finding.exception or "").endswith("ValidationError"):
        for line in finding.detail_lines:
            stated = _PYDANTIC_ERROR.match(line.text)
            if stated is not None:
                return line, stated.group(1)
    return finding.line, finding.message


def _category(finding: Finding, catalogue: Catalogue) -> Cause | None:
    """The catalogue entry that explains a root cause (its full statement may refine it)."""
    frames = frame_texts(finding)
    if finding.diagnostic is not None:
        stated = catalogue.match(finding.diagnostic.text)
        if stated is not None and not stated.role.never_root:
            return stated
    cause = catalogue.match(finding.statement(), finding.exception, frames)
    if cause is None or cause.role.never_root:
        cause = catalogue.match(finding.headline(), finding.exception, frames)
    return cause if cause is not None and not cause.role.never_root else None


def frame_texts(finding: Finding) -> tuple[str, ...]:
    """The finding's frames and source lines as printed."""
    return tuple(text for frame in finding.frames for text in frame.lines())


def excerpt(finding: Finding) -> tuple[str, ...]:
    """The lines around a finding: what led to it, the line itself, what followed."""
    own = () if finding.kind is Kind.ASSERT else (finding.line.raw,)
    lines = [*finding.before, *own, *finding.after]
    return tuple(_clip(line) for line in lines[-MAX_EXCERPT:])


def _phase(finding: Finding, reading: LogReading) -> str:
    ready = reading.ready_line is not None and finding.line.number > reading.ready_line
    return "first_request" if ready else "engine_startup"


def _advice(finding: Finding, cause: Cause | None, scenario: Scenario | None) -> tuple[str, str]:
    if cause is not None:
        explanation, fix = cause.explanation, cause.fix
    else:
        what = finding.exception or "this error"
        where = f" in {finding.process}" if finding.process else ""
        explanation = (
            f"{what}{where} is the first failure in the log; the errors after it are vLLM "
            "reacting to it. The catalogue has no entry for this message."
        )
        fix = "Read the message and the excerpt; search it in vLLM's issue tracker."
    if scenario is not None and scenario.fixed:
        fix = f"{fix} Fixed in vLLM {scenario.fixed}."
    return explanation, fix


def _workarounds(scenario: Scenario | None) -> tuple[str, ...]:
    if scenario is None:
        return ()
    found = []
    for variant in scenario.variants:
        if variant.kind != "workaround":
            continue
        flags = ", ".join(f"{k}={v}" for k, v in variant.flags.items())
        found.append(f"{variant.name}: {variant.description or flags}")
    return tuple(found)


def _without_cause(reading: LogReading) -> Diagnosis:
    fix = _NO_CAUSE_FIX if reading.final_error or reading.last_errors else ""
    if reading.binary:
        explanation = "This input does not look like a text log; it was not read."
    elif reading.serving_line is not None and reading.died_line is None:
        explanation = (
            f"The server started (line {reading.serving_line} says it serves) and its engine "
            "did not die afterwards: nothing in this log stopped the start. Error lines "
            "before or after it are listed below; requests the server refused are listed "
            "apart."
        )
    elif reading.ends_in_traceback and not reading.final_error:
        explanation = (
            "The log ends inside a traceback, before the exception line that would state "
            "its error: it was cut off. Triage needs the rest of the output."
        )
    elif reading.requests_refused:
        refused = reading.requests_refused
        explanation = (
            f"The server started and served requests; {refused} "
            f"{'request was' if refused == 1 else 'requests were'} refused (request errors, "
            "not a failure of the server or of its start-up)."
        )
        fix = _REFUSED_FIX
    elif reading.final_error:
        explanation = _NO_CAUSE
    elif reading.last_errors:
        explanation = "The error lines below name no cause triage recognises."
    else:
        explanation = _nothing(reading)
    return Diagnosis(
        root_cause=None,
        explanation=explanation,
        fix=fix,
        last_errors=reading.last_errors,
        signature_seen=reading.signature_seen,
        scenarios_seen=reading.scenarios_seen,
        final_error=reading.final_error,
        lines_read=reading.lines_read,
        notes=reading.notes,
        facts=reading.facts,
        reached_seen=reading.reached_seen,
        request_errors=reading.request_errors,
        requests_refused=reading.requests_refused,
    )


def _nothing(reading: LogReading) -> str:
    """What a log without any error line holds."""
    if reading.lines_read:
        return "No error was found in this log."
    if reading.nul_bytes:
        return (
            f"The log holds only NUL bytes ({reading.nul_bytes:,}), no text: what `logrotate "
            "copytruncate` leaves where a log was, or a file that was never written."
        )
    return "The log is empty."


def _clip(line: str) -> str:
    return line if len(line) <= MAX_EXCERPT_LINE else line[:MAX_EXCERPT_LINE] + " [...]"

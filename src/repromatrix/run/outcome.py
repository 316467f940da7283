"""Deciding what happened in a cell: harness status + triage + container facts → an outcome.

Pure functions over plain values. The backend reports facts (``Execution``),
the harness reports what it saw inside the container (its
``@@repromatrix-status`` line, taken only from a line's start), triage names
the root cause in the log and what the engine stated it chose; this module is
the one place that turns those into ``hit`` / ``avoided`` / ... with a
one-line reason a person can act on.

An engine that served without the signature is ``avoided`` only where the
cell's scenario makes no claim about its code path, or where its ``reached``
evidence was seen; otherwise the cell did not test the crash: ``not_reached``,
the engine cell's counterpart of a probe's ``unreachable``. A workaround is
exempt (it may avoid the crash by leaving that path), and a failure of another
kind stays ``other_failure``; both record ``reached`` all the same.

A probe that saw vLLM raise reports the exception (``raised``); whether it is
the documented crash is decided here, by the scenario's signatures (RE2,
``patterns.py``), not by a pattern matched inside the image.

A signature seen only in WARNING or INFO lines is no crash of an engine that became ready
and answered (vLLM warns in the same words where a variable allows what the crash
refuses: ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``, vllm/config/model.py:2660 in 0.32.0), unless
the scenario says the warning is its crash (``warning_is_crash``). Ready and answered are
the harness's word, or the server's own access log's where the status line is missing (a
stop can cut the harness off before it prints it): ``served``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from repromatrix.backends.base import Execution
from repromatrix.harness.harness import STATUS_PREFIX
from repromatrix.patterns import compile_pattern
from repromatrix.triage.diagnosis import RootCause
from repromatrix.triage.facts import describe
from repromatrix.triage.signatures import signature_levels
from repromatrix.values import Cell, FactTest, Level, Outcome, Scenario, Signature

STATUS_MARK = STATUS_PREFIX.encode()
PROBE_OUTCOMES = {
    "hit": Outcome.HIT,
    "avoided": Outcome.AVOIDED,
    "other_failure": Outcome.OTHER_FAILURE,
    "unreachable": Outcome.UNREACHABLE,
}
RAISED = "raised"  # a probe's exception, matched here against the scenario's signatures
# What the runner records when the kernel's OOM killer ended the container: triage cannot
# see it in the log (the process just vanishes), so the fact becomes the root cause.
OOM_CAUSE = RootCause(
    line="container killed for memory (OOMKilled)",
    exception="OOMKilled",
    category="host_oom",
    layer="engine_startup",
)


class DiagnosisLike(Protocol):
    """What outcome needs from ``triage.Diagnosis``."""

    @property
    def root_cause(self) -> RootCause | None:
        """The named root cause, or None when triage found none."""

    def shows(self, scenario_id: str) -> bool:
        """Whether the log shows that scenario's crash (``triage.Diagnosis.shows``)."""

    def reached(self, scenario_id: str) -> bool:
        """Whether the log shows that scenario's code path entered (``Diagnosis.reached``)."""

    @property
    def facts(self) -> Mapping[str, str]:
        """What the engine stated it chose and sized (``triage.facts``)."""


@dataclass(frozen=True)
class ProbeReport:
    """A probe's own verdict, from its ``@@repromatrix-probe`` line."""

    outcome: str
    evidence: str = ""
    exception: str | None = None
    vllm_version: str | None = None


@dataclass(frozen=True)
class HarnessStatus:
    """The harness's final ``@@repromatrix-status`` line."""

    ready: bool = False
    answered: bool = False
    exit_code: int | None = None  # vLLM's, not the harness's
    ready_s: float = 0.0
    request_s: float = 0.0
    vllm_version: str | None = None
    error: str | None = None
    probe: ProbeReport | None = None
    # Names of the processes the kernel's OOM killer ended, as the harness saw them.
    oom_killed: tuple[str, ...] = ()
    # The commits of the HF cache snapshots the harness resolved the cell's repos to.
    model_revision: str | None = None
    adapter_revision: str | None = None
    infra_error: str | None = None  # the container could not run the cell (nothing launched)


@dataclass(frozen=True)
class Decision:
    """An outcome, why, and the root cause behind it (None when nothing failed).

    ``reached``: whether the code path of every scenario the cell tests that makes a
    claim about it (``Scenario.reached``) was shown entered; None when none makes one
    or the engine never ran.
    """

    outcome: Outcome
    reason: str
    root_cause: RootCause | None = None
    reached: bool | None = None


def parse_status(log: bytes) -> HarnessStatus | None:
    """Return the harness's status: the last well-formed line of ``log`` (lines end at
    ``\n`` alone) that begins with the status mark; None when there is none.

    Only the harness begins a line with the mark: it relays an engine's line that does
    behind a mark of its own (``harness.relayed``), and the mark anywhere else in a line
    (after a ``\r``, or quoted in an engine's message) is the engine's text, never taken.
    """
    for line in reversed(log.split(b"\n")):
        if not line.startswith(STATUS_MARK):
            continue
        try:
            data = json.loads(line[len(STATUS_MARK) :])
        except ValueError:
            continue
        if isinstance(data, dict):
            return status_from_json(data)
    return None


def status_from_json(data: Mapping[str, Any]) -> HarnessStatus:
    """Build a status from the harness's JSON, tolerating missing or mistyped keys."""
    probe = data.get("probe")
    return HarnessStatus(
        ready=data.get("ready") is True,
        answered=data.get("answered") is True,
        exit_code=_int_or_none(data.get("exit_code")),
        ready_s=_float(data.get("ready_s")),
        request_s=_float(data.get("request_s")),
        vllm_version=_str_or_none(data.get("vllm_version")),
        error=_str_or_none(data.get("error")),
        probe=_probe(probe) if isinstance(probe, dict) else None,
        oom_killed=_victims(data.get("oom_killed")),
        model_revision=_str_or_none(data.get("model_revision")),
        adapter_revision=_str_or_none(data.get("adapter_revision")),
        infra_error=_str_or_none(data.get("infra_error")),
    )


# The server's own access log: uvicorn's ``"GET /health HTTP/1.1" 200`` and the answer.
_HEALTH_OK = re.compile(rb'"GET /health HTTP/[0-9.]+" 200\b')
_ANSWER_OK = re.compile(rb'"POST /v1/(?:chat/)?completions HTTP/[0-9.]+" 200\b')


def served(status: HarnessStatus | None, log: bytes) -> tuple[bool, bool]:
    """Whether the server became ready and answered: as the harness's status says, or, where
    the log has no status line (a stop cut the harness off before it printed it), as the
    server's own access log says: ``GET /health`` and a completion answered 200."""
    if status is not None:
        return status.ready, status.answered
    ready = _HEALTH_OK.search(log) is not None
    return ready, ready and _ANSWER_OK.search(log) is not None


def _victims(value: object) -> tuple[str, ...]:
    """The names in the harness's ``oom_killed`` list (``[{"pid", "name"}]``)."""
    if not isinstance(value, list):
        return ()
    return tuple(str(item.get("name")) for item in value if isinstance(item, dict))


def _probe(data: Mapping[str, Any]) -> ProbeReport:
    exception = data.get("exception")
    if isinstance(exception, dict):
        exception = ": ".join(str(v) for v in exception.values() if v)
    return ProbeReport(
        outcome=str(data.get("outcome", "")),
        evidence=str(data.get("evidence") or ""),
        exception=_str_or_none(exception),
        vllm_version=_str_or_none(data.get("vllm_version")),
    )


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _str_or_none(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


def skipped(reason: str) -> Decision:
    """A cell this host cannot run (a GPU cell without a GPU, a lane the backend lacks)."""
    return Decision(Outcome.SKIPPED, reason)


def infra_error(reason: str) -> Decision:
    """A cell whose container never ran: the image failed to build or pull, the engine failed."""
    return Decision(Outcome.INFRA_ERROR, reason)


def decide(
    cell: Cell,
    execution: Execution,
    status: HarnessStatus | None,
    diagnosis: DiagnosisLike,
) -> Decision:
    """Turn one executed cell's facts into its outcome and reason."""
    if execution.infra_error is not None:
        return infra_error(execution.infra_error)
    if status is not None and status.infra_error is not None:
        return infra_error(status.infra_error)
    if cell.level is Level.PROBE:
        return _decide_probe(cell, execution, status, diagnosis)
    decision = _decide_engine(cell, execution, status, diagnosis)
    return replace(decision, reached=reached(cell, diagnosis))


def _decide_engine(
    cell: Cell, execution: Execution, status: HarnessStatus | None, diagnosis: DiagnosisLike
) -> Decision:
    cause = diagnosis.root_cause
    shown = hit_scenario(cell, diagnosis)
    ready, answered = served(status, execution.log)
    warned = shown is not None and ready and answered and only_warned(cell, shown, execution.log)
    if shown is not None and not warned:
        return Decision(Outcome.HIT, _hit_reason(shown, cause), cause)
    if execution.timed_out:
        return _timeout(cell, cause)
    if execution.oom_killed:
        return Decision(Outcome.OTHER_FAILURE, OOM_CAUSE.line, cause or OOM_CAUSE)
    unreached = not_reached(cell, diagnosis)
    if ready and answered and (warned or not execution.stopped_early):
        if unreached and cell.variant.needs_reach:
            return Decision(Outcome.NOT_REACHED, _not_reached_reason(unreached, diagnosis))
        if warned:
            why = (
                f"ready and answered; the {shown} signature appeared only in a WARNING or INFO line"
            )
            return Decision(Outcome.AVOIDED, why)
        return Decision(Outcome.AVOIDED, "ready and answered; the signature never appeared")
    reason = _failure_reason(execution, status, cause)
    if unreached:
        reason += f" (the code path of {', '.join(s.id for s in unreached)} was not reached)"
    return Decision(Outcome.OTHER_FAILURE, reason, cause)


def claims(cell: Cell) -> tuple[Scenario, ...]:
    """The scenarios this cell tests that say what shows their code path entered."""
    if cell.level is Level.PROBE:
        return ()
    return tuple(s for s in cell.watched if s.reached and not s.baseline)


def reached(cell: Cell, diagnosis: DiagnosisLike) -> bool | None:
    """Whether every claiming scenario's code path was shown entered (None: no claim)."""
    claiming = claims(cell)
    if not claiming:
        return None
    return all(diagnosis.reached(s.id) for s in claiming)


def not_reached(cell: Cell, diagnosis: DiagnosisLike) -> tuple[Scenario, ...]:
    """The claiming scenarios whose code path the log does not show entered."""
    return tuple(s for s in claims(cell) if not diagnosis.reached(s.id))


def _not_reached_reason(unreached: tuple[Scenario, ...], diagnosis: DiagnosisLike) -> str:
    """Why the cell did not test the crash: the evidence looked for, and what was stated."""
    wanted = "; ".join(f"{s.id}: {_evidence(s)}" for s in unreached)
    stated = [
        f"{test.fact} {diagnosis.facts[test.fact]}"
        for s in unreached
        for test in s.reached
        if isinstance(test, FactTest) and test.fact in diagnosis.facts
    ]
    said = f"; the engine stated {', '.join(dict.fromkeys(stated))}" if stated else ""
    return f"ready and answered, but the crash's code path was not shown reached ({wanted}){said}"


def _evidence(scenario: Scenario) -> str:
    """The scenario's reached evidence in words: ``a line `...` or compilation_mode ...``."""
    words = []
    for entry in scenario.reached:
        if isinstance(entry, Signature):
            where = f" from {entry.process}" if entry.process else ""
            words.append(f"a line `{entry.pattern}`{where}")
        else:
            words.append(describe(entry))
    return " or ".join(words)


def only_warned(cell: Cell, scenario_id: str, log: bytes) -> bool:
    """Whether the log shows ``scenario_id``'s signature in a WARNING or INFO line and in no
    other, and the scenario does not say such a warning is its crash (``warning_is_crash``)."""
    scenario = next((s for s in (*cell.watched, cell.scenario) if s.id == scenario_id), None)
    if scenario is None or scenario.warning_is_crash:
        return False
    quiet, loud = signature_levels(log.decode("utf-8", "replace"), scenario)
    return quiet and not loud


def hit_scenario(cell: Cell, diagnosis: DiagnosisLike) -> str | None:
    """The scenario whose crash makes this cell a hit: its own, or one its baseline predicts.

    The triager must have watched ``cell.watched`` for a baseline's predictions to show.
    """
    return next((s for s in cell.hit_scenarios if diagnosis.shows(s)), None)


def _hit_reason(scenario_id: str, cause: RootCause | None) -> str:
    where = f" in {cause.process}" if cause is not None and cause.process else ""
    line = f": {cause.line.strip()}" if cause is not None else ""
    return f"{scenario_id} signature seen{where}{line}"


def _timeout(cell: Cell, cause: RootCause | None) -> Decision:
    reason = f"no verdict within the cell's deadline of {cell.deadline_s:g} s"
    return Decision(Outcome.TIMEOUT, reason, cause)


def _failure_reason(
    execution: Execution, status: HarnessStatus | None, cause: RootCause | None
) -> str:
    if cause is not None:
        return cause.line.strip()
    if status is not None and status.error:
        return status.error
    if status is not None and status.ready and not status.answered:
        return "the server became ready but did not answer its first request"
    if status is None:
        return f"the harness printed no status (container exit code {execution.exit_code})"
    return f"vLLM failed without a recognisable cause (exit code {status.exit_code})"


def _decide_probe(
    cell: Cell, execution: Execution, status: HarnessStatus | None, diagnosis: DiagnosisLike
) -> Decision:
    if execution.timed_out:
        return Decision(Outcome.TIMEOUT, "the probe did not finish within the cell's deadline")
    if execution.oom_killed:
        return Decision(Outcome.OTHER_FAILURE, OOM_CAUSE.line, OOM_CAUSE)
    probe = status.probe if status is not None else None
    if probe is not None and probe.outcome == RAISED:
        return probe_raised(cell.scenario, probe)
    if probe is None or probe.outcome not in PROBE_OUTCOMES:
        cause = diagnosis.root_cause
        reason = cause.line.strip() if cause else "the probe printed no @@repromatrix-probe line"
        return Decision(Outcome.OTHER_FAILURE, reason, cause)
    outcome = PROBE_OUTCOMES[probe.outcome]
    reason = probe.evidence or probe.outcome
    cause = None
    if probe.exception and outcome in (Outcome.HIT, Outcome.OTHER_FAILURE):
        cause = RootCause(line=probe.exception, process="probe", category="probe")
        reason = f"{reason}: {probe.exception}" if probe.evidence else probe.exception
    return Decision(outcome, reason, cause)


def probe_raised(scenario: Scenario, probe: ProbeReport) -> Decision:
    """What a probe's exception means: a hit where one of the scenario's signatures is found
    in it (its ``beside`` too, in the exception or the probe's evidence), else another
    failure. The process a signature names does not apply: the probe called the code."""
    exception = probe.exception or ""
    texts = (exception, probe.evidence)
    shown = any(
        compile_pattern(s.pattern).search(exception)
        and (s.beside is None or any(compile_pattern(s.beside).search(t) for t in texts))
        for s in scenario.signatures
    )
    outcome = Outcome.HIT if shown else Outcome.OTHER_FAILURE
    what = "the documented crash" if shown else "not the documented crash"
    cause = RootCause(line=exception, process="probe", category="probe") if exception else None
    said = f": {exception}" if exception else ""
    seen = probe.evidence or "the probe saw vLLM raise"
    return Decision(outcome, f"{seen}, {what} of {scenario.id}{said}", cause)

"""One cell's life, from its image to its result file, in one place.

What the cell is given (``CellContext``, from its image job's value), the
callable the pool runs for it (``work_for``: its GPUs checked idle and its
driver against the image's CUDA, then ``run_cell``), its container call with a
live triage on the stream (``execute_cell``: an early stop once the root cause is
named),
the outcome decided from the facts (``decide``), and the result written the
moment the cell ends (``save``).

``run_cell`` is the one place where anything that goes wrong in a cell (a
spec that cannot be built, an engine failure, a bug of ours) becomes that
cell's outcome, so the run always goes on to the next cell; only an interrupt
escapes.

Deciding what happened is pure functions over plain values. The backend reports
facts (``Execution``), the harness reports what it saw inside the container (its
``@@repromatrix-status`` line, taken only from a line's start), triage names
the root cause in the log and what the engine stated it chose; ``decide`` is
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
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from repromatrix.backends.base import Backend, Execution, Placement, Prepared
from repromatrix.backends.harness_spec import build_spec, model_path
from repromatrix.errors import InfraError, RepromatrixError
from repromatrix.harness.harness import STATUS_PREFIX
from repromatrix.harness.oomwatch import KILL_WORDS, LINE_PREFIX
from repromatrix.host.identity import driver_shortfall
from repromatrix.host.idle import NO_WAIT, IdleWait, wait_idle
from repromatrix.host.runner import Runner
from repromatrix.judgement import Outcome
from repromatrix.models.tinymodel import TinyModel, content_hash
from repromatrix.patterns import compile_pattern
from repromatrix.results import store
from repromatrix.results.schema import GpuFact
from repromatrix.results.store import CellResult, Timings, now_iso
from repromatrix.run.folder import RunFolder
from repromatrix.run.images import ImageReady, adapter_rank
from repromatrix.run.pool import DependencyFailed, Done, Skipped, Ticket, Work
from repromatrix.run.progress import Progress
from repromatrix.run.schedule import Allocation
from repromatrix.triage.diagnosis import CONTAINER_OOM, OomKill, RootCause
from repromatrix.triage.facts import describe
from repromatrix.triage.signatures import signature_levels
from repromatrix.triage.triager import Triager
from repromatrix.values import Cell, FactTest, Lane, Level, Scenario, Signature


# --- What the cell is given: its image, its model, what the run knows of them before it starts.
@dataclass(frozen=True)
class CellContext:
    """What one cell needs beyond itself: its prepared image and the path of its model, and
    what the run knows of them before the cell starts."""

    prepared: Prepared | None
    model_path: str
    adapter_path: str | None = None
    image_version: str | None = None  # vLLM's version as read inside the image
    environment: str | None = None  # the image's environment report, relative to the run
    # The revisions the host knows (the CPU lane's tiny model by its content hash); a GPU
    # cell's repo ids are resolved by the harness in its container's HF cache instead.
    model_revision: str | None = None
    adapter_revision: str | None = None


def cell_context(cell: Cell, ready: ImageReady, models_root: Path) -> CellContext:
    """What ``cell`` runs with, from its image job's value: the image, model and adapter paths
    (with the tiny model's content hashes), vLLM's version and the environment report (a
    failed model of its own makes its image unusable for it)."""
    image, version, report = ready.prepared, ready.version, ready.environment
    model = ready.models.get(cell.model.name) if cell.level is Level.ENGINE else None
    if isinstance(model, str) and image.error is None:
        return CellContext(Prepared(image.image_key, image.ref, error=model), "")
    if isinstance(model, TinyModel):
        served = model.files_path(cell.model_files)
        adapter = (
            model.adapter_path(adapter_rank(cell)) if cell.scenario.launch.lora_adapter else None
        )
        return CellContext(
            image,
            str(served),
            str(adapter) if adapter else None,
            image_version=version,
            environment=report,
            model_revision=content_hash(served),
            adapter_revision=content_hash(adapter) if adapter else None,
        )
    path = model_path(cell, models_root)
    return CellContext(image, path, image_version=version, environment=report)


# --- In the pool: the callable a pool thread runs for the cell, and what it returns.
@dataclass(frozen=True)
class Ran:
    """What one cell's job returns: when it started, what running it gave, what it ran with."""

    started_at: str
    run: CellRun
    context: CellContext | None = None  # None: it never got a usable image
    gpus: tuple[Mapping[str, GpuFact], ...] = ()  # the runner's GPUs it was given


def work_for(
    backend: Backend,
    cell: Cell,
    runner: Runner,
    models_root: Path,
    idle_wait: IdleWait = NO_WAIT,
) -> Work[Ran]:
    """The callable that runs ``cell`` in a pool thread, on the value of its image's job,
    once its GPUs are idle (waiting for them as ``idle_wait`` says); cancelling it stops
    its wait or its container."""

    def work(ticket: Ticket) -> Ran:
        ticket.on_cancel(lambda: backend.stop(cell.id))
        started_at = now_iso()
        if not isinstance(ticket.before, ImageReady):
            raise TypeError(f"{cell.id} started without its image job's value")  # a bug of ours
        context = cell_context(cell, ticket.before, models_root)
        placement = placement_of(ticket.allocation, runner)
        gpus = lent_gpus(ticket.allocation.gpu_ids, runner)
        lent = Lent(placement, runner, idle_wait, ticket.wait_cancelled)
        if (refused := gpu_refusal(backend, cell, context, lent)) is not None:
            return Ran(started_at, CellRun(infra_error(refused), NOT_RUN), context, gpus)
        return Ran(started_at, run_cell(backend, cell, context, placement), context, gpus)

    return work


@dataclass(frozen=True)
class Lent:
    """The GPUs a cell was lent, on which runner, and how long it waits for them to be idle
    (``pause`` waits up to the seconds given, True when the run is interrupted)."""

    placement: Placement
    runner: Runner
    idle_wait: IdleWait = NO_WAIT
    pause: Callable[[float], bool] = lambda _seconds: True


def gpu_refusal(backend: Backend, cell: Cell, context: CellContext, lent: Lent) -> str | None:
    """Why a GPU cell must not start on its lent GPUs: the driver is older than its image's
    CUDA (at once: waiting changes nothing), or a GPU is still busy after the wait (the backend
    names what holds it). Either is the machine's fault, so the cell becomes an
    infrastructure error, never a verdict. None for a CPU cell, a rehearsal (no device), or
    an image that is not ready (``run_cell`` says why)."""
    prepared, runner = context.prepared, lent.runner
    if cell.lane is not Lane.GPU or runner.rehearse or prepared is None or prepared.error:
        return None
    gpus = [gpu for i in lent.placement.gpu_ids or () if (gpu := runner.gpu(i)) is not None]
    short = driver_shortfall(gpus, prepared.cuda_version, prepared.cuda_requirement)
    if short is not None:
        return short
    return wait_idle(lambda: backend.busy_reason(lent.placement), lent.idle_wait, lent.pause)


def placement_of(allocation: Allocation, runner: Runner) -> Placement:
    """The pool's allocation as the backend takes it: GPU ids as UUIDs where the host has them."""
    gpus = tuple(runner.uuid_of(i) or i for i in allocation.gpu_ids)
    return Placement(gpu_ids=gpus if allocation.gpu_ids else None, core_ids=allocation.core_ids)


def lent_gpus(gpu_ids: Sequence[str], runner: Runner) -> tuple[dict[str, GpuFact], ...]:
    """The runner's GPUs ``gpu_ids`` as the runner read each (every field it has); an id it
    does not list (a MIG id, a GPU named to a runner without nvidia-smi) as the id alone."""
    listed = {gpu.index: gpu for gpu in runner.gpus}
    return tuple(asdict(listed[i]) if i in listed else {"index": i} for i in gpu_ids)


def ended_run(done: Done[Ran | ImageReady]) -> Ran:
    """What an ended cell job stands for: its run, or the outcome of why it did not run."""
    if isinstance(done.value, Ran):
        return done.value
    error = done.error
    if isinstance(error, Skipped):
        decision = skipped(str(error))
    elif isinstance(error, DependencyFailed):
        decision = infra_error(f"image not available: {error}")
    else:
        decision = infra_error(f"internal error: {error!r}")
    return Ran(now_iso(), CellRun(decision, NOT_RUN))


# --- The container call.
@dataclass(frozen=True)
class CellRun:
    """What running one cell gave: the decision, the backend's facts, the harness's status,
    and what the engine stated it chose and sized (``triage.facts``)."""

    decision: CellOutcome
    execution: Execution
    status: HarnessStatus | None = None
    facts: Mapping[str, str] = field(default_factory=dict)


def execute_cell(
    backend: Backend, cell: Cell, context: CellContext, placement: Placement | None = None
) -> CellRun:
    """Run one cell on ``backend`` (on ``placement``) and decide its outcome from the facts."""
    assert context.prepared is not None
    spec = build_spec(
        cell,
        context.model_path,
        adapter_path=context.adapter_path,
        launcher=context.prepared.launcher,
    )
    listener, triager = make_listener(cell)
    execution = backend.execute(cell, spec, context.prepared, listener, placement)
    # What the backend kept after the listener last read still counts: the output drained
    # once an early stop killed the container (the harness's OOM record can come last), or
    # a log read again after the live stream broke.
    triager.feed(execution.log[triager.bytes_read :])
    status = parse_status(execution.log)
    if status is not None and status.oom_killed:
        # Docker's OOMKilled can miss a killed grandchild; the harness's cgroup count does not.
        execution = replace(execution, oom_killed=True)
    kill = oom_kill(execution, status, triager.kills)
    diagnosis = triager.diagnose(oom=kill)
    decision = decide(cell, execution, status, diagnosis)
    if kill is not None and kill.lines and not (status and status.oom_killed):
        execution = replace(execution, log=execution.log + on_a_line(execution.log, kill.lines[0]))
    return CellRun(decision, execution, status, diagnosis.facts)


# vLLM's executor names the process that got SIGKILL: "Worker proc VllmWorker-0 died
# unexpectedly (exit code: -9)".
_SIGKILLED = re.compile(rb"(?:proc|process) (\S+) died unexpectedly \(exit code:? -9\)")


def oom_kill(
    execution: Execution, status: HarnessStatus | None, recorded: Sequence[str] = ()
) -> OomKill | None:
    """The OOM kill as data for triage; None when nothing was killed for memory.

    The harness's records of each kill (``recorded``: the triager reads them from the
    stream as data) say it all; without them, the victims its status names. The OOM killer
    can end the harness with the engine (the container's exit code is then 137 and its last
    lines are missing): the container's ``OOMKilled`` state remains, and vLLM's own log
    names the process that got SIGKILL.
    """
    if not execution.oom_killed:
        return None
    if recorded:
        return OomKill((), container=True)
    if status is not None and status.oom_killed:
        return OomKill(tuple(LINE_PREFIX + KILL_WORDS + name for name in status.oom_killed), True)
    named = _SIGKILLED.search(execution.log)
    victim = named.group(1).decode(errors="replace") if named else "(not named in the log)"
    said = (
        f"{LINE_PREFIX}{KILL_WORDS}{victim} "
        "(the container's State.OOMKilled; the harness did not outlive the kill)"
    )
    return OomKill((said,), container=True)


def on_a_line(log: bytes, line: str) -> bytes:
    """``line`` as bytes to append to ``log``, on a line of its own (for the people who read
    the log: a kill can cut it in the middle of a line)."""
    cut = bool(log) and not log.endswith(b"\n")
    return (b"\n" if cut else b"") + f"{line}\n".encode()


def run_cell(
    backend: Backend, cell: Cell, context: CellContext, placement: Placement | None = None
) -> CellRun:
    """One cell, every failure mapped to an outcome here; only an interrupt escapes.

    Safe to call from several threads at once: each call has its own triager and log.
    """
    if context.prepared is None or context.prepared.error is not None:
        why = context.prepared.error if context.prepared else "image was not prepared"
        return CellRun(infra_error(f"image not available: {why}"), NOT_RUN)
    try:
        return execute_cell(backend, cell, context, placement)
    except RepromatrixError as exc:
        return CellRun(infra_error(str(exc)), NOT_RUN)
    except Exception as exc:
        # A bug of ours must not cost the rest of the run; the traceback goes in the log.
        trace = traceback.format_exc().encode()
        return CellRun(infra_error(f"internal error: {exc!r}"), Execution(None, trace))


# --- Live triage: the listener on the streamed output.
NOT_RUN = Execution(exit_code=None, log=b"")


LONGEST_LINE = 1 << 20  # bytes of an unfinished line kept for its match


class Served:
    """Whether the harness has said, in a status line of its own, that its engine answered.

    The harness prints that status before it stops a served engine; what follows is that
    stop's teardown (an engine core killed on purpose, a worker told its parent exited), in
    which a live triage can see a cause and a consequence. A served cell is never stopped
    early for them: the harness ends it, and its status is read whole.
    """

    def __init__(self) -> None:
        self.answered = False
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        """Read the next chunk of output."""
        if self.answered:
            return
        *lines, rest = (self._partial + chunk).split(b"\n")
        self._partial = rest[-LONGEST_LINE:]
        status = parse_status(b"\n".join(lines))
        self.answered = status is not None and status.ready and status.answered


def make_listener(cell: Cell) -> tuple[Callable[[bytes], bool], Triager]:
    """A listener that feeds a live ``Triager`` and asks to stop once it is terminal (never
    after the harness said the engine answered: ``Served``).

    Triage is given the cell's own scenario only, so ``signature_seen`` means
    *this* cell's documented crash, never another scenario's.
    """
    triager = Triager(cell.watched)
    served = Served()

    def on_output(chunk: bytes) -> bool:
        served.feed(chunk)
        triager.feed(chunk)
        return triager.terminal and not served.answered

    return on_output, triager


# --- The harness's word: its status line, and a probe's report.
STATUS_MARK = STATUS_PREFIX.encode()


PROBE_OUTCOMES = {
    "hit": Outcome.HIT,
    "avoided": Outcome.AVOIDED,
    "other_failure": Outcome.OTHER_FAILURE,
    "unreachable": Outcome.UNREACHABLE,
}


RAISED = "raised"  # a probe's exception, matched here against the scenario's signatures


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
class CellOutcome:
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


# --- The outcome: the facts in, a decision out (pure).
def skipped(reason: str) -> CellOutcome:
    """A cell this host cannot run (a GPU cell without a GPU, a lane the backend lacks)."""
    return CellOutcome(Outcome.SKIPPED, reason)


def infra_error(reason: str) -> CellOutcome:
    """A cell whose container never ran: the image failed to build or pull, the engine failed."""
    return CellOutcome(Outcome.INFRA_ERROR, reason)


def decide(
    cell: Cell,
    execution: Execution,
    status: HarnessStatus | None,
    diagnosis: DiagnosisLike,
) -> CellOutcome:
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
) -> CellOutcome:
    cause = diagnosis.root_cause
    shown = hit_scenario(cell, diagnosis)
    ready, answered = served(status, execution.log)
    warned = shown is not None and ready and answered and only_warned(cell, shown, execution.log)
    if shown is not None and not warned:
        return CellOutcome(Outcome.HIT, _hit_reason(shown, cause), cause)
    if execution.timed_out:
        return _timeout(cell, cause)
    if execution.oom_killed:
        return CellOutcome(Outcome.OTHER_FAILURE, CONTAINER_OOM.line, cause or CONTAINER_OOM)
    unreached = not_reached(cell, diagnosis)
    if ready and answered and (warned or not execution.stopped_early):
        if unreached and cell.variant.needs_reach:
            return CellOutcome(Outcome.NOT_REACHED, _not_reached_reason(unreached, diagnosis))
        if warned:
            why = (
                f"ready and answered; the {shown} signature appeared only in a WARNING or INFO line"
            )
            return CellOutcome(Outcome.AVOIDED, why)
        return CellOutcome(Outcome.AVOIDED, "ready and answered; the signature never appeared")
    reason = _failure_reason(execution, status, cause)
    if unreached:
        reason += f" (the code path of {', '.join(s.id for s in unreached)} was not reached)"
    return CellOutcome(Outcome.OTHER_FAILURE, reason, cause)


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


def _timeout(cell: Cell, cause: RootCause | None) -> CellOutcome:
    reason = f"no verdict within the cell's deadline of {cell.deadline_s:g} s"
    return CellOutcome(Outcome.TIMEOUT, reason, cause)


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
) -> CellOutcome:
    if execution.timed_out:
        return CellOutcome(Outcome.TIMEOUT, "the probe did not finish within the cell's deadline")
    if execution.oom_killed:
        return CellOutcome(Outcome.OTHER_FAILURE, CONTAINER_OOM.line, CONTAINER_OOM)
    probe = status.probe if status is not None else None
    if probe is not None and probe.outcome == RAISED:
        return probe_raised(cell.scenario, probe)
    if probe is None or probe.outcome not in PROBE_OUTCOMES:
        cause = diagnosis.root_cause
        reason = cause.line.strip() if cause else "the probe printed no @@repromatrix-probe line"
        return CellOutcome(Outcome.OTHER_FAILURE, reason, cause)
    outcome = PROBE_OUTCOMES[probe.outcome]
    reason = probe.evidence or probe.outcome
    cause = None
    if probe.exception and outcome in (Outcome.HIT, Outcome.OTHER_FAILURE):
        cause = RootCause(line=probe.exception, process="probe", category="probe")
        reason = f"{reason}: {probe.exception}" if probe.evidence else probe.exception
    return CellOutcome(outcome, reason, cause)


def probe_raised(scenario: Scenario, probe: ProbeReport) -> CellOutcome:
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
    return CellOutcome(outcome, f"{seen}, {what} of {scenario.id}{said}", cause)


# --- The result file, written the moment the cell ends.
def cell_result(
    cell: Cell,
    run: CellRun,
    *,
    context: CellContext | None,
    run_id: str,
    started_at: str,
    gpus: Sequence[Mapping[str, GpuFact]] = (),
) -> CellResult:
    """The saved form of one cell's outcome (``context`` None: it never got a usable image),
    ``gpus`` the runner's GPUs it was given, as the runner read them."""
    status, execution = run.status, run.execution
    known = context or CellContext(None, "")
    prepared = known.prepared
    ready, answered = served(status, execution.log)  # the status, or the log's own word
    return CellResult(
        id=cell.id,
        outcome=run.decision.outcome,
        expected=cell.expected,
        lane=cell.lane.value,
        level=cell.level.value,
        image=cell.image.ref,
        image_tag=cell.image.tag,
        gpu=cell.gpu.name,
        model=cell.model.name,
        flagset=cell.flagset.name,
        scenario=cell.scenario.id,
        variant=cell.variant.name,
        flags=dict(cell.flags),
        version=(status.vllm_version if status else None) or known.image_version,
        image_digest=prepared.digest if prepared else None,
        root_cause=run.decision.root_cause,
        reason=run.decision.reason,
        ready=ready,
        answered=answered,
        exit_code=execution.exit_code,
        oom_killed=execution.oom_killed,
        timings=Timings(
            build_s=prepared.build_s if prepared else 0.0,
            start_s=execution.start_s,
            ready_s=status.ready_s if status else 0.0,
            request_s=status.request_s if status else 0.0,
            total_s=execution.total_s,
        ),
        run_id=run_id,
        started_at=started_at,
        facts=dict(run.facts),
        reached=run.decision.reached,
        runner_gpus=tuple(dict(gpu) for gpu in gpus),
        model_revision=(status.model_revision if status else None) or known.model_revision,
        adapter_revision=(status.adapter_revision if status else None) or known.adapter_revision,
        environment=known.environment,
    )


def save(folder: RunFolder, cell: Cell, ran: Ran, counts: dict[str, int]) -> CellResult:
    """Write one cell's result and log now, and count its outcome."""
    result = cell_result(
        cell,
        ran.run,
        context=ran.context,
        run_id=folder.run_id,
        started_at=ran.started_at,
        gpus=ran.gpus,
    )
    try:
        store.write_result(folder.path, result, ran.run.execution.log)
    except OSError as exc:
        # A full disk or a read-only folder: the write left nothing half-done (it renames a
        # finished file), and the run must stop here with one clear line.
        why = exc.strerror or str(exc)
        raise InfraError(f"cannot save the result of {cell.id} under {folder.path}: {why}") from exc
    counts[result.outcome.value] = counts.get(result.outcome.value, 0) + 1
    return result


def save_skipped(
    cells: Sequence[Cell],
    skips: Mapping[str, str],
    folder: RunFolder,
    counts: dict[str, int],
    progress: Progress,
) -> None:
    """Save each of ``cells`` as skipped with its reason, in one progress line (the run's first
    lines said why, per reason: ``run.outlook``)."""
    for cell in cells:
        save(folder, cell, Ran(now_iso(), CellRun(skipped(skips[cell.id]), NOT_RUN)), counts)
    if cells:
        progress.note(f"{len(cells)} cell(s) this host cannot run saved as skipped")

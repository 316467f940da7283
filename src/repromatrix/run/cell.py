"""Running one cell: its harness spec, a live triage watcher, the outcome and the saved result.

``run_cell`` is the one place where anything that goes wrong in a cell (a
spec that cannot be built, an engine failure, a bug of ours) becomes that
cell's outcome, so the run always goes on to the next cell; only an interrupt
escapes.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from repromatrix.backends.base import Backend, Execution, Placement, Prepared
from repromatrix.backends.harness_spec import build_spec
from repromatrix.errors import RepromatrixError
from repromatrix.harness.harness import PROTOCOL_PREFIX
from repromatrix.harness.oomwatch import LINE_PREFIX
from repromatrix.patterns import compile_pattern
from repromatrix.results.schema import GpuFact
from repromatrix.results.store import CellResult, Timings
from repromatrix.run import outcome
from repromatrix.run.outcome import Decision, HarnessStatus
from repromatrix.triage import Triager
from repromatrix.values import Cell


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


NOT_RUN = Execution(exit_code=None, log=b"")


# Lines the harness prints itself (its protocol, its own notes): never the engine's, so
# never the line a scenario interrupts on.
HARNESS_LINES = (PROTOCOL_PREFIX.encode(), LINE_PREFIX.encode())
LONGEST_LINE = 1 << 20  # bytes of an unfinished line kept for the interrupt's match


class InterruptOn:
    """Sends the scenario's interrupt (``send``) the first time a line of the cell's output
    matches ``interrupt_on``: RE2 (``patterns.py``) on each whole line, on the host, as the
    output streams; the harness then SIGTERMs the server (``harness.Interrupt``)."""

    def __init__(self, pattern: str, send: Callable[[], None]) -> None:
        self.pattern = compile_pattern(pattern)
        self.send = send
        self.line: str | None = None  # the line that matched, once one has
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        """Read the next chunk of output; send the interrupt at the first matching line."""
        if self.line is not None:
            return
        *lines, rest = (self._partial + chunk).split(b"\n")
        self._partial = rest[-LONGEST_LINE:]
        for raw in lines:
            if raw.startswith(HARNESS_LINES):
                continue
            text = raw.decode("utf-8", errors="replace").rstrip("\r")
            if self.pattern.search(text):
                self.line, self._partial = text, b""
                self.send()
                return


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
        status = outcome.parse_status(b"\n".join(lines))
        self.answered = status is not None and status.ready and status.answered


def make_watcher(
    cell: Cell, interrupt: Callable[[], None] = lambda: None
) -> tuple[Callable[[bytes], bool], Triager]:
    """A watcher that feeds a live ``Triager`` and asks to stop once it is terminal (never
    after the harness said the engine answered: ``Served``); with a scenario's
    ``interrupt_on``, it calls ``interrupt`` when a line first matches it.

    Triage is given the cell's own scenario only, so ``signature_seen`` means
    *this* cell's documented crash, never another scenario's.
    """
    triager = Triager(cell.watched)
    interrupt_on = InterruptOn(cell.interrupt_on, interrupt) if cell.interrupt_on else None
    served = Served()

    def on_output(chunk: bytes) -> bool:
        if interrupt_on is not None:
            interrupt_on.feed(chunk)
        served.feed(chunk)
        triager.feed(chunk)
        return triager.terminal and not served.answered

    return on_output, triager


@dataclass(frozen=True)
class CellRun:
    """What running one cell gave: the decision, the backend's facts, the harness's status,
    and what the engine stated it chose and sized (``triage.facts``)."""

    decision: Decision
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
    watch, triager = make_watcher(cell, lambda: backend.interrupt(cell.id))
    execution = backend.execute(cell, spec, context.prepared, watch, placement)
    # What the backend kept after the watcher last read still counts: the output drained
    # once an early stop killed the container (the harness's OOM report can come last), or
    # a log read again after the live stream broke.
    triager.feed(execution.log[triager.bytes_read :])
    status = outcome.parse_status(execution.log)
    if status is not None and status.oom_killed:
        # Docker's OOMKilled can miss a killed grandchild; the harness's cgroup count does not.
        execution = replace(execution, oom_killed=True)
    if (report := oom_report(execution)) is not None:
        triager.feed(report)
        execution = replace(execution, log=execution.log + report)
    diagnosis = triager.diagnose(oom_killed=execution.oom_killed)
    decision = outcome.decide(cell, execution, status, diagnosis)
    return CellRun(decision, execution, status, diagnosis.facts)


# vLLM's executor names the process that got SIGKILL: "Worker proc VllmWorker-0 died
# unexpectedly (exit code: -9)".
_SIGKILLED = re.compile(rb"(?:proc|process) (\S+) died unexpectedly \(exit code:? -9\)")
_HARNESS_REPORT = (LINE_PREFIX + "Memory cgroup out of memory").encode()


def oom_report(execution: Execution) -> bytes | None:
    """The OOM kill in the kernel's words when Docker saw it and the harness could not say it
    (the bytes to append to the log, starting a line of their own).

    The OOM killer can end the harness with the engine (the container's exit code is then
    137 and its last lines are missing); the container's ``OOMKilled`` state remains, and
    vLLM's own log names the process that got SIGKILL.
    """
    if not execution.oom_killed or _HARNESS_REPORT in execution.log:
        return None
    named = _SIGKILLED.search(execution.log)
    victim = named.group(1).decode(errors="replace") if named else "(not named in the log)"
    # On a line of its own: the kill can cut the log in the middle of a line.
    cut = bool(execution.log) and not execution.log.endswith(b"\n")
    return (b"\n" if cut else b"") + (
        f"{LINE_PREFIX}Memory cgroup out of memory: Killed process {victim} "
        "(the container's State.OOMKilled; the harness did not outlive the kill)\n"
    ).encode()


def run_cell(
    backend: Backend, cell: Cell, context: CellContext, placement: Placement | None = None
) -> CellRun:
    """One cell, every failure mapped to an outcome here; only an interrupt escapes.

    Safe to call from several threads at once: each call has its own triager and log.
    """
    if context.prepared is None or context.prepared.error is not None:
        why = context.prepared.error if context.prepared else "image was not prepared"
        return CellRun(outcome.infra_error(f"image not available: {why}"), NOT_RUN)
    try:
        return execute_cell(backend, cell, context, placement)
    except RepromatrixError as exc:
        return CellRun(outcome.infra_error(str(exc)), NOT_RUN)
    except Exception as exc:
        # A bug of ours must not cost the rest of the run; the traceback goes in the log.
        trace = traceback.format_exc().encode()
        return CellRun(outcome.infra_error(f"internal error: {exc!r}"), Execution(None, trace))


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
    ready, answered = outcome.served(status, execution.log)  # the status, or the log's own word
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

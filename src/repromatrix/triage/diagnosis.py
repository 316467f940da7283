"""The answer triage gives about one log: the root cause and what to do about it.

``format_diagnosis`` writes it as a person reads it: the cause first, then what
it means and what to do. Log lines are shown through ``visible``: a log may
hold escape sequences that a terminal would act on.
"""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

from repromatrix.triage.facts import NO_FACTS, EngineFacts
from repromatrix.triage.fixes import FlagFix
from repromatrix.visible import visible

WIDTH = 92
MAX_SHOWN = 400  # characters of a log line shown in text output (JSON keeps all)
_LAYERS = {
    "image_pull": "pulling the image",
    "container_start": "starting the container",
    "engine_startup": "engine start-up",
    "first_request": "the first request (the server was up)",
    "hang": "a hang or time-out",
}


@dataclass(frozen=True)
class RootCause:
    """What triage named as the cause of a failure."""

    line: str  # the verbatim log line
    process: str | None = None  # "EngineCore", "Worker_TP0", "APIServer", None for unprefixed
    exception: str | None = None  # "ValueError", "AssertionError", ...
    message: str | None = None
    category: str | None = None  # catalogue category, e.g. "kv_cache_too_small"
    scenario: str | None = None  # id of the documented scenario it matches
    layer: str | None = None  # image_pull | container_start | engine_startup | first_request | hang


# The cause where the kernel's OOM killer ended the container and nothing names a process:
# the log cannot show it (the process just vanishes), so the fact becomes the root cause.
CONTAINER_OOM = RootCause(
    line="container killed for memory (OOMKilled)",
    exception="OOMKilled",
    category="host_oom",
    layer="engine_startup",
)


@dataclass(frozen=True)
class OomKill:
    """The kernel's OOM killer ended the cell's container or a process in it: data the
    runner hands triage (``Triager.diagnose``), from the harness's records of each kill, or
    the container's state where the kill took the harness too. Triage names the cause from
    it, never from the harness's line in the log."""

    lines: tuple[str, ...]  # each kill in the kernel's words (``oomwatch.kill_line``)
    container: bool = False  # the container's State.OOMKilled


@dataclass(frozen=True)
class RequestError:
    """A request the running server refused: a failure of that request, not of the server."""

    line: str  # the verbatim line that states it
    line_number: int
    message: str
    status: int | None  # the HTTP status the server answered with, when the log shows it


@dataclass(frozen=True)
class Diagnosis:
    """The root cause of a failure in a log (or why none was found), with its fix.

    ``root_cause.line`` is the verbatim line that states the cause, exactly as it
    appeared after decoding; ``line_number`` says where. ``final_error`` is the
    generic message vLLM ended on (``Engine core initialization failed``...), a
    consequence shown for context. ``signature_seen`` tells whether any line
    matched the signatures of the scenarios triage was given. ``request_errors``
    are the first requests the running server refused (``requests_refused`` counts
    them all): never the root cause, whatever else the log shows. ``fix_flags`` are the
    catalogue's fix for the cause as flag and environment changes, one workaround each.
    ``facts`` is what the engine stated it chose and sized (``triage.facts``);
    ``reached_seen`` names the scenarios whose ``reached`` evidence (a line or a fact)
    the log holds.
    """

    root_cause: RootCause | None
    explanation: str
    fix: str
    fix_flags: tuple[FlagFix, ...] = ()
    workarounds: tuple[str, ...] = ()
    excerpt: tuple[str, ...] = ()
    last_errors: tuple[str, ...] = ()
    signature_seen: bool = False
    title: str | None = None  # the catalogue's name for the category
    scenario_title: str | None = None
    line_number: int | None = None
    scenarios_seen: tuple[str, ...] = ()
    final_error: str | None = None
    lines_read: int = 0
    notes: tuple[str, ...] = ()
    request_errors: tuple[RequestError, ...] = ()
    requests_refused: int = 0
    facts: EngineFacts = field(default_factory=lambda: NO_FACTS)
    reached_seen: tuple[str, ...] = ()

    @property
    def category(self) -> str | None:
        """The catalogue category of the root cause, if any."""
        return self.root_cause.category if self.root_cause else None

    @property
    def scenario(self) -> str | None:
        """The id of the documented scenario the root cause matches, if any."""
        return self.root_cause.scenario if self.root_cause else None

    def shows(self, scenario_id: str) -> bool:
        """Whether this log shows ``scenario_id``'s crash: the one rule for a documented match.

        True when a line matched one of its signatures (printed by the process the signature
        names) or the root cause is it. It depends only on that scenario's signatures, never
        on which other scenarios triage was given, so ``repromatrix triage`` with the whole
        catalogue and the runner with a cell's scenarios agree; ``run.cell.decide`` calls it.
        """
        return scenario_id in self.scenarios_seen or self.scenario == scenario_id

    def reached(self, scenario_id: str) -> bool:
        """Whether this log shows ``scenario_id``'s code path entered: its crash shown, or any
        of its ``reached`` evidence seen (the runner's ``not_reached`` asks this)."""
        return self.shows(scenario_id) or scenario_id in self.reached_seen

    @property
    def layer(self) -> str | None:
        """Where the failure happened: image_pull ... engine_startup, first_request, hang."""
        return self.root_cause.layer if self.root_cause else None

    def to_json(self) -> dict[str, Any]:
        """The JSON form printed by ``repromatrix triage --json``."""
        return {
            "root_cause": asdict(self.root_cause) if self.root_cause else None,
            "line_number": self.line_number,
            "category": self.category,
            "title": self.title,
            "scenario": self.scenario,
            "scenario_title": self.scenario_title,
            "layer": self.layer,
            "explanation": self.explanation,
            "fix": self.fix,
            "fix_flags": [fix.to_json() for fix in self.fix_flags],
            "workarounds": list(self.workarounds),
            "excerpt": list(self.excerpt),
            "last_errors": list(self.last_errors),
            "final_error": self.final_error,
            "signature_seen": self.signature_seen,
            "scenarios_seen": list(self.scenarios_seen),
            "lines_read": self.lines_read,
            "notes": list(self.notes),
            "request_errors": [asdict(error) for error in self.request_errors],
            "requests_refused": self.requests_refused,
            "facts": dict(self.facts),
            "reached": list(self.reached_seen),
        }


def format_diagnosis(diagnosis: Diagnosis) -> str:
    """The short answer ``repromatrix triage`` prints."""
    if diagnosis.root_cause is None:
        return _no_cause(diagnosis)
    cause = diagnosis.root_cause
    where = f"line {diagnosis.line_number}" if diagnosis.line_number else "the log"
    who = f", printed by {cause.process}" if cause.process else ""
    parts = [f"Root cause ({where}{who}):", _indent_line(cause.line)]
    what = diagnosis.title or (cause.exception or "an unrecognised error")
    labels = ", ".join(x for x in (cause.category, _LAYERS.get(cause.layer or "")) if x)
    parts += [
        f"What it is: {what}" + (f" [{labels}]" if labels else ""),
        _wrap(diagnosis.explanation),
    ]
    if diagnosis.fix:
        parts += ["Fix:", _wrap(diagnosis.fix)]
    if diagnosis.fix_flags:
        parts.append("Flag changes that may avoid it (each one a workaround):")
        parts += [_wrap(f"- {fix.describe()}") for fix in diagnosis.fix_flags]
    if cause.scenario:
        title = f": {diagnosis.scenario_title}" if diagnosis.scenario_title else ""
        parts.append(f"Documented scenario: {cause.scenario}{title}")
    if diagnosis.workarounds:
        parts += ["Workarounds:", *(_wrap(f"- {w}") for w in diagnosis.workarounds)]
    if diagnosis.final_error and diagnosis.final_error != cause.line:
        parts += [
            "vLLM ended with (a consequence of the above):",
            _indent_line(diagnosis.final_error),
        ]
    if diagnosis.excerpt:
        parts += ["Excerpt:", *(_indent_line(line, "  | ") for line in diagnosis.excerpt)]
    parts += _refused(diagnosis)
    parts += _facts_lines(diagnosis)
    return visible("\n".join(parts), multiline=True) + "\n"


def _no_cause(diagnosis: Diagnosis) -> str:
    parts = ["No root cause found in this log.", _wrap(diagnosis.explanation)]
    parts += [_wrap(f"Note: {note}.") for note in diagnosis.notes]
    if diagnosis.fix:
        parts += ["What to do:", _wrap(diagnosis.fix)]
    if diagnosis.last_errors and not diagnosis.requests_refused:
        parts += ["Last error lines:", *(_indent_line(line) for line in diagnosis.last_errors)]
    parts += _refused(diagnosis)
    parts += _facts_lines(diagnosis)
    parts.append(f"({diagnosis.lines_read} lines read)")
    return visible("\n".join(parts), multiline=True) + "\n"


def _refused(diagnosis: Diagnosis) -> list[str]:
    if not diagnosis.requests_refused:
        return []
    lines = [f"Requests refused ({diagnosis.requests_refused}):"]
    for error in diagnosis.request_errors:
        answered = f", answered {error.status}" if error.status else ""
        lines += [f"  - line {error.line_number}{answered}:", _indent_line(error.line, "    ")]
    if diagnosis.requests_refused > len(diagnosis.request_errors):
        lines.append(f"  ... and {diagnosis.requests_refused - len(diagnosis.request_errors)} more")
    return lines


def _facts_lines(diagnosis: Diagnosis) -> list[str]:
    """What the engine stated, one ``name: value`` a line (nothing when it stated nothing)."""
    if not diagnosis.facts:
        return []
    stated = (f"  {name}: {value}" for name, value in diagnosis.facts.items())
    return ["The engine stated:", *stated]


def _wrap(text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent="  ", subsequent_indent="  ")


def _indent_line(line: str, prefix: str = "  ") -> str:
    shown = line if len(line) <= MAX_SHOWN else line[:MAX_SHOWN] + " [...]"
    return prefix + visible(shown)

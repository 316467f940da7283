"""A diagnosis as a person reads it: the cause first, then what it means and what to do.

Log lines are shown through ``visible``: a log may hold escape sequences that a
terminal would act on.
"""

from __future__ import annotations

import textwrap

from repromatrix.triage.diagnosis import Diagnosis
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
    return visible("\n".join(parts), multiline=True) + "\n"


def _no_cause(diagnosis: Diagnosis) -> str:
    parts = ["No root cause found in this log.", _wrap(diagnosis.explanation)]
    parts += [_wrap(f"Note: {note}.") for note in diagnosis.notes]
    if diagnosis.fix:
        parts += ["What to do:", _wrap(diagnosis.fix)]
    if diagnosis.last_errors:
        parts += ["Last error lines:", *(_indent_line(line) for line in diagnosis.last_errors)]
    parts.append(f"({diagnosis.lines_read} lines read)")
    return visible("\n".join(parts), multiline=True) + "\n"


def _wrap(text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent="  ", subsequent_indent="  ")


def _indent_line(line: str, prefix: str = "  ") -> str:
    shown = line if len(line) <= MAX_SHOWN else line[:MAX_SHOWN] + " [...]"
    return prefix + visible(shown)

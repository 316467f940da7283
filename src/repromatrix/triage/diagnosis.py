"""The answer triage gives about one log: the root cause and what to do about it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from repromatrix.results.store import RootCause


@dataclass(frozen=True)
class Diagnosis:
    """The root cause of a failure in a log (or why none was found), with its fix.

    ``root_cause.line`` is the verbatim line that states the cause, exactly as it
    appeared after decoding; ``line_number`` says where. ``final_error`` is the
    generic message vLLM ended on (``Engine core initialization failed``...), a
    consequence shown for context. ``signature_seen`` tells whether any line
    matched the signatures of the scenarios triage was given.
    """

    root_cause: RootCause | None
    explanation: str
    fix: str
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
        catalogue and the runner with a cell's scenarios agree; ``run.outcome`` calls it.
        """
        return scenario_id in self.scenarios_seen or self.scenario == scenario_id

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
            "workarounds": list(self.workarounds),
            "excerpt": list(self.excerpt),
            "last_errors": list(self.last_errors),
            "final_error": self.final_error,
            "signature_seen": self.signature_seen,
            "scenarios_seen": list(self.scenarios_seen),
            "lines_read": self.lines_read,
            "notes": list(self.notes),
        }

"""``--check``: triage logs with the draft alone; it must show in its own log and in no
healthy one (``Diagnosis.shows``, the rule the runner's outcome uses)."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix.matrix.scenarios import load_scenario
from repromatrix.model import Scenario
from repromatrix.triage import triage_path

HEALTHY_LOGS = Path("tests/data/logs/healthy")  # the healthy starts the project ships


def load_draft(scenario_id: str, text: str) -> Scenario:
    """The draft as the scenario loader reads it (a ``ConfigError`` lists every problem)."""
    with tempfile.TemporaryDirectory(prefix="repromatrix-draft-") as folder:
        path = Path(folder) / f"{scenario_id}.yaml"
        path.write_text(text, encoding="utf-8")
        return load_scenario(path)


def shows(scenario: Scenario, log: Path) -> bool:
    """Whether triage with ``scenario`` alone says ``log`` shows its crash."""
    return triage_path(log, (scenario,)).shows(scenario.id)


@dataclass(frozen=True)
class CheckReport:
    """The draft on its source log and on healthy logs."""

    source: Path
    source_matched: bool
    healthy: tuple[Path, ...]
    healthy_matched: tuple[Path, ...]

    @property
    def passed(self) -> bool:
        """Its own log matched, no healthy log did, and there were healthy logs to try."""
        return self.source_matched and not self.healthy_matched and bool(self.healthy)

    def lines(self) -> list[str]:
        """The report, a line each."""
        own = "matches" if self.source_matched else "does NOT match"
        out = [f"source log {self.source}: the draft {own} it"]
        if not self.healthy:
            out.append("no healthy logs to check against")
        out.append(f"healthy logs: {len(self.healthy_matched)} of {len(self.healthy)} matched")
        out += [f"  matched a healthy log: {path}" for path in self.healthy_matched]
        out.append("check passed" if self.passed else "check FAILED")
        return out


def healthy_logs(folder: Path) -> tuple[Path, ...]:
    """The logs of a folder of healthy starts (``*.log``, ``*.log.gz``, ``*.txt``)."""
    found = [
        p for p in folder.iterdir() if p.is_file() and p.name.endswith((".log", ".gz", ".txt"))
    ]
    return tuple(sorted(found))


def check_draft(scenario: Scenario, source: Path, healthy: Sequence[Path]) -> CheckReport:
    """Triage the source log and each healthy log with the draft."""
    matched = tuple(log for log in healthy if shows(scenario, log))
    return CheckReport(source, shows(scenario, source), tuple(healthy), matched)

"""``--check``: triage logs with the draft alone; it must show in its own log, in no healthy
one and in no crash log of another cause (``Diagnosis.shows``, the rule the runner's
outcome uses).

The crash logs of other causes are a folder of labelled logs (``labels.yaml`` in it or in
its subfolders: each entry's ``file``, ``category`` and ``root_cause_line``), by default
the project's own test logs (``tests/data/logs``, real logs of public issues and of this
project's CPU lane, each with its source). They are test data, not package data: a
checkout has them, an installed package is given a folder with ``--crashes``. A log is of
another cause when its label names another category, or, where either has none, when its
root cause line is not the draft's message with other numbers.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from repromatrix.errors import ConfigError, Problem
from repromatrix.matrix.scenarios import load_scenario
from repromatrix.triage import triage_path
from repromatrix.triage.diagnosis import RootCause
from repromatrix.values import Scenario

HEALTHY_LOGS = Path("tests/data/logs/healthy")  # the healthy starts the project ships
CRASH_LOGS = Path("tests/data/logs")  # the project's labelled crash logs
LABELS = "labels.yaml"


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
    """The draft on its source log, on healthy logs and on crash logs of other causes."""

    source: Path
    source_matched: bool
    healthy: tuple[Path, ...]
    healthy_matched: tuple[Path, ...]
    others: tuple[Path, ...] = ()
    others_matched: tuple[Path, ...] = ()

    @property
    def passed(self) -> bool:
        """Its own log matched, no healthy log and no log of another cause did, and there
        were both to try."""
        return (
            self.source_matched
            and not self.healthy_matched
            and not self.others_matched
            and bool(self.healthy)
            and bool(self.others)
        )

    def lines(self) -> list[str]:
        """The report, a line each."""
        own = "matches" if self.source_matched else "does NOT match"
        out = [f"source log {self.source}: the draft {own} it"]
        if not self.healthy:
            out.append("no healthy logs to check against")
        out.append(f"healthy logs: {len(self.healthy_matched)} of {len(self.healthy)} matched")
        out += [f"  matched a healthy log: {path}" for path in self.healthy_matched]
        if not self.others:
            out.append("no crash logs of other causes to check against (--crashes DIR)")
        matched = len(self.others_matched)
        out.append(f"crash logs of other causes: {matched} of {len(self.others)} matched")
        out += [f"  matched a log of another cause: {path}" for path in self.others_matched]
        if self.others_matched:
            out.append("the signature is not specific: keep what names the failing thing")
        out.append("check passed" if self.passed else "check FAILED")
        return out


@dataclass(frozen=True)
class KnownCrash:
    """A labelled crash log: its file, its category and the line that states its cause."""

    path: Path
    category: str | None
    line: str


def healthy_logs(folder: Path) -> tuple[Path, ...]:
    """The logs of a folder of healthy starts (``*.log``, ``*.log.gz``, ``*.txt``)."""
    found = [
        p for p in folder.iterdir() if p.is_file() and p.name.endswith((".log", ".gz", ".txt"))
    ]
    return tuple(sorted(found))


def crash_logs(folder: Path) -> tuple[KnownCrash, ...]:
    """The labelled crash logs of ``folder``: the entries of its ``labels.yaml`` and its
    subfolders' that name a root cause line (a healthy log's label names none)."""
    found: list[KnownCrash] = []
    for labels in sorted([folder / LABELS, *folder.glob(f"*/{LABELS}")]):
        if labels.is_file():
            found += _labelled(labels)
    return tuple(found)


def _labelled(labels: Path) -> list[KnownCrash]:
    try:
        entries: Any = yaml.safe_load(labels.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        raise ConfigError(
            [Problem(str(labels), line, 0, f"cannot read the labels: {exc}")]
        ) from exc
    found = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        file, line, category = (
            entry.get("file"),
            entry.get("root_cause_line"),
            entry.get("category"),
        )
        path = labels.parent / str(file)
        if isinstance(file, str) and isinstance(line, str) and line and path.is_file():
            found.append(KnownCrash(path, category if isinstance(category, str) else None, line))
    return found


def other_causes(crashes: Sequence[KnownCrash], source: Path, cause: RootCause) -> tuple[Path, ...]:
    """The crash logs whose cause is not the draft's (the source log itself left out)."""
    here = source.resolve()
    return tuple(
        crash.path
        for crash in crashes
        if crash.path.resolve() != here and not _same_cause(crash, cause)
    )


def _same_cause(crash: KnownCrash, cause: RootCause) -> bool:
    if crash.category is not None and cause.category is not None:
        return crash.category == cause.category
    message = _numbers_aside(cause.message or cause.line).strip()[:60]
    return bool(message) and message in _numbers_aside(crash.line)


def _numbers_aside(text: str) -> str:
    return re.sub(r"[0-9]+", "N", text)


def check_draft(
    scenario: Scenario, source: Path, healthy: Sequence[Path], others: Sequence[Path] = ()
) -> CheckReport:
    """Triage the source log, each healthy log and each log of another cause with the draft."""
    matched = tuple(log for log in healthy if shows(scenario, log))
    wrong = tuple(log for log in others if shows(scenario, log))
    return CheckReport(
        source, shows(scenario, source), tuple(healthy), matched, tuple(others), wrong
    )

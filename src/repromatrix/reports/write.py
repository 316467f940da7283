"""Every report of a run, rebuilt from its saved cell results: junit.xml and compat.{md,html,json}.

``write_reports(run_dir)`` is what the runner calls at the end of a run and
what ``repromatrix report`` calls on any machine later. It reports whatever is
readable and names each problem with the run's files once: an unreadable or
truncated result, a result from another schema version, a cell that started
and never finished, a planned cell that never ran, shards that disagreed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repromatrix.reports.excerpt import ExcerptLimits, log_excerpt
from repromatrix.reports.findings import (
    ReportOptions,
    build_findings,
    default_options,
    findings_json,
)
from repromatrix.reports.html import format_html
from repromatrix.reports.junit import build_junit, write_junit
from repromatrix.reports.markdown import format_markdown
from repromatrix.reports.table import build_table, compat_json
from repromatrix.results.store import (
    LOG_FILE,
    RESULT_FILE,
    SCHEMA_VERSION,
    CellResult,
    atomic_write,
    cell_dir,
    iter_result_files,
)
from repromatrix.results.verdicts import (
    SEVERITY,
    Judged,
    ProblemKind,
    RunProblem,
    Verdict,
    judge_all,
    unique_problems,
)

JUNIT_FILE = "junit.xml"
MARKDOWN_FILE = "compat.md"
HTML_FILE = "compat.html"
JSON_FILE = "compat.json"
PLAN_FILE = "plan.json"  # the ids a run meant to run (optional; written by the runner)
MERGE_FILE = "merge.json"  # problems found while merging shards (written by ``merge``)
EXCERPT_LIMITS = ExcerptLimits()
EXCERPT_BUDGET = 16 * 1024 * 1024  # all excerpts together; the most urgent cells get them first


@dataclass(frozen=True)
class LoadedRun:
    """What could be read from a run folder, and what could not."""

    results: tuple[CellResult, ...]
    problems: tuple[RunProblem, ...]


@dataclass(frozen=True)
class ReportSummary:
    """What ``write_reports`` wrote and found."""

    run_dir: Path
    files: tuple[Path, ...]
    cells: int
    counts: Mapping[Verdict, int]
    problems: tuple[RunProblem, ...]

    def lines(self) -> list[str]:
        """A few lines for a terminal: counts, problems, where the reports are."""
        counts = ", ".join(f"{n} {v.value.replace('_', ' ')}" for v, n in self.counts.items())
        out = [f"{self.cells} cells: {counts or 'none'}"]
        out += [f"problem: {p}" for p in self.problems]
        out += [f"wrote {path}" for path in self.files]
        return out


def write_reports(run_dir: Path, options: ReportOptions | None = None) -> ReportSummary:
    """Write junit.xml, compat.md, compat.html and compat.json into ``run_dir``."""
    loaded = load_run(run_dir)
    judged = judge_all(loaded.results)
    problems = unique_problems(
        [
            *loaded.problems,
            *unfinished_cells(run_dir),
            *never_ran(run_dir, loaded.results),
            *merge_problems(run_dir),
        ]
    )
    table = build_table(judged)
    excerpts = load_excerpts(run_dir, judged, EXCERPT_LIMITS, EXCERPT_BUDGET)
    run = run_dir.resolve().name
    findings = build_findings(judged, run, options or default_options(run_dir))
    write_junit(build_junit(judged, problems, excerpts), run_dir / JUNIT_FILE)
    markdown = format_markdown(table, judged, problems, run, findings=findings)
    _write_text(run_dir / MARKDOWN_FILE, markdown)
    _write_text(run_dir / HTML_FILE, format_html(table, problems, run, excerpts, findings))
    document = compat_json(table, judged, problems, run, findings_json(findings))
    _write_text(run_dir / JSON_FILE, json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    files = tuple(run_dir / name for name in (JUNIT_FILE, MARKDOWN_FILE, HTML_FILE, JSON_FILE))
    return ReportSummary(run_dir, files, table.cells, table.counts, problems)


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, text.encode("utf-8"))


def load_run(run_dir: Path) -> LoadedRun:
    """Read every cell result below ``run_dir``; name each file that cannot be used, and why."""
    results: list[CellResult] = []
    problems: list[RunProblem] = []
    for path in sorted(iter_result_files(run_dir)):
        where = path.relative_to(run_dir).as_posix()
        try:
            results.append(parse_result(path.read_bytes()))
        except ResultProblem as exc:
            problems.append(RunProblem(exc.kind, where, str(exc)))
        except OSError as exc:
            problems.append(RunProblem(ProblemKind.CORRUPT, where, f"unreadable: {exc}"))
    return LoadedRun(tuple(results), tuple(problems))


class ResultProblem(ValueError):
    """A result.json that cannot be reported, with the kind of trouble."""

    def __init__(self, kind: ProblemKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_result(data: bytes) -> CellResult:
    """Parse one result.json, raising ``ResultProblem`` with a sentence for a person."""
    if not data.strip():
        raise ResultProblem(ProblemKind.CORRUPT, "empty file (the run was cut off while writing)")
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ResultProblem(
            ProblemKind.CORRUPT, f"not valid JSON, truncated or corrupt ({exc})"
        ) from exc
    if not isinstance(raw, dict):
        raise ResultProblem(ProblemKind.CORRUPT, f"a JSON {type(raw).__name__}, not an object")
    version = raw.get("schema_version", 0)
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise ResultProblem(
            ProblemKind.SCHEMA,
            f"written by a newer repromatrix (schema_version {version}; this one reads "
            f"up to {SCHEMA_VERSION}): report it with that version",
        )
    try:
        return CellResult.from_json(raw)
    except ValueError as exc:
        if isinstance(version, int) and version < SCHEMA_VERSION:
            raise ResultProblem(
                ProblemKind.SCHEMA,
                f"written with an older schema (schema_version {version}) that this "
                f"repromatrix cannot read: {exc}",
            ) from exc
        raise ResultProblem(ProblemKind.CORRUPT, str(exc)) from exc


def unfinished_cells(run_dir: Path) -> list[RunProblem]:
    """Cells with a log or a half-written file but no result: the run stopped inside them."""
    problems = []
    cells = run_dir / "cells"
    for folder, _dirs, files in os.walk(cells):
        names = set(files)
        if RESULT_FILE in names:
            continue
        if LOG_FILE in names or any(n.startswith(f".{RESULT_FILE}.") for n in names):
            where = Path(folder).relative_to(cells).as_posix()
            problems.append(
                RunProblem(
                    ProblemKind.INCOMPLETE,
                    where,
                    "the cell started but has no result (the run was interrupted): "
                    "`repromatrix run --resume` runs it again",
                )
            )
    return problems


def write_plan(run_dir: Path, cell_ids: Iterable[str]) -> None:
    """Record the cells a run means to run, so a report can name those that never ran."""
    body = {"schema_version": SCHEMA_VERSION, "cells": sorted(set(cell_ids))}
    atomic_write(run_dir / PLAN_FILE, json.dumps(body, indent=1).encode() + b"\n")


def read_plan(run_dir: Path) -> tuple[frozenset[str] | None, list[RunProblem]]:
    """The planned cell ids (None when the run has no plan.json), and any problem reading it."""
    document, problems = _read_json(run_dir, PLAN_FILE)
    if document is None:
        return None, problems
    cells = document.get("cells")
    if not isinstance(cells, list):
        return None, [RunProblem(ProblemKind.CORRUPT, PLAN_FILE, "no list of cells")]
    return frozenset(str(c) for c in cells), problems


def never_ran(run_dir: Path, results: Sequence[CellResult]) -> list[RunProblem]:
    """Planned cells with no result folder at all: the run ended before reaching them."""
    planned, problems = read_plan(run_dir)
    if planned is None:
        return problems
    done = {r.id for r in results}
    missing = sorted(c for c in planned - done if not cell_dir(run_dir, c).exists())
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        problems.append(
            RunProblem(
                ProblemKind.INCOMPLETE,
                PLAN_FILE,
                f"{len(missing)} of {len(planned)} planned cells never ran (a half-finished "
                f"run: `repromatrix run --resume` completes it): {shown}",
            )
        )
    return problems


def merge_problems(run_dir: Path) -> list[RunProblem]:
    """The problems ``merge`` recorded in merge.json (conflicting shards, unreadable files)."""
    document, problems = _read_json(run_dir, MERGE_FILE)
    if document is None:
        return problems
    for item in document.get("problems", []):
        try:
            problems.append(RunProblem.from_json(item))
        except (ValueError, TypeError, AttributeError):
            problems.append(RunProblem(ProblemKind.CORRUPT, MERGE_FILE, f"bad entry {item!r}"))
    return problems


def _read_json(run_dir: Path, name: str) -> tuple[dict[str, Any] | None, list[RunProblem]]:
    path = run_dir / name
    if not path.exists():
        return None, []
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        return None, [RunProblem(ProblemKind.CORRUPT, name, f"unreadable: {exc}")]
    if not isinstance(document, dict):
        return None, [RunProblem(ProblemKind.CORRUPT, name, "not a JSON object")]
    return document, []


def load_excerpts(
    run_dir: Path, judged: Sequence[Judged], limits: ExcerptLimits, budget: int
) -> dict[str, str]:
    """Log excerpts for as many cells as ``budget`` bytes allow, the most urgent verdicts first."""
    excerpts: dict[str, str] = {}
    used = 0
    for item in sorted(judged, key=lambda j: (SEVERITY.index(j.verdict), j.result.id)):
        if used + limits.max_bytes > budget:
            break
        path = cell_dir(run_dir, item.result.id) / LOG_FILE
        if not path.is_file():
            continue
        anchor = item.result.root_cause.line if item.result.root_cause else None
        text = log_excerpt(path, anchor, limits)
        excerpts[item.result.id] = text
        used += len(text.encode("utf-8"))
    return excerpts

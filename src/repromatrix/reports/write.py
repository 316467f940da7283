"""Every report of a run, rebuilt from its saved cell results: junit.xml and compat.{md,html,json}.

``write_reports(run_dir)`` is what the runner calls at the end of a run and
what ``repromatrix report`` calls on any machine later. It reports whatever is
readable and names each problem with the run's files once: an unreadable,
truncated or malformed result, a result from another schema version, a cell
that started and never finished, a planned cell that never ran, shards that
disagreed. All of it is read through ``results.store.read_run``; a log that is
a link out of the run folder is never read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix.judgement import FAILING, SEVERITY, Verdict, label, worst
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
from repromatrix.reports.upgrade import UpgradeView
from repromatrix.results.store import atomic_write, log_file, read_run
from repromatrix.results.verdicts import Judged, RunProblem, judge_all
from repromatrix.visible import escape_json, visible

JUNIT_FILE = "junit.xml"
MARKDOWN_FILE = "compat.md"
HTML_FILE = "compat.html"
JSON_FILE = "compat.json"
EXCERPT_LIMITS = ExcerptLimits()
EXCERPT_BUDGET = 16 * 1024 * 1024  # all excerpts together; the most urgent cells get them first


@dataclass(frozen=True)
class ReportSummary:
    """What ``write_reports`` wrote and found."""

    run_dir: Path
    files: tuple[Path, ...]
    cells: int
    counts: Mapping[Verdict, int]
    problems: tuple[RunProblem, ...]
    answer: tuple[str, ...] = ()  # the run's last lines (``answer_lines``)

    def lines(self) -> list[str]:
        """A few lines for a terminal: counts, problems, where the reports are."""
        counts = ", ".join(f"{n} {label(v)}" for v, n in self.counts.items())
        out = [f"{self.cells} cells: {counts or 'none'}"]
        out += [f"problem: {p}" for p in self.problems]
        out += [f"wrote {path}" for path in self.files]
        return out


def write_reports(run_dir: Path, options: ReportOptions | None = None) -> ReportSummary:
    """Write junit.xml, compat.md, compat.html and compat.json into ``run_dir``."""
    loaded = read_run(run_dir)
    judged = judge_all(loaded.results)
    problems = loaded.problems
    table = build_table(judged)
    excerpts = load_excerpts(run_dir, judged, EXCERPT_LIMITS, EXCERPT_BUDGET)
    run = run_dir.resolve().name
    findings = build_findings(judged, run, options or default_options(run_dir))
    write_junit(build_junit(judged, problems, excerpts), run_dir / JUNIT_FILE)
    markdown = format_markdown(table, judged, problems, run, findings=findings)
    write_page(run_dir / MARKDOWN_FILE, markdown)
    write_page(run_dir / HTML_FILE, format_html(table, problems, run, excerpts, findings))
    document = compat_json(table, judged, problems, run, findings_json(findings))
    text = json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False)
    _write_text(run_dir / JSON_FILE, escape_json(text) + "\n")
    files = tuple(run_dir / name for name in (JUNIT_FILE, MARKDOWN_FILE, HTML_FILE, JSON_FILE))
    answer = answer_lines(findings.upgrade, judged, run_dir / MARKDOWN_FILE)
    return ReportSummary(run_dir, files, table.cells, table.counts, problems, answer)


DISAGREEMENTS_SHOWN = 5


def answer_lines(view: UpgradeView, judged: Sequence[Judged], compat: Path) -> tuple[str, ...]:
    """The last lines of a run: the upgrade answer per image (the worst of its configurations,
    with what makes it so), every verdict that disagrees with the documents, and the path of
    compat.md."""
    lines: list[str] = []
    for lane in view.lanes:
        for tag in lane.tags:
            found = [lane.safeties[key] for key in lane.safeties if key[0] == tag]
            safety = worst(one.safety for one in found)
            shown = next(one for one in found if one.safety is safety)
            lines.append(f"{lane.lane} {lane.row_label(tag)}: {shown.words}")
    differ = [j for j in judged if j.verdict in FAILING]
    for item in differ[:DISAGREEMENTS_SHOWN]:
        lines.append(f"differs from the documents: {item.result.id}: {label(item.verdict)}")
    if len(differ) > DISAGREEMENTS_SHOWN:
        lines.append(f"and {len(differ) - DISAGREEMENTS_SHOWN} more that differ")
    lines.append(f"the full answer: {compat}")
    return tuple(lines)


def write_page(path: Path, text: str) -> None:
    """Write a page people read (Markdown, HTML): text from logs and results may hold escapes
    and bidi controls that would rewrite what a reader sees; they are written ``visible``."""
    _write_text(path, visible(text, multiline=True))


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, text.encode("utf-8"))


def load_excerpts(
    run_dir: Path, judged: Sequence[Judged], limits: ExcerptLimits, budget: int
) -> dict[str, str]:
    """Log excerpts for as many cells as ``budget`` bytes allow, the most urgent verdicts first."""
    excerpts: dict[str, str] = {}
    used = 0
    for item in sorted(judged, key=lambda j: (SEVERITY.index(j.verdict), j.result.id)):
        if used + limits.max_bytes > budget:
            break
        path = log_file(run_dir, item.result.id)
        if path is None:
            continue
        anchor = item.result.root_cause.line if item.result.root_cause else None
        text = log_excerpt(path, anchor, limits) if isinstance(path, Path) else f"[{path}]"
        excerpts[item.result.id] = text
        used += len(text.encode("utf-8"))
    return excerpts

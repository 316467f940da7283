"""``compat.md``: the compatibility table as GitHub-flavoured Markdown, for job summaries.

The upgrade view comes first (per image and configuration: safe, safe with a
flag change, not safe, unknown: ``judgement.Safety``), then what changes between a baseline and a
candidate, the evidence against documented version ranges, and the cells
that could not run here, summarised per lane and reason. GitHub refuses a
job summary over 1 MiB, so the Markdown degrades in steps until it fits:
every entry with its short root cause, then symbols only, then a summary
(verdict counts per image tag and the cells that need attention).
The HTML and JSON reports always hold everything.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType

from repromatrix.judgement import FAILING, SEVERITY, Outcome, Safety, Verdict, label
from repromatrix.reports.findings import Findings, ReportOptions, build_findings
from repromatrix.reports.table import Agreement, Entry, Table, tag_key
from repromatrix.reports.upgrade import ImageSafety
from repromatrix.results.verdicts import Judged, RunProblem, one_line, shorten
from repromatrix.values import Level

JOINER = "\u200d"  # zero-width: what GitHub would link reads on, inert
MD_LIMIT = 1000 * 1024  # GitHub's job-summary limit is 1 MiB; keep a margin
CAUSE_CHARS = 70
MAX_PROBLEMS = 50
MAX_ATTENTION = 1000  # past this a list stops being read; compat.html has the rest

SYMBOLS: Mapping[Outcome, str] = MappingProxyType(
    {
        Outcome.HIT: "💥",
        Outcome.AVOIDED: "✅",
        Outcome.OTHER_FAILURE: "❌",
        Outcome.TIMEOUT: "⏱️",
        Outcome.INFRA_ERROR: "⚠️",
        Outcome.SKIPPED: "⏭️",
        Outcome.UNREACHABLE: "🚫",
        Outcome.NOT_REACHED: "⛔",
    }
)
PROBE_MARK = "🔬"
VERDICT_MARKS: Mapping[Verdict, str] = MappingProxyType(
    {
        **{
            v: f" **{label(v).upper()}**"
            for v in (Verdict.REGRESSION, Verdict.OUTSIDE_RANGE, Verdict.UNEXPECTED_FIX)
        },
        Verdict.UNKNOWN: " ❔",
    }
)
LEGEND = (
    "💥 crash hit · ✅ avoided · ❌ other failure · ⏱️ timeout · ⚠️ infrastructure error · "
    "⏭️ skipped · 🚫 probe could not reach the code path · ⛔ not reached: the engine served "
    "but nothing showed the crash's code path entered (not tested) · 🔬 probe level (vLLM's "
    "own code called on the trigger's shapes, no engine start) · ❔ no documented expectation · "
    f"{VERDICT_MARKS[Verdict.OUTSIDE_RANGE].strip()} hit where the documents say unaffected (the "
    f"range is too narrow) · {VERDICT_MARKS[Verdict.REGRESSION].strip()} hit again after an older "
    f"version was seen fixed · {VERDICT_MARKS[Verdict.UNEXPECTED_FIX].strip()} avoided where the "
    "documents say affected"
)


class Detail(enum.IntEnum):
    """How much each table entry says, from most to least."""

    FULL = 0  # symbol, verdict mark and short root cause
    SYMBOLS = 1  # symbol and verdict mark
    SUMMARY = 2  # no per-cell table at all


def escape(text: str) -> str:
    """Make ``text`` inert in any Markdown this tool writes (``compat.md``, job summaries,
    annotations, issue bodies), table cells included: HTML, emphasis, links and images,
    headings, pipes and line breaks are escaped, and what GitHub would link by itself is
    broken by a zero-width joiner: an ``@mention`` (which notifies its user), an e-mail
    address and a bare ``scheme://`` URL.

    The one escaping of a value from a result or a log in Markdown (``code`` for a value
    shown as code); HTML gets the same from Jinja's autoescape.
    """
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for char in "\\`*_[]|~#":
        text = text.replace(char, "\\" + char)
    text = text.replace("@", "@" + JOINER).replace("://", ":" + JOINER + "//")
    return " ".join(text.split())


def code(text: str) -> str:
    """``text`` as an inline code span, whatever it holds: on one line, fenced by one backtick
    more than its longest run of them (so it cannot close the span and write Markdown after
    it). Inside a code span nothing is rendered or linked."""
    flat = " ".join(text.split())
    if not flat:
        return ""
    fence = "`" * (max((len(run) for run in re.findall("`+", flat)), default=0) + 1)
    pad = " " if flat[0] == "`" or flat[-1] == "`" else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


SAFETY_MARKS: Mapping[Safety, str] = MappingProxyType(
    {
        Safety.SAFE: "🟢",
        Safety.SAFE_WITH_FLAG_CHANGE: "🟡",
        Safety.NOT_SAFE: "🔴",
        Safety.UNKNOWN: "⚪",
    }
)


def format_markdown(
    table: Table,
    judged: Sequence[Judged],
    problems: Sequence[RunProblem],
    run: str,
    limit: int = MD_LIMIT,
    *,
    findings: Findings | None = None,
) -> str:
    """Return ``compat.md``, as detailed as fits in ``limit`` bytes of UTF-8."""
    if findings is None:
        findings = build_findings(judged, run, ReportOptions())
    head = _head(table, problems, findings)
    if len(head.encode("utf-8")) > limit // 2:  # a huge matrix: marks only in the upgrade view
        head = _head(table, problems, findings, compact=True)
    for detail in (Detail.FULL, Detail.SYMBOLS):
        text = head + "".join(_sections(table, detail))
        if len(text.encode("utf-8")) <= limit:
            return text
    return _summary(table, judged, head, limit)


def _head(
    table: Table, problems: Sequence[RunProblem], findings: Findings, *, compact: bool = False
) -> str:
    counts = " · ".join(f"{n} {label(v)}" for v, n in table.counts.items())
    unreached = f" ({table.not_reached} of them not reached)" if table.not_reached else ""
    lines = [f"# {escape(findings.title)}", "", f"{table.cells} cells: {counts or '-'}{unreached}"]
    lines += upgrade_lines(findings, compact=compact)
    if problems:
        lines += ["", f"**{len(problems)} problem(s) with this run's files:**", ""]
        lines += [
            f"- {p.kind.value}: {escape(one_line(str(p), 400))}" for p in problems[:MAX_PROBLEMS]
        ]
        if len(problems) > MAX_PROBLEMS:
            lines.append(f"- … and {len(problems) - MAX_PROBLEMS} more (see compat.json)")
    lines += ["", "## Every cell", "", LEGEND, ""]
    return "\n".join(lines) + "\n"


def upgrade_lines(findings: Findings, *, compact: bool = False) -> list[str]:
    """The upgrade view, the move, the range evidence and the skips, as Markdown lines.

    ``compact`` keeps only each cell's mark and the crashes it hits by name.
    """
    lines = ["", "## Can we upgrade?", ""]
    marks = SAFETY_MARKS
    lines.append(
        f"{marks[Safety.SAFE]} {label(Safety.SAFE)} · {marks[Safety.SAFE_WITH_FLAG_CHANGE]} "
        f"{label(Safety.SAFE_WITH_FLAG_CHANGE)} (a variant observed avoided on the same image "
        f"and configuration) · {marks[Safety.NOT_SAFE]} {label(Safety.NOT_SAFE)}: a documented "
        "crash without a verified workaround, or the healthy baseline failed · "
        f"{marks[Safety.UNKNOWN]} {label(Safety.UNKNOWN)}"
    )
    for lane in findings.upgrade.lanes:
        header = ["image", *(escape(c.label) for c in lane.configurations)]
        lines += ["", f"**{escape(lane.lane)} lane**", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + "---|" * len(header))
        for tag in lane.tags:
            row = [escape(lane.row_label(tag))]
            for configuration in lane.configurations:
                found = lane.at(tag, configuration)
                row.append("" if found is None else _safety_text(found, compact))
            lines.append("| " + " | ".join(row) + " |")
    lines += _move_lines(findings)
    disagreeing = [r for r in findings.ranges if r.disagrees]
    if disagreeing:
        lines += ["", "## Documented ranges against the evidence", ""]
        lines += [f"- **{escape(r.scenario)}**: {_code(r.words)}" for r in disagreeing]
    if findings.skipped:
        total = sum(g.count for g in findings.skipped)
        lines += ["", f"## Not run on this host ({total} cells)", ""]
        lines += [
            f"- {escape(g.lane)} lane, {g.count} cell(s): {escape(g.reason)}"
            for g in findings.skipped
        ]
    return lines + _runner_lines(findings)


def _runner_lines(findings: Findings) -> list[str]:
    """Where it ran: each runner's GPUs, images (digest, vLLM, environment report), models."""
    if not findings.runners:
        return []
    lines = ["", "## Where it ran", ""]
    for runner in findings.runners:
        gpus = "; ".join(escape(words) for words in runner.gpu_lines) or "no GPU"
        lines.append(f"- **{escape(runner.host)}** ({runner.cells} cells): {gpus}")
        for image in runner.images:
            reports = ", ".join(code(path) for path in image.environments)
            lines.append(f"  - {escape(image.words)}" + (f"; {reports}" if reports else ""))
        lines += [f"  - model {escape(m)}: revision {code(rev)}" for m, rev in runner.models]
    return lines


def _safety_text(found: ImageSafety, compact: bool) -> str:
    if not compact:
        return SAFETY_MARKS[found.safety] + " " + escape(found.words)
    return SAFETY_MARKS[found.safety] + "".join(" " + escape(c.scenario) for c in found.crashes)


def _move_lines(findings: Findings) -> list[str]:
    move = findings.move
    if move is None:
        return []
    verdict = "**worse**" if move.worse else "not worse"
    lines = [
        "",
        f"## What changes if we move from {escape(move.baseline)} to {escape(move.candidate)}",
        "",
        f"The candidate is {verdict}; {move.still_avoided} crash check(s) stay avoided.",
        "",
    ]
    for listed in move.listed:
        items = move.of(listed)
        lines.append(f"- {listed.label}: {len(items)}")
        lines += [
            f"  - {escape(i.scenario)} on {escape(i.configuration.label)}: {escape(i.detail)}"
            for i in items
        ]
    return lines


def _code(words: str) -> str:
    """Escape ``words`` but keep its backtick-quoted specifiers as code."""
    parts = words.split("`")
    return "".join(f"`{p}`" if i % 2 else _spaced(p) for i, p in enumerate(parts))


def _spaced(text: str) -> str:
    """``escape`` that keeps one space where ``text`` starts or ends with one."""
    lead = " " if text[:1].isspace() else ""
    trail = " " if text[-1:].isspace() else ""
    return lead + escape(text) + trail


def _sections(table: Table, detail: Detail) -> Iterator[str]:
    for section in table.sections:
        yield f"## {escape(section.configuration.title)}\n\n"
        header = [
            "image",
            *(escape(c.scenario) + "<br>" + escape(c.variant) for c in section.columns),
        ]
        yield "| " + " | ".join(header) + " |\n"
        yield "|" + "---|" * len(header) + "\n"
        for tag in section.tags:
            row = [escape(section.row_label(tag))]
            row += [_entry_text(section.entry(tag, c), detail) for c in section.columns]
            yield "| " + " | ".join(row) + " |\n"
        yield "\n"


def _entry_text(entry: Entry | None, detail: Detail) -> str:
    if entry is None:
        return ""
    parts = [_level_text(j, detail) for j in entry.levels]
    if entry.agreement is Agreement.AGREE:
        parts.append("levels agree")
    elif entry.agreement is Agreement.DISAGREE:
        parts.append("**levels disagree**")
    return "<br>".join(parts)


def _level_text(judged: Judged, detail: Detail) -> str:
    mark = PROBE_MARK if judged.level is Level.PROBE else ""
    outcome = judged.result.outcome
    # A cell that did not test its crash says so by its symbol, not by the "no expectation" mark.
    verdict = "" if outcome is Outcome.NOT_REACHED else VERDICT_MARKS.get(judged.verdict, "")
    text = mark + SYMBOLS[outcome] + verdict
    if detail is Detail.FULL and judged.cause:
        text += " " + escape(shorten(judged.cause, CAUSE_CHARS))
    return text


def _summary(table: Table, judged: Sequence[Judged], head: str, limit: int) -> str:
    lines = [
        f"The full table of {table.cells} cells does not fit in a job summary: counts per "
        "image tag below, every cell in compat.html and compat.json.",
        "",
        *_count_table(table),
        "",
        "## Cells that need attention",
        "",
    ]
    text = head + "\n".join(lines) + "\n"
    attention = sorted(
        (j for j in judged if j.verdict in FAILING or j.verdict is Verdict.ERROR),
        key=lambda j: (SEVERITY.index(j.verdict), j.result.id),
    )
    return text + _bounded_list(attention, limit - len(text.encode("utf-8")))


def _count_table(table: Table) -> list[str]:
    counts: dict[tuple[str, str], Counter[Verdict]] = {}
    for section in table.sections:
        for (tag, _), entry in section.entries.items():
            key = (section.configuration.lane, tag)
            counts.setdefault(key, Counter()).update(j.verdict for j in entry.levels)
    verdicts = [v for v in SEVERITY if v in table.counts]
    lines = [
        "| lane | image | " + " | ".join(label(v) for v in verdicts) + " |",
        "|" + "---|" * (len(verdicts) + 2),
    ]
    for lane, tag in sorted(counts, key=lambda k: (k[0], tag_key(k[1]))):
        row = [str(counts[lane, tag][v] or "") for v in verdicts]
        lines.append(f"| {escape(lane)} | {escape(tag)} | " + " | ".join(row) + " |")
    return lines


def _bounded_list(attention: Sequence[Judged], budget: int) -> str:
    out: list[str] = []
    used = 0
    for number, item in enumerate(attention):
        line = (
            f"- {SYMBOLS[item.result.outcome]} {item.verdict.value}: "
            f"{escape(item.result.id)}: {escape(shorten(item.cause, CAUSE_CHARS))}\n"
        )
        more = f"- … and {len(attention) - number} more (see compat.html)\n"
        too_long = number >= MAX_ATTENTION
        if too_long or used + len(line.encode("utf-8")) + len(more.encode("utf-8")) > budget:
            out.append(more)
            break
        out.append(line)
        used += len(line.encode("utf-8"))
    return "".join(out) if attention else "None.\n"

"""``compat.html``: the compatibility table as one self-contained page.

No external assets: styles and the few lines of filter script are inline, so
the file works offline, attached to a CI run or mailed around. Every value
goes through jinja2's autoescaping (log lines contain ``<``). This module
turns the table into plain values for the template; the template lays them out.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jinja2

from repromatrix.judgement import SEVERITY, Expected, Outcome, Safety, Verdict, Word, label
from repromatrix.reports.findings import Findings, ReportOptions, build_findings
from repromatrix.reports.heatmap import heat_maps
from repromatrix.reports.table import Agreement, Entry, Table, TableSection, log_path
from repromatrix.results.verdicts import Judged, RunProblem, shorten

TEMPLATE = "compat.html.j2"
CAUSE_CHARS = 160  # in the summary line; the full root-cause line is one click away


@dataclass(frozen=True)
class LevelView:
    """One level's result inside a table entry."""

    id: str
    level: str
    verdict: str
    verdict_label: str
    cause: str
    expected: str
    observed: str
    explanation: str
    version: str
    image: str
    digest: str
    root_cause_line: str
    process: str
    log: str
    excerpt: str | None
    facts: str = ""  # what the engine stated: ``name value`` pairs


@dataclass(frozen=True)
class EntryView:
    """One table entry: its levels, the worst verdict (the outline), the tone and the agreement."""

    scenario: str
    verdict: str
    levels: tuple[LevelView, ...]
    agreement: str | None
    tone: str = "none"  # the background: what happened (hit, avoided, failure), not the verdict


@dataclass(frozen=True)
class RowView:
    """One image tag's row in a section."""

    label: str
    entries: tuple[EntryView | None, ...]


@dataclass(frozen=True)
class SectionView:
    """A configuration's table."""

    title: str
    lane: str
    gpu: str
    model: str
    flagset: str
    columns: tuple[tuple[str, str], ...]
    rows: tuple[RowView, ...]


@functools.cache  # one for the process: jinja2 compiles each template once per environment
def environment() -> jinja2.Environment:
    """The reports' templates (``reports/templates``), autoescaped, strict, with the judgement
    words (``Safety``) and their one label table (the ``label`` filter); never changed once made."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("repromatrix.reports", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["label"] = _label
    env.globals.update(Safety=Safety, Outcome=Outcome, Verdict=Verdict)
    return env


def _label(word: Word | str, kind: type[Word] | None = None) -> str:
    """The ``label`` filter: a word's label; a word's value (a history point's outcome, say)
    is read as one of ``kind`` first (``{{ p.outcome | label(Outcome) }}``)."""
    if isinstance(word, Outcome | Expected | Safety | Verdict):
        return label(word)
    if kind is None:
        raise TypeError(f"label: {word!r} is a value; say of which word (label(Outcome))")
    return label(kind(word))


def table_judged(table: Table) -> tuple[Judged, ...]:
    """Every judged cell that has an entry in ``table``."""
    return tuple(j for s in table.sections for e in s.entries.values() for j in e.levels)


def format_html(
    table: Table,
    problems: Sequence[RunProblem],
    run: str,
    excerpts: Mapping[str, str],
    findings: Findings | None = None,
) -> str:
    """Return ``compat.html``; ``excerpts`` maps cell ids to their log excerpts."""
    sections = tuple(_section_view(s, excerpts) for s in table.sections)
    judged = table_judged(table)
    if findings is None:
        findings = build_findings(judged, run, ReportOptions())
    maps = heat_maps(judged)
    return (
        environment()
        .get_template(TEMPLATE)
        .render(
            run=run,
            title=findings.title,
            findings=findings,
            heat_maps=maps,
            cell_href=lambda cell_id: "#c-" + cell_id,
            environment_href=lambda path: path,  # compat.html lies in the run folder
            cells=table.cells,
            counts=[(v.value, label(v), n) for v, n in table.counts.items()],
            not_reached=table.not_reached,
            problems=problems,
            sections=sections,
            gpus=sorted({s.gpu for s in sections}),
            models=sorted({s.model for s in sections}),
            scenarios=sorted({c[0] for s in sections for c in s.columns}),
        )
    )


def _section_view(section: TableSection, excerpts: Mapping[str, str]) -> SectionView:
    configuration = section.configuration
    rows = tuple(
        RowView(
            section.row_label(tag),
            tuple(_entry_view(section.entry(tag, c), excerpts) for c in section.columns),
        )
        for tag in section.tags
    )
    return SectionView(
        configuration.title,
        configuration.lane,
        configuration.gpu,
        configuration.model,
        configuration.flagset,
        tuple((c.scenario, c.variant) for c in section.columns),
        rows,
    )


def _entry_view(entry: Entry | None, excerpts: Mapping[str, str]) -> EntryView | None:
    if entry is None:
        return None
    levels = entry.levels
    worst = min((j.verdict for j in levels), key=SEVERITY.index)
    agreement = entry.agreement
    return EntryView(
        scenario=levels[0].result.scenario,
        verdict=worst.value,
        levels=tuple(_level_view(j, excerpts.get(j.result.id)) for j in levels),
        agreement=None if agreement is None else _AGREEMENT_TEXT[agreement],
        tone=_TONES.get(levels[0].result.outcome, "none"),
    )


_TONES = {
    Outcome.HIT: "hit",
    Outcome.AVOIDED: "avoided",
    Outcome.OTHER_FAILURE: "failure",
    Outcome.TIMEOUT: "failure",
    Outcome.NOT_REACHED: "not_reached",
}


_AGREEMENT_TEXT = {
    Agreement.AGREE: "levels agree",
    Agreement.DISAGREE: "levels disagree",
    Agreement.UNDECIDED: "levels not comparable",
}


def _level_view(judged: Judged, excerpt: str | None) -> LevelView:
    r = judged.result
    cause = r.root_cause
    return LevelView(
        id=r.id,
        level=judged.level.value,
        verdict=judged.verdict.value,
        verdict_label=label(judged.verdict),
        cause=shorten(judged.cause, CAUSE_CHARS),
        expected=r.expected.value,
        observed=label(r.outcome),
        explanation=judged.explanation,
        version=r.version or "unknown",
        image=r.image,
        digest=r.image_digest or "",
        root_cause_line=cause.line.strip() if cause else "",
        process=(cause.process or "") if cause else "",
        log=log_path(r.id),
        excerpt=excerpt,
        facts=" · ".join(f"{name} {value}" for name, value in r.facts.items()),
    )

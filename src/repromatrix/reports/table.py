"""The compatibility table: image tags in version order against scenario variants.

Pure: judged cells in, a ``Table`` out, and its machine form (``compat.json``).
A table has one section per configuration (lane, GPU, model, flag set), because a cell
is only comparable with cells that ran on the same hardware with the same
model and flags. Within a section, rows are image tags (version order, tags
that are not versions, like ``nightly``, last) and columns are scenario
variants; each entry holds the engine-level and the probe-level cell, and says
whether the two agree when both decided. Skipped cells (no such hardware on
this host) are counted but get no entry: the reports summarise them per lane
and reason instead of listing them one by one.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from packaging.version import InvalidVersion, Version

from repromatrix.judgement import DECISIVE, Outcome, Verdict
from repromatrix.results.store import LOG_FILE, cell_dir
from repromatrix.results.verdicts import Judged, RunProblem, tally
from repromatrix.values import Level

# 4: not-reached cells, facts, where each cell ran (runners). 5: the safety words of
# ``judgement`` (``not_safe``, ``safe_with_flag_change`` for 4's ``unsafe``, ``workaround``),
# and the move's ``counts`` and ``items`` as safety moves (before and after) for 4's changes.
COMPAT_SCHEMA_VERSION = 5


@dataclass(frozen=True, order=True)
class Configuration:
    """What a user runs, and what a table section holds fixed: lane, GPU, model and flag set."""

    lane: str
    gpu: str
    model: str
    flagset: str

    @property
    def title(self) -> str:
        """A heading for people, e.g. ``gpu lane · h100 · qwen3-30b-a3b · default``."""
        return f"{self.lane} lane · {self.gpu} · {self.model} · {self.flagset}"

    @property
    def label(self) -> str:
        """``h100 · qwen3-30b-a3b · default``."""
        return f"{self.gpu} · {self.model} · {self.flagset}"


@dataclass(frozen=True)
class Column:
    """A scenario variant: the documented trigger, a control, or a workaround."""

    scenario: str
    variant: str

    @property
    def label(self) -> str:
        """``scenario / variant``."""
        return f"{self.scenario} / {self.variant}"


def column_key(column: Column) -> tuple[str, int, str]:
    """Sort scenarios by id, and within one the trigger first, then the rest by name."""
    return (column.scenario, 0 if column.variant in ("trigger", "baseline") else 1, column.variant)


def tag_key(tag: str) -> tuple[int, Version, str]:
    """Sort image tags by version (``v0.31.0`` like ``0.31.0``); other tags (``nightly``) last."""
    try:
        return (0, Version(tag.removeprefix("v")), tag)
    except InvalidVersion:
        return (1, Version("0"), tag)


class Agreement(enum.StrEnum):
    """Whether the engine-level and probe-level cells of one entry tell the same story."""

    AGREE = "agree"
    DISAGREE = "disagree"
    UNDECIDED = "undecided"  # one of them did not decide (failure, error, unreachable, ...)


@dataclass(frozen=True)
class Entry:
    """One table entry: the engine-level and probe-level results of one image and variant."""

    engine: Judged | None = None
    probe: Judged | None = None

    @property
    def levels(self) -> tuple[Judged, ...]:
        """The results present, engine first."""
        return tuple(j for j in (self.engine, self.probe) if j is not None)

    @property
    def agreement(self) -> Agreement | None:
        """``None`` unless both levels ran; then whether their decisive outcomes match."""
        if self.engine is None or self.probe is None:
            return None
        engine, probe = self.engine.result.outcome, self.probe.result.outcome
        if engine not in DECISIVE or probe not in DECISIVE:
            return Agreement.UNDECIDED
        return Agreement.AGREE if engine == probe else Agreement.DISAGREE

    def with_level(self, judged: Judged) -> Entry:
        """Return this entry with ``judged`` in its level's slot (the first one seen wins)."""
        if judged.level is Level.PROBE:
            return self if self.probe else Entry(self.engine, judged)
        return self if self.engine else Entry(judged, self.probe)


@dataclass(frozen=True)
class TableSection:
    """The table of one configuration."""

    configuration: Configuration
    tags: tuple[str, ...]
    columns: tuple[Column, ...]
    entries: Mapping[tuple[str, Column], Entry]
    versions: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def entry(self, tag: str, column: Column) -> Entry | None:
        """The entry at a row and column, or None where no cell ran."""
        return self.entries.get((tag, column))

    def row_label(self, tag: str) -> str:
        """The tag, with the vLLM version seen inside when the tag does not say it."""
        version = self.versions.get(tag)
        if version and tag_key(tag)[0] == 1:
            return f"{tag} ({version})"
        return tag


@dataclass(frozen=True)
class Table:
    """Every section, and the verdict counts over all cells (``not_reached``: the engine
    cells among them that did not test their crash, counted apart from their ``unknown``)."""

    sections: tuple[TableSection, ...]
    counts: Mapping[Verdict, int]
    cells: int
    not_reached: int = 0


def build_table(judged: Iterable[Judged]) -> Table:
    """Arrange judged cells into sections, rows and columns."""
    grouped: dict[Configuration, dict[tuple[str, Column], Entry]] = defaultdict(dict)
    versions: dict[Configuration, dict[str, str]] = defaultdict(dict)
    everything = tuple(judged)
    for item in everything:
        r = item.result
        if r.outcome is Outcome.SKIPPED:
            continue
        configuration = Configuration(r.lane, r.gpu, r.model, r.flagset)
        key = (r.image_tag, Column(r.scenario, r.variant))
        grouped[configuration][key] = grouped[configuration].get(key, Entry()).with_level(item)
        if r.version:
            versions[configuration].setdefault(r.image_tag, r.version)
    sections = tuple(
        _section(configuration, grouped[configuration], versions[configuration])
        for configuration in sorted(grouped)
    )
    unreached = sum(1 for j in everything if j.result.outcome is Outcome.NOT_REACHED)
    return Table(sections, MappingProxyType(tally(everything)), len(everything), unreached)


def _section(
    configuration: Configuration, entries: dict[tuple[str, Column], Entry], versions: dict[str, str]
) -> TableSection:
    tags = tuple(sorted({tag for tag, _ in entries}, key=tag_key))
    columns = tuple(sorted({column for _, column in entries}, key=column_key))
    return TableSection(
        configuration,
        tags,
        columns,
        MappingProxyType(dict(entries)),
        MappingProxyType(dict(versions)),
    )


def agreements(table: Table) -> list[tuple[TableSection, str, Column, Entry]]:
    """Every entry where both levels ran, in table order."""
    found = []
    for section in table.sections:
        for tag in section.tags:
            for column in section.columns:
                entry = section.entry(tag, column)
                if entry is not None and entry.agreement is not None:
                    found.append((section, tag, column, entry))
    return found


def cell_json(judged: Judged) -> dict[str, Any]:
    """The machine form of one cell: its saved result plus verdict, cause and log path."""
    data = judged.result.to_json()
    data["observed"] = data.pop("outcome")
    data["verdict"] = judged.verdict.value
    data["cause"] = judged.cause
    data["explanation"] = judged.explanation
    data["log"] = log_path(judged.result.id)
    return data


def log_path(cell_id: str) -> str:
    """The cell's log relative to the run folder, with ``/`` separators."""
    return (cell_dir(Path(), cell_id) / LOG_FILE).as_posix()


def compat_json(
    table: Table,
    judged: Sequence[Judged],
    problems: Sequence[RunProblem],
    run: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``compat.json``: every cell, the agreements between levels, the problems, the counts.

    ``extra`` holds the findings (upgrade view, move, ranges, skips) from
    ``reports.findings``; they come first, as in the other reports.
    """
    return {
        "schema_version": COMPAT_SCHEMA_VERSION,
        "run": run,
        **(extra or {}),
        "summary": {
            "cells": table.cells,
            "verdicts": {verdict.value: count for verdict, count in table.counts.items()},
            "not_reached": table.not_reached,
        },
        "problems": [p.to_json() for p in problems],
        "cells": [cell_json(j) for j in sorted(judged, key=lambda j: j.result.id)],
        "levels": [
            {
                **_position(section, tag, column),
                "engine": entry.engine.result.outcome.value if entry.engine else None,
                "probe": entry.probe.result.outcome.value if entry.probe else None,
                "agreement": entry.agreement.value if entry.agreement else None,
            }
            for section, tag, column, entry in agreements(table)
        ],
    }


def _position(section: TableSection, tag: str, column: Column) -> dict[str, str]:
    s = section.configuration
    return {
        "lane": s.lane,
        "image_tag": tag,
        "gpu": s.gpu,
        "model": s.model,
        "flagset": s.flagset,
        "scenario": column.scenario,
        "variant": column.variant,
    }

"""What ``repromatrix plan`` prints as a table or JSON (the CI forms are in ``ci_jobs``)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from repromatrix.model import Cell

TABLE_COLUMNS = ("lane", "image", "gpu", "model", "flagset", "scenario", "variant", "level")


def cell_json(cell: Cell) -> dict[str, Any]:
    """Return one cell as the JSON object ``plan --json`` prints."""
    return {
        "id": cell.id,
        "lane": cell.lane.value,
        "level": cell.level.value,
        "image": cell.image.ref,
        "image_tag": cell.image.tag,
        "version": str(cell.image.version) if cell.image.version is not None else None,
        "gpu": cell.gpu.name,
        "runner": cell.gpu.runner_label,
        "model": cell.model.name,
        "model_source": cell.model.source,
        "flagset": cell.flagset.name,
        "scenario": cell.scenario.id,
        "variant": cell.variant.name,
        "variant_kind": cell.variant.kind,
        "expected": cell.expected.value,
        "flags": dict(cell.flags),
        "env": dict(cell.env),
        "deadline_s": cell.deadline_s,
        "interrupt_after_s": cell.interrupt_after_s,
    }


def format_json(cells: Iterable[Cell]) -> str:
    """Return the cells as a JSON list."""
    return json.dumps([cell_json(cell) for cell in cells], indent=2) + "\n"


def _row(cell: Cell) -> tuple[str, ...]:
    parts = cell.id.removesuffix("@probe").split("/")
    return (*parts, cell.level.value, cell.expected.value)


def format_table(cells: Sequence[Cell]) -> str:
    """Return an aligned text table of the cells and a one-line summary."""
    header = (*TABLE_COLUMNS, "expected")
    rows = [header, *(_row(cell) for cell in cells)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join([*lines, "", summary(cells)]) + "\n"


def summary(cells: Sequence[Cell]) -> str:
    """Return e.g. ``273 cells: 60 hit, 190 avoided, 23 unknown (gpu 249, cpu 24)``."""
    expected = Counter(cell.expected.value for cell in cells)
    lanes = Counter(cell.lane.value for cell in cells)
    counts = ", ".join(f"{expected[name]} {name}" for name in ("hit", "avoided", "unknown"))
    per_lane = ", ".join(f"{lane} {n}" for lane, n in sorted(lanes.items()))
    noun = "cell" if len(cells) == 1 else "cells"
    return f"{len(cells)} {noun}: {counts} ({per_lane})"

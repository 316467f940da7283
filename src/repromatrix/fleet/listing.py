"""What ``repromatrix plan`` prints as a table or JSON (the CI forms are in ``jobs``), each
cell with its memory estimate (``memory``)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from repromatrix.matrix import config_facts, memory
from repromatrix.values import Cell, Lane

TABLE_COLUMNS = ("lane", "image", "gpu", "model", "flagset", "scenario", "variant", "level")
# How the table marks where an effective flag came from (``matrix.effective``).
SOURCE_MARKS = {"flagset": "f", "include": "i", "scenario": "s", "variant": "v"}
SOURCE_LEGEND = "flag sources: [f] flag set, [i] include, [s] scenario launch, [v] variant"
MEMORY_LEGEND = (
    "memory (GiB, per GPU): weights+LoRA buffers+KV cache on one GPU = a lower bound of its "
    "need, against what vLLM may use on one GPU (reported x gpu_memory_utilization); xN: the "
    "GPUs (TP x PP) that each need it; ? unknown, - a probe; host: a CPU-lane cell, in the "
    "host's memory"
)


def cell_json(cell: Cell) -> dict[str, Any]:
    """Return one cell as the JSON object ``plan --json`` prints."""
    return {
        "id": cell.id,
        "lane": cell.lane.value,
        "level": cell.level.value,
        "image": cell.image.ref,
        "image_tag": cell.image.tag,
        "image_pull": cell.image.pull.value if cell.lane is Lane.GPU else None,
        "version": str(cell.image.version) if cell.image.version is not None else None,
        "gpu": cell.gpu.name,
        "runner": cell.gpu.runner_label,
        "model": cell.model.name,
        "model_source": cell.model.source,
        "model_path": cell.model.path,
        "model_facts": config_facts.source_json(cell.model),
        "adapter": _adapter_json(cell),
        "lora_rank": cell.scenario.launch.lora_rank,
        "model_files": cell.model_files,
        "flagset": cell.flagset.name,
        "scenario": cell.scenario.id,
        "variant": cell.variant.name,
        "variant_kind": cell.variant.kind,
        "expected": cell.expected.value,
        "expected_scenario": cell.expected_scenario,
        "predicted": [scenario.id for scenario in cell.predicted],
        "flags": dict(cell.flags),
        "flag_sources": dict(cell.flag_sources),
        "same_as": list(cell.same_as),
        "env": dict(cell.env),
        "deadline_s": cell.deadline_s,
        "interrupt_on": cell.interrupt_on,
        "memory": memory.estimate_json(memory.estimate(cell)),
    }


def _adapter_json(cell: Cell) -> dict[str, str | None] | None:
    adapter = cell.adapter
    if adapter is None:
        return None
    return {"name": adapter.name, "source": adapter.source, "path": adapter.path}


def format_json(cells: Iterable[Cell]) -> str:
    """Return the cells as a JSON list."""
    return json.dumps([cell_json(cell) for cell in cells], indent=2) + "\n"


def _row(cell: Cell) -> tuple[str, ...]:
    parts = cell.id.removesuffix("@probe").split("/")
    expected = cell.expected.value
    if cell.scenario.baseline and cell.expected_scenario:
        expected += f":{cell.expected_scenario}"  # the crash the baseline's flags trigger
    needs = memory.table_text(memory.estimate(cell))
    return (*parts, cell.level.value, expected, needs, flags_text(cell))


def flags_text(cell: Cell) -> str:
    """The effective flags, each marked with its source: ``max_lora_rank=256[f]``; then the
    tiny adapter's rank and a broken model folder, where the scenario asks for them."""
    parts = [
        f"{name}={json.dumps(value)}[{SOURCE_MARKS.get(cell.flag_sources.get(name, ''), '?')}]"
        for name, value in cell.flags.items()
    ]
    if cell.scenario.launch.lora_rank is not None:
        parts.append(f"lora_rank={cell.scenario.launch.lora_rank}[s]")
    if cell.model_files != "intact" or cell.variant.model_files:
        mark = "v" if cell.variant.model_files else "s"
        parts.append(f"model_files={cell.model_files}[{mark}]")
    return " ".join(parts)


def format_table(cells: Sequence[Cell]) -> str:
    """Return an aligned text table of the cells, the flag-source and memory legends and a
    summary."""
    header = (*TABLE_COLUMNS, "expected", "memory", "flags")
    rows = [header, *(_row(cell) for cell in cells)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join([*lines, "", SOURCE_LEGEND, MEMORY_LEGEND, summary(cells)]) + "\n"


def summary(cells: Sequence[Cell]) -> str:
    """Return e.g. ``273 cells: 60 hit, 190 avoided, 23 unknown (gpu 249, cpu 24)``, then
    the cells planned once for identical ones and the infeasible ones, where there are any."""
    expected = Counter(cell.expected.value for cell in cells)
    lanes = Counter(cell.lane.value for cell in cells)
    counts = ", ".join(f"{expected[name]} {name}" for name in ("hit", "avoided", "unknown"))
    per_lane = ", ".join(f"{lane} {n}" for lane, n in sorted(lanes.items()))
    noun = "cell" if len(cells) == 1 else "cells"
    twins = sum(len(cell.same_as) for cell in cells)
    once = f"; {twins} identical cells planned once" if twins else ""
    infeasible = sum(1 for cell in cells if memory.infeasible_reason(cell) is not None)
    beyond = f"; {infeasible} infeasible (memory)" if infeasible else ""
    return f"{len(cells)} {noun}: {counts} ({per_lane}){once}{beyond}"

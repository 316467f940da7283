"""What the selected cells need on disk: model and adapter weights, checked and listed.

Pure over cells (the folder test is a parameter). ``check_adapters`` runs when
a plan is made: a scenario that sends its request through a LoRA adapter needs
that adapter on the cell's model. ``check_local`` runs on the runner, before
any image is pulled or started: every local model or adapter folder exists.
``downloads`` lists the HF repos (each at its pinned revision) ``repromatrix
prepare`` fetches into the HF cache, so the cells themselves stay offline.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix.errors import Problem, suggest
from repromatrix.values import Cell, Lane, Level, Model


@dataclass(frozen=True)
class Download:
    """One HF repo the selected cells read from the runner's HF cache."""

    repo_id: str
    kind: str  # "model" | "adapter"
    used_by: tuple[str, ...]  # model names, for the progress lines
    revision: str | None = None  # the matrix's pin (None: main)

    @property
    def label(self) -> str:
        """``org/name`` or ``org/name@revision``, for messages."""
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def _needs_weights(cell: Cell) -> bool:
    """GPU engine cells load the model; probes and CPU recipes do not read the HF cache."""
    return cell.lane is Lane.GPU and cell.level is Level.ENGINE


def check_adapters(cells: Iterable[Cell], models: Iterable[Model] = ()) -> list[Problem]:
    """A problem for each scenario adapter a cell's model does not have, at the scenario line.

    A LoRA adapter serves only the model it was trained for, so the advice is never to
    add it to this model: declare it under its own model (``models`` says where it already
    is) and exclude this model from the scenario.
    """
    owners: dict[str, list[str]] = {}
    for model in models:
        for adapter in model.adapters:
            owners.setdefault(adapter.name, []).append(model.name)
    problems: dict[tuple[str, str, str], Problem] = {}
    for cell in cells:
        name = cell.scenario.launch.lora_adapter
        if not _needs_weights(cell) or name is None or not cell.flags.get("enable_lora"):
            continue
        if cell.model.adapter(name) is not None:
            continue
        where = cell.scenario.file or f"scenario {cell.scenario.id}"
        key = (where, name, cell.model.name)
        message = _adapter_advice(cell, name, owners)
        problems.setdefault(key, Problem(where, cell.scenario.launch.lora_adapter_line, 0, message))
    return list(problems.values())


def _adapter_advice(cell: Cell, name: str, owners: Mapping[str, Sequence[str]]) -> str:
    """Why a cell lacks its scenario's adapter, and the fix that keeps each adapter on the
    model it was trained for (``owners``: the models that declare each adapter)."""
    model, scenario = cell.model.name, cell.scenario.id
    exclude = f"`exclude: [{{model: {model}, scenario: {scenario}}}]`"
    if name in owners:
        declared = ", ".join(f"`{owner}`" for owner in owners[name])
        kind = "model" if len(owners[name]) == 1 else "models"
        return (
            f"adapter `{name}` is declared under {kind} {declared}, not under `{model}` "
            f"(cell {cell.id}): a LoRA adapter serves only the model it was trained for, so "
            f"exclude `{model}` from scenario `{scenario}` in the matrix ({exclude})"
        )
    known = sorted({*owners, *(adapter.name for adapter in cell.model.adapters)})
    return (
        f"adapter `{name}` is declared under no model (cell {cell.id}): declare it under "
        f"the model it was trained for (its adapter_config.json names it as "
        f"`base_model_name_or_path`), as `models: <that model>: adapters: {name}: "
        f"{{source: org/repo}}` (or `{{path: /folder}}`), and exclude the other models from "
        f"scenario `{scenario}` ({exclude}).{suggest(name, known)}"
    )


def check_local(
    cells: Iterable[Cell], matrix_file: str, is_dir: Callable[[str], bool] = os.path.isdir
) -> list[Problem]:
    """A problem for each local model or adapter folder the cells need that does not exist."""
    missing: dict[str, Problem] = {}
    for cell in cells:
        if not _needs_weights(cell):
            continue
        folders = [(f"model `{cell.model.name}`", cell.model.path, cell.model.path_line)]
        adapter = cell.adapter
        if adapter is not None:
            what = f"adapter `{adapter.name}` of model `{cell.model.name}`"
            folders.append((what, adapter.path, adapter.line))
        for what, folder, line in folders:
            if folder is not None and folder not in missing and not is_dir(folder):
                message = f"{what}: the folder {folder} does not exist on this runner"
                missing[folder] = Problem(matrix_file, line, 0, message)
    return list(missing.values())


def downloads(cells: Sequence[Cell]) -> tuple[Download, ...]:
    """The HF repos the cells read (at each revision), models first, each once, in a stable
    order."""
    found: dict[tuple[str, str, str], set[str]] = {}
    for cell in cells:
        if not _needs_weights(cell):
            continue
        if cell.model.path is None:
            key = ("model", cell.model.source, cell.model.revision or "")
            found.setdefault(key, set()).add(cell.model.name)
        adapter = cell.adapter
        if adapter is not None and adapter.source is not None:
            key = ("adapter", adapter.source, adapter.revision or "")
            found.setdefault(key, set()).add(cell.model.name)
    order = sorted(found, key=lambda key: (key[0] != "model", key[1], key[2]))
    return tuple(
        Download(repo, kind, tuple(sorted(found[kind, repo, rev])), rev or None)
        for kind, repo, rev in order
    )


# (what to fetch, the hub cache folder) -> the snapshot folder; ``models.hfhub.hub_downloader``
# is the real one.
Downloader = Callable[[Download, Path], Path]


def fetch(
    wanted: Sequence[Download],
    cache: Path,
    download: Downloader,
    say: Callable[[str], None],
) -> tuple[str, ...]:
    """Download each repo into ``cache`` (an HF hub cache), saying how far it got.

    A failed download does not stop the others (what was fetched stays in the cache);
    returns one ``repo: reason`` line per failure.
    """
    failures = []
    for number, item in enumerate(wanted, start=1):
        users = ", ".join(item.used_by)
        say(f"prepare: [{number}/{len(wanted)}] {item.kind} {item.label} (for {users})")
        try:
            folder = download(item, cache)
        # The downloader is a network client: any error it raises is this repo's failure.
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
            failures.append(f"{item.label}: {reason}")
            say(f"prepare:   failed: {reason}")
        else:
            say(f"prepare:   in the cache: {folder}")
    return tuple(failures)

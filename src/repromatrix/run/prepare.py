"""Getting a run's cells ready: which this host can run, their images, their models, their vLLM.

Nothing here runs a cell and nothing here knows which backend it talks to: the
backend's kind says which cells it can run, the backend prepares images, reads
vLLM's version and makes tiny models. ``image_jobs`` calls these pieces for
each image, as a job of the run's pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix.backends.base import Backend, BackendKind, Host, Prepared
from repromatrix.backends.harness_spec import model_path
from repromatrix.errors import InfraError, RepromatrixError
from repromatrix.heartbeat import heartbeat
from repromatrix.model import Cell, Image, Lane, Level, Model
from repromatrix.models.tinymodel import LORA_RANK, TinyModel, ensure_model_files, tiny_model_for
from repromatrix.run.cell import CellContext


def runnable_images(cells: Iterable[Cell], kind: BackendKind, host: Host) -> list[Image]:
    """The distinct images of the cells ``kind`` can run on ``host``, in plan order."""
    seen: dict[str, Image] = {}
    for cell in cells:
        if kind.skip_reason(cell, host) is None:
            seen.setdefault(cell.image.key, cell.image)
    return list(seen.values())


@dataclass(frozen=True)
class ModelNeed:
    """A CPU model the engine cells need, with each adapter rank and broken folder they ask for."""

    model: Model
    ranks: tuple[int, ...]
    files: tuple[str, ...]


def model_needs(cells: Iterable[Cell]) -> dict[str, ModelNeed]:
    """What each tiny model must hold for ``cells``: generated once, it serves all of them."""
    models: dict[str, Model] = {}
    ranks: dict[str, set[int]] = {}
    files: dict[str, set[str]] = {}
    for cell in cells:
        if cell.lane is Lane.CPU and cell.level is Level.ENGINE:
            models.setdefault(cell.model.name, cell.model)
            ranks.setdefault(cell.model.name, {LORA_RANK}).add(adapter_rank(cell))
            files.setdefault(cell.model.name, set()).add(cell.model_files)
    return {
        name: ModelNeed(model, tuple(sorted(ranks[name])), tuple(sorted(files[name])))
        for name, model in models.items()
    }


def make_model(
    backend: Backend,
    need: ModelNeed,
    image: Prepared | None,
    models_root: Path,
    note: Callable[[str], None],
) -> TinyModel | str:
    """``need``'s tiny model made (in ``image`` when it is not already cached), or why not."""
    try:
        tiny = _make_model(backend, need.model, image, models_root, ranks=need.ranks, note=note)
        for kind in need.files:
            ensure_model_files(tiny, kind)
    except RepromatrixError as exc:
        return str(exc)
    return tiny


def adapter_rank(cell: Cell) -> int:
    """The rank of the tiny LoRA adapter a CPU cell is served: its scenario's, else 8."""
    return cell.scenario.launch.lora_rank or LORA_RANK


def _make_model(
    backend: Backend,
    model: Model,
    image: Prepared | None,
    models_root: Path,
    *,
    ranks: Sequence[int],
    note: Callable[[str], None],
) -> TinyModel:
    tiny = tiny_model_for(model, models_root)
    if tiny.complete and all(tiny.has_adapter(rank) for rank in ranks):
        return tiny
    if image is None:
        raise InfraError(f"tiny model {model.name}: no working image to generate it in")
    what = f"the tiny model {model.name} (LoRA ranks {', '.join(map(str, ranks))})"
    with heartbeat(note, f"generating {what} (once, cached in {tiny.path})"):
        return backend.make_model(model, image, models_root, ranks)


def cell_contexts(
    cells: Sequence[Cell],
    *,
    models_root: Path,
    skips: Mapping[str, str],
    prepared: Mapping[str, Prepared],
    made: Mapping[str, TinyModel | str],
    versions: Mapping[str, str | None],
) -> dict[str, CellContext]:
    """Every cell's prepared image, model path and version, or the reason it is skipped."""
    contexts: dict[str, CellContext] = {}
    for cell in cells:
        if cell.id in skips:
            contexts[cell.id] = CellContext(None, "", None, skips[cell.id])
            continue
        image = prepared.get(cell.image.key)
        version = versions.get(cell.image.key)
        model = made.get(cell.model.name) if cell.level is Level.ENGINE else None
        if isinstance(model, str) and image is not None and image.error is None:
            contexts[cell.id] = CellContext(Prepared(image.image_key, image.ref, error=model), "")
        elif isinstance(model, TinyModel):
            adapter = model.adapter_path(adapter_rank(cell))
            path = str(adapter) if cell.scenario.launch.lora_adapter else None
            served = str(model.files_path(cell.model_files))
            contexts[cell.id] = CellContext(image, served, path, image_version=version)
        else:
            path = model_path(cell, models_root)
            contexts[cell.id] = CellContext(image, path, image_version=version)
    return contexts

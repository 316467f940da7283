"""Each image of a run as a pool job: made, read, its tiny models made, its cells given context.

An image job builds or pulls one image (``Backend.prepare``), reads vLLM's
version inside it, saves vLLM's environment report of it on this runner (a real
run only: ``environment.EnvironmentReports``), makes the tiny models its CPU
engine cells need (each model once, by whichever image job gets to it first,
with every adapter rank and broken folder any cell of the run asks for); each
of its cells takes its ``CellContext`` from the job's value (``cell.cell_context``).
The pool starts a cell only once its image job has ended, so a cell's context
is always there when it starts; image jobs run
``--image-jobs`` at once, apart from the cells' GPUs, cores and memory, so a
slow pull or build overlaps with the cells of images already made.

A failed build or pull is not an exception: it is the image's ``Prepared.error``
and each of its cells ends as an infra error naming it. An image job that
raises (a bug of ours) fails only the cells that wait for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from repromatrix.backends.base import Backend, Prepared
from repromatrix.errors import InfraError, RepromatrixError
from repromatrix.heartbeat import duration, heartbeat
from repromatrix.models.tinymodel import (
    LORA_RANK,
    TinyModel,
    ensure_model_files,
    tiny_model_for,
)
from repromatrix.run.environment import EnvironmentReports
from repromatrix.run.pool import Pool, Ticket, Work
from repromatrix.run.progress import Progress
from repromatrix.run.schedule import IMAGE_ESTIMATE_S, Capacity, Job, Need
from repromatrix.values import Cell, Image, Lane, Level, Model

PREFIX = "image:"


def job_key(image_key: str) -> str:
    """The pool's key of the job that makes the image ``image_key``."""
    return PREFIX + image_key


def image_job(image_key: str, estimate_s: float = IMAGE_ESTIMATE_S) -> Job:
    """The job that makes ``image_key``: it holds an image slot, none of the cells' resources."""
    return Job(job_key(image_key), Need(slots=0), estimate_s, image_task=True)


@dataclass(frozen=True)
class ImageReady:
    """What an image job hands each cell that waits for it: the image (made, or why not), the
    vLLM version read inside it, its environment report in the run folder, and each tiny
    model its cells serve (made, or why not)."""

    prepared: Prepared
    version: str | None = None
    models: Mapping[str, TinyModel | str] = field(default_factory=dict)
    environment: str | None = None  # relative to the run folder; None: not made

    @property
    def error(self) -> str | None:
        """Why this image's cells cannot run: its build or pull failed, or a model of theirs."""
        failed = [why for why in self.models.values() if isinstance(why, str)]
        return self.prepared.error or (failed[0] if failed else None)


class ImageJobs:
    """The image jobs of one run: each makes one image and the tiny models of its cells."""

    def __init__(
        self,
        backend: Backend,
        cells: Iterable[Cell],
        *,
        models_root: Path,
        note: Callable[[str], None],
        reports: EnvironmentReports | None = None,
    ) -> None:
        self.backend = backend
        self.models_root = models_root
        self.note = note
        self.reports = reports  # None: no report (nothing is saved: images are only made)
        cells = list(cells)
        self.cells: dict[str, list[Cell]] = {}
        self.images: dict[str, Image] = {}
        for cell in cells:
            self.images.setdefault(cell.image.key, cell.image)
            self.cells.setdefault(cell.image.key, []).append(cell)
        self.needs = model_needs(cells)
        # Written only under each model's lock; every image job reads what the first made.
        self._models: dict[str, TinyModel | str] = {}
        self._model_locks = {name: threading.Lock() for name in self.needs}

    def jobs(self) -> list[Job]:
        """One job per image, in the order the cells first need them."""
        return [image_job(key) for key in self.images]

    def after(self) -> Mapping[str, str]:
        """Each image key and the job key its cells wait for."""
        return {key: job_key(key) for key in self.images}

    def work(self) -> dict[str, Work[ImageReady]]:
        """Each image job's callable for the pool."""
        return {job_key(key): self._work_for(key) for key in self.images}

    def _work_for(self, key: str) -> Work[ImageReady]:
        def work(_ticket: Ticket) -> ImageReady:
            return self.make(key)

        return work

    def make(self, key: str) -> ImageReady:
        """Make the image ``key``, read its vLLM version and environment, make its cells'
        tiny models."""
        image = self.images[key]
        prepared = self.backend.prepare([image])[key]
        if prepared.error is not None:
            ready = ImageReady(prepared)
        else:
            version = self.backend.vllm_version(prepared)
            models = self._models_for(self.cells[key], prepared)
            report = self.reports.save(self.backend, prepared, self.note) if self.reports else None
            ready = ImageReady(prepared, version, models, report)
        self.note(ready_line(image, prepared))
        return ready

    def _models_for(self, cells: Sequence[Cell], image: Prepared) -> dict[str, TinyModel | str]:
        names = {c.model.name for c in cells if c.level is Level.ENGINE} & set(self.needs)
        return {name: self._model(name, image) for name in sorted(names)}

    def _model(self, name: str, image: Prepared) -> TinyModel | str:
        # Two image jobs whose cells share a model: the first makes it, the other waits and
        # takes what it made (a failure too: the next image would fail the same way).
        with self._model_locks[name]:
            if name not in self._models:
                need = self.needs[name]
                made = make_model(self.backend, need, image, self.models_root, self.note)
                self._models[name] = made
            return self._models[name]


def ready_line(image: Image, prepared: Prepared) -> str:
    """One progress line for an image job that ended."""
    if prepared.error is not None:
        first = prepared.error.strip().splitlines()[0] if prepared.error.strip() else "?"
        return f"image {image.ref} failed: {first} (its cells end as infra errors)"
    how = f"built in {duration(prepared.build_s)}" if prepared.built else "found"
    return f"image {image.ref} ready ({how})"


def distinct_images(cells: Iterable[Cell]) -> list[Image]:
    """The distinct images of ``cells``, in plan order."""
    seen: dict[str, Image] = {}
    for cell in cells:
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


def prepare_images(
    backend: Backend,
    cells: Sequence[Cell],
    *,
    models_root: Path,
    progress: Progress,
    image_jobs: int = 1,
) -> dict[str, ImageReady]:
    """Make every image and tiny model ``cells`` need, ``image_jobs`` at once; run no cell."""
    images = ImageJobs(backend, cells, models_root=models_root, note=progress.note)
    made: dict[str, ImageReady] = {}

    pool = Pool(images.jobs(), Capacity(), images.work(), image_slots=image_jobs)
    for done in pool.ended():
        if done.value is not None:
            made[done.value.prepared.image_key] = done.value
        elif done.error is not None:  # a bug of ours
            progress.note(f"{done.key} failed: {done.error!r}")
    if pool.report.interrupted:
        raise KeyboardInterrupt
    built = sum(1 for ready in made.values() if ready.prepared.built)
    progress.note(f"images ready: {len(made)} ({built} built)")
    return made

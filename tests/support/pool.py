"""A recording backend and the cell stage around it: the pool's wiring without an engine.

``Recorder`` stands behind the project's ``Backend`` interface and records what
ran at once and on which ids; ``hold`` decides when each cell may end and
``make`` what each image job gets. The real engine is exercised by the
integration tests (``test_schedule_docker.py``, ``test_cpu_matrix_jobs.py``).
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repromatrix.backends.base import EnvironmentReport, Execution, Placement, Prepared
from repromatrix.host.runner import Runner, RunnerGpu
from repromatrix.models.tinymodel import TinyModel, tiny_model_for
from repromatrix.results import store
from repromatrix.run.environment import EnvironmentReports
from repromatrix.run.folder import RunFolder
from repromatrix.run.images import ModelNeed, model_needs
from repromatrix.run.main import Pacing, run_cells
from repromatrix.run.progress import Progress
from repromatrix.run.schedule import GIB
from repromatrix.secret_env import OutputListener
from repromatrix.values import Cell, Image, Model

GUARD_S = 120.0  # only a broken test waits this long; it decides nothing
UUIDS = {str(i): f"GPU-{i}{i}{i}{i}-uuid" for i in range(4)}


@dataclass
class Recorder:
    """A backend that records what ran at once; ``hold`` decides when each cell may end."""

    hold: Callable[[Cell, threading.Event], Execution] = lambda _c, _e: Execution(0, b"")
    make: Callable[[Image], Prepared] = lambda image: Prepared(image.key, f"img-{image.key}")
    # Why the GPUs of a placement are busy (None: idle), as the Docker backend would say.
    busy: Callable[[Placement], str | None] = lambda _placement: None
    # What vLLM's environment collector prints in each image (None: it fails).
    report: Callable[[Prepared], str | None] = lambda p: f"vLLM Version : in {p.image_key}\n"
    reported: list[str] = field(default_factory=list)  # the image keys reports were made of
    models: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    name: str = "recorder"
    running: dict[str, Placement | None] = field(default_factory=dict)
    most: int = 0
    clashes: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    placements: dict[str, Placement | None] = field(default_factory=dict)
    events: dict[str, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def execute(
        self,
        cell: Cell,
        spec: Mapping[str, Any],
        prepared: Prepared,
        watch: OutputListener,
        placement: Placement | None = None,
    ) -> Execution:
        stop = self.events.setdefault(cell.id, threading.Event())
        with self.lock:
            held = {g for p in self.running.values() if p and p.gpu_ids for g in p.gpu_ids}
            mine = set(placement.gpu_ids or ()) if placement else set()
            if held & mine:
                self.clashes.append(f"{cell.id} got {sorted(mine)} while {sorted(held)} held")
            self.running[cell.id] = placement
            self.placements[cell.id] = placement
            self.most = max(self.most, len(self.running))
        try:
            return self.hold(cell, stop)
        finally:
            with self.lock:
                del self.running[cell.id]

    def interrupt(self, cell_id: str) -> None:
        self.interrupted.append(cell_id)

    def stop(self, cell_id: str) -> None:
        self.stopped.append(cell_id)
        self.events.setdefault(cell_id, threading.Event()).set()

    def alive(self) -> bool:
        return True

    def busy_reason(self, placement: Placement) -> str | None:
        return self.busy(placement)

    def close(self) -> None:
        pass

    def prepare(self, images: Sequence[Image]) -> Mapping[str, Prepared]:
        return {image.key: self.make(image) for image in images}

    def vllm_version(self, prepared: Prepared) -> str | None:
        return f"version-in-{prepared.image_key}"

    def environment_report(self, prepared: Prepared) -> EnvironmentReport:
        with self.lock:
            self.reported.append(prepared.image_key)
        text = self.report(prepared)
        return EnvironmentReport(text, None if text else "collect_env exited with code 1")

    def make_model(
        self, model: Model, prepared: Prepared, models_root: Path, lora_ranks: Sequence[int] = ()
    ) -> TinyModel:
        with self.lock:
            self.models.append((model.name, prepared.image_key, tuple(lora_ranks)))
        return tiny_model_for(model, models_root)


def resources(gpus: int = 0, cores: int = 8, memory: int = 64 * GIB) -> Runner:
    listed = tuple(RunnerGpu(str(i), "H200", UUIDS[str(i)]) for i in range(gpus))
    return Runner(listed, tuple(g.index for g in listed), tuple(range(cores)), memory)


def run(
    tmp_path: Path,
    backend: Recorder,
    cells: Sequence[Cell],
    host: Runner,
    out: io.StringIO | None = None,
    pacing: Pacing | None = None,
    skips: Mapping[str, str] | None = None,
    reports: EnvironmentReports | None = None,
) -> dict[str, int]:
    """The cell stage as a run calls it: the images made by image jobs of the same pool."""
    progress = Progress(len(cells), out=out or io.StringIO())
    return run_cells(
        backend, cells, skips or {}, host, RunFolder("t", tmp_path),
        models_root=tmp_path / "models", progress=progress, pacing=pacing or Pacing(),
        reports=reports,
    )  # fmt: skip


def saved(tmp_path: Path) -> dict[str, store.CellResult]:
    found, problems = store.read_results(tmp_path)
    assert problems == []
    return {r.id: r for r in found}


def together(count: int) -> Callable[[Cell, threading.Event], Execution]:
    """Cells that end only once ``count`` of them run at the same time."""
    barrier = threading.Barrier(count, timeout=GUARD_S)

    def hold(_cell: Cell, _stop: threading.Event) -> Execution:
        barrier.wait()
        return Execution(0, b"")

    return hold


def at_once(out: io.StringIO) -> list[int]:
    """The cells running at each start, from the progress lines' ``(N other(s) running)``."""
    lines = [line for line in out.getvalue().splitlines() if " start " in line]
    return [
        1 + int(re.findall(r"\((\d+) other\(s\) running\)", line + "(0 other(s) running)")[0])
        for line in lines
    ]


def run_making_images(
    tmp_path: Path,
    backend: Recorder,
    cells: Sequence[Cell],
    host: Runner,
    out: io.StringIO | None = None,
    pacing: Pacing | None = None,
) -> tuple[dict[str, int], dict[str, ModelNeed]]:
    """``run``, and what each tiny model must hold for ``cells``."""
    return run(tmp_path, backend, cells, host, out, pacing), model_needs(cells)

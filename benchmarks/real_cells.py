"""Real CPU-lane cells through the scheduler's ``Pool`` (for ``bench_schedule.py --real``).

Uses images a matrix run has built (``nox -s matrix`` or ``repromatrix run --lane cpu
--prepare-only``) and the tiny model in ``.cache/models``; builds nothing itself.
"""

from __future__ import annotations

from pathlib import Path

import docker

from repromatrix.backends.base import Prepared
from repromatrix.backends.docker import container_settings
from repromatrix.backends.docker_calls import CELL_LABEL, RUN_LABEL
from repromatrix.backends.oci_container import DockerBackend, connect
from repromatrix.build import tinymodel
from repromatrix.build.render import render_image
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import load_inputs
from repromatrix.matrix.selector import Selector
from repromatrix.model import Cell, Lane
from repromatrix.run import cell_needs
from repromatrix.run.cell import CellContext, CellRun, run_cell
from repromatrix.run.host_resources import detect
from repromatrix.run.pool import Done, Pool, Ticket

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("/tmp/repromatrix-bench-schedule")


def run_one(backend: DockerBackend, cell: Cell, context: CellContext, ticket: Ticket) -> CellRun:
    """One cell as the run does it, stoppable through its container's labels."""

    def stop() -> None:
        labels = [f"{RUN_LABEL}={backend.run_id}", f"{CELL_LABEL}={cell.id}"]
        for container in backend.client.containers.list(filters={"label": labels}):
            container.kill()

    ticket.on_cancel(stop)
    return run_cell(backend, cell, context)


def built_image(client: docker.DockerClient, tag: str) -> str:
    """``tag`` when built, else the newest build of the same repository (another checkout's
    render of the same version); raises ``ImageNotFound`` when there is none."""
    repository = tag.split(":", maxsplit=1)[0]
    if client.images.list(name=tag):
        return tag
    images = sorted(client.images.list(name=repository), key=lambda i: i.attrs["Created"])
    if not images:
        raise docker.errors.ImageNotFound(f"{repository}: build the CPU images first")
    return str(next(t for t in images[-1].tags if t.startswith(repository)))


def run_real(selection: str, jobs: int) -> dict[str, str]:
    """Run the selected CPU cells with ``jobs`` at most at once; each cell's outcome."""
    matrix, scenarios = load_inputs(ROOT / "matrix.yaml", ROOT / "scenarios")
    cells = plan(matrix, scenarios, Lane.CPU, Selector([selection]))
    runtime = matrix.lanes[Lane.CPU].runtime
    models = (ROOT / ".cache" / "models").resolve()
    client = connect()
    contexts = {}
    for cell in cells:
        tag = built_image(client, render_image(cell.image, runtime, OUT / "dockerfiles").tag)
        model = tinymodel.tiny_model_for(cell.model, models)
        adapter = model.adapter_path() if cell.scenario.launch.lora_adapter else None
        contexts[cell.id] = CellContext(
            Prepared(cell.image.key, tag), str(model.path), str(adapter) if adapter else None
        )
    backend = DockerBackend(
        f"bench-jobs{jobs}",
        container_settings({lane: c.runtime for lane, c in matrix.lanes.items()}, models),
        client=client,
    )
    host = detect()
    outcomes: dict[str, str] = {}

    def on_done(done: Done[CellRun]) -> None:
        outcomes[done.key] = done.value.decision.outcome.value if done.value else repr(done.error)

    work = {c.id: (lambda ticket, c=c: run_one(backend, c, contexts[c.id], ticket)) for c in cells}
    try:
        jobs_list = cell_needs.cell_jobs(cells, host.free_memory)
        Pool(jobs_list, host.capacity(jobs), work, on_done).run()
    finally:
        backend.close()
    return outcomes

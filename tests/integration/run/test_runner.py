"""The runner's faults in real containers: OOM, hangs, floods, a lost engine, a full disk."""

from __future__ import annotations

import contextlib
import io
import socket
import socketserver
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import pytest

from repromatrix.backends.base import Execution, Placement, Prepared, Setup
from repromatrix.backends.docker import kind as docker_kind
from repromatrix.backends.docker.calls import RUN_LABEL, ContainerSettings
from repromatrix.backends.docker.engine import DockerBackend
from repromatrix.backends.output import HEAD_BYTES, TAIL_BYTES
from repromatrix.errors import InfraError
from repromatrix.host.runner import detect_runner
from repromatrix.judgement import Outcome
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.matrix.selector import Selector
from repromatrix.models import tinymodel
from repromatrix.results import store as results
from repromatrix.run.cell import cell_context
from repromatrix.run.folder import RunFolder, pending
from repromatrix.run.images import ImageJobs
from repromatrix.run.main import Pacing, run_cells
from repromatrix.run.progress import Progress
from repromatrix.secret_env import OutputListener
from repromatrix.values import Cell, Image, Lane, Model
from support import paths
from support.runner import cell, fake_image

ROOT = paths.ROOT


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    client = docker.from_env()
    yield fake_image(client)
    client.close()


class GivenImage:
    """A real Docker backend whose every image is one already built (``fake_image``): the cell
    stage makes no image and no model, and its cells run in real containers."""

    def __init__(self, backend: DockerBackend, image: str) -> None:
        self.backend, self.image, self.name = backend, image, backend.name

    def prepare(self, images: Sequence[Image]) -> Mapping[str, Prepared]:
        return {i.key: Prepared(i.key, self.image, digest="sha256:x") for i in images}

    def vllm_version(self, prepared: Prepared) -> str | None:
        return None

    def make_model(
        self, model: Model, prepared: Prepared, models_root: Path, lora_ranks: Sequence[int] = ()
    ) -> tinymodel.TinyModel:
        return tinymodel.tiny_model_for(model, models_root)  # the fake harness reads no model

    def alive(self) -> bool:
        return self.backend.alive()

    def execute(
        self,
        cell: Cell,
        spec: Mapping[str, Any],
        prepared: Prepared,
        watch: OutputListener,
        placement: Placement | None = None,
    ) -> Execution:
        return self.backend.execute(cell, spec, prepared, watch, placement)

    def stop(self, cell_id: str) -> None:
        self.backend.stop(cell_id)

    def close(self) -> None:
        self.backend.close()


def run_on(
    tmp_path: Path,
    backend: DockerBackend,
    cells: Sequence[Cell],
    image: str,
    progress: Progress,
    jobs: int | None = None,
) -> dict[str, int]:
    """The cell stage of a run ``backend.run_id`` under ``tmp_path``, on this host's cores."""
    return run_cells(
        GivenImage(backend, image), cells, {}, detect_runner(), folder_of(tmp_path, backend),
        models_root=tmp_path / "models", progress=progress, pacing=Pacing(jobs),
    )  # fmt: skip


def folder_of(tmp_path: Path, backend: DockerBackend) -> RunFolder:
    return RunFolder(backend.run_id, tmp_path / backend.run_id)


def fake_settings(**kw: object) -> dict[Lane, ContainerSettings]:
    settings = ContainerSettings(entrypoint=("/bin/sh", "/harness"), shm_size="64m")
    return {Lane.CPU: replace(settings, **kw)}  # type: ignore[arg-type]


def saved(run_dir: Path) -> dict[str, results.CellResult]:
    found, problems = results.read_results(run_dir)
    assert problems == []
    return {r.variant: r for r in found}


@pytest.mark.docker
def test_every_fault_becomes_its_cells_outcome_and_the_run_goes_on(tmp_path: Path, image: str):
    kv = next(s for s in load_scenarios(ROOT / "scenarios") if s.id == "cpu-kv-cache-too-small")
    cells = [
        cell(real=kv, variant="oom-case"),
        cell(real=kv, variant="sleep-case", deadline_s=3),
        cell(real=kv, variant="kv-case"),
        cell(real=kv, variant="fine"),
    ]
    backend = DockerBackend("test-runner-faults", fake_settings(mem_limit="32m"))
    out = io.StringIO()
    try:
        counts = run_on(tmp_path, backend, cells, image, Progress(4, out=out))
    finally:
        backend.close()
    run_dir = folder_of(tmp_path, backend).path
    by_variant = saved(run_dir)
    assert by_variant["oom-case"].outcome is Outcome.OTHER_FAILURE
    assert by_variant["oom-case"].oom_killed and "memory" in by_variant["oom-case"].reason
    assert by_variant["sleep-case"].outcome is Outcome.TIMEOUT
    assert "3 s" in by_variant["sleep-case"].reason
    hit = by_variant["kv-case"]
    assert hit.outcome is Outcome.HIT
    assert hit.root_cause is not None and "To serve at least one request" in hit.root_cause.line
    assert by_variant["fine"].outcome is Outcome.AVOIDED
    assert by_variant["fine"].image_digest == "sha256:x"
    log = (results.cell_dir(run_dir, cells[2].id) / results.LOG_FILE).read_bytes()
    assert b"Engine core initialization failed" in log
    assert counts == {"other_failure": 1, "timeout": 1, "hit": 1, "avoided": 1}
    assert out.getvalue().count(" start ") == 4


class _Proxy(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A unix socket that forwards to the real engine until it is shut: an engine that dies."""

    daemon_threads = True
    target = "/var/run/docker.sock"


class _Pipe(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        upstream = socket.socket(socket.AF_UNIX)
        upstream.connect(_Proxy.target)
        self.server.open.append((self.request, upstream))  # type: ignore[attr-defined]

        def pump(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    s.close()

        threading.Thread(target=pump, args=(upstream, self.request), daemon=True).start()
        pump(self.request, upstream)


@pytest.mark.docker
def test_an_engine_that_disappears_mid_run_fails_the_cells_not_the_run(tmp_path: Path, image):
    sock = tmp_path / "engine.sock"
    proxy = _Proxy(str(sock), _Pipe)
    proxy.open = []  # type: ignore[attr-defined]
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    client = docker.DockerClient(base_url=f"unix://{sock}", version="1.41")
    run_id = "test-runner-engine-gone"
    backend = DockerBackend(run_id, fake_settings(), client=client)
    first = cell(variant="fine")
    second = cell(variant="sleep-case", deadline_s=120)
    third = cell(variant="after")

    def kill_engine_when_second_starts() -> None:
        real = docker.from_env()
        try:
            for _ in range(200):
                if real.containers.list(filters={"label": f"{RUN_LABEL}={run_id}"}, sparse=True):
                    break
                threading.Event().wait(0.1)
        finally:
            real.close()
        proxy.shutdown()
        proxy.server_close()
        for pair in proxy.open:  # type: ignore[attr-defined]
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked reading it
                s.close()

    out = io.StringIO()
    killer = threading.Thread(target=kill_engine_when_second_starts)
    progress = Progress(3, out=out)
    run_dir = folder_of(tmp_path, backend).path
    try:
        # The first cell runs before the watcher thread looks: start it after.
        run_on(tmp_path, backend, [first], image, progress, jobs=1)
        killer.start()
        run_on(tmp_path, backend, [second, third], image, progress, jobs=1)  # one after another
    finally:
        killer.join()
        backend.close()  # cannot reach the engine: leaves the container for the sweep
    by_variant = saved(run_dir)
    assert by_variant["fine"].outcome is Outcome.AVOIDED
    assert by_variant["sleep-case"].outcome is Outcome.INFRA_ERROR
    assert "engine" in by_variant["sleep-case"].reason.lower()
    # No cell is started against a dead engine: the third keeps no result ...
    assert "after" not in by_variant
    assert "stopped answering: 1 cell(s) not started" in out.getvalue()
    assert pending((first, second, third), run_dir, resume=True) == (third,)
    # ... and when the engine is back, the run's leftovers are swept by label and a resume
    # completes the run.
    again = DockerBackend(run_id, fake_settings())
    try:
        run_on(tmp_path, again, [third], image, Progress(1, out=out))
    finally:
        again.close()
    assert saved(run_dir)["after"].outcome is Outcome.AVOIDED
    real = docker.from_env()
    assert (
        real.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}, sparse=True)
        == []
    )
    real.close()


@pytest.mark.docker
def test_a_cell_that_floods_a_gigabyte_keeps_a_bounded_log_and_its_root_cause(
    tmp_path: Path, image: str
):
    kv = next(s for s in load_scenarios(ROOT / "scenarios") if s.id == "cpu-kv-cache-too-small")
    flood = cell(real=kv, variant="flood-case")
    backend = DockerBackend("test-runner-flood", fake_settings())
    try:
        run_on(tmp_path, backend, [flood], image, Progress(1))
    finally:
        backend.close()
    run_dir = folder_of(tmp_path, backend).path
    result = saved(run_dir)["flood-case"]
    assert result.outcome is Outcome.HIT
    assert result.root_cause is not None and "To serve at least one" in result.root_cause.line
    log = results.cell_dir(run_dir, flood.id) / results.LOG_FILE
    assert log.stat().st_size <= HEAD_BYTES + TAIL_BYTES + 200
    text = log.read_bytes()
    assert b"bytes of output dropped here]" in text and b"Engine core initialization" in text


@pytest.mark.docker
def test_a_container_that_ignores_sigterm_is_still_removed_at_cleanup(tmp_path: Path, image):
    stubborn = cell(variant="stubborn-case", deadline_s=600)
    backend = DockerBackend("test-runner-stubborn", fake_settings())
    running = threading.Thread(
        target=lambda: run_on(tmp_path, backend, [stubborn], image, Progress(1, out=io.StringIO()))
    )
    running.start()
    real = docker.from_env()
    label = {"label": f"{RUN_LABEL}=test-runner-stubborn"}
    try:
        for _ in range(300):
            if real.containers.list(filters=label, sparse=True):
                break
            threading.Event().wait(0.1)
        assert real.containers.list(filters=label), "the stubborn cell never started"
        backend.close()  # what an interrupt does: SIGTERM is ignored, the removal is forced
        running.join(timeout=120)
        assert not running.is_alive()
        assert real.containers.list(all=True, filters=label, sparse=True) == []
    finally:
        real.close()


@pytest.mark.root
@pytest.mark.docker
def test_a_full_results_disk_stops_the_run_with_one_line_and_no_half_written_result(
    tmp_path: Path, image: str
):
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
    try:
        (full / "filler").write_bytes(b"\0" * 60 * 1024)  # leaves less than a result needs
        fine = cell(variant="fine")
        backend = DockerBackend("test-runner-disk-full", fake_settings())
        try:
            with pytest.raises(InfraError, match=r"cannot save the result of .*No space left"):
                run_on(full, backend, [fine], image, Progress(1, out=io.StringIO()))
        finally:
            backend.close()
        left = sorted(p.name for p in full.rglob("*") if p.is_file())
        assert left == ["filler"]  # no result, no log, no temporary file
    finally:
        subprocess.run(["umount", str(full)], check=True)


@pytest.mark.docker
@pytest.mark.vllm
def test_the_tiny_model_is_generated_once_inside_the_first_cpu_image(tmp_path: Path):
    matrix = load_matrix(ROOT / "matrix.yaml")
    only = Selector(["cpu/0.32.0/cpu/tiny-llama/default/healthy-cpu/baseline"])
    cells = plan(matrix, load_scenarios(ROOT / "scenarios"), Lane.CPU, only)
    runtimes = {lane: config.runtime for lane, config in matrix.lanes.items()}
    out = io.StringIO()
    progress = Progress(1, out=out)
    setup = Setup(
        run_id="test-tiny-model",
        runtimes=runtimes,
        cache=ROOT / ".cache",
        models_root=tmp_path / "cache" / "models",
        dockerfiles=ROOT / "dockerfiles",
        note=progress.note,
    )
    backend = docker_kind.KIND.open(setup, [cells[0].image])
    made = []
    try:
        for _ in range(2):  # a second run finds the model made by the first
            jobs = ImageJobs(backend, cells, models_root=setup.models_root, note=progress.note)
            ready = jobs.make(cells[0].image.key)
            assert ready.error is None
            made.append(cell_context(cells[0], ready, setup.models_root))
    finally:
        backend.close()
    tiny = tinymodel.tiny_model_for(cells[0].model, setup.models_root)
    assert tiny.complete and tiny.has_adapter()
    assert tiny.path.parent == tmp_path / "cache" / "models"
    assert (tiny.path / "config.json").is_file()
    # The second image job served the model the first made (its image may have been built
    # by the first and found by the second: only the model is compared).
    assert [(c.model_path, c.adapter_path) for c in made] == [(str(tiny.path), None)] * 2
    started = [line for line in out.getvalue().splitlines() if line.endswith(": started")]
    assert sum("generating the tiny model" in line for line in started) == 1

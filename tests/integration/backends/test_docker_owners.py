"""On the real engine: containers of dead runs are swept at a run's start and a live run's are
kept; a busy GPU is traced to the container that holds it; a GPU image's CUDA is read."""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from repromatrix.backends.base import Placement
from repromatrix.backends.docker.calls import CELL_LABEL, RUN_LABEL, ContainerSettings, ImageBuild
from repromatrix.backends.docker.engine import DockerBackend
from repromatrix.backends.docker.owners import STARTED_LABEL, Owner, this_process
from repromatrix.host import nvidia_smi
from repromatrix.host.runner import Runner, RunnerGpu
from repromatrix.values import Image, Lane
from support.nvidia_smi import captured
from support.runner import fake_image

pytestmark = [pytest.mark.docker]

UUID = "GPU-1a1b2c3d-0000-0000-0000-000000000001"


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    engine = docker.from_env()
    yield engine
    engine.close()


@pytest.fixture
def tag(request: pytest.FixtureRequest) -> str:
    """A name of this test's own, for its run ids and containers."""
    return hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]


@pytest.fixture
def made(client: docker.DockerClient) -> Iterator[list[str]]:
    """The containers a test makes, removed at the end whatever happened."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(name).remove(force=True)


def dead_process() -> Owner:
    """A process of this host and boot that has ended, with the start time it had."""
    child = subprocess.Popen(["sleep", "30"])
    owner = this_process(child.pid)
    child.kill()
    child.wait()
    return owner


def create(client, image: str, made: list[str], name: str, run: str, owner: dict[str, str]):
    labels = {RUN_LABEL: run, CELL_LABEL: "cell", **owner}
    client.containers.create(image, ["/bin/sh", "-c", "exit 0"], name=name, labels=labels)
    made.append(name)


def test_a_dead_runs_container_is_removed_and_a_live_runs_is_kept(client, tag, made):
    image = fake_image(client)
    here, dead = this_process(), dead_process()
    assert dead.started is not None
    cases = {
        "dead": ("dead-run", dead.labels()),
        "earlier-boot": ("boot-run", {**here.labels(), "repromatrix.boot": "another-boot"}),
        "pid-reused": ("reused-run", {**here.labels(), STARTED_LABEL: "1"}),
        "live": ("live-run", here.labels()),  # another run of this very process: alive
        "other-host": ("far-run", {**dead.labels(), "repromatrix.host": "another-host"}),
        "no-owner": ("old-run", {}),  # made before owners were labelled: never touched
        "this-run": ("this-run", dead.labels()),  # the run's own: close() removes those
    }
    for case, (run, owner) in cases.items():
        create(client, image, made, f"rm-test-{tag}-{case}", f"{run}-{tag}", owner)
    lines: list[str] = []
    backend = DockerBackend(f"this-run-{tag}", {}, client=client, log=lines.append)
    removed = backend.sweep_stale()
    left = {c.name for c in client.containers.list(all=True, filters={"name": f"rm-test-{tag}"})}
    assert left == {
        f"rm-test-{tag}-{case}" for case in ("live", "other-host", "no-owner", "this-run")
    }
    assert removed >= 3  # and whatever other dead run this host had left
    (line,) = lines
    assert line.startswith(f"removed {removed} container(s) of runs no longer alive on this host")
    for case in ("dead", "earlier-boot", "pid-reused"):
        assert f"rm-test-{tag}-{case}" in line
    assert backend.sweep_stale() == 0  # nothing left to sweep; no second line
    assert len(lines) == 1


def test_a_busy_gpu_is_traced_to_the_container_holding_it(client, tag, made):
    name = f"busy-test-{tag}"
    holder = client.containers.run(
        fake_image(client),
        ["/bin/sh", "-c", "exec sleep 120"],
        name=name,
        labels={RUN_LABEL: f"orphan-{tag}", CELL_LABEL: "gpu/cell"},
        detach=True,
    )
    made.append(name)
    holder.reload()
    pid = int(holder.attrs["State"]["Pid"])
    header = captured("csv-query-compute-apps-h100-mig.txt").splitlines()[0]
    columns = [c.strip() for c in header.split(",")]
    row = {
        "timestamp": "2026/07/14 09:00:44.742",
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "gpu_bus_id": "00000000:00:09.0",
        "gpu_serial": "0000000000000",
        "gpu_uuid": UUID,
        "pid": str(pid),
        "process_name": "sleep",
        "used_gpu_memory [MiB]": "9000 MiB",
    }
    apps = header + "\n" + ", ".join(row[c] for c in columns) + "\n"

    def smi(args):
        if tuple(args) == nvidia_smi.QUERY_APPS:
            return apps
        if tuple(args) == nvidia_smi.QUERY_MEMORY_USED:
            return f"uuid, memory.used [MiB]\n{UUID}, 9000 MiB\n"
        return ""

    runner = Runner((RunnerGpu("0", "NVIDIA H100 80GB HBM3", UUID, 81559, "9.0"),), ("0",))
    settings = {Lane.GPU: ContainerSettings()}
    backend = DockerBackend(f"busy-{tag}", settings, client=client, runner=runner, smi=smi)
    reason = backend.busy_reason(Placement(gpu_ids=(UUID,))) or ""
    assert reason.startswith("GPU 0: NVIDIA H100 80GB HBM3 (79.6 GiB, compute capability 9.0) is ")
    assert f"pid {pid} sleep (9000 MiB) in container {name} (run orphan-{tag}, cell gpu/cell)" in (
        reason
    )
    rehearsal = DockerBackend(
        f"busy-{tag}",
        {Lane.GPU: ContainerSettings(devices=False)},
        client=client,
        runner=runner,
        smi=smi,
    )
    assert rehearsal.busy_reason(Placement(gpu_ids=(UUID,))) is None


def test_a_gpu_images_cuda_is_read_from_its_configuration(client, tag, tmp_path: Path):
    (tmp_path / "Dockerfile").write_text(
        f"FROM {fake_image(client)}\n"
        "ENV CUDA_VERSION=12.9.1 "
        "NVIDIA_REQUIRE_CUDA='cuda>=12.9 brand=tesla,driver>=535,driver<536'\n"
    )
    built = f"repromatrix-test/cuda:{tag}"
    backend = DockerBackend(
        f"cuda-{tag}", {}, [ImageBuild("gpu-x", built, tmp_path)], client=client
    )
    try:
        (prepared,) = backend.prepare([Image("gpu-x", Lane.GPU, "x", "x", None)]).values()
    finally:
        client.images.remove(built, force=True)
    assert prepared.error is None
    assert (prepared.cuda_version, prepared.cuda_requirement) == (
        "12.9.1",
        "cuda>=12.9 brand=tesla,driver>=535,driver<536",
    )

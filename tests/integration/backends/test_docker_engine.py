"""The Docker adapter on the real engine: deadlines, OOM kills, early stops, cleanup, builds."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import docker
import pytest

from repromatrix.backends.base import Prepared
from repromatrix.backends.docker.calls import RUN_LABEL, ContainerSettings, ImageBuild
from repromatrix.backends.docker.engine import DockerBackend
from repromatrix.values import Image, Lane
from support.runner import cell, fake_image

pytestmark = [
    pytest.mark.docker,
]

SETTINGS = {Lane.CPU: ContainerSettings(entrypoint=("/bin/sh", "/harness"), shm_size="64m")}


@pytest.fixture(scope="session")
def tools_image() -> Iterator[str]:
    client = docker.from_env()
    yield fake_image(client)
    client.close()


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Iterator[DockerBackend]:
    run_id = f"test-{hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]}"
    b = DockerBackend(run_id, SETTINGS)
    yield b
    b.close()
    assert leftovers(run_id) == []


def leftovers(run_id: str) -> list[str]:
    client = docker.from_env()
    found = client.containers.list(
        all=True, filters={"label": f"{RUN_LABEL}={run_id}"}, sparse=True
    )
    client.close()
    return [c.id for c in found]


def run(backend: DockerBackend, image: str, act: str, deadline_s: float = 60.0, **kw):
    watch = kw.pop("watch", lambda _chunk: False)
    c = cell(deadline_s=deadline_s)
    return backend.execute(c, {"act": act}, Prepared("k", image), watch)


def test_a_finished_cell_reports_its_exit_code_and_whole_log(backend, tools_image):
    execution = run(backend, tools_image, "ok")
    assert execution.exit_code == 0
    assert execution.log.splitlines()[-1].startswith(b"@@repromatrix-status ")
    assert not (execution.timed_out or execution.stopped_early or execution.oom_killed)
    assert leftovers(backend.run_id) == []  # removed as soon as it ended


def test_the_cells_own_deadline_stops_a_hanging_container(backend, tools_image):
    execution = run(backend, tools_image, "sleep", deadline_s=3)
    assert execution.timed_out
    assert execution.exit_code == 137  # killed, not exited
    assert execution.log == b"started\n"
    assert execution.total_s < 60


def test_a_memory_limit_gives_a_real_oom_kill(tools_image):
    settings = {Lane.CPU: ContainerSettings(entrypoint=("/bin/sh", "/harness"), mem_limit="32m")}
    backend = DockerBackend("test-oom", settings)
    try:
        execution = run(backend, tools_image, "oom")
    finally:
        backend.close()
    assert execution.oom_killed
    assert execution.exit_code == 137
    assert not execution.timed_out


def test_the_watcher_stops_a_cell_as_soon_as_it_has_seen_enough(backend, tools_image):
    seen: list[bytes] = []

    def watch(chunk: bytes) -> bool:
        seen.append(chunk)
        return b"root cause" in b"".join(seen)

    execution = run(backend, tools_image, "crash", deadline_s=120, watch=watch)
    assert execution.stopped_early and not execution.timed_out
    assert b"ValueError: the root cause" in execution.log
    assert execution.total_s < 60


@pytest.mark.parametrize("lane", [Lane.CPU, Lane.GPU])
def test_no_cell_container_gets_the_token_not_even_in_docker_inspect(tools_image, lane):
    token = "hf_abcdefghijklmnop"
    run_id = f"test-token-{lane.value}"
    # A GPU cell as a rehearsal makes it (no device request on a host without GPUs).
    settings = {lane: replace(SETTINGS[Lane.CPU], devices=False)}
    backend = DockerBackend(run_id, settings, environ={"HF_TOKEN": token})
    client = docker.from_env()
    inspected: list[str] = []

    def inspect_while_running(_chunk: bytes) -> bool:
        [running] = client.containers.list(filters={"label": f"{RUN_LABEL}={run_id}"})
        inspected.append(json.dumps(client.api.inspect_container(running.id)))
        return True  # seen: stop the cell

    try:
        c = cell(lane, deadline_s=60)
        stopped = backend.execute(
            c, {"act": "sleep"}, Prepared("k", tools_image), inspect_while_running
        )
        printed = backend.execute(c, {"act": "env"}, Prepared("k", tools_image), lambda _c: False)
    finally:
        backend.close()
        client.close()
    assert stopped.stopped_early and len(inspected) == 1
    assert "HF_HUB_OFFLINE=1" in inspected[0]  # the container's Config.Env, as inspect shows it
    assert "HF_TOKEN" not in inspected[0] and token not in inspected[0]
    assert printed.exit_code == 3 and b"HF_HUB_OFFLINE=1" in printed.log
    assert b"HF_TOKEN" not in printed.log  # not passed in, so not even redacted: absent


def test_a_missing_image_is_an_infra_error_not_a_crash(backend):
    execution = run(backend, "repromatrix-test/absent:nope", "ok")
    assert execution.infra_error is not None
    assert "absent" in execution.infra_error


def test_an_engine_that_is_gone_is_an_infra_error(tools_image):
    client = docker.DockerClient(base_url="unix:///tmp/repromatrix-no-engine.sock", version="1.41")
    backend = DockerBackend("test-gone", SETTINGS, client=client)
    execution = run(backend, tools_image, "ok")
    backend.close()
    assert execution.infra_error is not None
    assert "engine" in execution.infra_error


def test_sweep_removes_leftovers_of_the_run(tools_image):
    client = docker.from_env()
    client.containers.create(tools_image, ["/bin/sleep", "1"], labels={RUN_LABEL: "test-sweep"})
    backend = DockerBackend("test-sweep", SETTINGS)
    assert backend.sweep() == 1
    backend.close()
    assert leftovers("test-sweep") == []
    client.close()


def test_build_once_then_reuse_and_report_a_failed_build(tools_image, tmp_path: Path):
    good = tmp_path / "good"
    good.mkdir()
    (good / "Dockerfile").write_text(f"FROM {tools_image}\nLABEL x=1\n")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "Dockerfile").write_text(f"FROM {tools_image}\nRUN /bin/sh -c 'exit 7'\n")
    digest = hashlib.sha256(good.joinpath("Dockerfile").read_bytes()).hexdigest()
    tag = f"repromatrix-test/built:{digest[:12]}"
    builds = [ImageBuild("good", tag, good), ImageBuild("bad", "repromatrix-test/bad:1", bad)]
    images = [Image("good", Lane.CPU, "good", "x", None), Image("bad", Lane.CPU, "bad", "x", None)]
    client = docker.from_env()
    try:
        first = DockerBackend("test-build", SETTINGS, builds).prepare(images)
        second = DockerBackend("test-build", SETTINGS, builds).prepare(images)
    finally:
        client.images.remove(tag, force=True)
        client.close()
    assert first["good"].built and first["good"].error is None
    assert first["good"].digest is not None and first["good"].digest.startswith("sha256:")
    assert not second["good"].built and second["good"].digest == first["good"].digest
    assert first["bad"].error is not None and "exit 7" in json.dumps(first["bad"].error)
    assert "returned a non-zero code: 7" in first["bad"].error


def test_stopping_a_container_that_has_just_exited_is_not_an_engine_failure(backend, tools_image):
    def slow_watch(chunk: bytes) -> bool:
        if b"@@repromatrix-status" not in chunk:
            return False
        time.sleep(2)  # the harness exits meanwhile: the stop finds nothing running
        return True

    execution = run(backend, tools_image, "ok", watch=slow_watch)
    assert execution.infra_error is None
    assert execution.stopped_early
    assert execution.exit_code == 0


def test_a_failed_pull_is_that_images_error_and_builds_nothing(tmp_path: Path):
    # A registry on the loopback that is not there: no traffic leaves the machine.
    (tmp_path / "Dockerfile").write_text("FROM 127.0.0.1:9/vllm/vllm-openai:v0\n")
    build = ImageBuild("gpu-v0", "repromatrix-test/gpu:1", tmp_path, pull="127.0.0.1:9/vllm:v0")
    image = Image("gpu-v0", Lane.GPU, "v0", "127.0.0.1:9/vllm:v0", None)
    backend = DockerBackend("test-pull", SETTINGS, [build])
    try:
        prepared = backend.prepare([image])["gpu-v0"]
    finally:
        backend.close()
    assert prepared.error is not None
    assert prepared.error.startswith("pull of 127.0.0.1:9/vllm:v0 failed")
    assert not prepared.built

"""Ctrl-C during concurrent cells on the real Docker engine: every container stops and goes."""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from collections.abc import Iterator

import docker
import pytest

from repromatrix.backends.base import Execution, Prepared
from repromatrix.backends.docker.calls import RUN_LABEL, ContainerSettings
from repromatrix.backends.docker.engine import DockerBackend
from repromatrix.run.pool import Pool, Ticket
from repromatrix.run.schedule import Capacity, Job, Need
from repromatrix.values import Lane
from support.runner import cell, fake_image

pytestmark = [
    pytest.mark.docker,
]

SETTINGS = {Lane.CPU: ContainerSettings(entrypoint=("/bin/sh", "/harness"), shm_size="64m")}
GUARD_S = 120.0  # only a broken test waits this long; it decides nothing


def containers(run_id: str, *, running: bool = False) -> list[str]:
    client = docker.from_env()
    found = client.containers.list(
        all=not running, filters={"label": f"{RUN_LABEL}={run_id}"}, sparse=True
    )  # sparse: no inspect of a container that may be gone by then
    client.close()
    return [str(c.id) for c in found]


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Iterator[DockerBackend]:
    run_id = f"test-{hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]}"
    b = DockerBackend(run_id, SETTINGS)
    yield b
    b.close()


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_stops_and_removes_every_running_container(backend: DockerBackend) -> None:
    image = fake_image(backend.client)
    sleepers = [cell(variant=f"sleeper-{i}", deadline_s=600) for i in range(3)]
    executions: dict[str, Execution] = {}
    main = threading.get_ident()

    def sleeper(ticket: Ticket) -> str:
        one = next(c for c in sleepers if c.id == ticket.key)

        ticket.on_cancel(lambda: backend.stop(one.id))  # the run's cancel hook
        executions[one.id] = backend.execute(one, {"act": "sleep"}, Prepared("k", image), _no)
        return "ended"

    def interrupter(_ticket: Ticket) -> str:
        give_up = time.monotonic() + GUARD_S
        while len(containers(backend.run_id, running=True)) < 3:
            assert time.monotonic() < give_up, "the three containers never ran together"
            time.sleep(0.2)
        signal.pthread_kill(main, signal.SIGINT)
        return "signalled"

    jobs = [Job(c.id, Need(cores=1), 600.0) for c in sleepers] + [Job("ctrl-c", Need(), 1.0)]
    work = {c.id: sleeper for c in sleepers} | {"ctrl-c": interrupter}
    pool = Pool(jobs, Capacity(core_ids=(0, 1, 2)), work)
    for _done in pool.ended():
        pass
    report = pool.report

    assert report.interrupted
    # The interrupter may still be returning when the pool cancels what runs: not a cell.
    assert set(report.cancelled) - {"ctrl-c"} == {c.id for c in sleepers}
    assert containers(backend.run_id) == []  # gone before the backend's close() sweeps
    for execution in executions.values():  # killed and removed, not timed out
        assert not execution.timed_out and execution.exit_code in (137, None)


def _no(_chunk: bytes) -> bool:
    return False

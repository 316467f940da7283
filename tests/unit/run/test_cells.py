"""The cell stage through the pool: GPUs never shared, limits held, hung cells alone, skips.

A recording backend stands behind the project's ``Backend`` interface (pure
wiring logic: what the stage hands the backend, and when); the real engine is
exercised by ``test_schedule_docker.py`` and ``test_cpu_matrix_jobs.py``.
"""

from __future__ import annotations

import io
import signal
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.backends.base import Execution, Placement, Prepared
from repromatrix.backends.docker.calls import ContainerSettings
from repromatrix.backends.docker.engine import DockerBackend
from repromatrix.backends.local import LocalBackend, kill_tagged
from repromatrix.host.idle import IdleWait
from repromatrix.host.runner import detect_runner
from repromatrix.judgement import Outcome
from repromatrix.run.main import Pacing
from repromatrix.run.schedule import GIB, capacity_of
from repromatrix.values import Cell, Lane
from support.pool import GUARD_S, UUIDS, Recorder, at_once, resources, run, saved, together
from support.runner import cell


def test_no_two_running_gpu_cells_share_a_gpu_and_the_engine_gets_uuids(tmp_path: Path):
    cells = [cell(Lane.GPU, gpus=1, variant=f"one-{i}") for i in range(4)]
    cells += [cell(Lane.GPU, gpus=2, variant=f"two-{i}") for i in range(3)]
    backend = Recorder()
    run(tmp_path, backend, cells, resources(gpus=4))
    assert backend.clashes == []
    assert len(saved(tmp_path)) == 7
    for one in cells:
        placement = backend.placements[one.id]
        assert placement is not None and placement.gpu_ids is not None
        assert len(placement.gpu_ids) == one.gpu.count
        assert set(placement.gpu_ids) <= set(UUIDS.values())


def test_four_single_gpu_cells_run_together_on_four_gpus(tmp_path: Path):
    cells = [cell(Lane.GPU, gpus=1, variant=f"one-{i}") for i in range(4)]
    backend = Recorder(hold=together(4))  # serial execution would break the barrier
    run(tmp_path, backend, cells, resources(gpus=4))
    assert backend.most == 4 and backend.clashes == []
    ids = [backend.placements[c.id].gpu_ids for c in cells]  # type: ignore[union-attr]
    assert sorted(i for one in ids for i in one or ()) == sorted(UUIDS.values())


def test_jobs_caps_the_cells_at_once(tmp_path: Path):
    cells = [cell(variant=f"c{i}") for i in range(4)]
    backend, out = Recorder(hold=together(2)), io.StringIO()
    counts = run(tmp_path, backend, cells, resources(cores=8), out, pacing=Pacing(jobs=2))
    assert backend.most == 2
    assert counts == {"other_failure": 4}  # each ended on its own, none by a broken barrier
    # The scheduler's own count of running cells at each start (exact, unlike the recorder's).
    assert max(at_once(out)) == 2


def test_cores_and_memory_cap_the_cpu_cells_at_once(tmp_path: Path):
    # Each cell needs one core and 3 GiB plus its 256 KiB KV budget: 7 GiB holds two.
    cells = [cell(variant=f"c{i}") for i in range(4)]
    backend, out = Recorder(hold=together(2)), io.StringIO()
    run(tmp_path, backend, cells, resources(cores=8, memory=7 * GIB), out)
    assert backend.most == 2 and max(at_once(out)) == 2
    backend, out = Recorder(hold=together(1)), io.StringIO()
    run(tmp_path / "one-core", backend, cells, resources(cores=1), out)
    assert backend.most == 1 and max(at_once(out)) == 1


def test_a_hung_cell_does_not_block_the_others_and_ends_at_its_deadline(tmp_path: Path):
    hung = cell(variant="hung", deadline_s=1)
    others = [cell(variant=f"quick-{i}") for i in range(3)]
    started = threading.Event()
    ended: list[str] = []

    def hold(one: Cell, stop: threading.Event) -> Execution:
        if one is hung:
            started.set()
            # What a backend does: wait for the cell to end or its deadline, then stop it.
            timed_out = not stop.wait(one.deadline_s)
            ended.append(one.variant.name)
            return Execution(None, b"", timed_out=timed_out)
        assert started.wait(GUARD_S)
        ended.append(one.variant.name)
        return Execution(0, b"")

    run(tmp_path, Recorder(hold=hold), [hung, *others], resources(cores=4))
    assert ended[-1] == "hung" and len(ended) == 4
    assert saved(tmp_path)[hung.id].outcome is Outcome.TIMEOUT


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_stops_every_running_cell_and_keeps_the_finished_ones(tmp_path: Path):
    quick = cell(variant="quick")
    hung = [cell(variant=f"hung-{i}") for i in range(2)]
    main = threading.get_ident()

    def hold(one: Cell, stop: threading.Event) -> Execution:
        if one is quick:
            return Execution(0, b"")
        if one is hung[0]:  # once the quick cell is saved, Ctrl-C the run
            while not (tmp_path / "cells").exists() or not saved(tmp_path):
                assert not stop.wait(0.05)
            signal.pthread_kill(main, signal.SIGINT)
        assert stop.wait(GUARD_S), "the cell was never stopped"
        return Execution(137, b"killed")

    backend = Recorder(hold=hold)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, backend, [quick, *hung], resources(cores=4))
    assert sorted(backend.stopped) == sorted(c.id for c in hung)
    assert list(saved(tmp_path)) == [quick.id]  # the stopped cells are left to --resume


def test_a_cell_too_big_for_the_runner_is_skipped_with_the_reason(tmp_path: Path):
    wide, narrow = cell(Lane.GPU, gpus=4, variant="wide"), cell(Lane.GPU, gpus=1, variant="one")
    backend = Recorder()
    counts = run(tmp_path, backend, [wide, narrow], resources(gpus=2))
    results = saved(tmp_path)
    assert results[wide.id].outcome is Outcome.SKIPPED
    assert "needs 4 GPU(s)" in results[wide.id].reason and "0, 1" in results[wide.id].reason
    assert wide.id not in backend.placements and narrow.id in backend.placements
    assert counts["skipped"] == 1


def test_a_busy_gpu_makes_the_cell_an_infra_error_never_a_verdict(tmp_path: Path):
    gpu, cpu = cell(Lane.GPU, gpus=1, variant="on-gpu"), cell(variant="on-cpu")
    asked: list[Placement] = []
    why = "GPU 0: NVIDIA H200 is not idle: 9000 MiB in use; held by pid 7 python"

    def busy(placement: Placement) -> str:
        asked.append(placement)
        return why

    backend = Recorder(busy=busy)
    counts = run(tmp_path, backend, [gpu, cpu], resources(gpus=1))
    results = saved(tmp_path)
    assert results[gpu.id].outcome is Outcome.INFRA_ERROR
    assert results[gpu.id].reason == why
    assert gpu.id not in backend.placements  # never started: nothing ran on the busy GPU
    assert [p.gpu_ids for p in asked] == [(UUIDS["0"],)]  # the CPU cell asked nothing
    assert results[cpu.id].outcome is not Outcome.INFRA_ERROR
    assert counts["infra_error"] == 1


def test_a_gpu_busy_at_first_look_is_waited_for_and_then_the_cell_runs(tmp_path: Path):
    gpu = cell(Lane.GPU, gpus=1)
    answers = iter(["GPU 0: NVIDIA H200 is not idle: 9000 MiB in use", "still", None])
    backend = Recorder(busy=lambda _placement: next(answers))
    idle_wait = IdleWait(wait_s=600, poll_s=0)  # looks again at once: no time passes in a test
    run(tmp_path, backend, [gpu], resources(gpus=1), pacing=Pacing(idle_wait=idle_wait))
    assert gpu.id in backend.placements  # it started once the GPU was idle
    assert saved(tmp_path)[gpu.id].outcome is not Outcome.INFRA_ERROR


def test_a_gpu_busy_for_the_whole_wait_is_an_infra_error_saying_how_long(tmp_path: Path):
    gpu = cell(Lane.GPU, gpus=1)
    looks: list[Placement] = []

    def busy(placement: Placement) -> str:
        looks.append(placement)
        return "GPU 0: NVIDIA H200 is not idle: 9000 MiB in use"

    ticks = iter(range(0, 10_000, 10))  # a clock that moves 10 s at each reading
    idle_wait = IdleWait(wait_s=30, poll_s=0, clock=lambda: float(next(ticks)))
    backend = Recorder(busy=busy)
    run(tmp_path, backend, [gpu], resources(gpus=1), pacing=Pacing(idle_wait=idle_wait))
    result = saved(tmp_path)[gpu.id]
    assert result.outcome is Outcome.INFRA_ERROR
    assert result.reason.endswith("9000 MiB in use; still so after 30 s of waiting")
    assert gpu.id not in backend.placements
    assert 1 < len(looks) < 10  # looked again, and stopped once the wait was over


def test_a_driver_older_than_the_images_cuda_is_an_infra_error(tmp_path: Path):
    gpu = cell(Lane.GPU, gpus=1)
    host = resources(gpus=1)
    host = replace(
        host, gpus=(replace(host.gpus[0], driver_version="535.129.03", cuda_version="12.2"),)
    )
    newer = Recorder(make=lambda image: Prepared(image.key, "img", cuda_version="12.9.1"))
    run(tmp_path / "new", newer, [gpu], host)
    reason = saved(tmp_path / "new")[gpu.id].reason
    assert saved(tmp_path / "new")[gpu.id].outcome is Outcome.INFRA_ERROR
    assert reason.startswith("the driver 535.129.03 supports CUDA up to 12.2, and the image")
    assert gpu.id not in newer.placements
    older = Recorder(make=lambda image: Prepared(image.key, "img", cuda_version="12.2.2"))
    run(tmp_path / "old", older, [gpu], host)
    assert gpu.id in older.placements


def test_a_driver_too_old_is_not_waited_for(tmp_path: Path):
    gpu = cell(Lane.GPU, gpus=1)
    host = resources(gpus=1)
    host = replace(host, gpus=(replace(host.gpus[0], cuda_version="12.2"),))
    looks: list[Placement] = []
    backend = Recorder(
        make=lambda image: Prepared(image.key, "img", cuda_version="12.9.1"),
        busy=lambda placement: looks.append(placement) or "busy",
    )
    never = IdleWait(wait_s=600, poll_s=0, clock=lambda: 0.0)  # a wait that would not end
    run(tmp_path, backend, [gpu], host, pacing=Pacing(idle_wait=never))
    assert saved(tmp_path)[gpu.id].reason.startswith("the driver")
    assert looks == []  # waiting changes no driver: the GPUs were not even looked at


def test_a_rehearsal_checks_neither_driver_nor_idleness(tmp_path: Path):
    gpu = cell(Lane.GPU, gpus=1)
    host = resources(gpus=1)
    host = replace(host, rehearse=True, gpus=(replace(host.gpus[0], cuda_version="12.2"),))
    backend = Recorder(
        make=lambda image: Prepared(image.key, "img", cuda_version="12.9.1"),
        busy=lambda _placement: "busy",
    )
    run(tmp_path, backend, [gpu], host)
    assert saved(tmp_path)[gpu.id].outcome is not Outcome.INFRA_ERROR


def test_a_tensor_parallel_cell_gets_gpus_of_one_numa_node(tmp_path: Path):
    # A 4-GPU runner whose GPUs 0-1 and 2-3 sit on two NUMA nodes: what the backend is handed.
    host = replace(resources(gpus=4), gpu_groups=(("0", "1"), ("2", "3")))
    one, two = cell(Lane.GPU, gpus=1, variant="one"), cell(Lane.GPU, gpus=2, variant="two")
    backend = Recorder(hold=together(2))
    run(tmp_path, backend, [one, two], host)
    # The wider cell first, on a whole node; the narrow one on the other, never across.
    assert backend.placements[two.id].gpu_ids == (UUIDS["0"], UUIDS["1"])  # type: ignore[union-attr]
    assert backend.placements[one.id].gpu_ids == (UUIDS["2"],)  # type: ignore[union-attr]


def test_the_docker_container_gets_exactly_the_scheduled_gpus(tmp_path: Path):
    gpu = cell(Lane.GPU, gpus=2)
    backend = DockerBackend("t", {Lane.GPU: ContainerSettings()}, client=object())  # type: ignore[arg-type]
    placement = Placement(gpu_ids=(UUIDS["2"], UUIDS["3"]))
    call = backend.call_for(gpu, {}, Prepared(gpu.image.key, "img"), placement)
    kwargs = call.create_kwargs()
    assert kwargs["device_requests"][0]["device_ids"] == [UUIDS["2"], UUIDS["3"]]
    assert kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] == f"{UUIDS['2']},{UUIDS['3']}"
    rehearsal = replace(ContainerSettings(), devices=False)
    backend.settings[Lane.GPU] = rehearsal
    assert (
        "device_requests"
        not in backend.call_for(gpu, {}, Prepared("k", "i"), placement).create_kwargs()
    )


def test_the_pool_lends_the_runs_gpus_as_every_other_stage_sees_them(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-not-on-this-host")  # --gpus wins over it
    runner = detect_runner("MIG-4f1c,1", smi=lambda _args: "")
    assert runner.gpu_ids == ("MIG-4f1c", "1")
    assert capacity_of(runner).total.gpus == 2


def test_the_local_backend_stops_one_cell_and_its_children(tmp_path: Path):
    # A stand-in for the venv's python: a harness that starts a child and hangs.
    fake = tmp_path / "venv" / "bin" / "python3"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\nsleep 600 &\necho up\nwait\n")
    fake.chmod(0o755)
    backend = LocalBackend(tmp_path / "venvs", environ={"PATH": "/usr/bin:/bin"})
    one, up = cell(variant="hangs", deadline_s=GUARD_S), threading.Event()
    done: list[Execution] = []

    def watch(chunk: bytes) -> bool:
        up.set()
        return False

    prepared = Prepared("k", str(tmp_path / "venv"))
    thread = threading.Thread(target=lambda: done.append(backend.execute(one, {}, prepared, watch)))
    thread.start()
    assert up.wait(GUARD_S)
    token = backend.tokens[one.id]
    backend.stop(one.id)
    thread.join(GUARD_S)
    assert done and not done[0].timed_out and done[0].exit_code != 0
    assert kill_tagged(token) == 0  # the child went with its cell
    backend.close()

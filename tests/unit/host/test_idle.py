"""Are a cell's GPUs idle before it starts (``repromatrix.host.idle``)? nvidia-smi's answers are
outputs captured on real machines, behind the project's ``Smi`` interface."""

from __future__ import annotations

from repromatrix.host import nvidia_smi
from repromatrix.host.idle import (
    IDLE_MEMORY_MIB,
    Busy,
    GpuProcess,
    GpuUse,
    IdleWait,
    busy,
    describe,
    read_use,
    unreadable,
    wait_idle,
)
from repromatrix.host.runner import detect_runner
from support.nvidia_smi import A100_MIG, H100, captured, machine

UUID = "GPU-00000000-0000-0000-0000-000000000000"  # the exporter masks every GPU's UUID so
APPS = "csv-query-compute-apps-h100-mig.txt"  # its H100 under load: memhog x2, gpu_burn
A100_GPU0 = "GPU-513536b6-7d19-9063-b049-1e69664bb298"


def h100():
    return detect_runner(environ={}, smi=machine(H100))


def no_process() -> str:
    """The compute-process query where nothing runs: its header and no row."""
    return captured(APPS).splitlines()[0] + "\n"


# -- reading nvidia-smi -------------------------------------------------------------------------


def test_the_processes_and_memory_in_use_are_read():
    # The H100 capture's memory in use (19818 MiB) and the processes of the exporter's H100.
    smi = machine(
        {nvidia_smi.QUERY_APPS: APPS, nvidia_smi.QUERY_MEMORY_USED: H100[nvidia_smi.QUERY_GPUS]}
    )
    use = read_use(smi)
    assert use is not None
    assert use.used_mib == {UUID: 19818}
    assert use.processes == (
        GpuProcess(UUID, 21180, "/root/tools/memhog", 2296),
        GpuProcess(UUID, 21181, "/root/tools/memhog", 1272),
        GpuProcess(UUID, 21198, "./gpu_burn", 7484),
    )


def test_no_answer_is_not_idle():
    assert read_use(lambda _args: "") is None
    assert read_use(machine({nvidia_smi.QUERY_MEMORY_USED: H100[nvidia_smi.QUERY_GPUS]})) is None
    gpu = h100().gpus[0]
    assert unreadable([gpu]) == (
        "nvidia-smi did not answer, so GPU 0: NVIDIA H100 80GB HBM3 (79.6 GiB, compute "
        "capability 9.0) could not be checked idle before the cell"
    )


def test_a_mig_slices_own_memory_in_use_comes_from_the_xml_report():
    smi = machine(
        {
            **A100_MIG,
            nvidia_smi.QUERY_APPS: APPS,  # any answer: a real header and rows
            nvidia_smi.QUERY_MEMORY_USED: H100[nvidia_smi.QUERY_GPUS],
        }
    )
    use = read_use(smi, slices=True)
    assert use is not None and use.slice_used_mib == {(A100_GPU0, n): 12 for n in range(4)}
    assert read_use(smi).slice_used_mib == {}  # no slice asked about: no -q -x


# -- judging ------------------------------------------------------------------------------------


def test_a_gpu_with_processes_or_memory_in_use_is_busy_and_named():
    runner = h100()
    gpu = runner.gpus[0]
    use = GpuUse((GpuProcess(UUID, 21198, "./gpu_burn", 7484),), {UUID: 19818})
    (found,) = busy([gpu], runner, use)
    assert found == Busy(gpu, use.processes, 19818)
    assert describe([found], {21198: "container repromatrix-x (run r1, cell c1)"}) == (
        "GPU 0: NVIDIA H100 80GB HBM3 (79.6 GiB, compute capability 9.0) is not idle: "
        "19818 MiB in use; held by pid 21198 ./gpu_burn (7484 MiB) in container repromatrix-x "
        "(run r1, cell c1) (a busy GPU fails a cell for reasons that are not its image's)"
    )


def test_idle_is_no_process_and_memory_under_the_threshold():
    runner = h100()
    gpu = runner.gpus[0]
    assert busy([gpu], runner, GpuUse((), {UUID: 0})) == ()
    assert busy([gpu], runner, GpuUse((), {UUID: IDLE_MEMORY_MIB - 1})) == ()
    # Memory in use without a process nvidia-smi can list (another PID namespace): busy.
    assert busy([gpu], runner, GpuUse((), {UUID: IDLE_MEMORY_MIB})) != ()
    # A process that holds next to nothing: busy all the same.
    assert busy([gpu], runner, GpuUse((GpuProcess(UUID, 7, "python", 0),), {UUID: 0})) != ()
    # Another GPU's process is not this one's.
    other = GpuUse((GpuProcess("GPU-other", 7, "python", 900),), {UUID: 1})
    assert busy([gpu], runner, other) == ()


def test_a_mig_slice_is_judged_by_its_own_memory_its_gpus_processes_named():
    runner = detect_runner(
        "MIG-a45882f0-9215-5733-a0c1-49286ab31cb5", environ={}, smi=machine(A100_MIG)
    )
    (slice_1,) = [gpu for gpu in runner.usable if gpu is not None]
    assert slice_1.index == "0:1"
    on_gpu = (GpuProcess(A100_GPU0, 42, "python", 8000),)
    # Another slice of the same GPU is in use (its GPU's memory too): this one is idle.
    idle = GpuUse(on_gpu, {A100_GPU0: 8000}, {(A100_GPU0, 0): 8000, (A100_GPU0, 1): 12})
    assert busy([slice_1], runner, idle) == ()
    held = GpuUse(on_gpu, {A100_GPU0: 8000}, {(A100_GPU0, 1): 8000})
    (found,) = busy([slice_1], runner, held)
    assert (
        "MIG 0:1: NVIDIA A100-SXM4-80GB MIG 1g.20gb (19.5 GiB) is not idle: 8000 MiB in use; "
        "held on its GPU by pid 42 python (8000 MiB)" in describe([found])
    )


class FakeTime:
    """A clock that moves only when the wait pauses; ``pause`` records what it was asked and
    says to stop once ``cancel_after`` pauses have passed."""

    def __init__(self, cancel_after: int | None = None) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []
        self.cancel_after = cancel_after

    def clock(self) -> float:
        return self.now

    def pause(self, seconds: float) -> bool:
        self.pauses.append(seconds)
        self.now += seconds
        return self.cancel_after is not None and len(self.pauses) >= self.cancel_after


def looks(*answers: str | None):
    """A check that gives ``answers`` in turn (the GPUs as each look at them finds them)."""
    given = iter(answers)
    return lambda: next(given)


def test_a_gpu_let_go_of_while_the_cell_waits_lets_the_cell_start():
    time = FakeTime()
    wait = IdleWait(wait_s=60, poll_s=5, clock=time.clock)
    assert wait_idle(looks("busy", "busy", None), wait, time.pause) is None
    assert time.pauses == [5, 5]


def test_a_gpu_still_busy_after_the_wait_gives_its_reason_and_how_long_it_waited():
    time = FakeTime()
    wait = IdleWait(wait_s=12, poll_s=5, clock=time.clock)
    reason = wait_idle(lambda: "GPU 0: NVIDIA H100 is not idle", wait, time.pause)
    assert reason == "GPU 0: NVIDIA H100 is not idle; still so after 12 s of waiting"
    assert time.pauses == [5, 5, 2]  # bounded: the last pause ends at the wait's end


def test_no_wait_decides_at_the_first_look_and_an_interrupt_ends_the_wait():
    time = FakeTime()
    assert wait_idle(looks("busy"), IdleWait(wait_s=0, clock=time.clock), time.pause) == "busy"
    assert time.pauses == []
    interrupted = FakeTime(cancel_after=1)
    wait = IdleWait(wait_s=600, poll_s=5, clock=interrupted.clock)
    assert wait_idle(lambda: "busy", wait, interrupted.pause).startswith("busy; still so")
    assert interrupted.pauses == [5]

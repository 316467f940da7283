"""Whether the GPUs a cell is about to get are idle, as nvidia-smi sees them now.

A GPU is idle when no compute process runs on it and less than
``IDLE_MEMORY_MIB`` of its memory is in use. The memory rule catches a process
nvidia-smi cannot list (one in another PID namespace): an idle GPU shows 0-2
MiB in use (17 MiB for a MIG slice) in the captured outputs, and a CUDA
context alone takes a few hundred. A MIG slice is judged by its own memory
(``-q -x``); the compute-process query names only the GPU a process runs on,
so the processes of its GPU are named as the possible holders.

A GPU left busy (a container orphaned by a killed CI job) would fail the cell
for reasons that are not its image's: the caller makes the cell an
infrastructure error with ``describe``'s words, never a verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from repromatrix.host import nvidia_smi
from repromatrix.host.nvidia_smi import Smi, mebibytes
from repromatrix.host.runner import Runner, RunnerGpu

IDLE_MEMORY_MIB = 256
IDLE_POLL_S = 5.0  # between two looks at a busy GPU: nvidia-smi takes a fraction of a second


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU, as ``--query-compute-apps`` lists it."""

    gpu_uuid: str
    pid: int | None
    name: str
    used_mib: int | None = None


@dataclass(frozen=True)
class GpuUse:
    """What runs on the host's GPUs and how much memory each uses, read at one moment."""

    processes: tuple[GpuProcess, ...] = ()
    used_mib: Mapping[str, int] = field(default_factory=dict)  # whole GPUs, by UUID
    slice_used_mib: Mapping[tuple[str, int], int] = field(default_factory=dict)  # (GPU, device)


def read_use(smi: Smi, slices: bool = False) -> GpuUse | None:
    """The GPUs' processes and memory in use now (a slice's from ``-q -x`` when ``slices``);
    None when nvidia-smi did not answer (a query that lists nothing still has its header)."""
    apps, memory = smi(nvidia_smi.QUERY_APPS), smi(nvidia_smi.QUERY_MEMORY_USED)
    if not apps.strip() or not memory.strip():
        return None
    processes = tuple(p for row in nvidia_smi.parse_csv(apps) if (p := _process_of(row)))
    used = {
        str(row["uuid"]): mib
        for row in nvidia_smi.parse_csv(memory)
        if row.get("uuid") is not None and (mib := mebibytes(row.get("memory.used"))) is not None
    }
    parts = nvidia_smi.parse_mig_memory(smi(nvidia_smi.XML)) if slices else {}
    own = {key: part.used for key, part in parts.items() if part.used is not None}
    return GpuUse(processes, used, own)


def _process_of(row: nvidia_smi.Row) -> GpuProcess | None:
    uuid, pid = row.get("gpu_uuid"), row.get("pid")
    if uuid is None:
        return None
    number = int(pid) if pid is not None and pid.isdigit() else None
    name = row.get("process_name") or "?"
    return GpuProcess(uuid, number, name, mebibytes(row.get("used_gpu_memory")))


@dataclass(frozen=True)
class Busy:
    """A GPU that is not idle: what runs on it and how much of its memory is in use."""

    gpu: RunnerGpu
    processes: tuple[GpuProcess, ...]
    used_mib: int | None


def busy(gpus: Sequence[RunnerGpu], runner: Runner, use: GpuUse) -> tuple[Busy, ...]:
    """The GPUs of ``gpus`` that are not idle in ``use`` (``runner`` knows a slice's GPU)."""
    found = []
    for gpu in gpus:
        parent = runner.parent_of(gpu)
        on = (parent or gpu).uuid
        processes = tuple(p for p in use.processes if on is not None and p.gpu_uuid == on)
        if parent is None:
            used = use.used_mib.get(gpu.uuid or "")
            idle = not processes and (used is None or used < IDLE_MEMORY_MIB)
        else:
            device = int(gpu.index.partition(":")[2])
            used = use.slice_used_mib.get((parent.uuid or "", device))
            idle = used is None or used < IDLE_MEMORY_MIB
        if not idle:
            found.append(Busy(gpu, processes, used))
    return tuple(found)


def describe(found: Sequence[Busy], holders: Mapping[int, str] | None = None) -> str:
    """One reason for the busy GPUs, naming each process and, where ``holders`` knows it, the
    container that runs it: ``GPU 0: NVIDIA H100 ... is not idle: 19818 MiB in use; pid 21180
    /root/tools/memhog (2296 MiB) in container x``."""
    known = holders or {}
    parts = []
    for one in found:
        what = f"{one.gpu.summary} is not idle"
        if one.used_mib is not None:
            what += f": {one.used_mib} MiB in use"
        held = [_process(p, known) for p in one.processes]
        if held:
            on = " on its GPU" if one.gpu.mig_profile else ""
            what += f"; held{on} by " + ", ".join(held)
        parts.append(what)
    return "; ".join(parts) + " (a busy GPU fails a cell for reasons that are not its image's)"


def _process(process: GpuProcess, holders: Mapping[int, str]) -> str:
    text = f"pid {process.pid} {process.name}" if process.pid is not None else process.name
    if process.used_mib is not None:
        text += f" ({process.used_mib} MiB)"
    holder = holders.get(process.pid) if process.pid is not None else None
    return f"{text} in {holder}" if holder else text


def unreadable(gpus: Sequence[RunnerGpu]) -> str:
    """The reason when nvidia-smi did not answer at a cell's start."""
    names = ", ".join(gpu.summary for gpu in gpus)
    return f"nvidia-smi did not answer, so {names} could not be checked idle before the cell"


@dataclass(frozen=True)
class IdleWait:
    """How long a cell waits for its GPUs to become idle (the matrix's ``gpu_idle_wait_s``),
    how often it looks again, and the clock that measures the wait."""

    wait_s: float = 0.0  # 0: the first look decides
    poll_s: float = IDLE_POLL_S
    clock: Callable[[], float] = time.monotonic


NO_WAIT = IdleWait()  # the first look decides


def wait_idle(
    check: Callable[[], str | None], wait: IdleWait, pause: Callable[[float], bool]
) -> str | None:
    """None as soon as ``check`` finds the GPUs idle; else its last reason once ``wait.wait_s``
    has passed (saying how long it waited), or at once when ``pause`` (which waits up to the
    seconds it is given) says to stop waiting (the run is interrupted)."""
    start = wait.clock()
    reason = check()
    while reason is not None:
        waited = wait.clock() - start
        left = wait.wait_s - waited
        if left <= 0 or pause(min(wait.poll_s, left)):
            if wait.wait_s <= 0:
                return reason
            return f"{reason}; still so after {waited:.0f} s of waiting"
        reason = check()
    return None

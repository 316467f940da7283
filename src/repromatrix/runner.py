"""This runner: the GPUs it has and may lend cells, its cores, its free memory, read once per run.

``detect_runner`` is the one place that looks at the host. The GPUs a run may use
are ``--gpus``, else the first of ``CUDA_VISIBLE_DEVICES`` and
``NVIDIA_VISIBLE_DEVICES`` that is set, else every GPU ``nvidia-smi -L`` lists.
Each grammar is the same: ``0,1``, ``GPU-<uuid>`` or ``MIG-<id>``, ``all``, or
``none`` (also an empty value, ``void``, ``-1``, ``NoDevFiles``). An index or GPU
UUID that nvidia-smi lists becomes its index, so one GPU never counts twice; an id
it does not list (no nvidia-smi on a dry-run host, a MIG id) is kept as given, and
whatever consumes it (Docker's device request) says whether it exists.

Cells that run at once on one runner take disjoint ids (``select_devices``), never
"the first N" of the host.

Inside a Slurm job the runner is what Slurm allocated: its cores are
``SLURM_CPUS_PER_TASK`` (else ``SLURM_CPUS_ON_NODE``) at most, its memory the job's
(``SLURM_MEM_PER_NODE``, or per CPU times the CPUs), and its GPUs the
``CUDA_VISIBLE_DEVICES`` Slurm set. Under device constraints Slurm numbers those from 0
and ``nvidia-smi`` inside the job lists only them, also from 0, so an index is mapped to
the UUID nvidia-smi gives it: a daemon outside the job (Docker's) counts the host's GPUs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix.errors import InfraError, UsageError

# Read in this order after the command line: what CUDA honours, then the NVIDIA runtime's.
GPU_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
DEVICE_ID = re.compile(r"[0-9]+|(?:GPU|MIG)-[0-9A-Za-z/_-]+")
NO_DEVICES = frozenset({"", "none", "void", "-1", "NoDevFiles"})
# MIG instances are listed indented below their GPU: they are not GPUs of the host.
SMI_LINE = re.compile(r"GPU (?P<index>\d+): (?P<name>.*?)(?: \(UUID: (?P<uuid>[^)]+)\))?\s*\Z")


@dataclass(frozen=True)
class RunnerGpu:
    """One GPU as ``nvidia-smi -L`` lists it."""

    index: str
    name: str
    uuid: str | None = None


MIB = 1 << 20


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm job this process runs in, and what Slurm allocated it on this node."""

    job_id: str  # SLURM_JOB_ID (an array task's own id)
    cpus: int | None = None  # cores allocated (None: not said)
    memory: int | None = None  # bytes allocated (None: not said, or all of the node's)


@dataclass(frozen=True)
class Runner:
    """What this runner is and may lend cells, read once per run."""

    gpus: tuple[RunnerGpu, ...] = ()  # every GPU the host lists
    gpu_ids: tuple[str, ...] = ()  # those this run may use, as indexes where listed
    core_ids: tuple[int, ...] = ()  # the cores this process may run on
    free_memory: int = 0  # bytes, MemAvailable when read (at most the Slurm job's memory)
    # A rehearsal of the GPU lane: its cells run without a device request, vLLM on its CPU.
    rehearse: bool = False
    slurm: SlurmJob | None = None  # the Slurm job this run is a task of

    @property
    def memory_limit(self) -> int | None:
        """Bytes every cell of this runner must stay within (a Slurm job's memory), if any."""
        return self.slurm.memory if self.slurm is not None else None

    @property
    def gpu_count(self) -> int:
        """How many GPUs this run may use."""
        return len(self.gpu_ids)

    def uuid_of(self, gpu_id: str) -> str | None:
        """The UUID of GPU ``gpu_id``: stable across container namespaces, unlike an index."""
        return next((gpu.uuid for gpu in self.gpus if gpu.index == gpu_id), None)


def parse_gpu_ids(text: str, where: str = "--gpus") -> tuple[str, ...] | None:
    """``"0,1"`` → ``("0", "1")``; ``"all"`` → None (every GPU of the host); ``"none"`` → ().

    Raises ``UsageError`` for an id Docker would not accept, or one given twice.
    """
    value = text.strip()
    if value == "all":
        return None
    if value in NO_DEVICES:
        return ()
    ids = tuple(part.strip() for part in value.split(","))
    bad = [part for part in ids if not DEVICE_ID.fullmatch(part)]
    if bad:
        raise UsageError(
            f"{where}: {bad[0]!r} is no GPU id (use ordinals like 0,1, GPU-<uuid> or MIG-<id>)"
        )
    twice = sorted({part for part in ids if ids.count(part) > 1})
    if twice:
        raise UsageError(f"{where}: GPU {twice[0]} is named twice")
    return ids


def parse_smi_list(text: str) -> tuple[RunnerGpu, ...]:
    """The GPUs in ``nvidia-smi -L`` output, in its (PCI) order."""
    found = (SMI_LINE.match(line) for line in text.splitlines())
    return tuple(RunnerGpu(m["index"], m["name"], m["uuid"]) for m in found if m)


def allowed_gpu_ids(
    gpus: tuple[RunnerGpu, ...], environ: Mapping[str, str], option: str | None = None
) -> tuple[str, ...]:
    """The GPUs a run may use: ``option`` (``--gpus``), else the first of ``GPU_ENV`` set,
    else every listed GPU; listed ones by index, each once, in the order named."""
    sources = [("--gpus", option)] + [(name, environ.get(name)) for name in GPU_ENV]
    named = next((parse_gpu_ids(text, where) for where, text in sources if text is not None), None)
    if named is None:
        return tuple(gpu.index for gpu in gpus)
    index_of = {key: gpu.index for gpu in gpus for key in (gpu.index, gpu.uuid) if key}
    return tuple(dict.fromkeys(index_of.get(item, item) for item in named))


def run_nvidia_smi() -> str:
    """``nvidia-smi -L`` output, or "" without the tool or a driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def available_memory(meminfo: str) -> int:
    """``MemAvailable`` from /proc/meminfo text, in bytes (0 when absent)."""
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            value, *unit = rest.split()
            return int(value) * (1024 if unit == ["kB"] else 1)
    return 0


def cpu_cores() -> tuple[int, ...]:
    """The cores this process may run on (taskset and cpusets narrow them)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def slurm_job(environ: Mapping[str, str]) -> SlurmJob | None:
    """The Slurm job in ``environ`` (None outside one): its id, cores and memory."""
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    cpus = _whole(environ.get("SLURM_CPUS_PER_TASK")) or _whole(environ.get("SLURM_CPUS_ON_NODE"))
    per_node, per_cpu = (
        _whole(environ.get("SLURM_MEM_PER_NODE")),
        _whole(environ.get("SLURM_MEM_PER_CPU")),
    )
    mib = per_node if per_node is not None else (per_cpu * cpus if per_cpu and cpus else None)
    return SlurmJob(job_id, cpus, mib * MIB if mib else None)  # --mem=0: the whole node


def _whole(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def detect_runner(
    gpus: str | None = None,
    *,
    rehearse: bool = False,
    environ: Mapping[str, str] | None = None,
    smi: Callable[[], str] = run_nvidia_smi,
    meminfo: Path = Path("/proc/meminfo"),
) -> Runner:
    """Read this runner now: ``gpus`` is ``--gpus`` (None: not given), ``environ`` the
    process's environment by default; free memory is what is free at this moment, within
    the Slurm job's allocation when this is one."""
    env = os.environ if environ is None else environ
    listed = parse_smi_list(smi())
    allowed = allowed_gpu_ids(listed, env, gpus)
    try:
        text = meminfo.read_text(encoding="ascii")
    except OSError:
        text = ""
    cores, free, job = cpu_cores(), available_memory(text), slurm_job(env)
    if job is not None and job.cpus:
        cores = cores[: job.cpus]  # without task binding every core shows: count the job's
    if job is not None and job.memory:
        free = min(free, job.memory)
    return Runner(listed, allowed, cores, free, rehearse, job)


def select_devices(
    count: int, usable: Sequence[str], busy: Collection[str] = ()
) -> tuple[str, ...]:
    """``count`` ids of ``usable`` that no running cell holds, in the runner's order.

    Raises ``InfraError`` when fewer are free, naming what the runner may use.
    """
    free = [device for device in usable if device not in busy]
    if len(free) < count:
        have = ", ".join(usable) if usable else "none"
        raise InfraError(
            f"a cell needs {count} GPU(s); this runner may use [{have}] and "
            f"{len(free)} of them are free (set CUDA_VISIBLE_DEVICES or pass --gpus)"
        )
    return tuple(free[:count])


def pending_devices(count: int) -> str:
    """How a dry run shows device ids the runner chooses at run time."""
    return f"<{count} of the runner's GPUs, chosen at run time>"

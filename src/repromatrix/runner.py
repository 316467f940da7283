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


@dataclass(frozen=True)
class Runner:
    """What this runner is and may lend cells, read once per run."""

    gpus: tuple[RunnerGpu, ...] = ()  # every GPU the host lists
    gpu_ids: tuple[str, ...] = ()  # those this run may use, as indexes where listed
    core_ids: tuple[int, ...] = ()  # the cores this process may run on
    free_memory: int = 0  # bytes, MemAvailable when read
    # A rehearsal of the GPU lane: its cells run without a device request, vLLM on its CPU.
    rehearse: bool = False

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


def detect_runner(
    gpus: str | None = None,
    *,
    rehearse: bool = False,
    environ: Mapping[str, str] | None = None,
    smi: Callable[[], str] = run_nvidia_smi,
    meminfo: Path = Path("/proc/meminfo"),
) -> Runner:
    """Read this runner now: ``gpus`` is ``--gpus`` (None: not given), ``environ`` the
    process's environment by default; free memory is what is free at this moment."""
    listed = parse_smi_list(smi())
    allowed = allowed_gpu_ids(listed, os.environ if environ is None else environ, gpus)
    try:
        text = meminfo.read_text(encoding="ascii")
    except OSError:
        text = ""
    return Runner(listed, allowed, cpu_cores(), available_memory(text), rehearse)


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

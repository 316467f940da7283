"""What this runner may lend to cells: GPU device ids, CPU cores, free memory.

GPUs are those ``nvidia-smi -L`` lists, narrowed by the first of: the run's
``--gpus`` option (Docker's syntax: ``all``, a count ``N``, ``device=0,2``),
``CUDA_VISIBLE_DEVICES``, ``NVIDIA_VISIBLE_DEVICES``. Ids are ``nvidia-smi``'s
indexes ("0", "1", ...); a UUID (``GPU-...``) is accepted wherever an index is
and mapped to its index, so one GPU never counts twice. Cores are the ones
this process may run on (``sched_getaffinity``), memory is ``MemAvailable``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from repromatrix.errors import UsageError, suggest
from repromatrix.run.schedule import Capacity

SMI_LINE = re.compile(r"GPU (?P<index>\d+): (?P<name>.*?)(?: \(UUID: (?P<uuid>[^)]+)\))?\s*\Z")
HIDDEN = frozenset({"", "none", "void", "-1", "nodevfiles"})


@dataclass(frozen=True)
class HostGpu:
    """One GPU as ``nvidia-smi -L`` lists it."""

    index: str
    name: str
    uuid: str | None = None


@dataclass(frozen=True)
class HostResources:
    """The GPUs this host has and those a run may use, its cores and its free memory."""

    gpus: tuple[HostGpu, ...]
    gpu_ids: tuple[str, ...]  # the allowed subset, as nvidia-smi indexes
    core_ids: tuple[int, ...]
    free_memory: int  # bytes

    def capacity(self, jobs: int | None = None) -> Capacity:
        """The scheduler's capacity; ``jobs`` caps cells at once (None: the whole runner)."""
        if jobs is not None and jobs < 1:
            raise UsageError(f"--jobs must be at least 1, not {jobs}")
        return Capacity(self.gpu_ids, self.core_ids, self.free_memory, jobs)

    def uuid_of(self, gpu_id: str) -> str | None:
        """The UUID of GPU ``gpu_id``: stable across container namespaces, unlike an index."""
        return next((g.uuid for g in self.gpus if g.index == gpu_id), None)


def parse_smi_list(text: str) -> tuple[HostGpu, ...]:
    """The GPUs in ``nvidia-smi -L`` output (MIG instances, indented below, are not GPUs)."""
    gpus = []
    for line in text.splitlines():
        match = SMI_LINE.match(line)
        if match:
            gpus.append(HostGpu(match["index"], match["name"], match["uuid"]))
    return tuple(gpus)


def _to_index(item: str, gpus: tuple[HostGpu, ...], source: str) -> str:
    for gpu in gpus:
        if item in (gpu.index, gpu.uuid):
            return gpu.index
    known = [g.index for g in gpus] + [g.uuid for g in gpus if g.uuid]
    have = ", ".join(g.index for g in gpus) or "none"
    raise UsageError(
        f"{source}: no GPU {item!r} on this host (nvidia-smi lists: {have}).{suggest(item, known)}"
    )


def parse_id_list(text: str, gpus: tuple[HostGpu, ...], source: str) -> tuple[str, ...]:
    """The GPUs a device list names: ``all``, ``none``/``void``, or indexes and UUIDs."""
    words = text.strip()
    if words.lower() == "all":
        return tuple(g.index for g in gpus)
    if words.lower() in HIDDEN:
        return ()
    ids: list[str] = []
    for item in (part.strip() for part in words.split(",")):
        index = _to_index(item, gpus, source)
        if index not in ids:
            ids.append(index)
    return tuple(ids)


def parse_gpus_option(text: str, gpus: tuple[HostGpu, ...]) -> tuple[str, ...]:
    """``--gpus`` in Docker's syntax: ``all``, a count ``N`` (the first N), ``device=0,2``."""
    words = text.strip().strip('"')
    if words.startswith("device="):
        return parse_id_list(words.removeprefix("device="), gpus, "--gpus")
    if words.isdigit():
        count = int(words)
        if count > len(gpus):
            raise UsageError(f"--gpus {count}: this host has {len(gpus)} GPU(s)")
        return tuple(g.index for g in gpus[:count])
    if words.lower() in ("all", "none"):
        return parse_id_list(words, gpus, "--gpus")
    raise UsageError(f"--gpus {text!r}: use all, a count (2) or device=0,2")


def allowed_gpu_ids(
    gpus: tuple[HostGpu, ...], environ: Mapping[str, str], option: str | None = None
) -> tuple[str, ...]:
    """The GPUs a run may use: ``--gpus``, else the first visible-devices variable set, else all."""
    if option is not None:
        return parse_gpus_option(option, gpus)
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        if name in environ:
            return parse_id_list(environ[name], gpus, name)
    return tuple(g.index for g in gpus)


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


def detect(
    environ: Mapping[str, str] | None = None,
    gpus_option: str | None = None,
    smi: Callable[[], str] = run_nvidia_smi,
    meminfo: Path = Path("/proc/meminfo"),
) -> HostResources:
    """Read this host's resources now (free memory is what is free at this moment)."""
    gpus = parse_smi_list(smi())
    allowed = allowed_gpu_ids(gpus, os.environ if environ is None else environ, gpus_option)
    try:
        text = meminfo.read_text(encoding="ascii")
    except OSError:
        text = ""
    return HostResources(gpus, allowed, cpu_cores(), available_memory(text))

"""This runner: the GPUs it has and may lend cells, its cores, its free memory, read once per run.

``detect_runner`` is the one place that looks at the host. Each GPU is read
through nvidia-smi's machine-readable queries (``nvidia_smi``): its index, name,
UUID, memory, compute capability, MIG mode, driver and CUDA versions, and each
MIG slice ``-L`` lists below it (its profile and its own memory), so a cell can
be matched against the GPU it would get (``gpu_identity``); ``topo -m`` gives
the GPUs that sit close together (an NVLink island, a NUMA node), so the
scheduler can keep a tensor-parallel cell inside one.

The GPUs a run may use are ``--gpus``, else the first of ``CUDA_VISIBLE_DEVICES``
and ``NVIDIA_VISIBLE_DEVICES`` that is set, else every whole GPU nvidia-smi
lists (a MIG slice only when named). Each grammar is the same: ``0,1``,
``GPU-<uuid>`` or ``MIG-<uuid>``, ``all``, or ``none`` (also an empty value,
``void``, ``-1``, ``NoDevFiles``). An index or UUID that nvidia-smi lists becomes
its index (``0:1`` for MIG slice 1 of GPU 0, as the NVIDIA runtime names it), so
one GPU never counts twice; an id it does not list (no nvidia-smi on a dry-run
host) is kept as given, unchecked, and whatever consumes it (Docker's device
request) says whether it exists.

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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repromatrix.errors import InfraError, UsageError
from repromatrix.host import nvidia_smi
from repromatrix.host.nvidia_smi import ListedGpu, Smi, run_nvidia_smi

# Read in this order after the command line: what CUDA honours, then the NVIDIA runtime's.
GPU_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
DEVICE_ID = re.compile(r"[0-9]+|(?:GPU|MIG)-[0-9A-Za-z/_-]+")
NO_DEVICES = frozenset({"", "none", "void", "-1", "NoDevFiles"})


@dataclass(frozen=True)
class RunnerGpu:
    """One GPU of this runner, or one MIG slice of one, as nvidia-smi reports it.

    A fact nvidia-smi could not give (an old driver, a query that failed) is None.
    """

    index: str  # nvidia-smi's; a MIG slice: "<GPU index>:<device>", the NVIDIA runtime's form
    name: str  # a MIG slice: its GPU's name
    uuid: str | None = None
    memory_mib: int | None = None  # total as the driver reports it; a MIG slice: its own
    compute_capability: str | None = None  # "9.0"; a MIG slice: its GPU's
    mig_mode: bool | None = None  # the GPU's current MIG mode (None: not supported or not read)
    mig_profile: str | None = None  # a MIG slice's profile ("1g.10gb"); None for a whole GPU
    driver_version: str | None = None
    cuda_version: str | None = None  # the highest CUDA version the driver supports

    @property
    def summary(self) -> str:
        """One line for reasons and the dry run: ``GPU 0: NVIDIA H200 (140.4 GiB, compute
        capability 9.0)``; a slice ``MIG 0:1: NVIDIA H100 80GB HBM3 MIG 1g.10gb (...)``."""
        kind = f"MIG {self.index}" if self.mig_profile else f"GPU {self.index}"
        what = f"{kind}: {self.name}" + (f" MIG {self.mig_profile}" if self.mig_profile else "")
        facts = []
        if self.memory_mib is not None:
            facts.append(f"{self.memory_mib / 1024:.1f} GiB")
        if self.compute_capability is not None:
            facts.append(f"compute capability {self.compute_capability}")
        if self.mig_mode and self.mig_profile is None:
            facts.append("MIG mode on")
        return f"{what} ({', '.join(facts)})" if facts else what


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

    gpus: tuple[RunnerGpu, ...] = ()  # every GPU the host lists, then every MIG slice
    gpu_ids: tuple[str, ...] = ()  # those this run may use, as indexes where listed
    core_ids: tuple[int, ...] = ()  # the cores this process may run on
    free_memory: int = 0  # bytes, MemAvailable when read (at most the Slurm job's memory)
    # A rehearsal of the GPU lane: its cells run without a device request, vLLM on its CPU.
    rehearse: bool = False
    # Sets of usable GPU ids that sit close together (an NVLink island, a NUMA node), from
    # ``nvidia-smi topo -m``: where a tensor-parallel cell should stay (``gpu_groups``).
    gpu_groups: tuple[tuple[str, ...], ...] = ()
    slurm: SlurmJob | None = None  # the Slurm job this run is a task of

    @property
    def memory_limit(self) -> int | None:
        """Bytes every cell of this runner must stay within (a Slurm job's memory), if any."""
        return self.slurm.memory if self.slurm is not None else None

    @property
    def gpu_count(self) -> int:
        """How many GPUs this run may use."""
        return len(self.gpu_ids)

    def gpu(self, gpu_id: str) -> RunnerGpu | None:
        """The listed GPU or MIG slice ``gpu_id`` names (an index or a UUID), if listed."""
        return next((gpu for gpu in self.gpus if gpu_id in (gpu.index, gpu.uuid)), None)

    def uuid_of(self, gpu_id: str) -> str | None:
        """The UUID of GPU ``gpu_id``: stable across container namespaces, unlike an index."""
        return next((gpu.uuid for gpu in self.gpus if gpu.index == gpu_id), None)

    def parent_of(self, gpu: RunnerGpu) -> RunnerGpu | None:
        """The whole GPU a MIG slice is part of (None for a whole GPU)."""
        if gpu.mig_profile is None:
            return None
        return self.gpu(gpu.index.partition(":")[0])

    @property
    def usable(self) -> tuple[RunnerGpu | None, ...]:
        """What each id this run may use is, as listed (None: an id nvidia-smi did not list)."""
        return tuple(self.gpu(gpu_id) for gpu_id in self.gpu_ids)


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


def read_gpus(smi: Smi = run_nvidia_smi) -> tuple[RunnerGpu, ...]:
    """Every GPU of this host, then every MIG slice, as nvidia-smi reports them now.

    The whole GPUs come from ``--query-gpu`` (``-L`` names them where the query
    fails: a GPU with slices listed below it is in MIG mode), the slices from
    ``-L``, the CUDA version from ``--version``, and a slice's own memory from
    ``-q -x``, read only when there is a slice.
    """
    listed = nvidia_smi.parse_list(smi(nvidia_smi.LIST))
    version = nvidia_smi.parse_version(smi(nvidia_smi.VERSION))
    queried = nvidia_smi.parse_csv(smi(nvidia_smi.QUERY_GPUS))
    gpus = tuple(_queried_gpu(str(n), row, version) for n, row in enumerate(queried))
    if not gpus:
        gpus = tuple(_listed_gpu(gpu, version) for gpu in listed)
    slices = [(gpu, found) for gpu in listed for found in gpu.slices]
    memory = nvidia_smi.parse_mig_memory(smi(nvidia_smi.XML)) if slices else {}
    by_index = {gpu.index: gpu for gpu in gpus}
    return gpus + tuple(
        _slice(parent, found, by_index.get(parent.index), memory) for parent, found in slices
    )


def _listed_gpu(gpu: ListedGpu, version: nvidia_smi.DriverVersion) -> RunnerGpu:
    mig = True if gpu.slices else None
    return RunnerGpu(gpu.index, gpu.name, gpu.uuid, mig_mode=mig, cuda_version=version.cuda)


def _queried_gpu(
    position: str, row: nvidia_smi.Row, version: nvidia_smi.DriverVersion
) -> RunnerGpu:
    mode = row.get("mig.mode.current")
    return RunnerGpu(
        index=row.get("index") or position,  # rows come in index order
        name=row.get("name") or "",
        uuid=row.get("uuid"),
        memory_mib=nvidia_smi.mebibytes(row.get("memory.total")),
        compute_capability=row.get("compute_cap"),
        mig_mode=None if mode is None else mode == "Enabled",
        driver_version=_version(row.get("driver_version")) or version.driver,
        cuda_version=version.cuda,
    )


def _version(text: str | None) -> str | None:
    return text if text is not None and nvidia_smi.VERSION_NUMBER.fullmatch(text) else None


def _slice(
    listed: ListedGpu,
    found: nvidia_smi.ListedSlice,
    parent: RunnerGpu | None,
    memory: Mapping[tuple[str, int], nvidia_smi.SliceMemory],
) -> RunnerGpu:
    own = memory.get((listed.uuid or "", found.device))
    return RunnerGpu(
        index=f"{listed.index}:{found.device}",
        name=listed.name,
        uuid=found.uuid,
        memory_mib=own.total if own is not None else None,
        compute_capability=parent.compute_capability if parent else None,
        mig_mode=True,
        mig_profile=found.profile,
        driver_version=parent.driver_version if parent else None,
        cuda_version=parent.cuda_version if parent else None,
    )


def allowed_gpu_ids(
    gpus: tuple[RunnerGpu, ...], environ: Mapping[str, str], option: str | None = None
) -> tuple[str, ...]:
    """The GPUs a run may use: ``option`` (``--gpus``), else the first of ``GPU_ENV`` set,
    else every listed whole GPU; listed ones (a MIG slice too) by index, each once, in the
    order named."""
    sources = [("--gpus", option)] + [(name, environ.get(name)) for name in GPU_ENV]
    named = next((parse_gpu_ids(text, where) for where, text in sources if text is not None), None)
    if named is None:
        return tuple(gpu.index for gpu in gpus if gpu.mig_profile is None)
    index_of = {key: gpu.index for gpu in gpus for key in (gpu.index, gpu.uuid) if key}
    return tuple(dict.fromkeys(index_of.get(item, item) for item in named))


def gpu_groups(topology: nvidia_smi.Topology, usable: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """The sets of ``usable`` GPUs that sit close together, as ``topology`` says: each NVLink
    island, each PCIe switch, each NUMA node, and each island's part of a node.

    Only sets of two or more usable GPUs, each once, in the order of ``usable``; the
    scheduler keeps a tensor-parallel cell inside the smallest that holds it.
    """
    islands = nvidia_smi.nvlink_islands(topology)
    nodes = nvidia_smi.numa_nodes(topology)
    both = [tuple(g for g in island if g in node) for island in islands for node in nodes]
    switches = nvidia_smi.pcie_switches(topology)
    groups: dict[tuple[str, ...], None] = {}
    for group in (*both, *islands, *switches, *nodes):
        kept = tuple(gpu for gpu in usable if gpu in group)
        if len(kept) > 1:
            groups.setdefault(kept)
    return tuple(groups)


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
    smi: Smi = run_nvidia_smi,
    meminfo: Path = Path("/proc/meminfo"),
) -> Runner:
    """Read this runner now: ``gpus`` is ``--gpus`` (None: not given), ``environ`` the
    process's environment by default, ``smi`` how nvidia-smi is asked; free memory is what
    is free at this moment, within the Slurm job's allocation when this is one."""
    env = os.environ if environ is None else environ
    listed = read_gpus(smi)
    allowed = allowed_gpu_ids(listed, env, gpus)
    whole = [gpu_id for gpu_id in allowed if ":" not in gpu_id]
    # Where at most one whole GPU may be used, there is nothing to keep together.
    topology = nvidia_smi.parse_topology(smi(nvidia_smi.TOPOLOGY)) if len(whole) > 1 else None
    try:
        text = meminfo.read_text(encoding="ascii")
    except OSError:
        text = ""
    groups = gpu_groups(topology, allowed) if topology is not None else ()
    cores, free, job = cpu_cores(), available_memory(text), slurm_job(env)
    if job is not None and job.cpus:
        cores = cores[: job.cpus]  # without task binding every core shows: count the job's
    if job is not None and job.memory:
        free = min(free, job.memory)
    return Runner(listed, allowed, cores, free, rehearse, groups, slurm=job)


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

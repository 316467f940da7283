"""nvidia-smi: the one way this tool asks the driver about its GPUs, and what it answers, parsed.

Every read is one of nvidia-smi's machine-readable forms:

- ``--query-gpu`` and ``--query-compute-apps`` as CSV with the header kept and
  the units dropped (``--format=csv,nounits``): the header names each column,
  so a field an older driver lacks is absent rather than a column shifted, and
  a query that lists nothing (no process) is told apart from one that failed;
- ``-L`` for the MIG slices of each GPU (profile, device number, UUID), which
  ``--query-gpu`` does not list;
- ``--version`` for the highest CUDA version the driver supports (no query
  field holds it);
- ``-q -x`` for a MIG slice's own memory (total and used);
- ``topo -m`` for the links between GPUs and each GPU's NUMA node.

The parsers are pure and tested on outputs captured on real machines
(``tests/data/nvidia-smi/``); ``run_nvidia_smi`` is the only code that starts
the program.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from xml.etree import ElementTree

# nvidia-smi's arguments in, its standard output out ("" when it cannot answer).
Smi = Callable[[Sequence[str]], str]

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "compute_cap",
    "mig.mode.current",
    "driver_version",
)
CSV = "--format=csv,nounits"
QUERY_GPUS = (f"--query-gpu={','.join(GPU_FIELDS)}", CSV)
QUERY_MEMORY_USED = ("--query-gpu=uuid,memory.used", CSV)
# The header's own names: nvidia-smi prints ``used_gpu_memory`` for ``used_memory``.
QUERY_APPS = ("--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory", CSV)
LIST = ("-L",)
VERSION = ("--version",)
XML = ("-q", "-x")
TOPOLOGY = ("topo", "-m")
TIMEOUT_S = 30.0

UNIT = re.compile(r"\s*\[(?P<unit>[^\]]+)\]\Z")
LIST_GPU = re.compile(r"GPU (?P<index>\d+): (?P<name>.*?)(?: \(UUID: (?P<uuid>[^)]+)\))?\s*\Z")
LIST_MIG = re.compile(
    r"\s+MIG (?P<profile>\S+)\s+Device\s+(?P<device>\d+): \(UUID: (?P<uuid>[^)]+)\)\s*\Z"
)
VERSION_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)+")
NVLINK = re.compile(r"NV[0-9]+")
PCIE_SWITCH = re.compile(r"PIX|PXB")


def run_nvidia_smi(args: Sequence[str]) -> str:
    """nvidia-smi's standard output for ``args``, or "" without the tool, a driver, or on
    any failure (the callers read "" as "nothing known")."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return ""
    try:
        done = subprocess.run(
            [program, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return ""
    return done.stdout if done.returncode == 0 else ""


Row = Mapping[str, str | None]


def parse_csv(text: str) -> tuple[Row, ...]:
    """The rows of a ``--format=csv`` query by column name, the header's unit dropped from the
    name (``memory.total [MiB]`` is ``memory.total``) and from each value (``81559 MiB``);
    a value nvidia-smi cannot give (``[N/A]``, ``[Not Supported]``, ``N/A``) is None."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return ()
    reader = csv.reader(lines, skipinitialspace=True)
    header = [_column(name) for name in next(reader)]
    return tuple(
        {name: _value(value, unit) for (name, unit), value in zip(header, row, strict=False)}
        for row in reader
    )


def _column(name: str) -> tuple[str, str | None]:
    found = UNIT.search(name)
    return (name[: found.start()].strip(), found["unit"]) if found else (name.strip(), None)


def _value(value: str, unit: str | None) -> str | None:
    text = value.strip()
    if unit and text.endswith(f" {unit}"):
        text = text[: -len(unit) - 1].strip()
    unknown = text in ("", "N/A") or (text.startswith("[") and text.endswith("]"))
    return None if unknown else text


def mebibytes(value: str | None) -> int | None:
    """A MiB count from a query's value, or None when there is none."""
    return int(value) if value is not None and value.isdigit() else None


@dataclass(frozen=True)
class ListedSlice:
    """One MIG slice as ``nvidia-smi -L`` lists it under its GPU."""

    device: int  # its number under its GPU (the NVIDIA runtime's ``<gpu>:<device>``)
    profile: str  # e.g. 1g.10gb, or 1c.3g.71gb for a compute instance of a 3g.71gb slice
    uuid: str


@dataclass(frozen=True)
class ListedGpu:
    """One GPU as ``nvidia-smi -L`` lists it, with the MIG slices listed below it."""

    index: str
    name: str
    uuid: str | None
    slices: tuple[ListedSlice, ...] = ()


def parse_list(text: str) -> tuple[ListedGpu, ...]:
    """The GPUs of ``nvidia-smi -L`` output in its (PCI) order, each with its MIG slices."""
    gpus: list[ListedGpu] = []
    for line in text.splitlines():
        if gpu := LIST_GPU.match(line):
            gpus.append(ListedGpu(gpu["index"], gpu["name"], gpu["uuid"]))
        elif (mig := LIST_MIG.match(line)) and gpus:
            found = ListedSlice(int(mig["device"]), mig["profile"], mig["uuid"])
            last = gpus[-1]
            gpus[-1] = ListedGpu(last.index, last.name, last.uuid, (*last.slices, found))
    return tuple(gpus)


@dataclass(frozen=True)
class DriverVersion:
    """The driver's version and the highest CUDA version it supports, as ``--version`` says."""

    driver: str | None = None
    cuda: str | None = None


def parse_version(text: str) -> DriverVersion:
    """``nvidia-smi --version`` output: ``DRIVER version``/``CUDA Version`` until 610, where
    they became ``KMD version``/``CUDA UMD version`` (the old names then say "Deprecated")."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        number = VERSION_NUMBER.fullmatch(value.strip())
        if number:
            found[" ".join(key.lower().split())] = number.group()
    return DriverVersion(
        driver=found.get("driver version") or found.get("kmd version"),
        cuda=found.get("cuda version") or found.get("cuda umd version"),
    )


@dataclass(frozen=True)
class SliceMemory:
    """A MIG slice's own memory, in MiB, as ``nvidia-smi -q -x`` reports it."""

    total: int | None
    used: int | None


def parse_mig_memory(text: str) -> dict[tuple[str, int], SliceMemory]:
    """Each MIG slice's memory from ``nvidia-smi -q -x``, keyed by its GPU's UUID and its
    device number (the ``index`` of ``<mig_device>``, the ``Device N`` of ``-L``)."""
    try:
        root = ElementTree.fromstring(text)  # nvidia-smi's own output, not input from outside
    except ElementTree.ParseError:
        return {}
    found: dict[tuple[str, int], SliceMemory] = {}
    for gpu in root.iter("gpu"):
        uuid = (gpu.findtext("uuid") or "").strip()
        for device in gpu.iterfind("mig_devices/mig_device"):
            index = (device.findtext("index") or "").strip()
            if uuid and index.isdigit():
                total = _xml_mib(device.findtext("fb_memory_usage/total"))
                used = _xml_mib(device.findtext("fb_memory_usage/used"))
                found[(uuid, int(index))] = SliceMemory(total, used)
    return found


def _xml_mib(text: str | None) -> int | None:
    value = (text or "").removesuffix("MiB").strip()
    return int(value) if value.isdigit() else None


@dataclass(frozen=True)
class Topology:
    """What ``nvidia-smi topo -m`` says of the GPUs: each pair's link and each GPU's NUMA node."""

    gpus: tuple[str, ...] = ()  # indexes, in the matrix's order
    links: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (a, b) -> NV18, SYS, ...
    numa: Mapping[str, str] = field(default_factory=dict)  # index -> NUMA node, where given

    def link(self, a: str, b: str) -> str | None:
        """How GPUs ``a`` and ``b`` are connected (``NV18``, ``SYS``, ...), if the matrix says."""
        return self.links.get((a, b))


def parse_topology(text: str) -> Topology:
    """``nvidia-smi topo -m`` output, tab- or space-aligned, with or without NIC rows and the
    ``GPU NUMA ID`` column. Columns before ``CPU Affinity`` are devices (GPUs, then NICs);
    after them come the GPU's CPU affinity and its NUMA affinity (``N/A``: not known)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return Topology()
    header = lines[0].split()
    devices = header[: header.index("CPU")] if "CPU" in header else header
    gpus = tuple(name.removeprefix("GPU") for name in devices if re.fullmatch(r"GPU\d+", name))
    links: dict[tuple[str, str], str] = {}
    numa: dict[str, str] = {}
    for line in lines[1:]:
        cells = line.split()
        row = cells[0].removeprefix("GPU") if re.fullmatch(r"GPU\d+", cells[0]) else None
        if row is None or len(cells) < 1 + len(devices):
            continue
        for column, value in zip(devices, cells[1 : 1 + len(devices)], strict=True):
            if column.startswith("GPU"):
                links[(row, column.removeprefix("GPU"))] = value
        rest = cells[1 + len(devices) :]  # CPU affinity, NUMA affinity, GPU NUMA ID
        if len(rest) >= 2 and rest[1].isdigit():
            numa[row] = rest[1]
    return Topology(gpus, links, numa)


def nvlink_islands(topology: Topology) -> tuple[tuple[str, ...], ...]:
    """The sets of GPUs joined by NVLink (``NV#`` links), each of more than one GPU."""
    return linked_sets(topology, NVLINK)


def pcie_switches(topology: Topology) -> tuple[tuple[str, ...], ...]:
    """The sets of GPUs behind one PCIe switch (``PIX``, ``PXB``: no host bridge between)."""
    return linked_sets(topology, PCIE_SWITCH)


def linked_sets(topology: Topology, link: re.Pattern[str]) -> tuple[tuple[str, ...], ...]:
    """The sets of GPUs joined, directly or through each other, by links that match ``link``;
    only sets of more than one GPU, in the topology's order."""
    sets: list[set[str]] = []
    for gpu in topology.gpus:
        joined = [s for s in sets if any(link.fullmatch(topology.link(gpu, o) or "") for o in s)]
        sets = [s for s in sets if s not in joined] + [{gpu}.union(*joined)]
    order = {gpu: n for n, gpu in enumerate(topology.gpus)}
    return tuple(
        tuple(sorted(found, key=order.__getitem__))
        for found in sorted(sets, key=lambda s: min(order[g] for g in s))
        if len(found) > 1
    )


def numa_nodes(topology: Topology) -> tuple[tuple[str, ...], ...]:
    """The GPUs of each NUMA node, where the topology gives the GPUs' nodes."""
    nodes: dict[str, list[str]] = {}
    for gpu in topology.gpus:
        if (node := topology.numa.get(gpu)) is not None:
            nodes.setdefault(node, []).append(gpu)
    return tuple(tuple(gpus) for _, gpus in sorted(nodes.items(), key=lambda n: int(n[0])))

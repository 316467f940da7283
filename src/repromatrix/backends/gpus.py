"""Which GPUs a cell gets: specific device ids from the GPUs this runner may use.

Pure. A runner agent that shares a host with others is given its GPUs through
``CUDA_VISIBLE_DEVICES`` or ``NVIDIA_VISIBLE_DEVICES`` (or ``--gpus 0,1`` on
the command line); a cell then takes ids from those, never "the first N" of the
host, and cells that run at once on one runner take disjoint ids (``busy``).
Ids are what Docker's device requests accept: host ordinals (``0``), GPU UUIDs
(``GPU-8f6...``) or MIG ids (``MIG-...``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from repromatrix.errors import InfraError, UsageError

# Read in this order: the command line, then what CUDA honours, then the NVIDIA runtime's.
GPU_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
DEVICE_ID = re.compile(r"[0-9]+|(?:GPU|MIG)-[0-9A-Za-z/_-]+")
NO_DEVICES = frozenset({"", "none", "void", "-1", "NoDevFiles"})


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


def runner_gpus(
    environ: Mapping[str, str], cli: str | None = None, host_count: int = 0
) -> tuple[str, ...]:
    """The GPU ids this runner may use: ``--gpus``, else the first of ``GPU_ENV`` that is set.

    When nothing restricts the runner (none set, or ``all``), it may use every GPU of
    the host: ordinals ``0 .. host_count - 1``.
    """
    sources = [("--gpus", cli)] + [(name, environ.get(name)) for name in GPU_ENV]
    for where, text in sources:
        if text is not None:
            ids = parse_gpu_ids(text, where)
            if ids is not None:
                return ids
            break
    return tuple(str(index) for index in range(host_count))


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

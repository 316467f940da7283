"""``repromatrix run --dry-run``: what the run would do, printed; nothing written or started.

The description comes from the chosen backend's kind, from the same values a
real run executes (for Docker: image builds and pulls, then one
``containers.create`` per cell with its image, exec-form command, mounts,
``/dev/shm`` or IPC, device requests and labels). Secret values are never
printed, only their names. Cells this host cannot run are described in full
and marked with the reason they would be skipped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from repromatrix.backends.base import BackendKind, Host, Setup
from repromatrix.model import Cell


def describe(kind: BackendKind, setup: Setup, cells: Sequence[Cell], host: Host) -> dict[str, Any]:
    """The run's calls as JSON-ready data (secrets redacted)."""
    return {
        "run_id": setup.run_id,
        "backend": kind.name,
        "host_gpus": host.gpus,
        **kind.describe(setup, cells, host),
    }


def print_calls(
    kind: BackendKind, setup: Setup, cells: Sequence[Cell], host: Host, out: TextIO | None = None
) -> None:
    """Print ``describe(...)`` as indented JSON."""
    stream = out or sys.stdout
    json.dump(describe(kind, setup, cells, host), stream, indent=2, sort_keys=True)
    stream.write("\n")

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

from repromatrix.backends.base import BackendKind, Setup
from repromatrix.model import Cell
from repromatrix.runner import Runner


def describe(
    kind: BackendKind, setup: Setup, cells: Sequence[Cell], runner: Runner
) -> dict[str, Any]:
    """The run's calls as JSON-ready data (secrets redacted)."""
    return {
        "run_id": setup.run_id,
        "backend": kind.name,
        "host_gpus": runner.gpu_count,
        **kind.describe(setup, cells, runner),
    }


def print_calls(
    kind: BackendKind,
    setup: Setup,
    cells: Sequence[Cell],
    runner: Runner,
    out: TextIO | None = None,
) -> None:
    """Print ``describe(...)`` as indented JSON."""
    stream = out or sys.stdout
    json.dump(describe(kind, setup, cells, runner), stream, indent=2, sort_keys=True)
    stream.write("\n")

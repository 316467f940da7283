"""``repromatrix run --dry-run``: every engine call a run would make, printed, nothing started.

The calls come from the same ``container_plan`` values a real run executes,
so what is printed is what would run: image builds and pulls, then one
``containers.create`` per cell with its image, exec-form command, mounts,
``/dev/shm`` or IPC, device requests and labels. Secret values are never
printed, only their names. GPU cells are described in full even on a host
without a GPU (they are marked as skipped there).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from repromatrix.backends.docker_calls import container_call
from repromatrix.model import Cell
from repromatrix.run import prepare as run_setup
from repromatrix.run.harness_spec import build_spec

if TYPE_CHECKING:
    from repromatrix.run.stages import RunState


def describe(state: RunState) -> dict[str, Any]:
    """The run's engine calls as JSON-ready data (secrets redacted)."""
    assert state.matrix is not None
    settings = run_setup.container_settings(state.matrix, state.models_root)
    tags = {render.key: render.tag for render in state.rendered}
    builds = run_setup.image_builds(state.rendered, state.matrix)
    return {
        "run_id": state.run_id,
        "backend": state.backend_name,
        "host_gpus": state.gpus,
        "images": [build.describe() for build in builds],
        "cells": [_cell(state, cell, tags, settings) for cell in state.todo],
    }


def _cell(
    state: RunState, cell: Cell, tags: dict[str, str], settings: dict[Any, Any]
) -> dict[str, Any]:
    spec = build_spec(cell, run_setup.model_path(cell, state.models_root))
    image = tags.get(cell.image.key, cell.image.ref)
    plan = container_call(cell, spec, image, settings[cell.lane], state.run_id)
    return {
        "id": cell.id,
        "skip": run_setup.skip_reason(cell, "docker", state.gpus),
        "deadline_s": cell.deadline_s,
        "create": plan.describe(os.environ),
    }


def print_calls(state: RunState, out: TextIO | None = None) -> None:
    """Print ``describe(state)`` as indented JSON."""
    json.dump(describe(state), out or sys.stdout, indent=2, sort_keys=True)
    (out or sys.stdout).write("\n")

"""The interface between the runner and whatever executes a cell (Docker, or local virtualenvs).

A backend prepares images (build, pull, or a virtualenv per vLLM version) and
executes one cell's harness under the cell's own deadline, streaming its
output to a watcher that may stop the cell early. It returns plain values;
deciding the outcome is ``outcome.py``'s job, not the backend's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from repromatrix.model import Cell, Image

# Called with each chunk of a cell's output as it arrives; returns True to stop the cell now
# (triage has seen a terminal root cause, so waiting for vLLM to exit or hang gains nothing).
Watcher = Callable[[bytes], bool]


@dataclass(frozen=True)
class Prepared:
    """An image ready to run cells, or the reason it is not."""

    image_key: str
    ref: str  # the local image tag (docker) or the virtualenv path (local)
    digest: str | None = None  # the pulled digest (GPU lane) or the built image id
    build_s: float = 0.0
    built: bool = False  # False when an existing image or environment was reused
    error: str | None = None  # build or pull failure: every cell of this image is an infra error


@dataclass(frozen=True)
class Execution:
    """What happened when a cell's harness ran, as plain facts."""

    exit_code: int | None
    log: bytes
    oom_killed: bool = False
    timed_out: bool = False  # the cell's own deadline passed and it was stopped
    stopped_early: bool = False  # the watcher asked to stop: a terminal root cause was seen
    infra_error: str | None = None  # the engine or host failed (not vLLM): container never ran
    start_s: float = 0.0
    total_s: float = 0.0


class Backend(Protocol):
    """Executes cells; one instance per run, closed at the end (and on interrupt)."""

    name: str

    def prepare(self, images: Sequence[Image]) -> Mapping[str, Prepared]:
        """Build, pull or create what each image needs; failures are reported, not raised."""
        ...

    def execute(
        self, cell: Cell, spec: Mapping[str, Any], prepared: Prepared, watch: Watcher
    ) -> Execution:
        """Run the harness for ``cell`` with ``spec`` under ``cell.deadline_s``."""
        ...

    def close(self) -> None:
        """Stop and remove everything this run started; safe to call twice."""
        ...

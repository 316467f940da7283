"""The interface between the run and whatever executes a cell (Docker, local virtualenvs, ...).

Everything that differs between backends is a method here: whether one is
available on this host, which cells it can run, how it prepares images (a
render and a build, a pull, or a virtualenv per vLLM version), which vLLM an
image holds and the environment vLLM reports in it, how it makes a tiny model,
what a dry run shows, and how it executes one cell's harness under the cell's
own deadline, streaming the output to a listener that may stop the cell early,
and whether a cell's GPUs are idle before it starts. Backends return plain
values; deciding the outcome is ``run/cell.py``'s job (``decide``). ``registry.py``
finds them by name; nothing outside ``backends/`` names one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from repromatrix.host.runner import Runner
from repromatrix.models.tinymodel import LORA_RANK
from repromatrix.secret_env import OutputListener
from repromatrix.values import Cell, Image, Lane, Model

if TYPE_CHECKING:
    from repromatrix.matrix.lanes import Runtime
    from repromatrix.models.tinymodel import TinyModel


@dataclass(frozen=True)
class Prepared:
    """An image ready to run cells, or the reason it is not."""

    image_key: str
    ref: str  # the local image tag (docker) or the virtualenv path (local)
    digest: str | None = None  # the pulled digest (GPU lane) or the built image id
    build_s: float = 0.0
    built: bool = False  # False when an existing image or environment was reused
    error: str | None = None  # build or pull failure: every cell of this image is an infra error
    # GPU images: the CUDA version the image is built for and what it asks of the driver (its
    # config's CUDA_VERSION and NVIDIA_REQUIRE_CUDA), known once it is pulled.
    cuda_version: str | None = None
    cuda_requirement: str | None = None
    # How the image's own entrypoint starts vLLM's server (``vllm serve``), read from the
    # published image's configuration; () where there is none to follow (the harness's module).
    launcher: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnvironmentReport:
    """What vLLM's environment collector printed in an image, or why it printed nothing."""

    text: str | None
    error: str | None = None


@dataclass(frozen=True)
class Execution:
    """What happened when a cell's harness ran, as plain facts."""

    exit_code: int | None
    log: bytes
    oom_killed: bool = False
    timed_out: bool = False  # the cell's own deadline passed and it was stopped
    stopped_early: bool = False  # the listener asked to stop: a terminal root cause was seen
    infra_error: str | None = None  # the engine or host failed (not vLLM): container never ran
    start_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class Placement:
    """Where the scheduler put one cell: the device ids it holds while it runs.

    ``gpu_ids`` are what the engine should be given (UUIDs where the host lists them,
    since an index may differ inside a container); no two running cells share one.
    None leaves the choice to the backend (one cell at a time, a dry run).
    """

    gpu_ids: tuple[str, ...] | None = None
    core_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Setup:
    """What a run gives its backend: where things go, the lanes' runtimes, how to say things."""

    run_id: str
    runtimes: Mapping[Lane, Runtime]
    cache: Path  # host caches: wheelhouses, virtualenvs, base root file systems
    models_root: Path  # tiny models, mounted read-only at the same path in cells
    dockerfiles: Path = Path("dockerfiles")  # where build contexts are written
    logs: Path | None = None  # where a backend keeps preparation logs (image builds)
    note: Callable[[str], None] = lambda _line: None
    pull: str | None = None  # a pull policy for every image (``--pull``), else each image's own
    runner: Runner = field(default_factory=Runner)  # its GPUs; whether the run rehearses


@dataclass(frozen=True)
class Preflight:
    """A backend kind's answer for one run: ready (with the lanes' runtimes as this host makes
    them, and why), or refused (why, and the one command that would enable it)."""

    runtimes: Mapping[Lane, Runtime]
    reason: str  # why it is ready, or why it is not
    ready: bool = True
    fix: str | None = None  # where refused: the one command that would make it ready

    @property
    def refusal(self) -> str:
        """The reason with its fix, as one sentence for a person."""
        return f"{self.reason}; to enable it: `{self.fix}`" if self.fix else self.reason


class Backend(Protocol):
    """Executes cells; one instance per run, closed at the end (and on interrupt)."""

    name: str

    def prepare(self, images: Sequence[Image]) -> Mapping[str, Prepared]:
        """Build, pull or create what each image needs; failures are reported, not raised."""
        ...

    def vllm_version(self, prepared: Prepared) -> str | None:
        """vLLM's version as installed in a prepared image (None when it cannot be read)."""
        ...

    def environment_report(self, prepared: Prepared) -> EnvironmentReport:
        """vLLM's own environment report (``python3 -m vllm.collect_env``) run in a prepared
        image on this runner, with the GPUs its cells may get."""
        ...

    def make_model(
        self,
        model: Model,
        prepared: Prepared,
        models_root: Path,
        lora_ranks: Sequence[int] = (LORA_RANK,),
    ) -> TinyModel:
        """Generate ``model``'s tiny model (and an adapter per rank) with the image's own
        Python, once."""
        ...

    def alive(self) -> bool:
        """Whether the backend can still start cells (an engine that died cannot)."""
        ...

    def busy_reason(self, placement: Placement) -> str | None:
        """Why the GPUs of ``placement`` are not idle now (naming the processes or containers
        holding them), or None when they are idle or are not this backend's to check.

        Asked just before a GPU cell starts: a busy GPU makes the cell an infrastructure
        error, never a verdict against its image.
        """
        ...

    def execute(
        self,
        cell: Cell,
        spec: Mapping[str, Any],
        prepared: Prepared,
        listener: OutputListener,
        placement: Placement | None = None,
    ) -> Execution:
        """Run the harness for ``cell`` with ``spec`` under ``cell.deadline_s`` on ``placement``.

        Called from one thread per running cell: cells of one run execute at the same time.
        """
        ...

    def stop(self, cell_id: str) -> None:
        """Kill and remove whatever runs ``cell_id`` now, and whatever it starts from now on.

        Called from another thread than the cell's (a cancel or an interrupt); its
        ``execute`` then returns soon with what it had. Safe when nothing runs.
        """
        ...

    def close(self) -> None:
        """Stop and remove everything this run started; safe to call twice."""
        ...


GB = 1000**3


@dataclass(frozen=True)
class Footprint:
    """What a backend makes on disk for each distinct image of a run, about, from scratch:
    what it calls them (``images``, ``virtualenvs``) and their bytes per lane."""

    made: str
    bytes_per_image: Mapping[Lane, int]


class BackendKind(Protocol):
    """A kind of backend, as the registry knows it: found by name, opened once per run."""

    name: str
    summary: str  # one line for ``--help``
    footprint: Footprint  # the first lines' disk estimate

    def available(self) -> bool:
        """Whether this host can use this backend now (an engine answers, ...)."""
        ...

    def skip_reason(self, cell: Cell, runner: Runner) -> str | None:
        """Why this backend on ``runner`` cannot run ``cell``, or None when it can."""
        ...

    def preflight(self, runtimes: Mapping[Lane, Runtime], lanes: Collection[Lane]) -> Preflight:
        """Whether this host can make what the cells of ``lanes`` need, asked in seconds
        before anything is built; the runtimes as this host makes them."""
        ...

    def describe(
        self, setup: Setup, cells: Sequence[Cell], runner: Runner, skips: Mapping[str, str]
    ) -> dict[str, Any]:
        """What a run of ``cells`` would do, as JSON-ready data; writes and starts nothing.

        ``skips`` are the run's own skip reasons by cell id (this kind's, the memory
        estimate's): a skipped cell is shown with its reason and is given no GPU."""
        ...

    def open(self, setup: Setup, images: Sequence[Image]) -> Backend:
        """Open the backend for a run that needs ``images``; raises ``InfraError`` if it cannot."""
        ...

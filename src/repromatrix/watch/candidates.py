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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from packaging.version import Version

from repromatrix.errors import InfraError
from repromatrix.matrix.config import LaneConfig, Matrix
from repromatrix.model import Image, Lane, PullPolicy
from repromatrix.publish.history import History
from repromatrix.upstream.lock import Lock, listed_lock, locked_image
from repromatrix.upstream.resolve import Upstream

SHORT_DIGEST = 12  # hex digits of a digest in keys and run ids


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
        """The run folder its cells are written to on this host."""
        return f"watch-{self.key}"

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

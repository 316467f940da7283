"""The lock file: the tags (and digests) the matrix's follow rules gave, read by every shard.

A lane whose images follow a rule (``matrix.follow``) is resolved once, by
whoever plans the run, into a lock file: for each such lane the rule it was
resolved for, where the tags came from, each tag taken with the digest it
pointed at, and every tag left out with why. Every shard of the run reads the
same lock instead of asking the registry again, so a plan and its shards agree
even if a tag appears or moves in between: GPU images are pulled by the digest
the lock names (``<registry>@sha256:...``), the tag naming them in cell ids.

    {"schema_version": 1, "matrix": "matrix.yaml", "resolved_at": "2026-...Z",
     "lanes": {"gpu": {"rule": {"follow": ">=0.31", ...}, "source": "vllm/vllm-openai",
                       "images": [{"tag": "v0.32.0", "digest": "sha256:..."}],
                       "left_out": [{"tag": "nightly", "reason": "a nightly ..."}]}}}
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.grammars import check_tag, load_json
from repromatrix.matrix.config import LaneConfig, Matrix
from repromatrix.matrix.follow import LeftOut
from repromatrix.matrix.images import image_version, make_image
from repromatrix.values import Image, Lane, PullPolicy

LOCK_SCHEMA_VERSION = 1
LOCK_SUFFIX = ".lock.json"
LEFT_OUT_SHOWN = 8  # tags named per reason in ``lock_lines``; the rest are counted
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_SHOWN = 1000  # characters of a left-out tag or reason


@dataclass(frozen=True)
class LockedImage:
    """One tag a rule took, and the digest it pointed at (None on the CPU lane: a version)."""

    tag: str
    digest: str | None = None


@dataclass(frozen=True)
class LaneLock:
    """One following lane as resolved: its rule, where the tags came from, what it gave."""

    lane: Lane
    rule: Mapping[str, Any]  # ``Follow.to_json()``: a lock holds for that rule only
    source: str  # the registry repository, or the package
    images: tuple[LockedImage, ...]
    left_out: tuple[LeftOut, ...] = ()


@dataclass(frozen=True)
class Lock:
    """Every following lane of one matrix, resolved at one time."""

    matrix: str
    resolved_at: str
    lanes: Mapping[Lane, LaneLock]

    def to_json(self) -> dict[str, Any]:
        """The document written to the lock file."""
        return {
            "schema_version": LOCK_SCHEMA_VERSION,
            "matrix": self.matrix,
            "resolved_at": self.resolved_at,
            "lanes": {lane.value: _lane_json(locked) for lane, locked in self.lanes.items()},
        }


def _lane_json(locked: LaneLock) -> dict[str, Any]:
    return {
        "rule": dict(locked.rule),
        "source": locked.source,
        "images": [{"tag": i.tag, "digest": i.digest} for i in locked.images],
        "left_out": [{"tag": o.tag, "reason": o.reason} for o in locked.left_out],
    }


def default_lock_path(matrix: Path) -> Path:
    """``matrix.yaml`` -> ``matrix.lock.json``, beside it."""
    return matrix.with_name(matrix.stem + LOCK_SUFFIX)


def source_of(config: LaneConfig) -> str:
    """Where a lane's tags come from: its registry (GPU) or its package (CPU)."""
    source = config.runtime.registry if config.lane is Lane.GPU else config.runtime.package
    assert source is not None, config.lane  # the lane reader always sets them
    return source


def stale_lanes(matrix: Matrix, lock: Lock) -> tuple[Lane, ...]:
    """The following lanes the lock does not hold for (another rule, another source, none)."""
    stale = []
    for lane, config in matrix.lanes.items():
        if config.follow is None:
            continue
        locked = lock.lanes.get(lane)
        if (
            locked is None
            or dict(locked.rule) != config.follow.to_json()
            or locked.source != source_of(config)
        ):
            stale.append(lane)
    return tuple(stale)


def apply_lock(matrix: Matrix, lock: Lock | None) -> Matrix:
    """The matrix with each following lane's images taken from the lock (GPU images pinned
    to the digest it names). A lane that lists its images is left as it is, unless the lock
    pins them (``listed_lock``: what ``watch`` hands the fleet), then each pinned image is
    pulled by its digest. No lock: the matrix as it is."""
    if lock is None:
        return matrix
    lanes = dict(matrix.lanes)
    for lane, config in matrix.lanes.items():
        locked = lock.lanes.get(lane)
        if locked is None:
            continue
        if config.follow is not None:
            images = tuple(locked_image(config, item) for item in locked.images)
            lanes[lane] = dataclasses.replace(config, images=images)
        elif dict(locked.rule) == listed_rule(config):
            lanes[lane] = dataclasses.replace(config, images=_pinned(config, locked))
    return dataclasses.replace(matrix, lanes=MappingProxyType(lanes))


def listed_rule(config: LaneConfig) -> dict[str, Any]:
    """The rule a lock records for a lane that lists its images: the list itself."""
    return {"listed": [image.tag for image in config.images]}


def listed_lock(config: LaneConfig, digests: Mapping[str, str]) -> LaneLock:
    """A lock of a GPU lane that lists its images: each tag pinned to ``digests[tag]``."""
    images = tuple(LockedImage(tag, digest) for tag, digest in sorted(digests.items()))
    return LaneLock(config.lane, listed_rule(config), source_of(config), images)


def _pinned(config: LaneConfig, locked: LaneLock) -> tuple[Image, ...]:
    digests = {item.tag: item.digest for item in locked.images if item.digest}
    return tuple(
        dataclasses.replace(
            image,
            ref=f"{_repository(image.ref)}@{digests[image.tag]}",
            pull=PullPolicy.MISSING,
        )
        if image.tag in digests
        else image
        for image in config.images
    )


def _repository(ref: str) -> str:
    """``host:5000/name:tag@sha256:..`` -> ``host:5000/name``."""
    name = ref.partition("@")[0]
    repository, colon, tag = name.rpartition(":")
    return repository if colon and "/" not in tag else name


def locked_image(config: LaneConfig, item: LockedImage) -> Image:
    """The image of one locked tag: on the GPU lane pulled by its digest, never by its tag."""
    runtime = config.runtime
    ref = f"{runtime.registry}@{item.digest}" if item.digest and config.lane is Lane.GPU else None
    version = image_version(item.tag)
    return make_image(config.lane, item.tag, version, runtime.registry, runtime.package, ref=ref)


def restricted(lock: Lock, lane: Lane, tags: Iterable[str]) -> Lock:
    """The lock of one lane with only ``tags``: what a hand-off to the fleet runs."""
    wanted = set(tags)
    locked = lock.lanes[lane]
    images = tuple(item for item in locked.images if item.tag in wanted)
    only = dataclasses.replace(locked, images=images, left_out=())
    return dataclasses.replace(lock, lanes=MappingProxyType({lane: only}))


def write_lock(path: Path, lock: Lock) -> None:
    """Write the lock file whole (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(lock.to_json(), indent=1) + "\n"
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_lock(path: Path) -> Lock:
    """Read a lock file; ``UsageError`` naming the file when it is not one this tool wrote.

    A lock may come from elsewhere (``--lock``, a workflow's input): each tag is checked by
    the tag grammar and each digest by its own here, before any becomes a key or a path."""
    try:
        return parse_lock(load_json(path.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise UsageError(
            f"{path}: not a lock file this repromatrix reads ({exc}); delete it, or plan "
            "again with --relock"
        ) from exc


def parse_lock(data: Mapping[str, Any]) -> Lock:
    """A lock from its JSON document; ``ValueError`` (or ``KeyError``) when malformed."""
    if data.get("schema_version") != LOCK_SCHEMA_VERSION:
        raise ValueError(f"schema_version {data.get('schema_version')!r}")
    lanes = {Lane(name): _parse_lane(Lane(name), body) for name, body in data["lanes"].items()}
    return Lock(_shown(data["matrix"]), _shown(data["resolved_at"]), MappingProxyType(lanes))


def _parse_lane(lane: Lane, body: Mapping[str, Any]) -> LaneLock:
    images = tuple(LockedImage(_tag(i["tag"]), _digest(i.get("digest"))) for i in body["images"])
    left = tuple(LeftOut(_shown(o["tag"]), _shown(o["reason"])) for o in body.get("left_out", ()))
    rule = body["rule"]
    if not isinstance(rule, dict):
        raise ValueError("`rule` is not a mapping")
    return LaneLock(lane, MappingProxyType(rule), _shown(body["source"]), images, left)


def _tag(value: object) -> str:
    """A locked tag becomes an image key, a render folder and a cell id: the tag grammar."""
    if not isinstance(value, str):
        raise ValueError(f"a tag is text, not {type(value).__name__}")
    if (why := check_tag(value)) is not None:
        raise ValueError(f"tag {value[:80]!r} is refused: {why}")
    return value


def _shown(value: object) -> str:
    """A left-out tag or a reason is only ever printed: one line of printable text."""
    text = str(value)
    if len(text) > MAX_SHOWN or any(not ch.isprintable() for ch in text):
        raise ValueError(f"{text[:80]!r} is not one short line of printable text")
    return text


def _digest(value: object) -> str | None:
    if value is None or (isinstance(value, str) and DIGEST.fullmatch(value)):
        return value
    raise ValueError(f"digest {str(value)[:80]!r} is not sha256:<64 hex digits>")


def lock_lines(lock: Lock, path: Path, fresh: bool) -> list[str]:
    """What ``plan`` says about a lock: per lane, the rule, the tags it gave (with digests),
    and the tags left out grouped by reason."""
    how = "resolved now" if fresh else f"resolved {lock.resolved_at}"
    lines = []
    for lane, locked in sorted(lock.lanes.items()):
        rule = locked.rule.get("follow")
        what = f"follows {locked.source} `{rule}`" if rule else "lists its tags, pinned"
        lines.append(f"lane {lane} {what} ({how}, lock {path}): {len(locked.images)} tags")
        for item in locked.images:
            lines.append(f"  {item.tag}" + (f"  {item.digest}" if item.digest else ""))
        by_reason: dict[str, list[str]] = {}
        for left in locked.left_out:
            by_reason.setdefault(left.reason, []).append(left.tag)
        for reason, tags in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            shown = ", ".join(tags[:LEFT_OUT_SHOWN])
            more = f" and {len(tags) - LEFT_OUT_SHOWN} more" if len(tags) > LEFT_OUT_SHOWN else ""
            lines.append(f"  left out, {reason}: {shown}{more}")
    return lines

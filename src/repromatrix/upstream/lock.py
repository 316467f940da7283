"""The lock file: the tags (and digests) the matrix's follow rules gave, read by every shard.

A lane whose images follow a rule (``matrix.follow``) is resolved once, by
whoever plans the run, into a lock file: for each such lane the rule it was
resolved for, where the tags came from, each tag taken with the digest it
pointed at, and every tag left out with why. Every shard of the run reads the
same lock instead of asking the registry again, so a plan and its shards agree
even if a tag appears or moves in between: GPU images are pulled by the digest
the lock names (``<registry>@sha256:...``), the tag naming them in cell ids.

The lock's values (``matrix.follow.Lock``) and its application to a loaded
matrix (``matrix.inputs.apply_lock``, a step of the run) are the matrix's; this
module is the file: named, read and checked, written, said.

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
from pathlib import Path
from types import MappingProxyType
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.grammars import check_tag, load_json
from repromatrix.matrix.config import LaneConfig, Matrix
from repromatrix.matrix.follow import LOCK_SCHEMA_VERSION, LaneLock, LeftOut, Lock, LockedImage
from repromatrix.matrix.inputs import listed_rule
from repromatrix.values import Lane

LOCK_SUFFIX = ".lock.json"
LEFT_OUT_SHOWN = 8  # tags named per reason in ``lock_lines``; the rest are counted
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_SHOWN = 1000  # characters of a left-out tag or reason


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


def listed_lock(config: LaneConfig, digests: Mapping[str, str]) -> LaneLock:
    """A lock of a GPU lane that lists its images: each tag pinned to ``digests[tag]``."""
    images = tuple(LockedImage(tag, digest) for tag, digest in sorted(digests.items()))
    return LaneLock(config.lane, listed_rule(config), source_of(config), images)


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

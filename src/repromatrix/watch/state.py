"""What ``watch`` keeps between rounds, and what the results root holds of a candidate.

``<results>/watch/`` holds the round's lock, each hand-off to the fleet (so a
tag's GPU cells are handed over once), each answer with the channels it was
delivered to (so an answer a webhook did not take is sent again next round,
and one sent is never sent twice), and the GitHub issue opened per tag. Every
file is written whole through ``results.store.atomic_write`` (secrets redacted).

The cells of a candidate are found wherever the results root has them: the
run folder this host wrote (``watch-<key>``), or a folder of the fleet's
merged results, matched by lane, tag and digest. A result the infrastructure
stopped (``infra_error``) does not count: its cell runs again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.grammars import load_json
from repromatrix.judgement import Outcome
from repromatrix.publish.history import same_digest
from repromatrix.results.merge import finish_time
from repromatrix.results.store import (
    CELLS_DIR,
    CellResult,
    Unreadable,
    atomic_write,
    read_file,
    read_results,
)
from repromatrix.watch.candidates import Candidate

WATCH_DIR = "watch"
MAX_STATE_BYTES = 64 * 1024 * 1024  # a state file: an answer, a hand-off, the round's lock


@dataclass(frozen=True)
class WatchFolder:
    """``<results>/watch/``: the state of the rounds."""

    root: Path

    @property
    def lock(self) -> Path:
        """The lock of the latest round (every run of the round reads it)."""
        return self.root / "lock.json"

    def handoff(self, key: str) -> Path:
        """The record of a candidate's cells handed to the fleet."""
        return self.root / "handoffs" / f"{key}.json"

    def answer(self, key: str, stage: str) -> Path:
        """An answer, with the channels it was delivered to."""
        return self.root / "answers" / f"{key}.{stage}.json"

    def answers(self) -> Iterator[Path]:
        """Every answer kept, in name order."""
        yield from sorted((self.root / "answers").glob("*.json"))

    @property
    def issues(self) -> Path:
        """The GitHub issue opened for each tag."""
        return self.root / "issues.json"

    def merged(self, key: str) -> Path:
        """Where a candidate's cells from several folders are merged before publishing."""
        return self.root / "merged" / key


def read_json(path: Path) -> dict[str, Any] | None:
    """A state file, or None when there is none; ``UsageError`` when it is not JSON."""
    if not path.is_file():
        return None
    try:
        data = load_json(read_file(path, MAX_STATE_BYTES))
    except (Unreadable, ValueError, RecursionError) as exc:
        raise UsageError(f"{path}: not a state file watch can read ({exc}); delete it") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a state file watch can read (not an object); delete it")
    return data


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    """Write a state file whole."""
    atomic_write(path, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode())


@dataclass(frozen=True)
class Recorded:
    """A candidate's cells with a result in the results root, and the folders holding them."""

    results: Mapping[str, CellResult]
    folders: Mapping[str, Path]  # cell id -> the run folder its kept result is in


def recorded(results_root: Path, candidate: Candidate) -> Recorded:
    """Every result of the candidate's image under ``results_root`` (the latest attempt of
    each cell; ``infra_error`` left out, so its cell runs again)."""
    kept: dict[str, CellResult] = {}
    folders: dict[str, Path] = {}
    for folder in run_folders(results_root):
        results, _problems = read_results(folder)  # an unreadable cell runs again
        for result in results:
            if not _of(result, candidate) or result.outcome is Outcome.INFRA_ERROR:
                continue
            earlier = kept.get(result.id)
            if earlier is None or _later(result, earlier):
                kept[result.id] = result
                folders[result.id] = folder
    return Recorded(kept, folders)


def run_folders(results_root: Path) -> Iterator[Path]:
    """The run folders directly under the results root (watch's own folder is none)."""
    if not results_root.is_dir():
        return
    for folder in sorted(results_root.iterdir()):
        if folder.name != WATCH_DIR and (folder / CELLS_DIR).is_dir():
            yield folder


def _of(result: CellResult, candidate: Candidate) -> bool:
    if (result.lane, result.image_tag) != (candidate.lane.value, candidate.tag):
        return False
    return candidate.digest is None or same_digest(result.image_digest, candidate.digest)


def _later(result: CellResult, than: CellResult) -> bool:
    mine, theirs = finish_time(result), finish_time(than)
    return mine is not None and (theirs is None or mine > theirs)

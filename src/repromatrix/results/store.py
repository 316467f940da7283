"""The run folder on disk: the one reader and writer of ``results/<run>/``.

Layout of a run::

    results/<run>/plan.json                         the cell ids the run means to run
    results/<run>/cells/<cell-id-as-path>/result.json, log.txt
    results/<run>/environment/<image-key>-<hash>.txt  vLLM's environment report of an image
                                                    on the runner (results point at it)
    results/<run>/merge.json                        what ``merge`` found (merged runs only)

Every file is written to a new temporary name and renamed, so an interrupted
run never leaves a half-written result (a cell has a complete result or none,
and ``--resume`` runs it again) and a link planted where a file goes is
replaced, never written through. Every path comes from a cell id checked by
the planner's grammar, so data cannot name a path outside the folder.

``read_run`` is what ``--resume``, ``report``, ``merge`` and ``diff`` read: the
results that fit the schema, and one named problem for each file that does
not (never a traceback). Files are opened without following links, and a FIFO
or a device is named, not read.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import socket
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repromatrix.errors import UsageError
from repromatrix.files import LeadsOut, inside, replace_file
from repromatrix.grammars import check_run_id, load_json
from repromatrix.results.problems import ProblemKind, RunProblem, unique_problems
from repromatrix.results.schema import (
    ENVIRONMENT_DIR,
    SCHEMA_VERSION,
    CellResult,
    ResultProblem,
    Timings,
    is_cell_id,
    is_environment_path,
    parse_result,
    whole_text,
)
from repromatrix.results.verdicts import judge
from repromatrix.secret_env import redact, redact_text, redacted_from

# The result values are defined in ``schema`` and handed out here with the files they live in.
__all__ = [
    "LOG_FILE",
    "MERGE_FILE",
    "PLAN_FILE",
    "RESULT_FILE",
    "SCHEMA_VERSION",
    "CellResult",
    "StoredRun",
    "Timings",
    "Unreadable",
    "atomic_write",
    "cell_dir",
    "copy_cell",
    "copy_environment",
    "finished_ids",
    "log_file",
    "merge_problems",
    "never_ran",
    "read_environment",
    "read_file",
    "read_plan",
    "read_results",
    "read_run",
    "run_folder",
    "unfinished_cells",
    "write_environment",
    "write_merge_record",
    "write_plan",
    "write_result",
]

CELLS_DIR = "cells"  # one folder per cell below it
RESULT_FILE = "result.json"
LOG_FILE = "log.txt"
PLAN_FILE = "plan.json"  # the ids a run means to run, written when it starts
MERGE_FILE = "merge.json"  # what ``merge`` found: shards, replaced copies, problems
_MAX_JSON_BYTES = 8 * 1024 * 1024
_MAX_ENVIRONMENT_BYTES = 4 * 1024 * 1024  # collect_env prints a few KiB; pip lists can be long
_MAX_LOG_BYTES = 1 << 31  # the runner bounds logs far below this; merge copies nothing bigger
# What a reader of a run reads at most (a result.json is a few KiB): a folder past these is not
# one this tool wrote, and reports on what it could read, naming the rest.
MAX_RESULTS = 200_000
MAX_RESULT_BYTES = 2 << 30  # of all its result.json files together


def cell_dir(run_dir: Path, cell_id: str) -> Path:
    """Return the folder of one cell's files; the id's ``/`` become folders, ``@`` stays."""
    if not is_cell_id(cell_id):
        raise ValueError(f"{cell_id!r} is not a cell id")
    return run_dir / CELLS_DIR / Path(*cell_id.split("/"))


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with ``files.replace_file`` (whole or not at all, links replaced).

    Every file of a run folder (results, logs, plan, reports) and of a site is
    written here, so this is where the secret values of this process's
    environment are redacted once more, whatever slipped past the stream.
    """
    replace_file(path, redact(data, redacted_from(os.environ)))


def run_folder(results: Path, run_id: str) -> Path:
    """The folder of run ``run_id`` under ``results`` (itself resolved first, as clusters
    often reach it through a link); ``UsageError`` for an id outside the grammar or a
    run folder that is a link, which would take the whole run elsewhere."""
    if (why := check_run_id(run_id)) is not None:
        raise UsageError(f"run id {run_id!r} is refused: {why}")
    folder = results.resolve() / run_id
    if folder.is_symlink():
        raise LeadsOut(
            f"{folder} is a symbolic link: a run folder is a folder of its own under {results}"
        )
    return folder


def now_iso() -> str:
    """The current UTC time, ISO 8601, to the microsecond (attempts of a cell are ordered by it)."""
    return datetime.now(UTC).isoformat()


def write_result(run_dir: Path, result: CellResult, log: bytes) -> Path:
    """Save a cell's log, then its result (the result last: its presence marks the cell done).

    The result gets its finish time and host here when it has none, so every
    attempt of a cell can be told apart and ordered by ``merge``. A cell has
    both files or neither: a log whose result cannot be written is removed.
    """
    stamped = replace(
        result,
        finished_at=result.finished_at or now_iso(),
        host=result.host or socket.gethostname(),
    )
    folder = cell_dir(run_dir, stamped.id)
    # The cell's verdict on its own, for whoever reads result.json alone (the reports judge
    # every cell again with its run: a hit outside the range may be a regression there).
    document = {**stamped.to_json(), "verdict": judge(stamped).value}
    body = json.dumps(document, indent=2, sort_keys=True).encode() + b"\n"
    atomic_write(inside(run_dir, folder / LOG_FILE), log)
    try:
        atomic_write(inside(run_dir, folder / RESULT_FILE), body)
    except BaseException:
        (folder / LOG_FILE).unlink(missing_ok=True)
        raise
    return folder


def environment_path(image_key: str, text: str) -> str:
    """Where an image's environment report goes in a run folder, relative to it: named by
    the image and the report's content, so shards of several runners merge without a clash."""
    name = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in image_key)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    return f"{ENVIRONMENT_DIR}/{name.lstrip('.-_') or 'image'}-{digest}.txt"


def write_environment(run_dir: Path, image_key: str, text: str) -> str:
    """Save an image's environment report (secrets redacted); return its path in the run."""
    redacted = redact_text(text)
    relative = environment_path(image_key, redacted)
    path = run_dir / relative
    if not path.is_file():  # the same report, saved by an earlier image job or attempt
        atomic_write(inside(run_dir, path), redacted.encode("utf-8"))
    return relative


def read_environment(run_dir: Path, relative: str) -> str | None:
    """The environment report a result points at, or None when it is not readable here."""
    if not is_environment_path(relative):
        return None
    try:
        data = read_file(run_dir / relative, limit=_MAX_ENVIRONMENT_BYTES)
    except Unreadable:
        return None
    return data.decode("utf-8", errors="replace")


def copy_environment(source_run: Path, out: Path, relative: str) -> list[str]:
    """Copy one environment report into ``out`` (once); return why it was left out."""
    target = out / relative
    if not is_environment_path(relative) or os.path.lexists(target):
        return []
    try:
        data = read_file(source_run / relative, limit=_MAX_ENVIRONMENT_BYTES)
    except Unreadable as exc:
        return [f"{relative}: {exc}"]
    atomic_write(inside(out, target), data)
    return []


def write_plan(run_dir: Path, cell_ids: Iterable[str], matrix: str | None = None) -> None:
    """Record the cells a run means to run, so every report can name those that never ran,
    and the matrix file they come from, so every report's title can name it."""
    ids = sorted(set(cell_ids))
    bad = [c for c in ids if not is_cell_id(c)]
    if bad:
        raise ValueError(f"not cell ids: {', '.join(map(repr, bad[:3]))}")
    body: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "cells": ids}
    if matrix is not None:
        body["matrix"] = matrix
    atomic_write(inside(run_dir, run_dir / PLAN_FILE), json.dumps(body, indent=1).encode() + b"\n")


def write_merge_record(run_dir: Path, document: dict[str, Any]) -> None:
    """Write merge.json (``merge`` decides what goes in it)."""
    body = {"schema_version": SCHEMA_VERSION, **document}
    data = json.dumps(body, indent=1, ensure_ascii=False).encode() + b"\n"
    atomic_write(inside(run_dir, run_dir / MERGE_FILE), data)


class Unreadable(Exception):
    """A file of the run that is not read, and the sentence saying why."""


def read_file(path: Path, limit: int = _MAX_JSON_BYTES) -> bytes:
    """Read a regular file without following a link at ``path`` (raises ``Unreadable``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            message = "a symbolic link: files of a run are read only from the run itself"
            raise Unreadable(message) from exc
        raise Unreadable(f"unreadable: {exc.strerror or exc}") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"not a regular file ({_file_kind(info.st_mode)})")
        raise Unreadable(f"{info.st_size} bytes, more than the {limit} it may have")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(min(info.st_size, limit) + 1)
        except OSError as exc:
            raise Unreadable(f"unreadable: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise Unreadable(f"grew past the {limit} bytes a file of the run may have")
    return data


def _file_kind(mode: int) -> str:
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a folder"}
    return next((name for test, name in kinds.items() if test(mode)), "a device")


@dataclass(frozen=True)
class StoredRun:
    """What could be read from a run folder, and one named problem for each thing that could not."""

    results: tuple[CellResult, ...]
    problems: tuple[RunProblem, ...]
    planned: frozenset[str] | None  # None: the run has no plan.json


def read_run(run_dir: Path) -> StoredRun:
    """Read a run folder: its results, plan and merge record, and every problem with them."""
    results, problems = read_results(run_dir)
    planned, plan_problems = read_plan(run_dir)
    problems += plan_problems
    problems += unfinished_cells(run_dir)
    problems += never_ran(run_dir, planned, results)
    problems += merge_problems(run_dir)
    return StoredRun(tuple(results), unique_problems(problems), planned)


def read_results(run_dir: Path) -> tuple[list[CellResult], list[RunProblem]]:
    """Read every cell result under ``run_dir``; each file that does not fit is one problem."""
    results: list[CellResult] = []
    problems: list[RunProblem] = []
    paths = sorted(itertools.islice(_result_paths(run_dir, problems), MAX_RESULTS + 1))
    if len(paths) > MAX_RESULTS:
        message = (
            f"more than the {MAX_RESULTS} result files a run may have: {MAX_RESULTS} are "
            "read, the rest are not"
        )
        problems.append(RunProblem(ProblemKind.CORRUPT, CELLS_DIR, message))
        paths = paths[:MAX_RESULTS]
    budget = MAX_RESULT_BYTES
    for index, path in enumerate(paths):
        where = path.relative_to(run_dir).as_posix()
        if _size(path) > budget:
            message = (
                f"the run's result files hold more than the {MAX_RESULT_BYTES} bytes a run may "
                f"have: {index} are read, the {len(paths) - index} from {where} on are not"
            )
            problems.append(RunProblem(ProblemKind.CORRUPT, CELLS_DIR, message))
            break
        try:
            data = read_file(path)
            budget -= len(data)
            result = parse_result(data)
        except ResultProblem as exc:
            problems.append(RunProblem(exc.kind, where, str(exc)))
            continue
        except Unreadable as exc:
            problems.append(RunProblem(ProblemKind.CORRUPT, where, str(exc)))
            continue
        if cell_dir(run_dir, result.id) != path.parent:
            message = f"holds the result of another cell ({result.id}): not used"
            problems.append(RunProblem(ProblemKind.CORRUPT, where, message))
            continue
        results.append(result)
    return results, problems


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0  # gone or unreadable: ``read_file`` names why


def _result_paths(run_dir: Path, problems: list[RunProblem]) -> Iterator[Path]:
    """Every ``result.json`` below ``cells/``; links to folders are named, never followed."""
    cells = run_dir / CELLS_DIR
    if cells.is_symlink():
        problems.append(RunProblem(ProblemKind.CORRUPT, "cells", "a symbolic link: not followed"))
        return
    for folder, dirs, files in os.walk(cells, followlinks=False):
        here = Path(folder)
        for name in [d for d in dirs if (here / d).is_symlink()]:
            where = (here / name).relative_to(run_dir).as_posix()
            problems.append(RunProblem(ProblemKind.CORRUPT, where, "a symbolic link: not followed"))
        if RESULT_FILE in files or RESULT_FILE in dirs:
            yield here / RESULT_FILE


def finished_ids(run_dir: Path) -> set[str]:
    """Return the ids of cells that already have a readable result (for ``--resume``)."""
    results, _ = read_results(run_dir)
    return {r.id for r in results}


def unfinished_cells(run_dir: Path) -> list[RunProblem]:
    """Cells with a log or a half-written file but no result: the run stopped inside them."""
    problems = []
    cells = run_dir / CELLS_DIR
    for folder, dirs, files in os.walk(cells, followlinks=False):
        names = set(files) | set(dirs)
        if RESULT_FILE in names:
            continue
        if LOG_FILE in names or any(n.startswith(f".{RESULT_FILE}.") for n in names):
            where = Path(folder).relative_to(cells).as_posix()
            problems.append(
                RunProblem(
                    ProblemKind.INCOMPLETE,
                    where,
                    "the cell started but has no result (the run was interrupted): "
                    "`repromatrix run --resume` runs it again",
                )
            )
    return problems


def plan_matrix(run_dir: Path) -> str | None:
    """The matrix file named in plan.json, when the run has a readable one that names it."""
    document, _ = _read_json(run_dir, PLAN_FILE)
    matrix = document.get("matrix") if document is not None else None
    return matrix if isinstance(matrix, str) else None


def read_plan(run_dir: Path) -> tuple[frozenset[str] | None, list[RunProblem]]:
    """The planned cell ids (None when the run has no plan.json), and any problem reading it."""
    document, problems = _read_json(run_dir, PLAN_FILE)
    if document is None:
        return None, problems
    cells = document.get("cells")
    if not isinstance(cells, list):
        return None, [RunProblem(ProblemKind.CORRUPT, PLAN_FILE, "no list of cells")]
    bad = [c for c in cells if not is_cell_id(c)]
    if bad:
        shown = ", ".join(repr(c)[:80] for c in bad[:3])
        message = f"{len(bad)} entries are not cell ids and were left out: {shown}"
        problems.append(RunProblem(ProblemKind.CORRUPT, PLAN_FILE, message))
    return frozenset(c for c in cells if is_cell_id(c)), problems


def never_ran(
    run_dir: Path, planned: frozenset[str] | None, results: Sequence[CellResult]
) -> list[RunProblem]:
    """Planned cells with no result folder at all: the run ended before reaching them."""
    if planned is None:
        return []
    done = {r.id for r in results}
    missing = sorted(c for c in planned - done if not os.path.lexists(cell_dir(run_dir, c)))
    if not missing:
        return []
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    message = (
        f"{len(missing)} of {len(planned)} planned cells never ran (a half-finished run: "
        f"`repromatrix run --resume` completes it): {', '.join(missing[:5])}{more}"
    )
    return [RunProblem(ProblemKind.INCOMPLETE, PLAN_FILE, message)]


def merge_problems(run_dir: Path) -> list[RunProblem]:
    """The problems ``merge`` recorded in merge.json (conflicts, replaced copies, bad files)."""
    document, problems = _read_json(run_dir, MERGE_FILE)
    if document is None:
        return problems
    items = document.get("problems", [])
    if not isinstance(items, list):
        return [RunProblem(ProblemKind.CORRUPT, MERGE_FILE, "`problems` is not a list")]
    bad = 0
    for item in items:
        try:
            problems.append(RunProblem.from_json(item))
        except ValueError:
            bad += 1
    if bad:
        message = f"{bad} of {len(items)} problems are malformed and were left out"
        problems.append(RunProblem(ProblemKind.CORRUPT, MERGE_FILE, message))
    return problems


def _read_json(run_dir: Path, name: str) -> tuple[dict[str, Any] | None, list[RunProblem]]:
    path = run_dir / name
    if not os.path.lexists(path):
        return None, []
    try:
        document = whole_text(load_json(read_file(path)))
    except Unreadable as exc:
        return None, [RunProblem(ProblemKind.CORRUPT, name, str(exc))]
    except (ValueError, RecursionError) as exc:
        return None, [RunProblem(ProblemKind.CORRUPT, name, f"not valid JSON ({exc})")]
    if not isinstance(document, dict):
        return None, [RunProblem(ProblemKind.CORRUPT, name, "not a JSON object")]
    return document, []


def log_file(run_dir: Path, cell_id: str) -> Path | str | None:
    """A cell's log when it is a regular file inside the run, else why not (None: no log)."""
    path = cell_dir(run_dir, cell_id) / LOG_FILE
    if not os.path.lexists(path):
        return None
    real = path.resolve()
    if not real.is_relative_to(run_dir.resolve()):
        return "the log is a link out of the run folder: not read"
    try:
        mode = real.stat().st_mode
    except OSError as exc:
        return f"log not readable: {exc.strerror or exc}"
    return real if stat.S_ISREG(mode) else f"the log is not a regular file ({_file_kind(mode)})"


def copy_cell(source_run: Path, out: Path, cell_id: str) -> list[str]:
    """Copy one cell's log and result (the result last); return why any file was left out."""
    left_out = []
    for name in (LOG_FILE, RESULT_FILE):
        source = cell_dir(source_run, cell_id) / name
        try:
            data = read_file(source, limit=_MAX_LOG_BYTES)
        except Unreadable as exc:
            left_out.append(f"{name}: {exc}")
            continue
        atomic_write(inside(out, cell_dir(out, cell_id) / name), data)
    return left_out

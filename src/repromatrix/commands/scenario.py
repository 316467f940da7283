"""``repromatrix scenario draft LOG [--out FILE] [--force] [--check] [--healthy DIR]
[--crashes DIR] [--try]``:
a scenario file drafted from a crash log, checked on logs and tried on this host."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import zlib
from pathlib import Path
from typing import Any

from repromatrix.commands.arguments import MATRIX_HELP
from repromatrix.drafting.check import (
    CRASH_LOGS,
    HEALTHY_LOGS,
    check_draft,
    crash_logs,
    healthy_logs,
    load_draft,
    other_causes,
)
from repromatrix.drafting.trial import try_draft
from repromatrix.drafting.write import draft_id, render_draft
from repromatrix.errors import EXIT_FAILURE, EXIT_OK, UsageError
from repromatrix.files import replace_file
from repromatrix.grammars import check_run_id
from repromatrix.matrix.selector import Selector
from repromatrix.run.main import RunOptions
from repromatrix.run.progress import Progress
from repromatrix.triage import triage_path
from repromatrix.triage.facts import read_launch
from repromatrix.triage.triager import log_lines
from repromatrix.values import Lane

# ``--try`` runs go under a folder no run id can name (it starts with a dot), so none of
# them becomes the "latest" run of results/ (``run.folder.latest_run``).
TRIES = Path("results") / ".tries"


def add_parser(subparsers: Any) -> None:
    """Register ``scenario`` and its ``draft`` subcommand."""
    parser = subparsers.add_parser("scenario", help="work with scenario files")
    inner = parser.add_subparsers(dest="scenario_command", metavar="SUBCOMMAND", required=True)
    draft = inner.add_parser(
        "draft",
        help="draft a scenario file from a crash log",
        description=(
            "Write a scenario from a vLLM crash log: its root cause as the signature, the "
            "log's engine arguments as trigger and launch, its version as affected, the "
            "catalogue's flag changes as workarounds; comments where the log is silent."
        ),
    )
    draft.add_argument("log", type=Path, metavar="LOG", help="the crash log")
    draft.add_argument("--out", type=Path, metavar="FILE", help="write here (default: stdout)")
    draft.add_argument("--force", action="store_true", help="replace an existing --out file")
    draft.add_argument("--check", action="store_true", help="triage the source and healthy logs")
    draft.add_argument("--healthy", type=Path, metavar="DIR", help="healthy logs for --check")
    draft.add_argument(
        "--crashes",
        type=Path,
        metavar="DIR",
        help="labelled crash logs for --check (default tests/data/logs): none may match",
    )
    draft.add_argument("--try", dest="trial", action="store_true", help="run its cells here")
    draft.add_argument(
        "--matrix", type=Path, default=Path("matrix.yaml"), metavar="FILE", help=MATRIX_HELP
    )
    draft.add_argument(
        "--lane",
        choices=[lane.value for lane in Lane],
        default=None,
        help="--try: one lane only",
    )
    draft.add_argument(
        "--only", action="append", default=[], metavar="GLOB", help="--try: keep cells matching"
    )
    draft.add_argument(
        "--skip", action="append", default=[], metavar="GLOB", help="--try: drop cells matching"
    )
    draft.add_argument(
        "--results",
        type=Path,
        default=TRIES,
        metavar="DIR",
        help=f"where --try's run folder is made (default: {TRIES}: never the latest run of "
        "results/, which the next run's --durations-from latest takes)",
    )
    draft.add_argument(
        "--run-id", default=None, metavar="ID", help="--try's run folder name (default: time)"
    )
    draft.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Draft, write, then check and try as asked; 1 when a check fails or nothing reproduced."""
    _check_out(args.out, force=args.force)  # before the log is read
    scenario_id, text = _draft(args.log, args.out)
    load_draft(scenario_id, text)  # a draft that does not load is a bug, shown as one
    _write(text, args.out, force=args.force)
    status = EXIT_OK
    if args.check:
        healthy = healthy_logs(args.healthy or HEALTHY_LOGS)
        if args.crashes is not None and not args.crashes.is_dir():
            raise UsageError(f"--crashes {args.crashes}: no such folder of labelled crash logs")
        others = _other_causes(args.log, args.crashes or CRASH_LOGS)
        report = check_draft(load_draft(scenario_id, text), args.log, healthy, others)
        _say(report.lines())
        status = status if report.passed else EXIT_FAILURE
    if args.trial:
        trial = try_draft(scenario_id, text, _options(args), _selector(args), Progress(0))
        _say(trial.lines())
        status = status if trial.reproduced else EXIT_FAILURE
    return status


def _draft(log: Path, out: Path | None) -> tuple[str, str]:
    try:
        diagnosis = triage_path(log)
        if diagnosis.root_cause is None:
            raise UsageError(f"{log}: triage names no root cause, so there is nothing to draft")
        with log.open("rb") as handle:  # line by line, as triage reads it: bounded memory
            record = read_launch(log_lines(handle))
    except (OSError, EOFError, zlib.error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(f"cannot read {log}: {reason}") from exc
    scenario_id = _id(out) or draft_id(diagnosis)
    return scenario_id, render_draft(diagnosis, record, scenario_id, log.name)


def _other_causes(log: Path, folder: Path) -> tuple[Path, ...]:
    """The labelled crash logs of ``folder`` whose cause is not the one triage names in ``log``."""
    cause = triage_path(log).root_cause
    if cause is None or not folder.is_dir():
        return ()
    return other_causes(crash_logs(folder), log, cause)


def _id(out: Path | None) -> str | None:
    if out is None or not out.name.endswith(".yaml"):
        return None
    stem = out.name[: -len(".yaml")]
    return stem if check_run_id(stem) is None and stem == stem.lower() else None


def _check_out(out: Path | None, *, force: bool) -> None:
    """``--out`` is a file to write: not a folder, and with ``--force`` only a regular file
    (or a link, which is replaced, never followed) is replaced, never a FIFO or a device."""
    if out is None or not os.path.lexists(out):
        return
    mode = out.lstat().st_mode
    if stat.S_ISDIR(mode):
        raise UsageError(f"--out {out} is a folder: give a file, like {out / 'my-crash.yaml'}")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise UsageError(
            f"--out {out} is not a regular file (a FIFO, a socket or a device): "
            "--force replaces only a file"
        )
    if not force:
        raise UsageError(f"{out} exists; --force replaces it")


def _write(text: str, out: Path | None, *, force: bool) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    _check_out(out, force=force)
    replace_file(out, text.encode("utf-8"))
    print(f"wrote {out}", file=sys.stderr)


def _say(lines: list[str]) -> None:
    # With the draft on stdout, reports go to stderr so the YAML stays a file.
    for line in lines:
        print(line, file=sys.stderr)


def _options(args: argparse.Namespace) -> RunOptions:
    lane = Lane(args.lane) if args.lane else None
    return RunOptions(matrix=args.matrix, lane=lane, results=args.results, run_id=args.run_id)


def _selector(args: argparse.Namespace) -> Selector:
    return Selector(tuple(args.only), tuple(args.skip))

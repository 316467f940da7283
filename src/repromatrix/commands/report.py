"""``repromatrix report RESULTS_DIR``: rebuild a run's junit.xml and compat.{md,html,json}."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from repromatrix.errors import EXIT_OK, UsageError
from repromatrix.secret_env import redact_text
from repromatrix.visible import visible


def add_parser(subparsers: Any) -> None:
    """Register the ``report`` command."""
    parser = subparsers.add_parser(
        "report",
        help="rebuild the reports of a run from its saved cell results",
        description=(
            "Rebuild junit.xml, compat.md, compat.html and compat.json in RESULTS_DIR from "
            "the cell results saved there. Needs no Docker and no vLLM."
        ),
    )
    parser.add_argument(
        "results", type=Path, metavar="RESULTS_DIR", help="a run folder, results/<run>"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Write the reports and print what was found."""
    from repromatrix.reports.write import write_reports  # noqa: PLC0415  (keeps `--help` fast)

    run_dir = require_run_dir(args.results)
    summary = write_reports(run_dir)
    for line in summary.lines():
        stream = sys.stderr if line.startswith("problem:") else sys.stdout
        print(visible(redact_text(line)), file=stream)
    return EXIT_OK


def require_run_dir(path: Path) -> Path:
    """Return ``path`` when it is a run folder; otherwise a usage error that says what is there."""
    if not path.is_dir():
        raise UsageError(f"{path}: no such folder")
    if (path / "cells").is_dir():
        return path
    runs = sorted(p.name for p in path.iterdir() if (p / "cells").is_dir())
    if runs:
        raise UsageError(
            f"{path} holds runs ({', '.join(runs)}), not cell results: give one run folder. "
            f"Perhaps you meant `{path / runs[-1]}`?"
        )
    raise UsageError(f"{path} is not a results folder: it has no cells/ folder")

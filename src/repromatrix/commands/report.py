"""``repromatrix report RESULTS_DIR``: rebuild a run's junit.xml and compat.{md,html,json}."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
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
    parser.add_argument("--baseline", metavar="TAG", help="the image tag in use today")
    parser.add_argument(
        "--candidate", metavar="TAG", help="the tag to move to: adds 'what changes if we move'"
    )
    parser.add_argument(
        "--scenarios",
        type=Path,
        metavar="DIR",
        help="the scenario files whose documented ranges the evidence is held against "
        "(default: the scenarios shipped with repromatrix, and ./scenarios)",
    )
    parser.add_argument(
        "--suggest-ranges",
        action="store_true",
        help="print a patch that puts the ranges the observations fit into the scenario files",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Write the reports and print what was found (or, with --suggest-ranges, the patch)."""
    from repromatrix.reports.findings import default_options  # noqa: PLC0415  (fast --help)
    from repromatrix.reports.ranges import load_documents  # noqa: PLC0415
    from repromatrix.reports.write import write_reports  # noqa: PLC0415

    run_dir = require_run_dir(args.results)
    if (args.baseline is None) != (args.candidate is None):
        raise UsageError("--baseline and --candidate go together: give both or neither")
    defaults = default_options(run_dir)
    documents = load_documents(args.scenarios) if args.scenarios else defaults.documents
    options = replace(
        defaults, documents=documents, baseline=args.baseline, candidate=args.candidate
    )
    if args.suggest_ranges:
        return _print_patch(run_dir, options)
    summary = write_reports(run_dir, options)
    for line in summary.lines():
        stream = sys.stderr if line.startswith("problem:") else sys.stdout
        print(visible(redact_text(line)), file=stream)
    return EXIT_OK


def _print_patch(run_dir: Path, options: Any) -> int:
    from repromatrix.reports.ranges import range_evidence, suggest_patch  # noqa: PLC0415
    from repromatrix.results.store import read_run  # noqa: PLC0415
    from repromatrix.results.verdicts import judge_all  # noqa: PLC0415

    if not options.documents:
        raise UsageError("--suggest-ranges needs the scenario files: give --scenarios DIR")
    evidence = range_evidence(judge_all(read_run(run_dir).results), options.documents)
    patch = suggest_patch(evidence, Path.cwd())
    if not patch:
        print("every documented range fits the observations: nothing to change", file=sys.stderr)
    print(patch, end="")
    return EXIT_OK


def require_run_dir(path: Path) -> Path:
    """Return ``path`` when it is a run folder; otherwise a usage error that says what is there."""
    if not path.is_dir():
        if os.path.lexists(path):
            what = "a file" if path.is_file() else "not a folder"
            raise UsageError(f"{path} is {what}: give the run folder that holds cells/")
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

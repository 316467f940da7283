"""``repromatrix publish RESULTS... --out SITE``: a static site with every run's history."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from repromatrix.commands.arguments import check_output_folder
from repromatrix.commands.report import require_run_dir
from repromatrix.errors import EXIT_OK, UsageError
from repromatrix.secret_env import redact_text
from repromatrix.visible import visible


def add_parser(subparsers: Any) -> None:
    """Register the ``publish`` command."""
    parser = subparsers.add_parser(
        "publish",
        help="build a static site of runs, extending the site published before",
        description=(
            "Build a static site in --out from run folders: an index with the newest run's "
            "upgrade view, a page per scenario and per cell run, and history.json. When --out "
            "(or --previous) holds a published site, its history is kept and extended."
        ),
    )
    parser.add_argument(
        "results", type=Path, nargs="+", metavar="RESULTS", help="run folders, results/<run>"
    )
    parser.add_argument("--out", type=Path, required=True, metavar="SITE", help="the site folder")
    parser.add_argument(
        "--previous", type=Path, metavar="SITE", help="a previously published site to extend"
    )
    parser.add_argument(
        "--scenarios",
        type=Path,
        metavar="DIR",
        help="scenario files (default: the scenarios shipped with repromatrix, and ./scenarios)",
    )
    parser.add_argument("--baseline", metavar="TAG", help="the image tag in use today")
    parser.add_argument("--candidate", metavar="TAG", help="the image tag to move to")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Publish, and say where the site is."""
    from repromatrix.publish.site import publish  # noqa: PLC0415  (keeps `--help` fast)
    from repromatrix.reports.findings import ReportOptions  # noqa: PLC0415
    from repromatrix.reports.ranges import load_documents  # noqa: PLC0415

    if (args.baseline is None) != (args.candidate is None):
        raise UsageError("--baseline and --candidate go together: give both or neither")
    folders = [require_run_dir(path) for path in args.results]
    check_output_folder(args.out, "--out")
    options = ReportOptions(
        documents=load_documents(args.scenarios),
        baseline=args.baseline,
        candidate=args.candidate,
    )
    summary = publish(folders, args.out, options, args.previous)
    first, *rest = (visible(redact_text(line)) for line in summary.lines())
    print(first)
    for line in rest:
        print(line, file=sys.stderr)
    print(f"open {(summary.out / 'index.html').resolve().as_uri()}")
    return EXIT_OK

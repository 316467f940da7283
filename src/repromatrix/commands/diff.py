"""``repromatrix diff RESULTS --baseline TAG --candidate TAG``: is the upgrade safe for us?"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from repromatrix.commands.report import require_run_dir
from repromatrix.errors import EXIT_FAILURE, EXIT_OK
from repromatrix.judgement import Safety, label
from repromatrix.secret_env import redact_text
from repromatrix.visible import visible


def add_parser(subparsers: Any) -> None:
    """Register the ``diff`` command."""
    parser = subparsers.add_parser(
        "diff",
        help="what an upgrade from one image tag to another fixes and breaks",
        description=(
            "Compare the cells of two image tags in one run: each cell's outcome on both, and "
            f"its safety before and after ({label(Safety.SAFE)}, {label(Safety.NOT_SAFE)}, "
            f"{label(Safety.UNKNOWN)}). Exits 1 when the candidate is worse than the baseline: "
            f"{label(Safety.SAFE)} there, {label(Safety.NOT_SAFE)} here."
        ),
    )
    parser.add_argument("results", type=Path, metavar="RESULTS", help="a run folder, results/<run>")
    parser.add_argument("--baseline", required=True, metavar="TAG", help="the image tag in use")
    parser.add_argument("--candidate", required=True, metavar="TAG", help="the tag to move to")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the answer; the exit status says whether the candidate is worse."""
    from repromatrix.reports import diff  # noqa: PLC0415  (keeps `--help` fast)
    from repromatrix.results.store import read_run  # noqa: PLC0415

    loaded = read_run(require_run_dir(args.results))
    for problem in loaded.problems:
        print(visible(redact_text(f"problem: {problem}")), file=sys.stderr)
    upgrade = diff.diff(loaded.results, args.baseline, args.candidate)
    if args.json:
        print(json.dumps(diff.to_json(upgrade), indent=2))
    else:
        print(visible(redact_text(diff.format_diff(upgrade)), multiline=True), end="")
    if not upgrade.evidence:
        print(
            f"repromatrix: error: no cell has a decided outcome on both {args.baseline} and "
            f"{args.candidate}: the gate has no evidence either way",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return EXIT_FAILURE if upgrade.worse else EXIT_OK

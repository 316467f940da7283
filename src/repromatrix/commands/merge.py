"""``repromatrix merge DIR... --out DIR``: combine result shards from many runners into one run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from repromatrix.errors import EXIT_OK


def add_parser(subparsers: Any) -> None:
    """Register the ``merge`` command."""
    parser = subparsers.add_parser(
        "merge",
        help="combine result shards from many runners into one run folder",
        description=(
            "Copy the cells of every shard into --out, keep one copy of each cell, record "
            "shards that disagree, and write the merged run's reports."
        ),
    )
    parser.add_argument("shards", type=Path, nargs="+", metavar="DIR", help="a shard's run folder")
    parser.add_argument("--out", type=Path, required=True, help="a new or empty folder")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Merge, then write the merged run's reports."""
    from repromatrix.reports.write import write_reports  # noqa: PLC0415
    from repromatrix.results.merge import merge  # noqa: PLC0415  (keeps `--help` fast)

    result = merge(args.shards, args.out)
    print(result.lines()[0])
    summary = write_reports(args.out)
    for line in summary.lines():
        stream = sys.stderr if line.startswith("problem:") else sys.stdout
        print(line, file=stream)
    return EXIT_OK

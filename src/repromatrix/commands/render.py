"""``repromatrix render``: write the build context of every image of the plan to dockerfiles/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from repromatrix.commands.arguments import (
    add_selection_arguments,
    check_output_folder,
    load_selected,
)
from repromatrix.errors import EXIT_OK
from repromatrix.images.render import render_all
from repromatrix.matrix.expand import plan
from repromatrix.matrix.selector import Selector
from repromatrix.values import Lane


def add_parser(subparsers: Any) -> None:
    """Register ``render`` and its options."""
    parser = subparsers.add_parser(
        "render",
        help="write dockerfiles/<image-key>/ for every image of the plan",
        description=(
            "Render each distinct image of the selected cells into OUT/<image-key>/ "
            "(Dockerfile, harness, probes) and print each image's content-hash tag. "
            "Same input, same bytes: the tag changes only when the render does."
        ),
    )
    add_selection_arguments(parser)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("dockerfiles"),
        metavar="DIR",
        help="where the build contexts are written (default: dockerfiles)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Render the plan's images and print one line per image: key, tag, folder."""
    check_output_folder(args.out, "--out")
    matrix, scenarios, _lock = load_selected(args, lambda line: print(line, file=sys.stderr))
    lane = Lane(args.lane) if args.lane else None
    cells = plan(matrix, scenarios, lane, Selector(args.only, args.skip))
    for name, config in sorted(matrix.lanes.items()):
        chosen = [cell for cell in cells if cell.lane is name]
        if not chosen:
            continue
        # GPU runtimes have no base image; rendering never reads it for GPU images.
        for image in render_all(chosen, config.runtime, args.out):
            print(f"{image.key}\t{image.tag}\t{image.context}")
    return EXIT_OK

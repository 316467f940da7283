"""``repromatrix schema [matrix|scenario] [--out DIR]``: the JSON Schemas editors read."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from repromatrix.commands.arguments import check_output_folder
from repromatrix.files import replace_file
from repromatrix.matrix.schema import SCHEMA_FILES, schema_text


def add_parser(subparsers: Any) -> None:
    """Register the ``schema`` command."""
    parser = subparsers.add_parser(
        "schema",
        help="print or write the JSON Schemas of matrix.yaml and the scenario files",
        description=(
            "Generate the JSON Schemas of matrix.yaml and the scenario files from the "
            "validator's own key tables. With --out, write both (schemas/ holds the published "
            "copies that the shipped files name in their yaml-language-server comment)."
        ),
    )
    parser.add_argument("kind", nargs="?", choices=tuple(SCHEMA_FILES), help="print one schema")
    parser.add_argument("--out", type=Path, metavar="DIR", help="write every schema into DIR")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print one schema, or write them all."""
    if args.out is None:
        sys.stdout.write(schema_text(args.kind or "matrix"))
        return 0
    check_output_folder(args.out, "--out")
    kinds = [args.kind] if args.kind else list(SCHEMA_FILES)
    for kind in kinds:
        path = args.out / SCHEMA_FILES[kind]
        replace_file(path, schema_text(kind).encode("utf-8"))
        print(path)
    return 0

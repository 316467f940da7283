"""``repromatrix plan``: print the cells of the matrix and what each is expected to show."""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repromatrix.commands.arguments import add_selection_arguments, load_selected
from repromatrix.errors import UsageError
from repromatrix.fleet import jobs, listing
from repromatrix.fleet.buildkite import PipelineInputs, format_buildkite
from repromatrix.grammars import check_pipeline_text
from repromatrix.matrix.config_facts import cells_models, facts_problems, source_text
from repromatrix.matrix.expand import expand, path_notices, plan
from repromatrix.matrix.memory import memory_warning
from repromatrix.matrix.selector import Selector
from repromatrix.run.folder import resolve_folder
from repromatrix.run.main import RunOptions
from repromatrix.slurm.arrays import TaskArray, split
from repromatrix.slurm.main import planned_scripts, print_scripts
from repromatrix.values import Cell, Lane


def add_parser(subparsers: Any) -> None:
    """Register ``plan`` and its options."""
    parser = subparsers.add_parser(
        "plan",
        help="print the cells of the matrix and their expected outcomes",
        description=(
            "Expand matrix.yaml and the scenario files into cells and print them with the "
            "outcome each scenario's documentation predicts (hit, avoided, unknown) and a lower "
            "bound of the GPU memory each engine cell needs; cells it cannot fit are marked "
            "infeasible and left out of the CI forms."
        ),
    )
    add_selection_arguments(parser)
    form = parser.add_mutually_exclusive_group()
    form.add_argument(
        "--format",
        choices=("table", "json", "github", "buildkite", "slurm"),
        default="table",
        help="table (default), json (a list of cells), github (an Actions job matrix), "
        "buildkite (a dynamic pipeline), slurm (the batch scripts `run --executor slurm` "
        "would submit, a job array per GPU kind, for review or to submit by hand)",
    )
    form.add_argument(
        "--json", dest="format", action="store_const", const="json", help="same as --format json"
    )
    add_job_arguments(parser)
    parser.set_defaults(handler=run)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the CI forms: job size, measured durations, the gate and the install."""
    ci = parser.add_argument_group("CI jobs (--format github, buildkite or slurm)")
    ci.add_argument(
        "--job-minutes",
        type=int,
        default=jobs.DEFAULT_JOB_MINUTES,
        metavar="N",
        help="the runner's time limit per job; jobs are sized to fit it with a margin "
        f"(default {jobs.DEFAULT_JOB_MINUTES}, the workflow's timeout-minutes)",
    )
    ci.add_argument(
        "--durations",
        type=Path,
        action="append",
        default=[],
        metavar="RESULTS_DIR",
        help="earlier results whose measured durations replace the cells' deadlines",
    )
    ci.add_argument("--baseline", metavar="TAG", help="buildkite: the gate's image in use")
    ci.add_argument("--candidate", metavar="TAG", help="buildkite: the gate's image to move to")
    ci.add_argument(
        "--package",
        default=".",
        metavar="REQUIREMENT",
        help="buildkite: what each step pip-installs as repromatrix (default: the checkout)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the plan in the chosen format; bad input raises (the CLI prints it, exit 2).
    Which tags the follow rules gave, and why others were left out, goes first: with the
    table on standard output, else on standard error (the other forms are for machines)."""
    said: list[str] = []
    matrix, scenarios, locked = load_selected(args, said.append)
    for line in said if args.format != "table" else ():
        print(f"repromatrix: {line}", file=sys.stderr)
    lane = Lane(args.lane) if args.lane else None
    selector = Selector(args.only, args.skip)
    cells = plan(matrix, scenarios, lane, selector)
    if warning := memory_warning(cells, str(args.matrix)):
        print(f"repromatrix: warning: {warning}", file=sys.stderr)
    models = cells_models(cells)
    for problem in facts_problems(models, str(args.matrix)):
        print(f"repromatrix: warning: {problem}", file=sys.stderr)
    for model in models:
        if model.facts_source is not None and model.facts_source.found:
            print(f"repromatrix: {source_text(model)}", file=sys.stderr)
    for notice in path_notices(cells):
        print(f"repromatrix: warning: {notice}", file=sys.stderr)
    if args.format == "json":
        text = listing.format_json(cells)
    elif args.format in ("github", "buildkite", "slurm"):
        everything = (
            {cell.id for cell in cells}
            if selector.selects_all
            else {cell.id for cell in expand(matrix, scenarios, lane)}
        )
        lock = str(locked.path) if locked.lock is not None and locked.path else None
        text = _ci_form(args, cells, everything, lock)
    else:
        text = "".join(f"{line}\n" for line in said) + ("\n" if said else "")
        text += listing.format_table(cells)
    sys.stdout.write(text)
    return 0


def _check_pipeline_values(args: argparse.Namespace) -> None:
    """Every value the pipeline carries to its steps must reach them exactly (exit 2 if not)."""
    values = [("--matrix", str(args.matrix)), ("--package", args.package)]
    values += [("--scenarios", str(folder)) for folder in args.scenarios or ()]
    values += [
        (o, v) for o, v in (("--baseline", args.baseline), ("--candidate", args.candidate)) if v
    ]
    for option, value in values:
        if (why := check_pipeline_text(value)) is not None:
            raise UsageError(f"{option} {value!r} is refused for --format buildkite: {why}")


def slurm_scripts(args: argparse.Namespace, arrays: Sequence[TaskArray]) -> str:
    """The batch scripts of a new run of ``arrays`` under ``results/``, one after another."""
    scenarios = tuple(args.scenarios) if args.scenarios else None
    options = RunOptions(matrix=args.matrix, scenarios=scenarios)
    folder = resolve_folder(options.results, None, resume=False)
    out = io.StringIO()
    print_scripts(planned_scripts(folder, arrays, options), out)
    return out.getvalue()


def _ci_form(
    args: argparse.Namespace, cells: Sequence[Cell], everything: set[str], lock: str | None
) -> str:
    if args.job_minutes < 1:
        raise UsageError("--job-minutes must be at least 1")
    if bool(args.baseline) != bool(args.candidate):
        raise UsageError("give both --baseline and --candidate for the upgrade gate, or neither")
    budget = jobs.JobBudget(job_minutes=args.job_minutes)
    estimate = jobs.estimator(jobs.load_durations(args.durations))
    if args.format == "slurm":
        return slurm_scripts(args, split(cells, everything, budget, estimate))
    planned = jobs.plan_jobs(cells, everything, budget, estimate)
    if args.format == "github":
        matrix = {"include": [job.to_json() for job in planned]}
        return json.dumps(matrix, separators=(",", ":")) + "\n"
    _check_pipeline_values(args)
    inputs = PipelineInputs(
        matrix=str(args.matrix),
        scenarios=tuple(str(folder) for folder in args.scenarios or ()),
        package=args.package,
        job_minutes=args.job_minutes,
        baseline=args.baseline,
        candidate=args.candidate,
        lock=lock,
    )
    return format_buildkite(planned, inputs)

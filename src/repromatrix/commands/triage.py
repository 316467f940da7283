"""``repromatrix triage FILE|- [--json] [--scenarios DIR]``: name the root cause in a vLLM log."""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path
from typing import Any

from repromatrix.errors import EXIT_OK, UsageError
from repromatrix.secret_env import redact_text
from repromatrix.triage import Diagnosis, triage_path, triage_stream
from repromatrix.triage.diagnosis import format_diagnosis
from repromatrix.values import Scenario
from repromatrix.visible import escape_json


def add_parser(subparsers: Any) -> None:
    """Register the ``triage`` subcommand."""
    parser = subparsers.add_parser(
        "triage",
        help="name the root cause in a vLLM log",
        description=(
            "Read a whole vLLM log (every process's output) and name the line that states "
            "the root cause, what it means and how to fix it. Plain, gzip-compressed or "
            "UTF-16 logs are read; `-` reads standard input."
        ),
    )
    parser.add_argument("log", metavar="FILE|-", help="the log file, or - for standard input")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument(
        "--scenarios",
        metavar="DIR",
        type=Path,
        default=None,
        help="documented scenarios to match (default: the scenarios shipped with repromatrix)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Diagnose the log and print the answer."""
    scenarios = _scenarios(args.scenarios)
    diagnosis = _diagnose(args.log, scenarios)
    if args.json:
        text = escape_json(json.dumps(diagnosis.to_json(), indent=2, ensure_ascii=False)) + "\n"
    else:
        text = format_diagnosis(diagnosis)
    sys.stdout.write(redact_text(text))
    return EXIT_OK


def _scenarios(directory: Path | None) -> tuple[Scenario, ...]:
    from repromatrix.matrix.inputs import shipped_scenarios  # noqa: PLC0415
    from repromatrix.matrix.scenarios import load_scenarios  # noqa: PLC0415

    return load_scenarios(directory or shipped_scenarios())


def _diagnose(source: str, scenarios: tuple[Scenario, ...]) -> Diagnosis:
    try:
        if source == "-":
            return triage_stream(sys.stdin.buffer, scenarios)
        return triage_path(Path(source), scenarios)
    except OSError as exc:
        raise UsageError(f"cannot read {source}: {exc.strerror or exc}") from exc
    except (EOFError, zlib.error) as exc:
        raise UsageError(f"cannot read {source}: damaged gzip data ({exc})") from exc

"""The ``repromatrix`` command line: one parser, one place that maps errors to exit codes."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from repromatrix import __version__
from repromatrix.commands import COMMANDS
from repromatrix.errors import EXIT_INTERRUPTED, RepromatrixError


def _command_modules() -> list[ModuleType]:
    modules = []
    for name in COMMANDS:
        try:
            modules.append(importlib.import_module(f"repromatrix.commands.{name}"))
        except ModuleNotFoundError as exc:
            # A command still being built must not take the others down.
            if exc.name != f"repromatrix.commands.{name}":
                raise
    return modules


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with one subparser per command module."""
    parser = argparse.ArgumentParser(
        prog="repromatrix",
        description="Which documented vLLM start-up crashes does each image hit or avoid?",
    )
    parser.add_argument("--version", action="version", version=f"repromatrix {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _command_modules():
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (errors never escape as tracebacks)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)
    except RepromatrixError as exc:
        print(f"repromatrix: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("repromatrix: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `repromatrix plan | head` closes the pipe early; that is not an error.
        return 0
    return status

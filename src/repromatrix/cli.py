"""The ``repromatrix`` command line: one parser, one place that maps errors to exit codes."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from repromatrix import __version__
from repromatrix.commands import COMMANDS
from repromatrix.errors import EXIT_INFRA, EXIT_INTERRUPTED, EXIT_OK, RepromatrixError
from repromatrix.secret_env import redact_text
from repromatrix.visible import visible


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
        sys.stdout.flush()  # a full disk shows here, not as a traceback at exit
    except RepromatrixError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        print("repromatrix: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `repromatrix plan | head` closes the pipe early; that is not an error.
        _drop_stdout()
        return EXIT_OK
    except RecursionError:
        return _fail("the input nests too deeply to be read", EXIT_INFRA)
    except OSError as exc:
        # The host refused: a full disk, a read-only folder, an output that cannot be written.
        _drop_stdout()
        return _fail(os_error_line(exc), EXIT_INFRA)
    return status


def os_error_line(exc: OSError) -> str:
    """One line for an ``OSError``: what failed, on which file."""
    what = exc.strerror or str(exc) or type(exc).__name__
    return f"{exc.filename}: {what}" if exc.filename else f"cannot write the output: {what}"


def _fail(message: str, code: int) -> int:
    # An error may quote what an outside program or server answered: redacted like all output.
    print(f"repromatrix: error: {visible(redact_text(message), multiline=True)}", file=sys.stderr)
    return code


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so the exit does not retry a write that failed."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file behind stdout (a test's StringIO)
        pass

"""Every error repromatrix reports to a user, and the exit code each maps to.

Stages raise these; ``cli.main`` is the one place that turns them into a
message and an exit status, so no traceback ever reaches a user for bad input.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILURE = 1  # the run finished and something failed (a regression, a worse candidate)
EXIT_USAGE = 2  # bad input: matrix, scenario, selection, arguments
EXIT_INFRA = 3  # the machine could not do what was asked (no Docker engine, build failed)
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Problem:
    """One thing wrong in an input file, with where it is."""

    file: str
    line: int  # 1-based; 0 when unknown
    column: int  # 1-based; 0 when unknown
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line:
            where += f":{self.line}"
            if self.column:
                where += f":{self.column}"
        return f"{where}: {self.message}"


class RepromatrixError(Exception):
    """Base class: an error with a message fit for a user and an exit code."""

    exit_code = EXIT_FAILURE


class ConfigError(RepromatrixError):
    """One or more problems in matrix.yaml or the scenario files, reported all at once."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class UsageError(RepromatrixError):
    """A bad command line or a selection that matches nothing."""

    exit_code = EXIT_USAGE


class InfraError(RepromatrixError):
    """The host cannot do what was asked: no container engine, a failed build."""

    exit_code = EXIT_INFRA


def suggest(word: str, choices: Iterable[str]) -> str:
    """Return ``" Perhaps you meant `x`?"`` for the nearest choice, or ``""`` when none is near."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" Perhaps you meant `{close[0]}`?" if close else ""

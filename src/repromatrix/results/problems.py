"""Problems with a run's files: what kind, where, and a sentence for a person.

Every reader of a run folder (``--resume``, ``report``, ``merge``, ``diff``)
names what it could not use with these values, so each problem is said once,
in the same words, in the command's output and in every report.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


class ProblemKind(enum.StrEnum):
    """Kinds of trouble with a run's files, each named once in the reports."""

    CORRUPT = "corrupt"  # unreadable, truncated or malformed file
    SCHEMA = "schema"  # written by another schema version
    INCOMPLETE = "incomplete"  # a cell started but never finished, or never ran
    CONFLICT = "conflict"  # shards disagree about one cell
    SHARD = "shard"  # a shard that could not be merged
    REPLACED = "replaced"  # merge kept a later attempt of a cell (a notice, not a failure)


# Kinds that inform without saying anything is wrong with the run.
NOTICES = frozenset({ProblemKind.REPLACED})


@dataclass(frozen=True)
class RunProblem:
    """One problem with a run's files: what kind, where, and a sentence for a person."""

    kind: ProblemKind
    where: str  # a path relative to the run folder, or a cell id
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"

    def to_json(self) -> dict[str, str]:
        """Return the JSON-ready form."""
        return {"kind": self.kind.value, "where": self.where, "message": self.message}

    @classmethod
    def from_json(cls, data: object) -> RunProblem:
        """Build a problem from ``to_json`` output; raises ``ValueError`` when malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a problem must be an object, not {type(data).__name__}")
        values = [data.get(key) for key in ("kind", "where", "message")]
        if not all(isinstance(value, str) for value in values):
            raise ValueError("a problem without text `kind`, `where` and `message`")
        kind, where, message = (str(value) for value in values)
        try:
            return cls(ProblemKind(kind), where, message)
        except ValueError as exc:
            raise ValueError(f"unknown problem kind {kind!r}") from exc


def unique_problems(problems: Iterable[RunProblem]) -> tuple[RunProblem, ...]:
    """Drop repeats (the same problem seen by merge and again by report), keeping order."""
    return tuple(dict.fromkeys(problems))

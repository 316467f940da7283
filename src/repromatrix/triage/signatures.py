"""Scenario signatures: the patterns of the scenario files, searched in a log.

A signature is a regular expression searched in each line, optionally tied to
the process that prints it (``EngineCore``, ``Worker``, ``APIServer``), compared
by family (``vllm_processes.same_process``). A line without a process prefix (a
V0 log, a pasted excerpt) may have come from any process and so satisfies every
process constraint.

INFO and DEBUG lines are searched verbatim only: the fast path checks a whole
block of them with one search per signature, which must find everything the
per-line search finds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from repromatrix.errors import ConfigError, Problem
from repromatrix.model import Scenario
from repromatrix.triage.logmodel import Line
from repromatrix.vllm_processes import same_process


@dataclass(frozen=True)
class _Signature:
    scenario: Scenario
    regex: re.Pattern[str]
    block: re.Pattern[str]  # the same pattern, multi-line, for whole blocks of quiet lines
    process: str | None


class ScenarioSignatures:
    """The compiled signatures of a set of scenarios."""

    def __init__(self, scenarios: Sequence[Scenario]) -> None:
        problems: list[Problem] = []
        compiled: list[_Signature] = []
        for scenario in scenarios:
            for signature in scenario.signatures:
                try:
                    regex = re.compile(signature.pattern)
                    block = re.compile(signature.pattern, re.MULTILINE)
                except re.error as exc:
                    where = scenario.file or scenario.id
                    problems.append(Problem(where, 0, 0, f"bad signature pattern: {exc}"))
                    continue
                compiled.append(_Signature(scenario, regex, block, signature.process))
        if problems:
            raise ConfigError(problems)
        self._signatures = tuple(compiled)

    def __bool__(self) -> bool:
        return bool(self._signatures)

    def block_may_hit(self, block: str) -> bool:
        """Whether any signature occurs anywhere in ``block`` (a superset of the line hits)."""
        return any(s.block.search(block) for s in self._signatures)

    def line_hits(self, line: Line, *, quiet: bool) -> tuple[str, ...]:
        """Ids of the scenarios whose signature this line matches (quiet lines: verbatim only)."""
        texts = (line.raw,) if quiet else (line.raw, line.text)
        return self._hits(texts, line.process)

    def scenario_of(self, texts: Iterable[str], process: str | None) -> Scenario | None:
        """The first scenario with a signature found in ``texts`` printed by ``process``."""
        texts = tuple(texts)
        for signature in self._signatures:
            if same_process(signature.process, process) and any(
                signature.regex.search(t) for t in texts
            ):
                return signature.scenario
        return None

    def _hits(self, texts: tuple[str, ...], process: str | None) -> tuple[str, ...]:
        found: dict[str, None] = {}
        for signature in self._signatures:
            if same_process(signature.process, process) and any(
                signature.regex.search(t) for t in texts
            ):
                found[signature.scenario.id] = None
        return tuple(found)

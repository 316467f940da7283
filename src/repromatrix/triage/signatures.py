"""Scenario signatures: the patterns of the scenario files, searched in a log.

A signature is a regular expression searched in each line, optionally tied to
the process that prints it. A scenario's ``reached`` lines are written and
searched the same way (``ScenarioSignatures(scenarios, reached_lines)``); only
what a hit means differs: the crash, or its code path entered. A pattern is tied
to the process that prints it (``EngineCore``, ``Worker``, ``APIServer``), compared
by family (``vllm_processes.same_process``). A line without a process prefix (a
V0 log, a pasted excerpt) may have come from any process and so satisfies every
process constraint. A signature with ``beside`` (a second pattern, such as a frame
of the kernel that failed) matches only together with it: a log shows it once both
were seen, in either order (``line_hits`` names the scenario at the line that
completes the pair, so one ``ScenarioSignatures`` reads one log), and a root cause
matches it when its texts, its traceback's frames among them, hold the pattern and
either hold ``beside`` too or the log showed the pair (``scenario_of``: a pasted,
flattened traceback loses its frames' link to the error). A lone line never does.

INFO and DEBUG lines are searched verbatim only: the fast path checks a whole
block of them with one search per signature, which must find everything the
per-line search finds.

``signature_levels`` says whether a scenario's signature was seen in a WARNING, INFO or
DEBUG line and whether in any other: the runner's outcome does not count a signature seen
only at those levels as the crash of a cell that served (``run.cell.decide``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from repromatrix.errors import ConfigError, Problem
from repromatrix.patterns import Pattern, PatternError, compile_pattern
from repromatrix.triage.logmodel import Line, parse_line
from repromatrix.values import Scenario, Signature
from repromatrix.vllm_processes import same_process


@dataclass(frozen=True)
class _Signature:
    scenario: Scenario
    regex: Pattern
    block: Pattern  # the same pattern, multi-line, for whole blocks of quiet lines
    process: str | None
    beside: Pattern | None = None  # also needed in the same failure's texts


def signatures_of(scenario: Scenario) -> tuple[Signature, ...]:
    """A scenario's signatures: the lines that show its crash."""
    return scenario.signatures


def reached_lines(scenario: Scenario) -> tuple[Signature, ...]:
    """A scenario's ``reached`` lines: those that show its code path was entered."""
    return tuple(entry for entry in scenario.reached if isinstance(entry, Signature))


class ScenarioSignatures:
    """The compiled signatures (or other line patterns, ``patterns``) of a set of scenarios."""

    def __init__(
        self,
        scenarios: Sequence[Scenario],
        patterns: Callable[[Scenario], Sequence[Signature]] = signatures_of,
    ) -> None:
        problems: list[Problem] = []
        compiled: list[_Signature] = []
        for scenario in scenarios:
            for signature in patterns(scenario):
                try:
                    regex = compile_pattern(signature.pattern)
                    block = compile_pattern(signature.pattern, multiline=True)
                    beside = compile_pattern(signature.beside) if signature.beside else None
                except PatternError as exc:
                    where = scenario.file or scenario.id
                    message = f"bad pattern `{signature.pattern}`: {exc}"
                    problems.append(Problem(where, 0, 0, message))
                    continue
                compiled.append(_Signature(scenario, regex, block, signature.process, beside))
        if problems:
            raise ConfigError(problems)
        self._signatures = tuple(compiled)
        # Of the signatures with ``beside``: which of their two patterns this log showed.
        self._halves: dict[int, set[str]] = {}

    def __bool__(self) -> bool:
        return bool(self._signatures)

    def block_may_hit(self, block: str) -> bool:
        """Whether any signature (or its ``beside``) occurs anywhere in ``block`` (a superset
        of the line hits)."""
        return any(
            s.block.search(block) or (s.beside is not None and s.beside.search(block))
            for s in self._signatures
        )

    def line_hits(self, line: Line, *, quiet: bool) -> tuple[str, ...]:
        """Ids of the scenarios whose signature this line matches (quiet lines: verbatim only)."""
        texts = (line.raw,) if quiet else (line.raw, line.text)
        return self._hits(texts, line.process)

    def text_hits(self, text: str) -> tuple[str, ...]:
        """Ids of the scenarios whose signature (of any or no process) this text matches: what
        a kill the runner hands over shows (``OomKill``)."""
        return self._hits((text,), None)

    def scenario_of(self, texts: Iterable[str], process: str | None) -> Scenario | None:
        """The first scenario with a signature found in ``texts`` printed by ``process``."""
        texts = tuple(texts)
        for number, signature in enumerate(self._signatures):
            if (
                same_process(signature.process, process)
                and any(signature.regex.search(t) for t in texts)
                and self._beside_holds(number, signature, texts)
            ):
                return signature.scenario
        return None

    def _beside_holds(self, number: int, signature: _Signature, texts: tuple[str, ...]) -> bool:
        """No ``beside``, or it is among ``texts``, or this log showed the pair."""
        if signature.beside is None or any(signature.beside.search(t) for t in texts):
            return True
        return "done" in self._halves.get(number, set())

    def _hits(self, texts: tuple[str, ...], process: str | None) -> tuple[str, ...]:
        found: dict[str, None] = {}
        for number, signature in enumerate(self._signatures):
            if not same_process(signature.process, process):
                continue
            if signature.beside is not None:
                if self._completes(number, signature, texts):
                    found[signature.scenario.id] = None
                continue
            if any(signature.regex.search(t) for t in texts):
                found[signature.scenario.id] = None
        return tuple(found)

    def _completes(self, number: int, signature: _Signature, texts: tuple[str, ...]) -> bool:
        """Note which halves of a ``beside`` signature these texts show; True at the line
        that completes the pair (once)."""
        assert signature.beside is not None
        halves = self._halves.setdefault(number, set())
        if "done" in halves:
            return False
        if any(signature.regex.search(t) for t in texts):
            halves.add("pattern")
        if any(signature.beside.search(t) for t in texts):
            halves.add("beside")
        if halves >= {"pattern", "beside"}:
            halves.add("done")
            return True
        return False


# The levels at which a line states no failure of its own: what vLLM only warns about.
NOT_FAILURE_LEVELS = frozenset({"WARNING", "WARN", "INFO", "DEBUG"})


def signature_levels(text: str, scenario: Scenario) -> tuple[bool, bool]:
    """Whether ``scenario``'s signature matches a line of ``text`` at WARNING, INFO or DEBUG
    level, and whether it matches any other line (an ERROR line, a traceback, a line whose
    level cannot be read)."""
    compiled = ScenarioSignatures((scenario,))
    if not compiled or not compiled.block_may_hit(text):
        return False, False
    quiet = loud = False
    for number, raw in enumerate(text.splitlines(), 1):
        if not compiled.block_may_hit(raw):
            continue
        line = parse_line(number, raw)
        if not compiled.line_hits(line, quiet=False):
            continue
        if line.level in NOT_FAILURE_LEVELS:
            quiet = True
        else:
            loud = True
    return quiet, loud

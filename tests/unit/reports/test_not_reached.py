"""A cell that did not test its crash is never a fix: the upgrade view, the move, the diff gate,
range suggestions and the reports, each on results decided from real vLLM logs.

The zoo's ``cpu-compiler-missing`` crashes on 0.31.0 (InvalidCxxCompiler) and, on 0.32.0,
serves in compilation mode NONE: vLLM never asked for the missing compiler. Read as
``avoided`` (as before ``reached``), that would be a fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from junitparser.xunit2 import JUnitXml

from repromatrix.cli import main
from repromatrix.judgement import Expected, Outcome, Safety, SafetyMove, Verdict
from repromatrix.reports.diff import diff, format_diff, to_json
from repromatrix.reports.junit import read_facts
from repromatrix.reports.move import build_move
from repromatrix.reports.ranges import documented_ranges, range_evidence
from repromatrix.reports.upgrade import build_upgrade
from repromatrix.results.schema import CellResult
from repromatrix.results.store import write_result
from repromatrix.results.verdicts import judge_all
from support import paths
from support.reach import COMPILED, CRASHED, NOT_COMPILED, compiler_scenario, decided
from support.upgrade import move_counts, schema

FIXED = SafetyMove(Safety.NOT_SAFE, Safety.SAFE)


def crashed_then_untested() -> list[CellResult]:
    """0.31.0 hits the crash; 0.32.0's trigger serves without compiling, its workaround compiles."""
    return [
        decided("0.31.0", CRASHED),
        decided("0.32.0", NOT_COMPILED),
        decided("0.32.0", COMPILED, "with-compiler", Expected.AVOIDED),
    ]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "reach-run"
    for result in crashed_then_untested():
        write_result(folder, result, b"log\n")
    return folder


def test_the_untested_cell_is_not_reached_and_its_verdict_unknown() -> None:
    judged = judge_all(crashed_then_untested())
    assert [(j.result.outcome, j.verdict) for j in judged] == [
        (Outcome.HIT, Verdict.PASS),
        (Outcome.NOT_REACHED, Verdict.UNKNOWN),
        (Outcome.AVOIDED, Verdict.PASS),
    ]
    assert judged[1].explanation.startswith("the cell did not test the crash (expected hit)")


def test_an_image_whose_trigger_was_not_reached_is_never_safe() -> None:
    results = crashed_then_untested()
    view = build_upgrade(judge_all(results))
    [lane] = view.lanes
    [configuration] = lane.configurations
    cell = lane.at("0.32.0", configuration)
    assert cell is not None
    assert cell.safety is Safety.UNKNOWN  # the workaround avoided it: "safe" before reached
    assert cell.not_reached == (results[1].id,)
    assert cell.words == "unknown; 1 crash check(s) not reached, so not tested"


def test_the_move_to_an_untested_image_is_no_fix() -> None:
    judged = judge_all(crashed_then_untested())
    move = build_move(judged, build_upgrade(judged), "0.31.0", "0.32.0")
    assert move.count(FIXED) == 0
    [item] = move.of(SafetyMove(Safety.NOT_SAFE, Safety.UNKNOWN))
    assert item.detail.startswith("hit → not_reached")


def test_the_gate_counts_the_untested_pair_as_undecided_never_fixed() -> None:
    upgrade = diff(crashed_then_untested(), "0.31.0", "0.32.0")
    [trigger] = [p for p in upgrade.pairs if p.key.variant == "trigger"]
    assert trigger.move == SafetyMove(Safety.NOT_SAFE, Safety.UNKNOWN)
    assert upgrade.of(FIXED) == ()
    assert upgrade.undecided == {Outcome.NOT_REACHED: 1, None: 1}
    assert not upgrade.evidence  # nothing was decided on both tags
    assert format_diff(upgrade).startswith(
        "upgrade 0.31.0 -> 0.32.0: the candidate is not worse; "
        "2 pair(s) undecided (1 not reached, 1 no cell)\n"
    )
    assert to_json(upgrade)["undecided"] == {"not_reached": 1, "no cell": 1}


def test_repromatrix_diff_fails_for_want_of_evidence(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diff", str(run_dir), "--baseline", "0.31.0", "--candidate", "0.32.0"]) == 1
    captured = capsys.readouterr()
    assert "not safe → safe (0)" in captured.out
    assert "the gate has no evidence either way" in captured.err


def test_a_version_that_did_not_test_the_crash_suggests_no_range() -> None:
    documents = documented_ranges([compiler_scenario()])  # affected: all
    [evidence] = range_evidence(judge_all(crashed_then_untested()), documents)
    assert (evidence.hit, evidence.avoided, evidence.missed) == (("0.31.0",), (), ())
    assert evidence.suggested_affected is None
    assert evidence.not_reached == ("0.32.0",)
    assert evidence.words == (
        "observations agree with the documented range `>=0`; "
        "not reached on 0.32.0 (no evidence either way)"
    )


def test_report_suggest_ranges_prints_no_patch_for_it(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo = str(paths.ROOT / "scenarios" / "zoo")
    assert main(["report", str(run_dir), "--scenarios", zoo, "--suggest-ranges"]) == 0
    assert "+++" not in capsys.readouterr().out


def test_the_reports_show_it_as_not_reached(run_dir: Path) -> None:
    assert main(["report", str(run_dir), "--baseline", "0.31.0", "--candidate", "0.32.0"]) == 0
    document = json.loads((run_dir / "compat.json").read_text())
    jsonschema.validate(document, schema("compat.schema.json"))
    [entry] = [u for u in document["upgrade"] if u["image_tag"] == "0.32.0"]
    assert (entry["safety"], len(entry["not_reached"])) == ("unknown", 1)
    assert document["summary"]["not_reached"] == 1
    [untested] = [c for c in document["cells"] if c["observed"] == "not_reached"]
    assert untested["reached"] is False and untested["facts"]["compilation_mode"] == "NONE"
    assert move_counts(document["move"]["counts"])["not_safe->safe"] == 0
    markdown = (run_dir / "compat.md").read_text()
    assert "⛔" in markdown and "(1 of them not reached)" in markdown
    [case] = [
        c
        for s in JUnitXml.fromfile(str(run_dir / "junit.xml"))
        for c in s
        if "0.32.0" in c.name and c.classname.endswith(".trigger")
    ]
    [skipped] = case.result
    assert type(skipped).__name__ == "Skipped"
    assert skipped.message.startswith("not reached: ready and answered, but the crash's code")
    listed = read_facts(case.system_out)
    assert listed["observed"] == "not_reached" and listed["reached"] == "false"
    assert json.loads(listed["engine_facts"])["compilation_mode"] == "NONE"

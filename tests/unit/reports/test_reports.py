"""write_reports on damaged runs: every readable cell reported, every problem named once."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from junitparser.xunit2 import JUnitXml

from repromatrix.cli import main
from repromatrix.reports.write import write_reports
from repromatrix.results.store import cell_dir, read_run, write_plan
from repromatrix.results.verdicts import ProblemKind
from repromatrix.run.claim import claimed
from repromatrix.run.folder import record_plan
from repromatrix.run.main import Mode, RunOptions, execute_run, plan_run
from repromatrix.run.progress import Progress
from repromatrix.values import Lane
from support import paths
from support.reports import cpu_lane, write_run

HEALTHY_0_32 = "cpu/0.32.0/cpu/tiny-llama/default/healthy-cpu/baseline"
TRIGGER_0_31 = "cpu/0.31.0/cpu/tiny-llama/default/cpu-kv-cache-too-small/trigger"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "results" / "20260101-000000"
    write_run(folder, cpu_lane())
    return folder


def result_file(run_dir: Path, cell_id: str) -> Path:
    return cell_dir(run_dir, cell_id) / "result.json"


def problems_in_every_report(run_dir: Path) -> dict[str, list[str]]:
    """The problems as each report states them."""
    document = json.loads((run_dir / "compat.json").read_text())
    markdown = (run_dir / "compat.md").read_text()
    html = (run_dir / "compat.html").read_text()
    junit = JUnitXml.fromfile(str(run_dir / "junit.xml"))
    problem_cases = [c for s in junit if s.name == "repromatrix" for c in s]
    return {
        "json": [p["where"] for p in document["problems"]],
        "junit": [c.name for c in problem_cases],
        "md": [p["where"] for p in document["problems"] if p["where"] in markdown],
        "html": [p["where"] for p in document["problems"] if p["where"] in html],
    }


def test_a_truncated_result_is_named_and_the_rest_reported(run_dir: Path) -> None:
    path = result_file(run_dir, HEALTHY_0_32)
    path.write_bytes(path.read_bytes()[:120])
    summary = write_reports(run_dir)
    assert summary.cells == 5
    [problem] = summary.problems
    assert problem.kind is ProblemKind.CORRUPT
    assert problem.where == f"cells/{HEALTHY_0_32}/result.json"
    assert "not valid JSON, truncated or corrupt" in problem.message
    where = problem.where
    assert problems_in_every_report(run_dir) == {
        k: [where] for k in ("json", "junit", "md", "html")
    }


def test_an_empty_result_file(run_dir: Path) -> None:
    result_file(run_dir, HEALTHY_0_32).write_bytes(b"")
    [problem] = read_run(run_dir).problems
    assert problem.message == "empty file (the run was cut off while writing)"


def test_a_result_that_is_not_an_object(run_dir: Path) -> None:
    result_file(run_dir, HEALTHY_0_32).write_text("[1, 2]")
    [problem] = read_run(run_dir).problems
    assert problem.message == "a JSON list, not an object"


def test_a_newer_schema_is_refused_with_the_versions(run_dir: Path) -> None:
    path = result_file(run_dir, HEALTHY_0_32)
    data = json.loads(path.read_text())
    data["schema_version"] = 7
    path.write_text(json.dumps(data))
    [problem] = read_run(run_dir).problems
    assert problem.kind is ProblemKind.SCHEMA
    assert "schema_version 7; this one reads up to 3" in problem.message


def test_an_older_schema_missing_fields_is_named_as_such(run_dir: Path) -> None:
    path = result_file(run_dir, HEALTHY_0_32)
    path.write_text(json.dumps({"id": HEALTHY_0_32, "status": "passed"}))
    [problem] = read_run(run_dir).problems
    assert problem.kind is ProblemKind.SCHEMA
    assert problem.message.startswith("written with an older schema (schema_version 0)")


def test_an_older_schema_that_is_complete_is_read(run_dir: Path) -> None:
    path = result_file(run_dir, HEALTHY_0_32)
    data = json.loads(path.read_text())
    del data["schema_version"]
    path.write_text(json.dumps(data))
    loaded = read_run(run_dir)
    assert loaded.problems == ()
    assert len(loaded.results) == 6


def test_a_cell_cut_off_mid_run_is_named_incomplete(run_dir: Path) -> None:
    result_file(run_dir, TRIGGER_0_31).unlink()  # the log was written, the result never was
    summary = write_reports(run_dir)
    assert summary.cells == 5
    [problem] = summary.problems
    assert problem.kind is ProblemKind.INCOMPLETE
    assert problem.where == TRIGGER_0_31
    assert "--resume" in problem.message


def test_a_half_written_result_temp_file_is_named_incomplete(run_dir: Path) -> None:
    path = result_file(run_dir, TRIGGER_0_31)
    path.rename(path.with_name(".result.json.abc123.tmp"))
    [problem] = write_reports(run_dir).problems
    assert problem.kind is ProblemKind.INCOMPLETE


def test_planned_cells_that_never_ran(run_dir: Path) -> None:
    ids = [c.id for c in cpu_lane()]
    missing = [f"cpu/0.32.0/cpu/tiny-llama/default/other-{i}/trigger" for i in range(7)]
    write_plan(run_dir, ids + missing)
    [problem] = write_reports(run_dir).problems
    assert problem.kind is ProblemKind.INCOMPLETE
    assert problem.where == "plan.json"
    assert problem.message.startswith("7 of 13 planned cells never ran")
    assert "and 2 more" in problem.message


def test_a_complete_plan_raises_nothing(run_dir: Path) -> None:
    write_plan(run_dir, [c.id for c in cpu_lane()])
    assert write_reports(run_dir).problems == ()


def test_a_damaged_plan_or_merge_record_is_named(run_dir: Path) -> None:
    (run_dir / "plan.json").write_text("{not json")
    (run_dir / "merge.json").write_text('{"problems": [{"kind": "conflict"}]}')
    problems = write_reports(run_dir).problems
    assert [(p.kind, p.where) for p in problems] == [
        (ProblemKind.CORRUPT, "plan.json"),
        (ProblemKind.CORRUPT, "merge.json"),
    ]


def test_each_problem_is_named_once_even_when_recorded_twice(run_dir: Path) -> None:
    entry = {"kind": "conflict", "where": TRIGGER_0_31, "message": "shards disagree"}
    (run_dir / "merge.json").write_text(json.dumps({"problems": [entry, entry]}))
    summary = write_reports(run_dir)
    assert len(summary.problems) == 1
    assert problems_in_every_report(run_dir)["junit"] == [TRIGGER_0_31]


def test_summary_lines(run_dir: Path) -> None:
    result_file(run_dir, HEALTHY_0_32).write_text("{")
    lines = write_reports(run_dir).lines()
    assert lines[0] == "5 cells: 5 pass"
    assert lines[1].startswith(f"problem: cells/{HEALTHY_0_32}/result.json: not valid JSON")
    assert lines[2:] == [
        f"wrote {run_dir / name}"
        for name in ("junit.xml", "compat.md", "compat.html", "compat.json")
    ]


def test_reports_are_rewritten_not_appended(run_dir: Path) -> None:
    write_reports(run_dir)
    first = (run_dir / "compat.json").read_bytes()
    write_reports(run_dir)
    assert (run_dir / "compat.json").read_bytes() == first


def test_the_report_command(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result_file(run_dir, HEALTHY_0_32).write_text("{")
    assert main(["report", str(run_dir)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == "5 cells: 5 pass"
    assert f"wrote {run_dir / 'compat.html'}" in captured.out
    assert captured.err.startswith(f"problem: cells/{HEALTHY_0_32}/result.json: not valid JSON")


def test_the_report_command_on_the_wrong_folder(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(run_dir.parent)]) == 2
    err = capsys.readouterr().err
    assert "holds runs (20260101-000000), not cell results" in err
    assert f"Perhaps you meant `{run_dir}`?" in err
    assert main(["report", str(run_dir / "cells" / "cpu")]) == 2
    assert "is not a results folder" in capsys.readouterr().err
    assert main(["report", str(run_dir / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_a_run_writes_its_plan_when_it_starts_so_its_reports_name_what_never_ran(
    tmp_path: Path,
) -> None:
    root = paths.ROOT
    options = RunOptions(
        matrix=root / "matrix.yaml",
        scenarios=root / "scenarios",
        lane=Lane.CPU,
        results=tmp_path,
        run_id="cut-off",
    )
    progress = Progress(0, out=io.StringIO())
    run = plan_run(options, progress, None)
    with claimed(run.folder.path):
        record_plan(run.folder.path, run.cells, options.matrix)
    planned = read_run(run.folder.path).planned
    assert planned is not None and planned == {c.id for c in run.todo}
    [problem] = write_reports(run.folder.path).problems  # the run was stopped before any cell
    assert problem.message.startswith(f"{len(planned)} of {len(planned)} planned cells never ran")

    dry = replace(options, run_id="dry", mode=Mode.DRY_RUN, backend="local")
    execute_run(dry, progress)
    assert not (tmp_path / "dry").exists()

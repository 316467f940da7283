"""merge: shards from many runners become one run, equal to running them all in one place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from junitparser.xunit2 import JUnitXml

from _reports_support import mixed_run, result, with_id, write_run
from repromatrix.cli import main
from repromatrix.errors import UsageError
from repromatrix.model import Outcome
from repromatrix.reports.write import read_plan, write_plan, write_reports
from repromatrix.results.merge import Copy, choose, merge
from repromatrix.results.store import cell_dir, read_results
from repromatrix.results.verdicts import ProblemKind


def junit_cases(run_dir: Path) -> set[tuple[str, str, str, tuple[str, ...]]]:
    xml = JUnitXml.fromfile(str(run_dir / "junit.xml"))
    return {
        (suite.name, case.classname, case.name, tuple(type(r).__name__ for r in case.result))
        for suite in xml
        for case in suite
    }


def compat_cells(run_dir: Path) -> list[dict[str, object]]:
    return json.loads((run_dir / "compat.json").read_text())["cells"]


def test_two_shards_merge_into_the_single_run(tmp_path: Path) -> None:
    cells = mixed_run()
    single = tmp_path / "single"
    write_run(single, cells)
    write_plan(single, [c.id for c in cells])
    shard_a, shard_b = tmp_path / "shard-a", tmp_path / "shard-b"
    write_run(shard_a, cells[::2])
    write_plan(shard_a, [c.id for c in cells[::2]])
    write_run(shard_b, cells[1::2])
    write_plan(shard_b, [c.id for c in cells[1::2]])

    merged = merge([shard_a, shard_b], tmp_path / "merged")
    assert (merged.cells, merged.duplicates, merged.conflicts, merged.problems) == (18, 0, (), ())

    single_results, _ = read_results(single)
    merged_results, _ = read_results(tmp_path / "merged")
    assert sorted(merged_results, key=lambda r: r.id) == sorted(single_results, key=lambda r: r.id)
    for cell in cells:
        log = "log.txt"
        assert (cell_dir(tmp_path / "merged", cell.id) / log).read_bytes() == (
            cell_dir(single, cell.id) / log
        ).read_bytes()
    assert read_plan(tmp_path / "merged")[0] == read_plan(single)[0]

    write_reports(single)
    write_reports(tmp_path / "merged")
    assert compat_cells(tmp_path / "merged") == compat_cells(single)
    assert junit_cases(tmp_path / "merged") == junit_cases(single)
    assert (tmp_path / "merged" / "compat.md").read_text().split("\n", 1)[1] == (
        (single / "compat.md").read_text().split("\n", 1)[1]  # all but the title (run name)
    )


def test_identical_duplicates_are_kept_once_without_a_conflict(tmp_path: Path) -> None:
    cells = mixed_run()[:4]
    write_run(tmp_path / "a", cells)
    write_run(tmp_path / "b", cells)
    merged = merge([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert (merged.cells, merged.duplicates, merged.conflicts) == (4, 4, ())
    assert len(read_results(tmp_path / "out")[0]) == 4


def test_conflicting_shards_are_recorded_and_reported(tmp_path: Path) -> None:
    hit = result()
    avoided = with_id(hit, outcome=Outcome.AVOIDED, root_cause=None)
    write_run(tmp_path / "a", [hit])
    write_run(tmp_path / "b", [avoided])
    merged = merge([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    [conflict] = merged.conflicts
    assert conflict.cell_id == hit.id
    assert conflict.kept.result.outcome is Outcome.HIT  # the first shard, when both decided
    [problem] = merged.problems
    assert problem.kind is ProblemKind.CONFLICT
    assert problem.message == (
        f"shards disagree (hit in {tmp_path / 'a'}, avoided in {tmp_path / 'b'}); "
        f"kept hit from {tmp_path / 'a'}"
    )
    summary = write_reports(tmp_path / "out")
    assert summary.problems == (problem,)
    assert hit.id in (tmp_path / "out" / "compat.md").read_text()


def test_a_real_outcome_is_kept_over_an_infrastructure_error_or_a_skip() -> None:
    ran = result()
    copies = [
        Copy(Path("a"), with_id(ran, outcome=Outcome.SKIPPED)),
        Copy(Path("b"), with_id(ran, outcome=Outcome.INFRA_ERROR)),
        Copy(Path("c"), ran),
    ]
    kept, conflict = choose(copies)
    assert kept.shard == Path("c")
    assert conflict is not None
    assert [c.shard for c in conflict.others] == [Path("a"), Path("b")]
    kept, _ = choose(copies[:2])
    assert kept.shard == Path("b")


def test_unreadable_files_of_a_shard_are_carried_into_the_merged_reports(tmp_path: Path) -> None:
    cells = mixed_run()[:3]
    write_run(tmp_path / "a", cells)
    (cell_dir(tmp_path / "a", cells[0].id) / "result.json").write_text('{"id": ')
    merged = merge([tmp_path / "a"], tmp_path / "out")
    assert merged.cells == 2
    [problem] = merged.problems
    assert problem.where == f"{tmp_path / 'a'}/cells/{cells[0].id}/result.json"
    assert write_reports(tmp_path / "out").problems == (problem,)


def test_merged_plans_name_cells_that_no_shard_ran(tmp_path: Path) -> None:
    cells = mixed_run()[:2]
    write_run(tmp_path / "a", cells[:1])
    write_plan(tmp_path / "a", [cells[0].id])
    write_run(tmp_path / "b", [])
    (tmp_path / "b" / "cells").mkdir(parents=True)
    write_plan(tmp_path / "b", [cells[1].id])
    merge([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    [problem] = write_reports(tmp_path / "out").problems
    assert problem.message.startswith("1 of 2 planned cells never ran")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("no-cells", "is not a results folder"),
        ("out-not-empty", "is not empty"),
        ("out-is-shard", "is also one of the shards"),
    ],
)
def test_bad_folders_are_usage_errors(tmp_path: Path, setup: str, message: str) -> None:
    shard, out = tmp_path / "a", tmp_path / "out"
    write_run(shard, mixed_run()[:1])
    if setup == "no-cells":
        shard = tmp_path / "empty"
        shard.mkdir()
    elif setup == "out-not-empty":
        out.mkdir()
        (out / "stale.txt").write_text("x")
    else:
        out = shard
    with pytest.raises(UsageError, match=message):
        merge([shard], out)


def test_the_merge_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cells = mixed_run()
    write_run(tmp_path / "a", cells[:5])
    write_run(tmp_path / "b", cells[5:])
    status = main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")])
    assert status == 0
    out = capsys.readouterr().out
    assert out.startswith(f"merged 2 shards into {tmp_path / 'm'}: 18 cells, 0 duplicates")
    assert (tmp_path / "m" / "junit.xml").is_file()
    assert main(["merge", str(tmp_path / "nowhere"), "--out", str(tmp_path / "n")]) == 2
    assert "is not a results folder" in capsys.readouterr().err

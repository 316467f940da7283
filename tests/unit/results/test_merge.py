"""merge: shards from many runners become one run, equal to running them all in one place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from junitparser.xunit2 import JUnitXml

from repromatrix.cli import main
from repromatrix.errors import UsageError
from repromatrix.judgement import Outcome
from repromatrix.reports.write import write_reports
from repromatrix.results.merge import Copy, choose, gather, merge
from repromatrix.results.store import cell_dir, read_plan, read_results, write_plan
from repromatrix.results.verdicts import ProblemKind
from support.reports import mixed_run, result, with_id, write_run


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
    assert conflict.kept.result.outcome is Outcome.HIT  # the same finish time: the first shard
    [problem] = merged.problems
    assert problem.kind is ProblemKind.CONFLICT
    finished = "(finished 2026-01-01T00:00:31.500000+00:00)"
    assert problem.message == (
        f"shards disagree (hit in {tmp_path / 'a'} {finished}; avoided in {tmp_path / 'b'} "
        f"{finished}); kept hit from {tmp_path / 'a'}, the latest attempt that ran"
    )
    summary = write_reports(tmp_path / "out")
    assert summary.problems == (problem,)
    assert hit.id in (tmp_path / "out" / "compat.md").read_text()


def test_a_real_outcome_is_kept_over_an_infrastructure_error_or_a_skip() -> None:
    ran = result()
    later = "2026-01-02T00:00:00+00:00"
    copies = [
        Copy(Path("a"), with_id(ran, outcome=Outcome.SKIPPED, finished_at=later)),
        Copy(Path("b"), with_id(ran, outcome=Outcome.INFRA_ERROR, finished_at=later)),
        Copy(Path("c"), ran),
    ]
    choice = choose(copies)
    assert choice.kept.shard == Path("c")
    assert not choice.conflict  # a skip or an infrastructure error says nothing against a hit
    assert [c.shard for c in choice.replaced] == [Path("a"), Path("b")]
    assert choose(copies[:2]).kept.shard == Path("b")


def attempt(shard: Path, finished_at: str, **changes: object) -> Copy:
    return Copy(shard, with_id(result(), finished_at=finished_at, **changes))


def test_the_latest_attempt_of_a_cell_is_kept_whatever_the_shard_order() -> None:
    first = attempt(Path("try-1"), "2026-01-01T10:00:00+00:00", outcome=Outcome.TIMEOUT)
    retry = attempt(Path("try-2"), "2026-01-01T11:00:00+00:00")
    for copies in ([first, retry], [retry, first]):
        choice = choose(copies)
        assert choice.kept.shard == Path("try-2")
        assert [c.shard for c in choice.replaced] == [Path("try-1")]


def test_finish_times_in_other_offsets_are_compared_as_instants() -> None:
    utc = attempt(Path("utc"), "2026-01-01T10:30:00+00:00")
    berlin = attempt(Path("berlin"), "2026-01-01T11:00:00+01:00")  # 10:00 UTC: earlier
    assert choose([berlin, utc]).kept.shard == Path("utc")


def test_an_old_result_without_finish_time_is_ordered_by_start_and_duration() -> None:
    old = attempt(Path("old"), "", started_at="2026-01-01T10:00:00+00:00")  # + 31.5 s
    new = attempt(Path("new"), "2026-01-01T10:00:40+00:00")
    assert choose([new, old]).kept.shard == Path("new")
    unknown = attempt(Path("unknown"), "", started_at="")
    assert choose([unknown, old]).kept.shard == Path("old")


def test_a_retry_that_changed_the_answer_says_what_it_replaced(tmp_path: Path) -> None:
    cell = result()
    write_run(tmp_path / "try-1", [with_id(cell, outcome=Outcome.INFRA_ERROR, root_cause=None)])
    write_run(tmp_path / "try-2", [with_id(cell, finished_at="2026-01-01T01:00:00+00:00")])
    merged = merge([tmp_path / "try-1", tmp_path / "try-2"], tmp_path / "out")
    assert merged.conflicts == ()
    [problem] = merged.problems
    assert problem.kind is ProblemKind.REPLACED
    assert problem.message.startswith(f"hit in {tmp_path / 'try-2'} (finished 2026-01-01T01:00")
    assert f"replaced infra_error in {tmp_path / 'try-1'}" in problem.message
    record = json.loads((tmp_path / "out" / "merge.json").read_text())
    [entry] = record["replaced"]
    assert entry["kept"]["shard"] == str(tmp_path / "try-2")
    assert [c["shard"] for c in entry["replaced"]] == [str(tmp_path / "try-1")]
    [kept] = read_results(tmp_path / "out")[0]
    assert kept.outcome is Outcome.HIT
    summary = write_reports(tmp_path / "out")
    assert summary.problems == (problem,)
    junit = JUnitXml.fromfile(str(tmp_path / "out" / "junit.xml"))
    [notice] = [c for s in junit if s.name == "repromatrix" for c in s]
    assert [type(r).__name__ for r in notice.result] == ["Skipped"]  # a notice, not an error


def test_a_later_attempt_that_disagrees_is_kept_and_named_a_conflict(tmp_path: Path) -> None:
    cell = result()
    write_run(tmp_path / "runner-1", [cell])
    later = with_id(cell, outcome=Outcome.AVOIDED, root_cause=None, host="gpu-b")
    write_run(tmp_path / "runner-2", [with_id(later, finished_at="2026-01-02T00:00:00+00:00")])
    merged = merge([tmp_path / "runner-1", tmp_path / "runner-2"], tmp_path / "out")
    [conflict] = merged.conflicts
    assert conflict.kept.shard == tmp_path / "runner-2"
    [problem] = merged.problems
    assert problem.kind is ProblemKind.CONFLICT
    assert problem.message.endswith(
        f"kept avoided from {tmp_path / 'runner-2'}, the latest attempt that ran"
    )
    assert json.loads((tmp_path / "out" / "merge.json").read_text())["replaced"][0]["conflict"]


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


# -- gathering a run's own shards into it (a Slurm run) --------------------------------------


def test_gathered_shards_make_the_run_folder_equal_to_the_single_run(tmp_path: Path) -> None:
    cells = mixed_run()
    run_dir = tmp_path / "run"
    write_plan(run_dir, [c.id for c in cells])
    shards = [tmp_path / "slurm" / "a", tmp_path / "slurm" / "b", tmp_path / "slurm" / "none"]
    write_run(shards[0], cells[::2])
    write_run(shards[1], cells[1::2])
    gathered = gather(shards, run_dir)
    assert (gathered.cells, gathered.duplicates, gathered.problems) == (18, 0, ())
    assert gathered.shards == tuple(shards[:2])  # a task that wrote nothing has no shard
    found, _ = read_results(run_dir)
    written = read_results(shards[0])[0] + read_results(shards[1])[0]
    assert sorted(found, key=lambda r: r.id) == sorted(written, key=lambda r: r.id)
    again = gather(shards, run_dir)  # after the next submission: nothing changes
    assert (again.cells, again.conflicts, again.problems) == (18, (), ())
    assert read_results(run_dir)[0] == found
    assert read_plan(run_dir)[0] == {c.id for c in cells}


def test_a_newer_copy_in_the_run_folder_outlives_its_shard(tmp_path: Path) -> None:
    old = result(outcome=Outcome.INFRA_ERROR, finished_at="2026-01-01T00:00:00+00:00")
    new = with_id(old, outcome=Outcome.HIT, finished_at="2026-01-02T00:00:00+00:00")
    write_run(tmp_path / "run", [new])
    write_run(tmp_path / "shard", [old])
    gather([tmp_path / "shard"], tmp_path / "run")
    assert [r.outcome for r in read_results(tmp_path / "run")[0]] == [Outcome.HIT]


def test_a_cell_a_shard_left_unfinished_is_no_problem_of_the_gathered_run(tmp_path: Path) -> None:
    done, cut = mixed_run()[:2]
    write_run(tmp_path / "shard", [done])
    folder = cell_dir(tmp_path / "shard", cut.id)
    folder.mkdir(parents=True)
    (folder / "log.txt").write_text("cut short by the task's end")
    write_plan(tmp_path / "run", [done.id, cut.id])
    gathered = gather([tmp_path / "shard"], tmp_path / "run")
    assert gathered.problems == ()
    assert [r.id for r in read_results(tmp_path / "run")[0]] == [done.id]

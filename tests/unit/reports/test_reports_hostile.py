"""Hostile run folders: each bad file is one named problem, nothing is read or written outside.

Every variant damages one cell of a good six-cell run and checks the four
readers of a run folder (``report``, ``merge``, ``--resume``, ``diff``): the
five good cells are still there, the bad file is named once, and no command
ends in a traceback. Links and ids that point out of the folder are never
followed, in reading nor in writing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from junitparser.xunit2 import JUnitXml

from repromatrix.cli import main
from repromatrix.reports.junit import build_junit, write_junit
from repromatrix.reports.write import write_reports
from repromatrix.results import store
from repromatrix.results.merge import merge
from repromatrix.results.store import (
    atomic_write,
    cell_dir,
    finished_ids,
    read_run,
    write_plan,
    write_result,
)
from repromatrix.results.verdicts import ProblemKind, judge_all
from support.reports import cpu_lane, result, write_run

VICTIM = "cpu/0.32.0/cpu/tiny-llama/default/healthy-cpu/baseline"
GOOD = 5
SECRET = "s3cret-outside-the-run"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "results" / "run"
    write_run(folder, cpu_lane())
    return folder


def victim_file(run_dir: Path) -> Path:
    return cell_dir(run_dir, VICTIM) / "result.json"


def edit(**changes: Any) -> Callable[[Path], None]:
    """A damage that rewrites fields of the victim's result.json."""

    def damage(path: Path) -> None:
        data = json.loads(path.read_text())
        data.update(changes)
        path.write_text(json.dumps(data))

    return damage


def drop(name: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = json.loads(path.read_text())
        del data[name]
        path.write_text(json.dumps(data))

    return damage


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def link_elsewhere(path: Path) -> None:
    outside = path.parents[9] / "elsewhere.json"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)


def deep(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def raw(text: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        path.write_text(text)

    return damage


DAMAGES: dict[str, Callable[[Path], None]] = {
    "null reason": edit(reason=None),
    "flags a list": edit(flags=["max_model_len", 64]),
    "flags text": edit(flags="max_model_len=64"),
    "int id": edit(id=7),
    "id climbs out": edit(id="../../s1/payload"),
    "id of another cell": edit(id=VICTIM.replace("baseline", "other")),
    "unknown outcome": edit(outcome="exploded"),
    "null outcome": edit(outcome=None),
    "ready as text": edit(ready="yes"),
    "exit code true": edit(exit_code=True),
    "exit code fraction": edit(exit_code=1.5),
    "timings text": edit(timings="fast"),
    "timing not finite": raw('{"timings": {"total_s": NaN}}'),
    "root cause text": edit(root_cause="boom"),
    "root cause without line": edit(root_cause={"exception": "ValueError"}),
    "root cause line a number": edit(root_cause={"line": 3}),
    "started_at not a time": edit(started_at="yesterday"),
    "lane unknown": edit(lane="tpu"),
    "schema_version text": edit(schema_version="1"),
    "required field missing": drop("image_tag"),
    "a FIFO": fifo,
    "a folder": folder,
    "a link out of the run": link_elsewhere,
    "nested 100000 deep": deep,
    "a JSON string": raw('"result"'),
    "not UTF-8": lambda path: path.write_bytes(b"\xff\xfe{"),
    "a 9 MiB file": lambda path: os.truncate(path, 9 * 1024 * 1024),
    # Values that pass a type check but no consumer can use: one costs its own cell, no more.
    "started_at before year 1 in UTC": edit(started_at="0001-01-01T00:00:00+23:59"),
    "started_at after year 9999 in UTC": edit(started_at="9999-12-31T23:59:59-23:59"),
    "finished_at before year 1 in UTC": edit(finished_at="0001-01-01T00:00:00+23:59"),
    "a flag Infinity": lambda path: path.write_text(
        path.read_text().replace('"flags": {', '"flags": {"x": Infinity, ')
    ),
    "a flag -Infinity": lambda path: path.write_text(
        path.read_text().replace('"flags": {', '"flags": {"x": -Infinity, ')
    ),
    "a flag NaN in a valid result": lambda path: path.write_text(
        path.read_text().replace('"flags": {', '"flags": {"x": NaN, ')
    ),
    "a flag 1e400": lambda path: path.write_text(
        path.read_text().replace('"flags": {', '"flags": {"x": 1e400, ')
    ),
    "a nested flag -1e999": lambda path: path.write_text(
        path.read_text().replace('"flags": {', '"flags": {"x": [{"y": -1e999}], ')
    ),
    "a run id climbs out": edit(run_id="../../../x"),
    "a run id with a NUL": edit(run_id="a\x00b"),
    "a run id of 300 characters": edit(run_id="r" * 300),
    # Whole numbers past what a float or ``int()`` holds (issue 34, item 7).
    "a timing of 4001 digits": edit(timings={"total_s": 10**4000}),
    "an exit code of 5000 digits": raw('{"exit_code": ' + "9" * 5000 + "}"),
    "an exit code of 4001 digits": edit(exit_code=10**4000),
    "a GPU fact of 4001 digits": edit(gpus=[{"memory_mib": 10**4000}]),
    "a version of 5000 digits": edit(version="0." + "9" * 5000),
    "an image tag of 5000 digits": edit(image_tag="0." + "9" * 5000),
}


@pytest.mark.parametrize("name", list(DAMAGES))
def test_one_bad_result_is_one_problem_in_every_reader(
    run_dir: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    DAMAGES[name](victim_file(run_dir))
    where = f"cells/{VICTIM}/result.json"

    summary = write_reports(run_dir)  # report
    assert summary.cells == GOOD
    [problem] = summary.problems
    assert (problem.kind, problem.where) in {
        (ProblemKind.CORRUPT, where),
        (ProblemKind.SCHEMA, where),
    }
    JUnitXml.fromfile(str(run_dir / "junit.xml"))

    assert len(finished_ids(run_dir)) == GOOD  # --resume runs the bad cell again

    merged = merge([run_dir], run_dir.parent / "merged")  # merge
    assert merged.cells == GOOD
    assert [p.where for p in merged.problems] == [f"{run_dir}/{where}"]

    capsys.readouterr()
    status = main(["diff", str(run_dir), "--baseline", "0.31.0", "--candidate", "0.32.0"])
    captured = capsys.readouterr()
    assert status in (0, 1)
    assert captured.err.startswith(f"problem: {where}: ")
    assert "Traceback" not in captured.err


MERGE_RECORDS = {
    "a list": [],
    "problems text": {"problems": "none"},
    "problems an object": {"problems": {"kind": "conflict"}},
    "entries of numbers": {"problems": [1, 2]},
    "an unknown kind": {"problems": [{"kind": "doom", "where": "x", "message": "y"}]},
    "a where that is a number": {"problems": [{"kind": "conflict", "where": 3, "message": "y"}]},
    "a null message": {"problems": [{"kind": "conflict", "where": "x", "message": None}]},
}


@pytest.mark.parametrize("name", list(MERGE_RECORDS))
def test_a_merge_record_of_the_wrong_shape_is_one_problem(run_dir: Path, name: str) -> None:
    (run_dir / "merge.json").write_text(json.dumps(MERGE_RECORDS[name]))
    summary = write_reports(run_dir)
    assert summary.cells == GOOD + 1
    [problem] = summary.problems
    assert (problem.kind, problem.where) == (ProblemKind.CORRUPT, "merge.json")
    assert main(["report", str(run_dir)]) == 0


@pytest.mark.parametrize("name", ["a FIFO", "a link out", "not JSON"])
def test_a_plan_that_cannot_be_read_is_one_problem(run_dir: Path, name: str) -> None:
    plan = run_dir / "plan.json"
    if name == "a FIFO":
        os.mkfifo(plan)
    elif name == "a link out":
        (run_dir.parent / "plan.json").write_text(json.dumps({"cells": ["cpu/x/y/z/a/b/c"]}))
        plan.symlink_to(run_dir.parent / "plan.json")
    else:
        plan.write_text("{")
    [problem] = write_reports(run_dir).problems
    assert (problem.kind, problem.where) == (ProblemKind.CORRUPT, "plan.json")


def test_plan_entries_that_are_not_cell_ids_are_named_and_never_used(run_dir: Path) -> None:
    ids = [c.id for c in cpu_lane()]
    bad = ["../../etc", 7, "cpu/a/b/c/d/e/f/../../..", "CPU/X/Y/Z/A/B/C"]
    (run_dir / "plan.json").write_text(json.dumps({"cells": ids + bad}))
    [problem] = write_reports(run_dir).problems
    assert problem.message.startswith("4 entries are not cell ids and were left out")
    with pytest.raises(ValueError, match="not cell ids"):
        write_plan(run_dir, ["../escape"])


@pytest.mark.parametrize("target", ["absolute", "relative", "fifo"])
def test_report_never_reads_a_log_that_leads_out_of_the_run(run_dir: Path, target: str) -> None:
    outside = run_dir.parent / "secret.txt"
    outside.write_text(f"{SECRET}\n")
    log = cell_dir(run_dir, VICTIM) / "log.txt"
    log.unlink()
    if target == "absolute":
        log.symlink_to(outside)
    elif target == "relative":
        log.symlink_to(Path(*[".."] * 9) / "secret.txt")
        assert log.resolve() == outside.resolve()
    else:
        os.mkfifo(log)  # reading it would hang the report
    summary = write_reports(run_dir)
    assert summary.cells == GOOD + 1
    for name in ("junit.xml", "compat.html", "compat.json", "compat.md"):
        assert SECRET not in (run_dir / name).read_text()
    assert "not read" in (run_dir / "compat.html").read_text() or target == "fifo"


def test_a_log_linked_inside_the_run_is_read(run_dir: Path) -> None:
    log = cell_dir(run_dir, VICTIM) / "log.txt"
    (run_dir / "kept-log.txt").write_text(f"{SECRET}\n")
    log.unlink()
    log.symlink_to(run_dir / "kept-log.txt")
    write_reports(run_dir)
    assert SECRET in (run_dir / "compat.html").read_text()


def tree(root: Path) -> list[Path]:
    """Every path below ``root`` but ``out/``, links not followed."""
    found = []
    for here, dirs, files in os.walk(root):
        found += [Path(here, name) for name in dirs + files]
    return sorted(p for p in found if "out" not in p.relative_to(root).parts)


def test_merge_never_writes_outside_out_nor_copies_a_linked_log(tmp_path: Path) -> None:
    shard = tmp_path / "shard"
    write_run(shard, cpu_lane())
    payload = shard / "cells" / "evil" / "result.json"
    payload.parent.mkdir()
    data = result().to_json() | {"id": "../../s1/payload"}
    payload.write_text(json.dumps(data))
    (tmp_path / "secret.txt").write_text(SECRET)
    log = cell_dir(shard, VICTIM) / "log.txt"
    log.unlink()
    log.symlink_to(tmp_path / "secret.txt")
    linked = shard / "cells" / "linked"
    linked.symlink_to(tmp_path, target_is_directory=True)
    before = tree(tmp_path)

    merged = merge([shard], tmp_path / "out" / "merged")
    assert merged.cells == GOOD + 1
    wheres = sorted(p.where.removeprefix(f"{shard}/") for p in merged.problems)
    assert wheres == sorted(["cells/evil/result.json", "cells/linked", f"cells/{VICTIM}"])
    assert tree(tmp_path) == before  # nothing new outside --out (s1/payload above all)
    assert not (tmp_path / "s1").exists()
    assert not os.path.lexists(cell_dir(tmp_path / "out" / "merged", VICTIM) / "log.txt")
    write_reports(tmp_path / "out" / "merged")
    assert SECRET not in (tmp_path / "out" / "merged" / "junit.xml").read_text()


def test_reports_replace_a_planted_link_instead_of_writing_through_it(run_dir: Path) -> None:
    target = run_dir.parent / "victim.txt"
    target.write_text("keep me")
    for name in ("junit.xml", "compat.html", "plan.json"):
        (run_dir / name).symlink_to(target)
    write_plan(run_dir, [c.id for c in cpu_lane()])
    write_reports(run_dir)
    assert target.read_text() == "keep me"
    assert not (run_dir / "junit.xml").is_symlink()
    assert not (run_dir / "plan.json").is_symlink()


def test_a_cell_folder_linked_out_of_the_run_is_never_written(tmp_path: Path) -> None:
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    cell = result()
    parent = cell_dir(run_dir, cell.id).parent
    parent.parent.mkdir(parents=True)
    parent.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ValueError, match="leads out of"):
        write_result(run_dir, cell, b"log")
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(ValueError, match="not a cell id"):
        atomic_write(cell_dir(run_dir, "../x"), b"")


def test_a_cells_folder_linked_elsewhere_is_named_not_read(tmp_path: Path) -> None:
    elsewhere, run_dir = tmp_path / "elsewhere", tmp_path / "run"
    write_run(elsewhere, cpu_lane())
    run_dir.mkdir()
    (run_dir / "cells").symlink_to(elsewhere / "cells", target_is_directory=True)
    loaded = read_run(run_dir)
    assert loaded.results == ()
    assert [(p.kind, p.where) for p in loaded.problems] == [(ProblemKind.CORRUPT, "cells")]


def test_every_reader_reads_the_same_folder_the_same_way(run_dir: Path) -> None:
    edit(reason=None)(victim_file(run_dir))
    loaded = read_run(run_dir)
    assert {r.id for r in loaded.results} == finished_ids(run_dir)
    assert write_reports(run_dir).problems == loaded.problems


def test_a_time_that_slipped_past_the_schema_costs_junit_nothing(tmp_path: Path) -> None:
    # Results built in code, not read: the writer itself still takes one bad value.
    good = result()
    bad = replace(result(variant="baseline"), started_at="0001-01-01T00:00:00+23:59")
    for cells in ([bad], [good, bad]):
        write_junit(build_junit(judge_all(cells), (), {}), tmp_path / "junit.xml")
    assert 'timestamp="2026-01-01T00:00:00+00:00"' in (tmp_path / "junit.xml").read_text()


UNSAFE = [
    "\x1b]0;owned\x07",  # OSC: window title
    "\x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\",  # OSC 8: a hidden link
    "\x1b[2J\x1b[H",  # CSI: clear screen
    "\x9b31m",  # C1 CSI
    "\x07",  # BEL
    "\u202e",  # right-to-left override: "fail" shows as "liaf"
    "\u2066\u2069",  # isolates
    "\u200f\u061c",  # right-to-left mark, Arabic letter mark
    "\ufeff",  # byte-order mark
    "\u2028",  # line separator
]
RAW_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]"
)
FIELDS: dict[str, Callable[[str], dict[str, Any]]] = {
    "reason": lambda text: {"reason": f"pull failed {text} here"},
    "root cause line": lambda text: {
        "root_cause": {"line": f"ValueError: {text} too small", "message": f"m {text}"}
    },
    "version": lambda text: {"version": f"0.32.0{text}"},
    "digest": lambda text: {"image_digest": f"sha256:{text}"},
    "a flag's value": lambda text: {"flags": {"max_model_len": f"64{text}"}},
    "host": lambda text: {"host": f"runner-{text}"},
}


def strings(value: object) -> list[str]:
    """Every text inside a decoded JSON value."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [text for item in items for text in strings(item)]


@pytest.mark.parametrize("text", UNSAFE, ids=range(len(UNSAFE)))
@pytest.mark.parametrize("field", list(FIELDS))
def test_escapes_and_bidi_characters_from_results_never_reach_a_report_raw(
    run_dir: Path, tmp_path: Path, field: str, text: str
) -> None:
    edit(outcome="infra_error", **FIELDS[field](text))(victim_file(run_dir))
    assert write_reports(run_dir).problems == ()
    for name in ("compat.md", "compat.html", "compat.json", "junit.xml"):
        shown = (run_dir / name).read_text()
        assert not RAW_UNSAFE.search(shown), (name, RAW_UNSAFE.findall(shown))
    document = json.loads((run_dir / "compat.json").read_text())
    [cell] = [c for c in document["cells"] if c["id"] == VICTIM]
    assert any(text in value for value in strings(cell))  # the data keeps the exact value
    site = tmp_path / "site"
    assert main(["publish", str(run_dir), "--out", str(site)]) == 0
    for page in site.rglob("*.html"):
        assert not RAW_UNSAFE.search(page.read_text()), page


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_compat_json_is_json_a_browser_reads(run_dir: Path, text: str) -> None:
    path = victim_file(run_dir)
    path.write_text(path.read_text().replace('"flags": {', f'"flags": {{"x": {text}, '))
    write_reports(run_dir)
    body = (run_dir / "compat.json").read_text()

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in compat.json")

    json.loads(body, parse_constant=refuse)


def test_a_run_past_the_bounds_is_read_up_to_them_and_says_so(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 34: ``report`` read every result.json there was, however many and however big."""
    monkeypatch.setattr(store, "MAX_RESULTS", 4)
    assert main(["report", str(run_dir)]) == 0
    captured = capsys.readouterr()
    assert "more than the 4 result files a run may have" in captured.err
    assert "Traceback" not in captured.err
    size = victim_file(run_dir).stat().st_size
    monkeypatch.setattr(store, "MAX_RESULTS", 100)
    monkeypatch.setattr(store, "MAX_RESULT_BYTES", size * 2)
    summary = write_reports(run_dir)
    assert summary.cells <= 2
    assert any("bytes a run may have" in p.message for p in summary.problems)


@pytest.mark.parametrize("command", ["report", "diff"])
def test_a_file_given_as_the_run_folder_is_named_a_file(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    given = tmp_path / "result.json"
    given.write_text("{}")
    extra = ["--baseline", "0.31.0", "--candidate", "0.32.0"] if command == "diff" else []
    assert main([command, str(given), *extra]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "no such folder" not in err

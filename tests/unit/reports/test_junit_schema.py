"""junit.xml as publishers read it: valid against the JUnit XSD, whatever the results hold.

The schema (tests/data/junit-10.xsd) is the one Jenkins' xUnit plugin and
pytest validate against, with each suite's ``timestamp`` and ``hostname``
required. Every hostile variant damages a real-shaped run with text XML 1.0
cannot carry or values of odd sizes; the file must still parse, validate, and
report the good cells.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import xmlschema

from repromatrix.judgement import Outcome
from repromatrix.reports.junit import ATTRIBUTE_CHARS, PROPERTY_CHARS, read_facts
from repromatrix.reports.write import write_reports
from repromatrix.results.schema import Timings
from repromatrix.results.store import cell_dir
from support import paths
from support.reports import cpu_lane, mixed_run, result, write_run

SCHEMA = xmlschema.XMLSchema(str(paths.DATA / "junit-10.xsd"))
CONTROL = "\x00\x01\x07\x08\x0b\x0c\x1b[31m\x1f\ufffe"
VICTIM = "cpu/0.32.0/cpu/tiny-llama/default/healthy-cpu/baseline"


def junit(run_dir: Path) -> ElementTree.Element:
    """Write the reports, validate junit.xml against the XSD, and return its root."""
    write_reports(run_dir)
    path = run_dir / "junit.xml"
    SCHEMA.validate(str(path))
    return ElementTree.parse(path).getroot()


def test_the_report_of_every_verdict_validates(tmp_path: Path) -> None:
    write_run(tmp_path, mixed_run())
    (tmp_path / "cells" / "cpu" / "broken").mkdir(parents=True)
    (tmp_path / "cells" / "cpu" / "broken" / "log.txt").write_text("cut off")
    root = junit(tmp_path)
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites][-1] == "repromatrix"
    for suite in suites:
        assert suite.get("hostname")
        assert suite.get("timestamp")
        assert suite.find("properties") is not None
        assert next(iter(suite)).tag == "properties"  # before the cases, where the schema wants it
        for case in suite.findall("testcase"):
            assert case.find("properties") is None


def test_a_suite_says_when_and_where_its_cells_ran(tmp_path: Path) -> None:
    cells = [
        result(started_at="2026-01-01T10:00:05+00:00", host="gpu-a"),
        result(variant="other", started_at="2026-01-01T11:00:00+01:00", host="gpu-b"),
    ]
    write_run(tmp_path, cells)
    [suite] = junit(tmp_path).findall("testsuite")
    assert suite.get("timestamp") == "2026-01-01T10:00:00+00:00"  # the second, in UTC
    assert suite.get("hostname") == "gpu-a, gpu-b"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["cpu-kv-cache-too-small.scenario"] == "cpu-kv-cache-too-small"
    assert props["cpu-kv-cache-too-small.cells"] == "2"
    assert props["cpu-kv-cache-too-small.observed"] == json.dumps({"hit": 2})


def test_results_that_do_not_say_get_this_host_and_a_valid_time(tmp_path: Path) -> None:
    write_run(tmp_path, [result(started_at="", finished_at="", host="")])
    [suite] = junit(tmp_path).findall("testsuite")
    assert suite.get("hostname") == socket.gethostname()  # stamped when the result was saved


def edit(**changes: Any) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        path = cell_dir(run_dir, VICTIM) / "result.json"
        data = json.loads(path.read_text())
        data.update(changes)
        path.write_text(json.dumps(data))

    return damage


def control_folder(run_dir: Path) -> None:
    folder = run_dir / "cells" / f"cpu{CONTROL[4:-1]}evil"  # no NUL: a file name cannot hold one
    folder.mkdir()
    (folder / "log.txt").write_text("started")


def raw_json(text: str) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        (cell_dir(run_dir, VICTIM) / "result.json").write_text(text)

    return damage


HOSTILE: dict[str, Callable[[Path], None]] = {
    "control characters in the scenario and id": edit(
        scenario=f"healthy{CONTROL}", id=VICTIM.replace("healthy", f"healthy{CONTROL}")
    ),
    "control characters in flags": edit(flags={f"k{CONTROL}": f"v{CONTROL}", "n": [CONTROL]}),
    "control characters in the reason": edit(reason=f"boom{CONTROL}", outcome="other_failure"),
    "a lone surrogate in the reason": edit(reason="\ud800 half a pair", outcome="timeout"),
    "not JSON at all": raw_json(f'{{"id": "{CONTROL}'),
    "control characters in the run id": edit(run_id=f"run{CONTROL}"),
    "control characters in the host": edit(host=f"gpu{CONTROL}"),
    "control characters in the root cause": edit(
        outcome="hit",
        expected="avoided",
        root_cause={"line": CONTROL, "exception": CONTROL, "message": CONTROL},
    ),
    "a folder name with escapes": control_folder,
    "a megabyte reason": edit(reason="x" * 1_000_000, outcome="timeout"),
    "a megabyte host": edit(host="h" * 1_000_000),
    "a naive start time": edit(started_at="2026-01-01T00:00:00"),
    "a negative duration": edit(timings={"total_s": -5}),
    "a tiny duration": edit(timings={"total_s": 1e-7}),
    "a huge duration": edit(timings={"total_s": 1e300}),
    "a long fraction of a second": edit(timings={"total_s": 123456.789123}),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_values_still_give_a_valid_report(tmp_path: Path, name: str) -> None:
    write_run(tmp_path, cpu_lane())
    HOSTILE[name](tmp_path)
    root = junit(tmp_path)
    cases = list(root.iter("testcase"))
    assert len([c for c in cases if c.get("classname", "").split(".")[0] != "repromatrix"]) >= 5
    for element in root.iter():
        for key, value in element.attrib.items():
            limit = PROPERTY_CHARS if element.tag == "property" else ATTRIBUTE_CHARS
            assert len(value) <= limit, (element.tag, key)
    for case in cases:
        for value in read_facts(case.findtext("system-out") or "").values():
            assert len(value) <= PROPERTY_CHARS


def test_durations_are_written_as_the_schema_reads_them(tmp_path: Path) -> None:
    durations = [0.1, 0.2, 0.7, 31.5, 1e-7, 123456.789123]
    cells = [
        result(variant=f"v{i}", timings=Timings(total_s=s), outcome=Outcome.HIT)
        for i, s in enumerate(durations)
    ]
    write_run(tmp_path, cells)
    root = junit(tmp_path)
    [suite] = root.findall("testsuite")
    assert suite.get("time") == "123489.289"  # the sum, rounded to the millisecond


def test_a_fifo_log_does_not_hang_the_report(tmp_path: Path) -> None:
    write_run(tmp_path, cpu_lane())
    log = cell_dir(tmp_path, VICTIM) / "log.txt"
    log.unlink()
    os.mkfifo(log)
    junit(tmp_path)

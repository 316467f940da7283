"""junit.xml read by independent consumers, each giving the same counts: junitparser (what
the CI actions build on), xunitparser (one table of properties for the whole file),
junit2html (an HTML view) and the vendored schema (Jenkins' junit-10.xsd)."""

from __future__ import annotations

from pathlib import Path

import junitparser
import xmlschema
import xunitparser
from junit2htmlreport import parser as junit2html

from repromatrix.reports.write import write_reports
from support import paths
from support.reports import mixed_run, write_run


def written(tmp_path: Path) -> Path:
    write_run(tmp_path, mixed_run())
    (tmp_path / "cells" / "cpu" / "broken").mkdir(parents=True)  # a problem: its own suite
    (tmp_path / "cells" / "cpu" / "broken" / "log.txt").write_text("cut off")
    write_reports(tmp_path)
    return tmp_path / "junit.xml"


def counts_by_junitparser(path: Path) -> tuple[int, int, int, int]:
    xml = junitparser.JUnitXml.fromfile(str(path))
    cases = [case for suite in xml for case in suite]
    kinds = [type(result).__name__ for case in cases for result in case.result]
    return len(cases), kinds.count("Failure"), kinds.count("Error"), kinds.count("Skipped")


def test_three_independent_readers_read_the_same_counts(tmp_path: Path) -> None:
    path = written(tmp_path)
    xmlschema.XMLSchema(str(paths.DATA / "junit-10.xsd")).validate(str(path))
    tests, failures, errors, skipped = counts_by_junitparser(path)
    assert tests == len(mixed_run()) + 1 and failures > 0 and errors > 0 and skipped > 0
    with path.open("rb") as stream:
        _suite, outcome = xunitparser.parse(stream)
    assert (outcome.testsRun, len(outcome.failures), len(outcome.errors)) == (
        tests,
        failures,
        errors,
    )
    assert len(outcome.skipped) == skipped
    report = junit2html.Junit(str(path))
    html_cases = [case for suite in report.suites for case in suite.all()]
    assert len(html_cases) == tests
    assert sum(len(suite.failed()) for suite in report.suites) == failures + errors
    assert sum(len(suite.skipped()) for suite in report.suites) == skipped
    assert "<html" in report.html()


def test_every_case_name_carries_its_scenario_and_variant(tmp_path: Path) -> None:
    xml = junitparser.JUnitXml.fromfile(str(written(tmp_path)))
    cells = {result.id for result in mixed_run()}
    names = [case.name for suite in xml if suite.name != "repromatrix" for case in suite]
    assert sorted(names) == sorted(cells)  # every name is its whole cell id, none twice

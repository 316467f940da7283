"""``junit.xml``: one test suite per scenario, one test case per cell, for CI test publishers.

Publishers (EnricoMi/publish-unit-test-result-action, dorny/test-reporter)
identify a case by file, classname and name, so each cell gets a classname of
``<scenario>.<variant>`` and a name of ``<lane>/<image-tag>/<gpu>/<model>/<flagset>``
(with ``@probe`` for probe cells): the pair is unique exactly when the cell id is.
Verdict mismatches become ``<failure>`` with the root cause as message,
infrastructure trouble ``<error>``, skips and unreachable probes ``<skipped>``.
Problems with the run's files become errored cases of a ``repromatrix`` suite,
so that a CI job cannot pass over a corrupt shard unseen.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path

import junitparser
from junitparser import Error, Failure, Skipped
from junitparser.xunit2 import JUnitXml, TestCase, TestSuite

from repromatrix.model import Level
from repromatrix.reports.table import log_path
from repromatrix.results.store import CellResult, atomic_write
from repromatrix.results.verdicts import FAILING, Judged, RunProblem, Verdict, one_line

PROBLEM_SUITE = "repromatrix"
MESSAGE_CHARS = 500
# Characters XML 1.0 cannot carry at all; logs are full of them (ANSI escapes, NUL bytes).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def xml_text(text: str) -> str:
    """Drop the characters XML 1.0 forbids, so any log text can go into the report."""
    return _NOT_XML.sub("", text)


def case_classname(result: CellResult) -> str:
    """The case's classname: ``<scenario>.<variant>``."""
    return f"{result.scenario}.{result.variant}"


def case_name(result: CellResult) -> str:
    """The case's name: the cell id's image, GPU, model and flag set, with ``@probe`` for probes."""
    name = f"{result.lane}/{result.image_tag}/{result.gpu}/{result.model}/{result.flagset}"
    return name + ("@probe" if result.level == Level.PROBE.value else "")


def properties(judged: Judged) -> dict[str, str]:
    """The facts a CI reader filters on, as JUnit properties (empty values are left out)."""
    r = judged.result
    cause = r.root_cause
    facts = {
        "cell_id": r.id,
        "level": judged.level.value,
        "verdict": judged.verdict.value,
        "expected": r.expected.value,
        "observed": r.outcome.value,
        "image": r.image,
        "image_tag": r.image_tag,
        "image_digest": r.image_digest or "",
        "vllm_version": r.version or "",
        "lane": r.lane,
        "gpu": r.gpu,
        "model": r.model,
        "flagset": r.flagset,
        "flags": json.dumps(dict(r.flags), sort_keys=True),
        "root_cause": cause.line.strip() if cause else "",
        "root_cause_process": (cause.process or "") if cause else "",
        "root_cause_category": (cause.category or "") if cause else "",
        "reason": r.reason,
        "log": log_path(r.id),
    }
    return {k: xml_text(v) for k, v in facts.items() if v}


def test_case(judged: Judged, excerpt: str | None) -> TestCase:
    """One cell as a test case: properties, its result element and the log excerpt."""
    r = judged.result
    case = TestCase(case_name(r), case_classname(r), r.timings.total_s)
    for name, value in properties(judged).items():
        case.add_property(name, value)
    outcome = _result_element(judged)
    if outcome is not None:
        case.result = [outcome]
    case.system_out = xml_text(_system_out(judged, excerpt))
    return case


def _result_element(judged: Judged) -> Failure | Error | Skipped | None:
    message = one_line(xml_text(_message(judged)), MESSAGE_CHARS)
    verdict = judged.verdict
    element: Failure | Error | Skipped
    if verdict in FAILING:
        element = Failure(message, verdict.value)
    elif verdict is Verdict.ERROR:
        element = Error(message, "infra_error")
    elif verdict in (Verdict.SKIPPED, Verdict.UNREACHABLE):
        element = Skipped(message)
    else:
        return None
    element.text = xml_text(judged.explanation)
    return element


def _message(judged: Judged) -> str:
    if judged.verdict is Verdict.UNEXPECTED_FIX:
        return judged.explanation
    if judged.verdict is Verdict.UNREACHABLE:
        return f"probe unreachable: {judged.result.reason}"
    return judged.cause or judged.result.reason or judged.explanation


def _system_out(judged: Judged, excerpt: str | None) -> str:
    head = f"{judged.result.id}\n{judged.explanation}\nfull log: {log_path(judged.result.id)}"
    return head + ("\n\n" + excerpt if excerpt else "")


def problem_case(problem: RunProblem) -> TestCase:
    """A problem with the run's files as an errored case of the ``repromatrix`` suite."""
    case = TestCase(xml_text(problem.where), f"{PROBLEM_SUITE}.{problem.kind.value}", 0.0)
    case.result = [Error(one_line(xml_text(problem.message), MESSAGE_CHARS), problem.kind.value)]
    return case


def build_junit(
    judged: Sequence[Judged], problems: Sequence[RunProblem], excerpts: Mapping[str, str]
) -> JUnitXml:
    """Return the whole report: suites sorted by scenario, cases by cell id, problems last."""
    by_scenario: dict[str, list[Judged]] = defaultdict(list)
    for item in judged:
        by_scenario[item.result.scenario].append(item)
    xml = JUnitXml("repromatrix")
    for scenario in sorted(by_scenario):
        cells = sorted(by_scenario[scenario], key=lambda j: j.result.id)
        xml.add_testsuite(
            _suite(scenario, [test_case(j, excerpts.get(j.result.id)) for j in cells])
        )
    if problems:
        xml.add_testsuite(_suite(PROBLEM_SUITE, [problem_case(p) for p in problems]))
    xml.update_statistics()  # type: ignore[no-untyped-call]
    return xml


def _suite(name: str, cases: list[junitparser.TestCase]) -> TestSuite:
    suite = TestSuite(name)  # type: ignore[no-untyped-call]
    suite.add_testcases(cases)  # one batch: statistics are computed once, not per case
    return suite


def write_junit(xml: JUnitXml, path: Path) -> None:
    """Write the report atomically as UTF-8 with an XML declaration."""
    buffer = BytesIO()
    xml.write(buffer)
    atomic_write(path, buffer.getvalue())

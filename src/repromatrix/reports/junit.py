"""``junit.xml``: one test suite per scenario, one test case per cell, for CI test publishers.

Publishers (EnricoMi/publish-unit-test-result-action, dorny/test-reporter,
Jenkins) identify a case by file, classname and name, and many CI views show
the name alone, so each cell's name is its whole cell id
(``<lane>/<image-tag>/<gpu>/<model>/<flagset>/<scenario>/<variant>``, with
``@probe`` for probe cells) and its classname ``<scenario>.<variant>`` (the
suite's grouping). Verdict mismatches
become ``<failure>`` with the root cause as message, infrastructure trouble
``<error>``, skips, unreachable probes and engines that did not reach the
crash's code path (``not_reached``) ``<skipped>`` with the reason. Problems with the
run's files become errored cases of a ``repromatrix`` suite, so that a CI
job cannot pass over a corrupt shard unseen (notices, such as a retried
cell that merge replaced, are skipped cases).

The file follows the JUnit schema publishers validate against (Jenkins'
``junit-10.xsd``, pytest's ``xunit2``): every suite has ``timestamp`` and
``hostname``, properties only at suite level (a cell's facts are the first
lines of its ``<system-out>``), each property named after its suite
(``<suite>.cells``: readers such as xunitparser keep one table of properties for
the whole file, and refuse a name twice), and every text and attribute passes
through one rule that drops what XML 1.0 cannot carry and caps its size. Tests
read the file with junitparser, xunitparser, junit2html and the schema.
"""

from __future__ import annotations

import json
import math
import re
import socket
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from xml.etree import ElementTree

import junitparser
from junitparser import Error, Failure, Skipped
from junitparser.xunit2 import JUnitXml, TestCase, TestSuite

from repromatrix.judgement import FAILING, Outcome, Verdict
from repromatrix.reports.table import log_path
from repromatrix.results.problems import NOTICES
from repromatrix.results.store import CellResult, atomic_write
from repromatrix.results.verdicts import Judged, RunProblem, one_line
from repromatrix.visible import visible

PROBLEM_SUITE = "repromatrix"
MESSAGE_CHARS = 500
PROPERTY_CHARS = 2000  # a fact or property value; the excerpt has its own, larger bound
ATTRIBUTE_CHARS = 4000  # any attribute: names, messages, property values
# Characters XML 1.0 cannot carry at all; logs are full of them (ANSI escapes, NUL bytes).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def xml_text(text: str) -> str:
    """Any text as a report may carry it: escapes and bidi controls made ``visible``, then the
    characters XML 1.0 forbids dropped, so any log text can go into the report."""
    return _NOT_XML.sub("", visible(text, multiline=True))


def case_classname(result: CellResult) -> str:
    """The case's classname: ``<scenario>.<variant>``."""
    return f"{result.scenario}.{result.variant}"


def case_name(result: CellResult) -> str:
    """The case's name: the whole cell id (with its scenario and variant, ``@probe`` for
    probes), what a CI view that shows names alone needs to tell cells apart."""
    return result.id


def facts(judged: Judged) -> dict[str, str]:
    """The facts a CI reader filters on (empty values are left out), each one line and capped."""
    r = judged.result
    cause = r.root_cause
    found = {
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
        "reached": "" if r.reached is None else str(r.reached).lower(),
        "engine_facts": json.dumps(dict(r.facts)) if r.facts else "",
        "host": r.host,
        "finished_at": r.finished_at,
        "log": log_path(r.id),
    }
    return {k: one_line(xml_text(v), PROPERTY_CHARS) for k, v in found.items() if v.strip()}


def test_case(judged: Judged, excerpt: str | None) -> TestCase:
    """One cell as a test case: its result element, then its facts and the log excerpt."""
    r = judged.result
    case = TestCase(case_name(r), case_classname(r), _seconds(r.timings.total_s))
    outcome = _result_element(judged)
    if outcome is not None:
        case.result = [outcome]
    case.system_out = _system_out(judged, excerpt)
    return case


def _seconds(value: float) -> float:
    return round(max(value, 0.0), 3)


def _result_element(judged: Judged) -> Failure | Error | Skipped | None:
    message = one_line(xml_text(_message(judged)), MESSAGE_CHARS)
    verdict = judged.verdict
    element: Failure | Error | Skipped
    if verdict in FAILING:
        element = Failure(message, verdict.value)
    elif verdict is Verdict.ERROR:
        element = Error(message, "infra_error")
    elif verdict in (Verdict.SKIPPED, Verdict.UNREACHABLE) or _not_reached(judged):
        element = Skipped(message)
    else:
        return None
    element.text = judged.explanation
    return element


def _message(judged: Judged) -> str:
    if judged.verdict is Verdict.UNEXPECTED_FIX:
        return judged.explanation
    if judged.verdict is Verdict.UNREACHABLE:
        return f"probe unreachable: {judged.result.reason}"
    if _not_reached(judged):
        return f"not reached: {judged.result.reason}"
    return judged.cause or judged.result.reason or judged.explanation


def _not_reached(judged: Judged) -> bool:
    """An engine cell that did not test its crash: skipped, its verdict unknown."""
    return judged.result.outcome is Outcome.NOT_REACHED


def _system_out(judged: Judged, excerpt: str | None) -> str:
    # On one line: a blank line in the explanation (a reason read from a log) would end the
    # head early and shift the facts block that readers find as the second one.
    explanation = " ".join(judged.explanation.split())
    head = f"{judged.result.id}\n{explanation}\nfull log: {log_path(judged.result.id)}"
    listed = "\n".join(f"{name}: {value}" for name, value in facts(judged).items())
    return f"{head}\n\n{listed}" + ("\n\n" + excerpt if excerpt else "")


def read_facts(system_out: str) -> dict[str, str]:
    """The facts block of a case's ``<system-out>``, as ``facts`` wrote it."""
    blocks = system_out.split("\n\n")
    lines = blocks[1].splitlines() if len(blocks) > 1 else []
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def problem_case(problem: RunProblem) -> TestCase:
    """A problem with the run's files: an errored case, or a skipped one for a notice."""
    case = TestCase(problem.where, f"{PROBLEM_SUITE}.{problem.kind.value}", 0.0)
    message = one_line(xml_text(problem.message), MESSAGE_CHARS)
    if problem.kind in NOTICES:
        case.result = [Skipped(message, problem.kind.value)]
    else:
        case.result = [Error(message, problem.kind.value)]
    case.system_out = problem.message
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
        cases = [test_case(j, excerpts.get(j.result.id)) for j in cells]
        xml.add_testsuite(_suite(scenario, cases, [j.result for j in cells]))
    if problems:
        props = {"problems": str(len(problems))}
        cases = [problem_case(p) for p in problems]
        xml.add_testsuite(_suite(PROBLEM_SUITE, cases, [], props))
    xml.update_statistics()  # type: ignore[no-untyped-call]
    xml.time = _seconds(sum(suite.time or 0.0 for suite in xml))
    clean_tree(xml._elem)  # junitparser has no public handle on its tree
    return xml


def suite_properties(results: Sequence[CellResult]) -> dict[str, str]:
    """What a scenario's suite is about, as the suite properties publishers show."""
    verdicts = Counter(r.outcome.value for r in results)
    return {
        "scenario": ", ".join(sorted({r.scenario for r in results})),
        "cells": str(len(results)),
        "lanes": ", ".join(sorted({r.lane for r in results})),
        "image_tags": ", ".join(sorted({r.image_tag for r in results})),
        "observed": json.dumps(dict(sorted(verdicts.items()))),
        "runs": ", ".join(sorted({r.run_id for r in results if r.run_id})),
    }


def _suite(
    name: str,
    cases: Sequence[junitparser.TestCase],
    results: Sequence[CellResult],
    props: Mapping[str, str] | None = None,
) -> TestSuite:
    suite = TestSuite(name)  # type: ignore[no-untyped-call]
    suite.timestamp = _timestamp(results)
    suite.hostname = _hostname(results)
    # Properties first: the schema puts them before the cases.
    for key, value in (props or suite_properties(results)).items():
        if value:
            suite.add_property(f"{name}.{key}", value)
    suite.add_testcases(list(cases))  # one batch: statistics are computed once, not per case
    return suite


def _timestamp(results: Iterable[CellResult]) -> str:
    """When the suite's first cell started (UTC), else now: an ``xs:dateTime``."""
    moments = []
    for r in results:
        try:
            moment = datetime.fromisoformat(r.started_at or r.finished_at)
            moments.append(
                (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
            )
        except (ValueError, OverflowError):  # one bad time costs its own cell's, no more
            continue
    first = min(moments) if moments else datetime.now(UTC)
    return first.replace(microsecond=0).isoformat()


def _hostname(results: Iterable[CellResult]) -> str:
    """The machines that ran the suite's cells; this one when the results do not say."""
    hosts = sorted({r.host for r in results if r.host})
    return ", ".join(hosts) if hosts else socket.gethostname()


def clean_tree(root: ElementTree.Element) -> None:
    """Apply the one rule to every element: only XML 1.0 characters, bounded attributes."""
    for element in root.iter():
        if element.text:
            element.text = xml_text(element.text)
        if element.tail:
            element.tail = xml_text(element.tail)
        for key, value in element.attrib.items():
            limit = PROPERTY_CHARS if element.tag == "property" else ATTRIBUTE_CHARS
            text = _duration(value) if key == "time" else value
            element.set(key, one_line(xml_text(text), limit))


def _duration(text: str) -> str:
    """Seconds as the schema's pattern reads them: digits, a point, at most three decimals."""
    try:
        seconds = float(text)
    except ValueError:
        return "0"
    return f"{seconds:.3f}" if seconds >= 0 and math.isfinite(seconds) else "0"


def write_junit(xml: JUnitXml, path: Path) -> None:
    """Write the report atomically as UTF-8 with an XML declaration."""
    buffer = BytesIO()
    xml.write(buffer)
    atomic_write(path, buffer.getvalue())

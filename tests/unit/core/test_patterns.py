"""Patterns from data, matched by RE2: the flags map to RE2's options, the differences from
Python's re that a log line could meet are known, and the real catalogue, scenarios and
logs give the same answers under both engines."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from repromatrix import patterns
from repromatrix.matrix.scenarios import load_catalogue
from repromatrix.patterns import PatternError, compile_pattern, regex_problem
from repromatrix.triage import builtin_catalogue, triage_path
from repromatrix.values import FactTest, Signature
from support import paths

DATA = paths.ROOT / "tests" / "data"
FOLDERS = (paths.ROOT / "scenarios", paths.ROOT / "scenarios" / "zoo")
REHEARSAL = paths.ROOT / "src" / "repromatrix" / "rehearsal" / "scenarios"


def test_ignore_case_and_multiline_map_to_re2() -> None:
    assert compile_pattern("h100 80gb", ignore_case=True).fullmatch("H100 80GB")
    assert not compile_pattern("h100").fullmatch("H100")
    block = "x too small\ny"
    assert compile_pattern("small$", multiline=True).search(block)
    assert compile_pattern("^y", multiline=True).search(block)
    assert not compile_pattern("small$").search(block)
    assert not compile_pattern("^y").search(block)


def test_the_differences_from_re_a_line_could_meet() -> None:
    # Lines are searched without their line break: `$` ends the line under both engines.
    assert compile_pattern("small$").search("too small")
    assert not compile_pattern("small$").search("too small\n")  # re says yes here
    assert compile_pattern(r"small\z").search("too small")
    assert "writes `\\Z` as `\\z`" in (regex_problem(r"small\Z") or "")
    # \s, \d and \w are ASCII; `.` and literal text are Unicode.
    assert compile_pattern(r"a\sb").search("a\tb") and not compile_pattern(r"a\sb").search(
        "a\u00a0b"
    )
    assert not compile_pattern(r"\d").search("\u0663")
    assert compile_pattern("é.x").search("café→x")
    assert compile_pattern("CAFÉ", ignore_case=True).search("café")


def test_a_refused_pattern_raises_with_the_reason() -> None:
    with pytest.raises(PatternError, match="look-arounds"):
        compile_pattern("a(?=b)")
    assert regex_problem("(a|a)*$") is None


def _data_patterns() -> list[str]:
    catalogue = builtin_catalogue()
    found = [p for cause in catalogue.causes for p in (*cause.patterns, *cause.frames)]
    for scenario in load_catalogue([*FOLDERS, REHEARSAL]):
        lines = (*scenario.signatures, *scenario.reached)
        found += [s.pattern for s in lines if isinstance(s, Signature)]
        found += [s.matches for s in scenario.reached if isinstance(s, FactTest) and s.matches]
        if scenario.launch is not None and scenario.launch.interrupt_on:
            found.append(scenario.launch.interrupt_on)
    return found


def test_every_real_catalogue_and_scenario_pattern_compiles_in_re2() -> None:
    found = _data_patterns()
    assert len(found) > 290
    assert [p for p in found if regex_problem(p) is not None] == []


def _re_compiled(text: str, ignore_case: bool, multiline: bool) -> Any:
    flags = (re.IGNORECASE if ignore_case else 0) | (re.MULTILINE if multiline else 0)
    return re.compile(text, flags)


def _answers() -> list[str]:
    builtin_catalogue.cache_clear()
    scenarios = load_catalogue(list(FOLDERS))
    logs = sorted(p for p in DATA.rglob("*") if p.name.endswith((".log", ".log.gz")))
    assert len(logs) > 100
    return [json.dumps(triage_path(log, scenarios).to_json()) for log in logs]


def test_every_real_log_is_triaged_alike_by_re2_and_re(monkeypatch: pytest.MonkeyPatch) -> None:
    with_re2 = _answers()
    monkeypatch.setattr(patterns, "_compiled", _re_compiled)
    try:
        assert _answers() == with_re2
    finally:
        monkeypatch.undo()
        builtin_catalogue.cache_clear()

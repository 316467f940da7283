"""The fleet workflow: actionlint- and schema-clean, wired to the real commands, its shell run.

The plan and split steps run as CI would in test_ci_jobs.py; here the shard, install and
gate steps run with stand-ins for the tools they call.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from repromatrix.cli import build_parser
from repromatrix.fleet.jobs import DEFAULT_JOB_MINUTES
from repromatrix.rehearsal.hfcache import lay_out
from support.machine import program
from support.workflow import (
    ECHO_ARGV,
    ROOT,
    WORKFLOW,
    argv_recorder,
    calls,
    check_schema,
    fake_tool,
    load_workflow,
    real_path,
    run_script,
    step,
    workflow_env,
)


def actionlint() -> str:
    found = program("actionlint")
    assert found, "the test is marked program('actionlint')"
    return found


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [actionlint(), "-no-color", str(path)], capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return load_workflow()


@pytest.mark.program("actionlint")
def test_actionlint_accepts_the_workflow() -> None:
    linted = lint(WORKFLOW)
    assert linted.returncode == 0, linted.stdout + linted.stderr


@pytest.mark.program("actionlint")
def test_actionlint_would_catch_a_broken_copy(tmp_path: Path) -> None:
    broken = tmp_path / ".github" / "workflows" / "compat-matrix.yml"
    broken.parent.mkdir(parents=True)
    text = WORKFLOW.read_text().replace("needs: [plan, gpu, cpu]", "needs: [plan, gpu, cpus]")
    broken.write_text(text)
    linted = lint(broken)
    assert linted.returncode != 0
    assert '"cpus"' in linted.stdout


@pytest.mark.program("check-jsonschema")
def test_the_github_workflow_schema_accepts_the_workflow(tmp_path: Path) -> None:
    checked = check_schema(WORKFLOW, "vendor.github-workflows")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = tmp_path / "compat-matrix.yml"
    broken.write_text(WORKFLOW.read_text().replace("timeout-minutes: 360", "timeout-minutes: []"))
    assert check_schema(broken, "vendor.github-workflows").returncode != 0


def test_dispatch_and_call_take_the_same_inputs(workflow: dict[str, Any]) -> None:
    on = workflow[True]  # YAML 1.1 reads `on` as true
    dispatch, call = on["workflow_dispatch"]["inputs"], on["workflow_call"]["inputs"]
    assert dispatch == call
    assert set(dispatch) == {
        "matrix", "scenarios", "only", "skip", "baseline", "candidate", "package", "lock",
        "watch",
    }  # fmt: skip
    env = workflow["env"]  # one place every job reads them from, with schedule defaults
    assert env["REPROMATRIX_MATRIX"] == "${{ inputs.matrix || 'matrix.yaml' }}"
    assert env["REPROMATRIX_SCENARIOS"] == "${{ inputs.scenarios || 'scenarios' }}"
    assert all("inputs." not in json.dumps(job) for job in workflow["jobs"].values())


def test_every_job_installs_into_a_virtualenv(workflow: dict[str, Any]) -> None:
    for name, job in workflow["jobs"].items():
        install = step(job, "Install repromatrix")["run"]
        assert install.startswith('python3 -m venv "$RUNNER_TEMP/repromatrix-venv"'), name
        assert "--user" not in json.dumps(job) and "nox" not in json.dumps(job), name


def test_jobs_time_out_where_the_plan_sized_them(workflow: dict[str, Any]) -> None:
    assert int(workflow["env"]["JOB_MINUTES"]) == DEFAULT_JOB_MINUTES
    for lane in ("gpu", "cpu"):
        assert workflow["jobs"][lane]["timeout-minutes"] == DEFAULT_JOB_MINUTES
    assert '--job-minutes "$JOB_MINUTES"' in step(workflow["jobs"]["plan"], "Emit")["run"]


def test_gpu_jobs_run_on_self_hosted_runners_by_label(workflow: dict[str, Any]) -> None:
    gpu = workflow["jobs"]["gpu"]
    assert gpu["runs-on"] == ["self-hosted", "${{ matrix.runner }}"]
    assert gpu["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.gpu) }}"
    assert gpu["strategy"]["fail-fast"] is False
    assert gpu["env"]["LANE"] == "gpu" and workflow["jobs"]["cpu"]["env"]["LANE"] == "cpu"
    upload = step(gpu, "Upload the shard")
    assert upload["if"] == "always()"
    assert upload["with"]["path"] == "results/${{ env.RUN_ID }}/"


def test_the_last_job_merges_publishes_and_summarises(workflow: dict[str, Any]) -> None:
    report = workflow["jobs"]["report"]
    assert report["needs"] == ["plan", "gpu", "cpu"]
    assert step(report, "Download")["with"]["pattern"] == "shard-*"
    assert step(report, "Merge")["run"] == "repromatrix merge shards/* --out merged"
    publish = step(report, "Publish")
    assert publish["uses"].startswith("EnricoMi/publish-unit-test-result-action@")
    assert publish["with"]["files"] == "merged/junit.xml"
    assert report["permissions"]["checks"] == "write"
    table = step(report, "compatibility table")
    assert table["run"].rstrip().endswith('cat merged/compat.md >> "$GITHUB_STEP_SUMMARY"')
    # with a baseline and a candidate, the reports are rewritten to open with the move
    assert (
        'repromatrix report merged --baseline "$BASELINE" --candidate "$CANDIDATE"'
        in (table["run"])
    )
    assert table["if"].startswith("always()")
    names = [s.get("name", "") for s in report["steps"]]
    assert names.index(step(report, "Upgrade gate")["name"]) < names.index(table["name"])


@pytest.mark.parametrize("worse", [False, True])
def test_the_gate_puts_its_answer_in_the_job_summary(
    workflow: dict[str, Any], tmp_path: Path, worse: bool
) -> None:
    gate = step(workflow["jobs"]["report"], "Upgrade gate")
    assert gate["if"].startswith("always()")  # also after a failed merge or shard
    answer = "upgrade v0.31.0 -> v0.32.0: the candidate is " + ("WORSE" if worse else "not worse")
    fake_tool(tmp_path / "bin", "repromatrix", f"echo '{answer}'\nexit {int(worse)}\n")
    summary = tmp_path / "summary"
    env = {
        **workflow_env(workflow, baseline="v0.31.0", candidate="v0.32.0"),
        "GITHUB_STEP_SUMMARY": str(summary),
        "PATH": real_path(tmp_path / "bin"),
    }
    ran = run_script(gate["run"], env, cwd=tmp_path)
    assert ran.returncode == int(worse), ran.stderr
    text = summary.read_text()
    assert text.startswith("### Upgrade v0.31.0 -> v0.32.0\n") and answer in text
    assert answer in ran.stdout  # and in the step log


def test_the_shard_step_passes_each_glob_as_one_argument(
    workflow: dict[str, Any], tmp_path: Path
) -> None:
    log = tmp_path / "argv"
    argv_recorder(tmp_path / "bin", "repromatrix", log)
    globs = ["gpu/v0.22.1/h100/{model-a/default,model b/eager}/*", "gpu/v0.31.0/h100/*"]
    env = {
        **workflow_env(workflow, matrix="fleet/my matrix.yaml", scenarios="fleet/crashes"),
        "ONLY_JSON": json.dumps(globs),
        "LANE": "gpu",
        "RUN_ID": "gh-1-1-gpu-0",
        "PATH": real_path(tmp_path / "bin"),
    }
    ran = run_script(step(workflow["jobs"]["gpu"], "GPU lane")["run"], env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert calls(log) == [[
        "run", "--lane", "gpu", "--run-id", "gh-1-1-gpu-0", "--matrix", "fleet/my matrix.yaml",
        "--lock", "repromatrix.lock.json", "--scenarios", "fleet/crashes",
        "--only", globs[0], "--only", globs[1],
    ]]  # fmt: skip


def test_the_commands_accept_the_arguments_the_workflow_passes() -> None:
    parser = build_parser()
    run = parser.parse_args(["run", "--lane", "gpu", "--run-id", "gh-1", "--only", "gpu/*"])
    assert (run.lane, run.only) == ("gpu", ["gpu/*"])
    plan = parser.parse_args(
        ["plan", "--format", "github", "--matrix", "m.yaml", "--scenarios", "s",
         "--job-minutes", "360", "--only", "gpu/*", "--skip", "*/nightly/*"]
    )  # fmt: skip
    assert (plan.matrix, plan.job_minutes, plan.skip) == (Path("m.yaml"), 360, ["*/nightly/*"])
    merge = parser.parse_args(["merge", "shards/a", "shards/b", "--out", "merged"])
    assert merge.out == Path("merged")
    diff = parser.parse_args(["diff", "merged", "--baseline", "v0.31.0", "--candidate", "v0.32.0"])
    assert (diff.baseline, diff.candidate) == ("v0.31.0", "v0.32.0")


TOKEN = "hf_workflowTokenNotReal0123"
GPU_STEPS = ("Fetch this runner's models", "Check that the HF cache", "GPU lane")


def gpu_step_env(workflow: dict[str, Any], name: str, tmp_path: Path, **env: str) -> dict[str, str]:
    """What a GPU job's step sees: the workflow's env, the job's, the step's own with GitHub's
    expressions evaluated (a token for the secret, the plan's globs), and a stand-in PATH."""
    given = {
        "${{ secrets.HF_TOKEN }}": TOKEN,
        "${{ toJSON(matrix.only) }}": json.dumps(["gpu/v0.31.0/h100/*"]),
    }
    job = workflow["jobs"]["gpu"]
    own = {key: given.get(value, value) for key, value in step(job, name).get("env", {}).items()}
    assert set(own.values()) <= {TOKEN, given["${{ toJSON(matrix.only) }}"]}, own
    return {
        **workflow_env(workflow),
        "LANE": job["env"]["LANE"],
        "RUN_ID": "gh-1-1-gpu-0",
        **own,
        "PATH": real_path(tmp_path / "bin"),
        **env,
    }


def test_only_the_fetch_step_is_given_the_token(workflow: dict[str, Any]) -> None:
    for job_name, job in workflow["jobs"].items():
        for one in job["steps"]:
            named = "secrets." in json.dumps(one)
            assert named == (
                job_name == "gpu" and one.get("name") == step(job, GPU_STEPS[0])["name"]
            )
    names = [s.get("name", "") for s in workflow["jobs"]["gpu"]["steps"]]
    order = [names.index(step(workflow["jobs"]["gpu"], part)["name"]) for part in GPU_STEPS]
    assert order == sorted(order)  # fetch, then the pre-flight, then the cells


def test_a_gpu_job_fetches_checks_then_runs_its_cells_and_only_the_fetch_sees_the_token(
    workflow: dict[str, Any], tmp_path: Path
) -> None:
    log = tmp_path / "argv"
    # The stand-in records its argv and whether HF_TOKEN reached it.
    fake_tool(
        tmp_path / "bin",
        "repromatrix",
        f'"{sys.executable}" -c \'{ECHO_ARGV}\' "$@" "token:${{HF_TOKEN:-none}}" >> "{log}"\n',
    )
    for name in GPU_STEPS:
        ran = run_script(
            step(workflow["jobs"]["gpu"], name)["run"], gpu_step_env(workflow, name, tmp_path)
        )
        assert ran.returncode == 0, ran.stderr
    selection = [
        "--matrix",
        "matrix.yaml",
        "--lock",
        "repromatrix.lock.json",
        "--scenarios",
        "scenarios",
        "--only",
        "gpu/v0.31.0/h100/*",
    ]
    assert calls(log) == [
        ["prepare", "--lane", "gpu", *selection, f"token:{TOKEN}"],
        ["prepare", "--check", "--lane", "gpu", *selection, "token:none"],
        ["run", "--lane", "gpu", "--run-id", "gh-1-1-gpu-0", *selection, "token:none"],
    ]


PREFLIGHT_MATRIX = """
lanes:
  gpu:
    runtime: {hf_cache: HF_HOME}
    images: [v0.31.0]
    gpus: {h100: {runner: gpu-h100, count: 1}}
    models:
      tiny: {source: org/tiny, revision: REVISION}
"""


def test_the_preflight_step_fails_naming_what_the_runners_cache_lacks(
    workflow: dict[str, Any], tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    commit = lay_out(tmp_path / "hf", "org/tiny", folder).name
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    name = GPU_STEPS[1]
    for revision, status in ((commit, 0), ("v2", 3)):
        text = PREFLIGHT_MATRIX.replace("HF_HOME", str(tmp_path / "hf"))
        (tmp_path / "matrix.yaml").write_text(text.replace("REVISION", revision))
        env = gpu_step_env(workflow, name, tmp_path, PYTHONPATH=str(ROOT / "src"))
        ran = run_script(step(workflow["jobs"]["gpu"], name)["run"], env, cwd=tmp_path)
        assert ran.returncode == status, ran.stderr
    assert "model org/tiny@v2: not in the HF cache" in ran.stderr

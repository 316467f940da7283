"""Cells handed to the fleet: the GitHub workflow dispatch and the Buildkite build, rendered
as API calls and sent for real to a stand-in server on the loopback."""

from __future__ import annotations

import json
from pathlib import Path

from repromatrix.fleet.dispatch import BuildkiteBuild, GitHubWorkflow, Handoff
from support.webhook import receiver
from support.workflow import load_workflow

TOKEN = "ghp_loopbackonly0000"
HANDOFF = Handoff(
    key="gpu-v0.33.0-0123456789ab",
    lane="gpu",
    tag="v0.33.0",
    matrix="fleet/matrix.yaml",
    scenarios="scenarios",
    only=("gpu/v0.33.0/*",),
    skip=("*@probe",),
    lock='{"schema_version": 1}',
    cells=12,
)


def test_a_workflow_dispatch_runs_compat_matrix_with_the_handoff_as_its_inputs() -> None:
    with receiver(status=204) as api:
        github = GitHubWorkflow("team/compat", TOKEN, ref="main", api=f"{api.url}/api/v3")
        dispatched = github.dispatch(HANDOFF)
    assert dispatched.ok, dispatched.words
    [got] = api.got
    assert got.path == "/api/v3/repos/team/compat/actions/workflows/compat-matrix.yml/dispatches"
    assert got.headers["Authorization"] == f"Bearer {TOKEN}"
    assert got.headers["Accept"] == "application/vnd.github+json"
    assert got.json() == {
        "ref": "main",
        "inputs": {
            "matrix": "fleet/matrix.yaml", "scenarios": "scenarios", "only": "gpu/v0.33.0/*",
            "skip": "*@probe", "lock": '{"schema_version": 1}', "watch": HANDOFF.key,
            "package": ".",
        },
    }  # fmt: skip
    assert "watch-gpu-v0.33.0-0123456789ab" in dispatched.words


def test_the_inputs_sent_are_the_inputs_the_workflow_takes() -> None:
    inputs = load_workflow()[True]["workflow_dispatch"]["inputs"]  # YAML 1.1 reads on: as true
    sent = json.loads(GitHubWorkflow("t/c", TOKEN).call(HANDOFF).body)["inputs"]
    assert set(sent) <= set(inputs)


def test_a_buildkite_build_carries_the_handoff_in_its_environment() -> None:
    answer = {"id": "0190-build-uuid", "number": 42,
              "web_url": "https://buildkite.com/team/compat/builds/42"}  # fmt: skip
    with receiver(status=201, answer=answer) as api:
        build = BuildkiteBuild("team", "compat", "bkua_loopbackonly", api=api.url)
        dispatched = build.dispatch(HANDOFF)
    assert dispatched.ok and dispatched.url == answer["web_url"]
    assert dispatched.fleet_id == "0190-build-uuid"  # what its results are downloaded by
    [got] = api.got
    assert got.path == "/v2/organizations/team/pipelines/compat/builds"
    assert got.headers["Authorization"] == "Bearer bkua_loopbackonly"
    body = got.json()
    assert (body["commit"], body["branch"]) == ("HEAD", "main")
    assert body["env"]["REPROMATRIX_ONLY"] == "gpu/v0.33.0/*"
    assert body["env"]["REPROMATRIX_LOCK_JSON"] == HANDOFF.lock
    assert body["env"]["REPROMATRIX_WATCH"] == HANDOFF.key
    assert "build 42" in dispatched.words


def test_a_refused_dispatch_says_why_and_shows_no_token(tmp_path: Path) -> None:
    with receiver(
        status=422, answer={"message": "Workflow does not have a dispatch trigger"}
    ) as api:
        dispatched = GitHubWorkflow("team/compat", TOKEN, api=api.url).dispatch(HANDOFF)
    assert not dispatched.ok
    assert "HTTP 422" in dispatched.words and "dispatch trigger" in dispatched.words
    described = GitHubWorkflow("team/compat", TOKEN).describe(HANDOFF)
    assert (
        TOKEN not in json.dumps(described) and described["headers"]["Authorization"] == "<secret>"
    )
    assert described["url"].startswith("https://api.github.com/repos/team/compat/")

"""The hourly watch workflow: actionlint-clean, one round at a time, its shell steps run with
stand-ins for the tools they call, and its arguments the ones `repromatrix watch` takes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from repromatrix.cli import build_parser
from support import paths
from support.machine import program
from support.workflow import argv_recorder, calls, fake_tool, real_path, run_script, step

WATCH = paths.ROOT / ".github" / "workflows" / "watch.yml"
BUILDKITE = paths.ROOT / ".buildkite" / "watch.yml"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    data = yaml.safe_load(WATCH.read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.program("actionlint")
def test_actionlint_accepts_the_watch_workflow() -> None:
    tool = program("actionlint")
    assert tool
    argv = [tool, "-no-color", str(WATCH)]
    linted = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_it_runs_every_hour_one_round_at_a_time(workflow: dict[str, Any]) -> None:
    [schedule] = workflow[True]["schedule"]  # YAML 1.1 reads `on` as true
    minute, hour, *rest = schedule["cron"].split()
    assert minute.isdigit() and hour == "*" and rest == ["*", "*", "*"]
    assert workflow["concurrency"]["cancel-in-progress"] is False
    assert "watch" in workflow["concurrency"]["group"]


def test_the_state_is_restored_and_kept_even_after_a_failed_round(workflow: dict[str, Any]) -> None:
    job = workflow["jobs"]["watch"]
    restore, save = step(job, "Restore"), step(job, "Keep the state")
    assert restore["uses"].startswith("actions/cache/restore@")
    assert save["uses"].startswith("actions/cache/save@") and save["if"] == "always()"
    assert restore["with"]["path"] == save["with"]["path"]
    assert job["permissions"] == {"contents": "read", "actions": "write", "issues": "write"}


def test_the_watch_step_passes_arguments_watch_takes(
    tmp_path: Path, workflow: dict[str, Any]
) -> None:
    log = tmp_path / "argv"
    argv_recorder(tmp_path / "bin", "repromatrix", log)
    env = {
        "WATCH_MATRIX": "fleet/my matrix.yaml", "WATCH_SCENARIOS": "scenarios",
        "WATCH_BASELINE": "v0.31.0", "WATCH_WEBHOOK": "https://hooks.example/x",
        "WATCH_SITE_URL": "", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"),
        "GITHUB_REPOSITORY": "team/compat", "GITHUB_REF_NAME": "main",
        "PATH": real_path(tmp_path / "bin"),
    }  # fmt: skip
    ran = run_script(step(workflow["jobs"]["watch"], "Grade")["run"], env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    [argv] = calls(log)
    args = build_parser().parse_args(argv)
    assert (args.command, args.matrix, args.baseline) == (
        "watch", Path("fleet/my matrix.yaml"), ["v0.31.0"],
    )  # fmt: skip
    assert (args.fleet, args.fleet_repo, args.webhook) == (
        "github", "team/compat", "https://hooks.example/x",
    )  # fmt: skip
    assert args.site_url is None and args.summary == tmp_path / "summary"


def test_without_a_baseline_the_round_stops_and_says_what_to_set(
    tmp_path: Path, workflow: dict[str, Any]
) -> None:
    env = {"WATCH_BASELINE": "", "PATH": real_path(tmp_path / "bin")}
    ran = run_script(step(workflow["jobs"]["watch"], "Grade")["run"], env, cwd=tmp_path)
    assert ran.returncode == 2 and "WATCH_BASELINE" in ran.stdout


def test_the_fleet_results_of_each_handoff_are_fetched_once(
    tmp_path: Path, workflow: dict[str, Any]
) -> None:
    log = tmp_path / "gh-calls"
    # `gh run list` prints the watch-* run ids (as its --jq would); `gh run download` makes
    # the folder it is given.
    fake_tool(tmp_path / "bin", "gh", f"""echo "$*" >> "{log}"
if [ "$1 $2" = "run list" ]; then printf '11\\n12\\n'; exit 0; fi
mkdir -p "$7/cells"
""")  # fmt: skip
    (tmp_path / "results" / "fleet-11").mkdir(parents=True)
    env = {"PATH": real_path(tmp_path / "bin"), "GH_TOKEN": "x"}
    ran = run_script(step(workflow["jobs"]["watch"], "Fetch")["run"], env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    downloads = [line for line in log.read_text().splitlines() if line.startswith("run download")]
    assert downloads == ["run download 12 --name compat-matrix --dir results/fleet-12"]
    assert (tmp_path / "results" / "fleet-12" / "cells").is_dir()


def test_the_buildkite_pipeline_runs_one_round_at_a_time() -> None:
    pipeline = yaml.safe_load(BUILDKITE.read_text())
    [watch] = pipeline["steps"]
    assert watch["concurrency"] == 1 and watch["concurrency_group"] == "repromatrix/watch"
    assert "repromatrix watch" in watch["command"] and "--fleet buildkite" in watch["command"]

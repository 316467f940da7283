"""Run the fleet workflow's shell steps as a runner would, with stand-ins for CI's own tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from support import paths
from support.machine import program

ROOT = paths.ROOT
WORKFLOW = ROOT / ".github" / "workflows" / "compat-matrix.yml"
VENV_BIN = Path(sys.executable).parent
ECHO_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"


def load_workflow() -> dict[str, Any]:
    """The workflow as YAML data."""
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    return data


def step(job: dict[str, Any], name_part: str) -> dict[str, Any]:
    """The one step of ``job`` whose name (or action) contains ``name_part``."""
    [found] = [s for s in job["steps"] if name_part in s.get("name", s.get("uses", ""))]
    return found


def workflow_env(workflow: dict[str, Any], **inputs: str) -> dict[str, str]:
    """The workflow-level env as GitHub evaluates it for these inputs (defaults for the rest)."""
    dispatch = workflow[True]["workflow_dispatch"]["inputs"]  # YAML 1.1 reads `on` as true
    values = {name: spec.get("default", "") for name, spec in dispatch.items()}
    values.update(inputs)
    env = {
        "REPROMATRIX_MATRIX": values["matrix"],
        "REPROMATRIX_SCENARIOS": values["scenarios"],
        "REPROMATRIX_ONLY": values["only"],
        "REPROMATRIX_SKIP": values["skip"],
        "REPROMATRIX_PACKAGE": values["package"],
        "BASELINE": values["baseline"],
        "CANDIDATE": values["candidate"],
        "JOB_MINUTES": str(workflow["env"]["JOB_MINUTES"]),
        "REPROMATRIX_LOCK_JSON": values["lock"],
        "LOCK": str(workflow["env"]["LOCK"]),
    }
    return env


def run_script(
    script: str, env: dict[str, str], cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run a step's script with GitHub's default shell options."""
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def fake_tool(folder: Path, name: str, body: str) -> Path:
    """Write an executable stand-in for a CI tool into ``folder`` (a sh script)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def argv_recorder(folder: Path, name: str, log: Path) -> Path:
    """A stand-in that appends its argv (JSON, one line per call) to ``log``."""
    return fake_tool(folder, name, f'"{sys.executable}" -c \'{ECHO_ARGV}\' "$@" >> "{log}"\n')


def calls(log: Path) -> list[list[str]]:
    """The argv of each recorded call."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def real_path(*first: Path) -> str:
    """PATH with ``first`` ahead of this venv (whose ``repromatrix`` is the checkout's)."""
    return os.pathsep.join([*map(str, first), str(VENV_BIN), os.environ["PATH"]])


def check_schema(path: Path, schema: str) -> subprocess.CompletedProcess[str]:
    """Validate ``path`` with check-jsonschema's built-in ``schema`` (offline); its result."""
    tool = program("check-jsonschema")
    assert tool, "the test is marked program('check-jsonschema')"
    return subprocess.run(
        [tool, "--builtin-schema", schema, str(path)], capture_output=True, text=True, check=False
    )

"""The ``repromatrix`` command, run as a user runs it: a separate Python process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import paths

# A token-shaped value in a run's environment: containers get it, nothing may keep it.
TOKEN = "hf_repromatrixNotARealToken0123456789"
ENV = {**os.environ, "HF_TOKEN": TOKEN}


def argv(*args: str) -> list[str]:
    """The argv that runs ``repromatrix ARGS`` with this Python."""
    return [sys.executable, "-m", "repromatrix", *args]


def repromatrix(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``repromatrix ARGS`` in the project root; its output captured, never raising."""
    return subprocess.run(
        argv(*args),
        cwd=paths.ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def run_zoo_cells(cell_ids: list[str], results: Path, run_id: str, timeout: float) -> Path:
    """Run the zoo's cells ``cell_ids`` for real into ``results/run_id``; its folder."""
    only = [arg for cell in cell_ids for arg in ("--only", cell)]
    done = repromatrix(
        "run", "--lane", "cpu", "--scenarios", "scenarios/zoo", *only,
        "--results", str(results), "--run-id", run_id, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return results / run_id

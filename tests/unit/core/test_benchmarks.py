"""Every benchmark runs in quick mode: a refactor that breaks one fails here, not when someone
next wants its figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import paths

BENCHMARKS = paths.ROOT / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("bench_*.py"))
HELPERS = sorted(p for p in BENCHMARKS.glob("*.py") if p not in SCRIPTS)


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` under this interpreter with the package and the benchmarks importable, and a
    Docker engine address that leads nowhere: quick mode must not need one."""
    importable = [str(paths.ROOT / "src"), str(BENCHMARKS), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(importable)}
    env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"
    command = [sys.executable, *argv]
    return subprocess.run(
        command, cwd=paths.ROOT, env=env, capture_output=True, text=True, check=False
    )


def test_the_benchmarks_are_found() -> None:
    # An empty glob would parametrize the test below with nothing, and nothing fails.
    assert SCRIPTS, f"no bench_*.py in {BENCHMARKS}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_each_benchmark_runs_in_quick_mode_and_prints_its_figures(script: Path) -> None:
    done = run([str(script), "--quick"])
    assert done.returncode == 0, f"{script.name} --quick exited {done.returncode}:\n{done.stderr}"
    assert done.stdout.strip(), f"{script.name} --quick printed no figures"


@pytest.mark.parametrize("helper", HELPERS, ids=lambda path: path.stem)
def test_each_benchmark_helper_imports(helper: Path) -> None:
    # Helpers for the parts quick mode skips (real_cells.py: real Docker runs) rot too.
    done = run(["-c", f"import {helper.stem}"])
    assert done.returncode == 0, done.stderr

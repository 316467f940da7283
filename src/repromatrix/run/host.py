"""What this runner has to offer cells, read once per run."""

from __future__ import annotations

import shutil
import subprocess

from repromatrix.backends.base import Host


def host_gpu_count() -> int:
    """How many NVIDIA GPUs this host has (0 without ``nvidia-smi`` or a driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def detect_host() -> Host:
    """This host's GPUs."""
    return Host(gpus=host_gpu_count())

"""What this runner has to offer cells, read once per run."""

from __future__ import annotations

import os
import shutil
import subprocess

from repromatrix.backends.base import Host
from repromatrix.backends.gpus import runner_gpus


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


def detect_host(gpus: str | None = None, *, rehearse: bool = False) -> Host:
    """This runner's GPUs: ``--gpus``, else ``CUDA_VISIBLE_DEVICES`` or
    ``NVIDIA_VISIBLE_DEVICES``, else every GPU of the host."""
    ids = runner_gpus(os.environ, gpus, host_gpu_count())
    return Host(gpu_ids=ids, rehearse=rehearse)

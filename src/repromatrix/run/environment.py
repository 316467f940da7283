"""Each image's environment report on this runner: vLLM's own collector, once per image and runner.

``python3 -m vllm.collect_env`` inside the image (``Backend.environment_report``)
says what vLLM's bug template asks for: the OS, the torch and CUDA builds, the
GPUs and their driver, vLLM's version and build flags, the relevant variables.
It runs once per image and runner: a report is kept in the host cache under a
key of the image (its digest) and of the runner (host, kernel, the GPUs it lists
and lends), so the next run of an unchanged image on an unchanged runner reads
it back instead of importing torch and vLLM again. Each run folder holds its
own copy (``results.store.write_environment``), and each of the image's cells
points at it.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from repromatrix.backends.base import Backend, Prepared
from repromatrix.host.runner import Runner
from repromatrix.results import store


@dataclass(frozen=True)
class EnvironmentReports:
    """Where the reports of one run go: its folder, and the host's cache of reports."""

    run_dir: Path
    cache: Path
    runner: Runner

    def save(self, backend: Backend, prepared: Prepared, note: Callable[[str], None]) -> str | None:
        """The report of ``prepared`` saved in the run folder (made, or read from the cache);
        its path in the run, or None (and a line saying why) when vLLM's collector failed."""
        cached = self.cache / f"{report_key(backend.name, prepared, self.runner)}.txt"
        text = _read(cached)
        if text is None:
            report = backend.environment_report(prepared)
            if report.text is None:
                note(f"no environment report for {prepared.image_key}: {report.error}")
                return None
            text = report.text
            store.atomic_write(cached, text.encode("utf-8"))
        return store.write_environment(self.run_dir, prepared.image_key, text)


def report_key(backend: str, prepared: Prepared, runner: Runner) -> str:
    """What makes two reports the same: the backend, the image, and the runner as it is."""
    identity = {
        "backend": backend,
        "image": prepared.digest or prepared.ref,
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "gpus": [asdict(gpu) for gpu in runner.gpus],
        "lent": list(runner.gpu_ids),
        "rehearse": runner.rehearse,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None

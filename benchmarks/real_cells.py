"""Real CPU-lane cells through ``repromatrix run --jobs N`` (for ``bench_schedule.py --real``).

The real command path: plan, images (reused when built: ``nox -s matrix`` or
``repromatrix run --lane cpu --prepare-only`` makes them), the tiny model, the
cell stage's pool, results on disk. Each call is a fresh run folder under
``/tmp``; the wall clock covers the whole command, image checks included.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from repromatrix.results import store

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("/tmp/repromatrix-bench-schedule")


def run_real(selection: str, jobs: int) -> tuple[float, dict[str, str]]:
    """Run the selected CPU cells with ``--jobs jobs``; the wall clock and each cell's outcome."""
    run_id = f"bench-jobs{jobs}-{time.strftime('%H%M%S')}"
    argv = [
        sys.executable, "-m", "repromatrix", "run", "--lane", "cpu", "--only", selection,
        "--backend", "docker", "--jobs", str(jobs), "--results", str(OUT), "--run-id", run_id,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode not in (0, 3):
        raise SystemExit(f"repromatrix run --jobs {jobs} exited {done.returncode}:\n{done.stderr}")
    found, _ = store.read_results(OUT / run_id)
    return wall, {r.id: r.outcome.value for r in found}

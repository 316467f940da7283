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
from collections.abc import Sequence
from pathlib import Path

from repromatrix.results import store

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("/tmp/repromatrix-bench-schedule")


def run_real(
    selection: str | Sequence[str], jobs: int, *extra: str
) -> tuple[float, dict[str, str]]:
    """Run the selected CPU cells with ``--jobs jobs``; the wall clock and each cell's outcome."""
    run_id = f"bench-jobs{jobs}-{time.strftime('%H%M%S')}"
    only = [selection] if isinstance(selection, str) else list(selection)
    argv = [
        sys.executable, "-m", "repromatrix", "run", "--lane", "cpu",
        *(arg for glob in only for arg in ("--only", glob)), "--backend", "docker",
        "--jobs", str(jobs), "--results", str(OUT), "--run-id", run_id, *extra,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode not in (0, 3):
        raise SystemExit(f"repromatrix run --jobs {jobs} exited {done.returncode}:\n{done.stderr}")
    found, _ = store.read_results(OUT / run_id)
    return wall, {r.id: r.outcome.value for r in found if "--prepare-only" not in extra}


def remove_image(version: str) -> None:
    """Remove the CPU lane's built image of ``version`` (it is built again by the next run)."""
    listed = subprocess.run(
        ["docker", "images", "-q", f"repromatrix/cell-cpu-{version}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for image_id in sorted(set(listed.stdout.split())):
        subprocess.run(["docker", "rmi", "-f", image_id], capture_output=True, check=False)

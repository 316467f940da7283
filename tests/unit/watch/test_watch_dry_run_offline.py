"""``watch --dry-run`` on a lane that lists its tags answers without a registry: the listed
images are shown by their tags, digests unknown, said once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repromatrix.cli import main
from support.matrix import BASELINE, write
from support.webhook import free_port

MATRIX = """
lanes:
  gpu:
    registry: 127.0.0.1:{port}/vllm/vllm-openai
    images: [v0.31.0, v0.32.0]
    gpus: {{h100: {{runner: gpu-h100, count: 1, compute_capability: "9.0", memory_gib: 80}}}}
    models: {{dense: {{source: org/dense}}}}
"""


def test_listed_tags_are_answered_when_the_registry_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU here, whatever the host has
    write(tmp_path / "scenarios", "healthy.yaml", BASELINE)
    matrix = write(tmp_path, "matrix.yaml", MATRIX.format(port=free_port()))
    argv = ["watch", "--matrix", str(matrix), "--scenarios", str(tmp_path / "scenarios"),
            "--results", str(tmp_path / "results"), "--site", str(tmp_path / "site"),
            "--lane", "gpu", "--baseline", "v0.31.0", "--dry-run"]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    described = json.loads(captured.out)
    assert [(d["tag"], d["digest"]) for d in described] == [("v0.31.0", None), ("v0.32.0", None)]
    said = [line for line in captured.err.splitlines() if "digests unknown" in line]
    assert len(said) == 1
    assert "2 listed images shown by their tags, digests unknown" in said[0]
    assert not (tmp_path / "results").exists()


def test_without_dry_run_an_unanswered_registry_is_still_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    write(tmp_path / "scenarios", "healthy.yaml", BASELINE)
    matrix = write(tmp_path, "matrix.yaml", MATRIX.format(port=free_port()))
    argv = ["watch", "--matrix", str(matrix), "--scenarios", str(tmp_path / "scenarios"),
            "--results", str(tmp_path / "results"), "--site", str(tmp_path / "site"),
            "--lane", "gpu", "--baseline", "v0.31.0"]  # fmt: skip
    assert main(argv) != 0
    assert "registry" in capsys.readouterr().err


def test_a_baseline_written_unlike_the_lanes_tags_names_the_tag_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    write(tmp_path / "scenarios", "healthy.yaml", BASELINE)
    matrix = write(tmp_path, "matrix.yaml", MATRIX.format(port=free_port()))
    argv = ["watch", "--matrix", str(matrix), "--scenarios", str(tmp_path / "scenarios"),
            "--results", str(tmp_path / "results"), "--site", str(tmp_path / "site"),
            "--lane", "gpu", "--baseline", "0.31.0", "--dry-run"]  # fmt: skip
    assert main(argv) == 2
    assert "Perhaps you meant `v0.31.0`?" in capsys.readouterr().err

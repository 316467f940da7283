"""A round of ``watch`` bounded and checked: at most N new tags a round (the rest named and
left for later rounds, their digests never asked), its own options checked before the
registry is asked anything, and ``--fleet none`` answering the cells this host cannot run
as not run. The registry is a real HTTP server on the loopback that counts its requests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.grammars import check_run_id
from repromatrix.matrix.images import make_image
from repromatrix.values import Lane
from repromatrix.watch.candidates import Candidate
from support.matrix import BASELINE, write
from support.registry import StandIn, stand_in_registry

MATRIX = """
lanes:
  gpu:
    registry: {host}/vllm/vllm-openai
    images: {{follow: ">=0.1"}}
    gpus: {{h100: {{runner: gpu-h100, count: 1, compute_capability: "9.0", memory_gib: 80}}}}
    models: {{dense: {{source: org/dense}}}}
"""


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU here, whatever the host has
    with stand_in_registry() as stand_in:
        for minor in range(1, 51):
            stand_in.push(f"v0.{minor}.0")
        yield stand_in


def _argv(tmp_path: Path, registry: StandIn, *extra: str) -> list[str]:
    write(tmp_path / "scenarios", "healthy.yaml", BASELINE)
    matrix = write(tmp_path, "matrix.yaml", MATRIX.format(host=registry.host))
    return ["watch", "--matrix", str(matrix), "--scenarios", str(tmp_path / "scenarios"),
            "--results", str(tmp_path / "results"), "--site", str(tmp_path / "site"),
            "--baseline", "v0.1.0", "--backend", "docker", *extra]  # fmt: skip


def test_a_round_takes_at_most_n_new_tags_and_names_the_rest(
    registry: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _argv(tmp_path, registry, "--max-new-tags", "3", "--dry-run")
    assert main(argv) == 0
    described = json.loads(capsys.readouterr().out)
    assert [d["tag"] for d in described] == ["v0.1.0", "v0.2.0", "v0.3.0"]
    heads = [path for path in registry.asked if "/manifests/" in path]
    assert len(heads) == 3  # one digest asked per tag taken, none for those left


def test_the_round_says_what_it_left(
    registry: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(tmp_path, registry, "--max-new-tags", "2", "--dry-run")) == 0
    err = capsys.readouterr().err
    assert "48 new tags left for later rounds (at most 2 new tags a round" in err
    assert "v0.3.0, v0.4.0" in err and "and 40 more" in err


@pytest.mark.parametrize(
    "extra",
    [("--only", ""), ("--skip", " "), ("--max-new-tags", "0"), ("--lane", "cpu")],
)
def test_its_own_options_are_checked_before_the_registry_is_asked(
    registry: StandIn, tmp_path: Path, extra: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(tmp_path, registry, *extra)) == 2
    assert registry.asked == []
    assert "Traceback" not in capsys.readouterr().err


def test_without_a_fleet_the_cells_this_host_cannot_run_are_answered_not_run(
    registry: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _argv(tmp_path, registry, "--only", "gpu/v0.1.0/*", "--fleet", "none")
    status = main(argv)
    err = capsys.readouterr().err
    assert status in (0, 1), err
    assert "answered as not run" in err and "Traceback" not in err
    history = json.loads((tmp_path / "site" / "history.json").read_text())
    [points] = history["cells"].values()
    assert [p["outcome"] for p in points] == ["skipped"]


PASSWORD = "hunter2-webhook-password"


@pytest.mark.parametrize(
    ("option", "url", "words"),
    [
        ("--webhook", "http://[::1/hook", "is not a URL"),
        ("--site-url", "https://[2001:db8::1/site", "is not a URL"),
        ("--webhook", "http://127.0.0.1:99999/hook", "is not a URL"),
        ("--webhook", f"https://bot:{PASSWORD}@hooks.example/x", "holds a user name or password"),
        ("--site-url", f"https://{PASSWORD}@site.example/", "holds a user name or password"),
    ],
)
def test_a_url_option_that_is_no_url_to_send_to_is_refused_at_parse(
    registry: StandIn,
    tmp_path: Path,
    option: str,
    url: str,
    words: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REPROMATRIX_WEBHOOK_SECRET", "s")
    assert main(_argv(tmp_path, registry, option, url)) == 2
    err = capsys.readouterr().err
    assert f"{option}: " in err and words in err
    assert PASSWORD not in err and "Traceback" not in err
    assert registry.asked == []


@pytest.mark.parametrize("tag", ["v0.32.0", "nightly-" + "0123456789" * 4, "x" * 128])
def test_a_candidate_s_run_id_is_a_run_id_whatever_its_tag(tag: str) -> None:
    image = make_image(Lane.GPU, tag, None, "vllm/vllm-openai", None)
    made = Candidate(Lane.GPU, image, "sha256:" + "ab" * 32)
    assert check_run_id(made.run_id) is None
    other = Candidate(Lane.GPU, make_image(Lane.GPU, tag + "x", None, "r", None), made.digest)
    assert other.run_id != made.run_id  # cut tags stay apart

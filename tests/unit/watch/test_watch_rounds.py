"""Rounds of ``watch`` whose cells all go to the fleet: found, handed over once, waited for,
answered once the fleet's results are in, published and sent; nothing new is nothing done.
And bad input: each a clear message and exit code, nothing published half-way.

The registry, the GitHub API and the webhook are real HTTP servers on the loopback; the
fleet's results are written as a fleet's merged folder is (``results.store``). No cell runs
on this host (GPU cells, no GPU), so no Docker is needed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from repromatrix.cli import main
from repromatrix.judgement import Expected, Outcome
from repromatrix.publish.history import HISTORY_FILE, read_history
from support.matrix import BASELINE, write
from support.registry import StandIn, stand_in_registry
from support.reports import result, write_run
from support.upgrade import move_counts
from support.webhook import Receiver, free_port, receiver

SECRET = "loopback-secret"
CELL = "gpu/{tag}/h100/dense/default/healthy/baseline"
TOKEN = "ghp_loopback0000"
MATRIX = """
lanes:
  gpu:
    registry: {host}/vllm/vllm-openai
    images: {{follow: "{rule}"}}
    gpus: {{h100: {{runner: gpu-h100, count: 1, compute_capability: "9.0", memory_gib: 80}}}}
    models: {{dense: {{source: org/dense}}}}
"""


@dataclass
class World:
    tmp: Path
    registry: StandIn
    api: Receiver
    hook: Receiver

    def matrix(self, rule: str = ">=0.31") -> Path:
        write(self.tmp / "scenarios", "healthy.yaml", BASELINE)
        return write(self.tmp, "matrix.yaml", MATRIX.format(host=self.registry.host, rule=rule))

    def argv(self, *extra: str, baseline: str = "v0.31.0", rule: str = ">=0.31") -> list[str]:
        return ["watch", "--matrix", str(self.matrix(rule)), "--scenarios",
                str(self.tmp / "scenarios"), "--results", str(self.tmp / "results"),
                "--site", str(self.tmp / "site"), "--baseline", baseline, "--backend", "docker",
                "--fleet", "github", "--fleet-repo", "team/compat", "--fleet-api", self.api.url,
                "--webhook", self.hook.url, "--webhook-attempts", "1", *extra]  # fmt: skip

    def fleet_results(self, folder: str, tag: str, outcome: Outcome = Outcome.AVOIDED) -> None:
        """What the fleet's merged artifact holds, downloaded into the results root."""
        digest = self.registry.tags[tag]
        cell = result(lane="gpu", tag=tag, gpu="h100", model="dense", scenario="healthy",
                      variant="baseline", outcome=outcome, expected=Expected.AVOIDED,
                      image_digest=f"{self.registry.host}/vllm/vllm-openai@{digest}",
                      run_id=f"gh-{folder}", root_cause=None)  # fmt: skip
        write_run(self.tmp / "results" / folder, [cell])

    def answers(self) -> list[dict[str, Any]]:
        return [got.json() for got in self.hook.got]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("REPROMATRIX_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU here, whatever the host has
    with stand_in_registry() as registry, receiver(status=204) as api, receiver() as hook:
        registry.push("v0.30.0")
        registry.push("v0.31.0")
        registry.push("v0.32.0")
        registry.tags["latest"] = registry.tags["v0.32.0"]
        yield World(tmp_path, registry, api, hook)


def test_rounds_hand_over_wait_answer_then_find_nothing_then_a_moved_digest(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1. Two new tags (the baseline first); their GPU cells go to the fleet, once each.
    assert main(world.argv()) == 0
    dispatched = [got.json()["inputs"] for got in world.api.got]
    # exactly the cells this host cannot run, whatever else the tag has
    assert [d["only"] for d in dispatched] == [
        CELL.format(tag="v0.31.0"),
        CELL.format(tag="v0.32.0"),
    ]
    lock = json.loads(dispatched[1]["lock"])
    assert [i["tag"] for i in lock["lanes"]["gpu"]["images"]] == ["v0.32.0"]
    assert lock["lanes"]["gpu"]["images"][0]["digest"] == world.registry.tags["v0.32.0"]
    assert world.api.got[0].headers["Authorization"] == f"Bearer {TOKEN}"
    assert not (world.tmp / "site").exists() and world.hook.got == []

    # 2. The fleet has not answered: waited for, not handed over again.
    assert main(world.argv()) == 0
    assert len(world.api.got) == 2
    assert "waiting for the fleet's 1 cells" in capsys.readouterr().err

    # 3. The fleet's results arrive: each tag answered, published, sent; v0.32.0 against
    # the v0.31.0 published a moment before.
    world.fleet_results("fleet-1", "v0.31.0")
    world.fleet_results("fleet-2", "v0.32.0")
    assert main(world.argv()) == 0
    first, second = world.answers()
    assert (first["tag"], first["changes"]["compared"], first["safety"]) == (
        "v0.31.0", False, "safe",
    )  # fmt: skip
    assert second["changes"]["baseline"] == "v0.31.0"
    assert move_counts(second["changes"]["counts"])["safe->safe"] == 1
    assert len(read_history(world.tmp / "site").runs) == 2

    # 4. Nothing new: nothing handed over, published or sent.
    capsys.readouterr()
    assert main(world.argv()) == 0
    assert "nothing new: the 2 images the matrix gives are all graded" in capsys.readouterr().err
    assert len(world.api.got) == 2 and len(world.hook.got) == 2

    # 5. v0.32.0 moves: its new digest is a new image, handed over again.
    moved = world.registry.push("v0.32.0", stamp="2")
    assert main(world.argv()) == 0
    [again] = world.api.got[2:]
    assert (
        json.loads(again.json()["inputs"]["lock"])["lanes"]["gpu"]["images"][0]["digest"] == moved
    )


def test_an_interrupted_round_resumes_with_the_cells_it_has(world: World) -> None:
    # A result already in the results root (the fleet's, or this host's before a Ctrl-C)
    # is kept: only the rest is asked for.
    world.fleet_results("fleet-1", "v0.31.0")
    world.registry.tags.pop("v0.32.0")
    world.registry.tags.pop("latest")
    assert main(world.argv()) == 0
    assert world.api.got == []  # nothing left to hand over
    [answer] = world.answers()
    assert answer["tag"] == "v0.31.0" and answer["cells"]["ran"] == 1


def test_a_worse_new_tag_exits_1_with_its_answer_sent(world: World) -> None:
    world.fleet_results("fleet-1", "v0.31.0")
    world.fleet_results("fleet-2", "v0.32.0", outcome=Outcome.OTHER_FAILURE)
    assert main(world.argv()) == 1
    answer = world.answers()[-1]
    assert answer["worse"] and answer["safety"] == "not_safe"
    assert move_counts(answer["changes"]["counts"])["safe->not_safe"] == 1


def test_a_dry_run_shows_the_fleet_call_and_sends_nothing(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*world.argv(), "--dry-run"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert [d["tag"] for d in described] == ["v0.31.0", "v0.32.0"]
    call = described[1]["handoff"]
    assert call["url"] == (
        f"{world.api.url}/repos/team/compat/actions/workflows/compat-matrix.yml/dispatches"
    )
    assert call["headers"]["Authorization"] == "<secret>" and TOKEN not in json.dumps(call)
    assert call["body"]["inputs"]["only"] == CELL.format(tag="v0.32.0")
    assert described[1]["fleet"] == [CELL.format(tag="v0.32.0")]
    assert world.api.got == [] and world.hook.got == []
    assert not (world.tmp / "results" / "watch").exists()


# Bad input: a clear message, its exit code, nothing published.


def site_is_untouched(world: World) -> bool:
    return not (world.tmp / "site").exists() or (
        (world.tmp / "site" / HISTORY_FILE).read_text() == "not json at all"
    )


def error_of(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err


def test_a_baseline_not_in_the_history_nor_offered(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(world.argv(baseline="v0.29.0")) == 2
    err = error_of(capsys)
    assert "--baseline v0.29.0: not in the history of" in err
    assert "nor among the tags the matrix gives now (v0.31.0, v0.32.0)" in err
    assert site_is_untouched(world) and world.api.got == []


def test_a_malformed_history(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    (world.tmp / "site").mkdir()
    (world.tmp / "site" / HISTORY_FILE).write_text("not json at all")
    assert main(world.argv()) == 2
    assert f"{HISTORY_FILE}: not a history this repromatrix can extend" in error_of(capsys)
    assert site_is_untouched(world) and world.api.got == []


def test_a_history_with_a_point_no_run_wrote(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    (world.tmp / "site").mkdir()
    cell = "gpu/v0.31.0/h100/dense/default/healthy/baseline"
    point = {"run": "r", "date": "2026-11-30T10:00:00+00:00", "outcome": "exploded",
             "verdict": "pass", "version": None,
             "digest": None, "cause": "", "page": ""}  # fmt: skip
    document = {"schema_version": 1, "runs": [], "cells": {cell: [point]}}
    (world.tmp / "site" / HISTORY_FILE).write_text(json.dumps(document))
    assert main(world.argv()) == 2
    assert "'exploded'" in error_of(capsys)


def test_a_follow_rule_that_matches_no_tag(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(world.argv(rule=">=0.40")) == 2
    err = error_of(capsys)
    assert "matrix.yaml:4:" in err and "takes none of the tags of" in err
    assert "v0.32.0: outside `>=0.40`" in err and "latest: not a version" in err
    assert site_is_untouched(world)


def test_an_unreachable_registry_is_exit_3(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = world.argv()
    argv[argv.index("--matrix") + 1] = str(
        write(world.tmp, "down.yaml", MATRIX.format(host=f"127.0.0.1:{free_port()}", rule="all"))
    )
    assert main(argv) == 3
    assert "Connection refused" in error_of(capsys)
    assert site_is_untouched(world)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--webhook", "ftp://hooks.example.com/x", "is not an http(s) URL"),
        ("--webhook", "hooks.example.com/x", "is not an http(s) URL"),
        ("--github-api", "file:///tmp/api", "is not an http(s) URL"),
        ("--site-url", "javascript:alert(1)", "is not an http(s) URL"),
    ],
)
def test_a_url_that_is_not_http(
    world: World, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    argv = [*world.argv(), flag, value]
    if flag == "--github-api":
        argv += ["--github-repo", "team/compat"]
    assert main(argv) == 2
    assert message in error_of(capsys)
    assert site_is_untouched(world) and world.api.got == []


def test_a_lane_with_new_images_and_no_baseline_of_its_own(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = world.argv()
    cpu = '  cpu:\n    images: ["0.31.0"]\n    gpus: {cpu: {runner: ubuntu-latest, count: 0}}\n'
    cpu += "    models: {tiny: {source: tiny-llama}}\n"
    text = MATRIX.format(host=world.registry.host, rule=">=0.31") + cpu
    argv[argv.index("--matrix") + 1] = str(write(world.tmp, "both.yaml", text))
    assert main(argv) == 2
    assert "lane cpu has new images (0.31.0) but no --baseline of its own" in error_of(capsys)
    assert world.api.got == []


def test_a_webhook_without_its_secret(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REPROMATRIX_WEBHOOK_SECRET")
    assert main(world.argv()) == 2
    assert "set the shared secret in $REPROMATRIX_WEBHOOK_SECRET" in error_of(capsys)


LISTED = """
lanes:
  gpu:
    registry: {host}/vllm/vllm-openai
    images: [v0.31.0, nightly]
    gpus: {{h100: {{runner: gpu-h100, count: 1, compute_capability: "9.0", memory_gib: 80}}}}
    models: {{dense: {{source: org/dense}}}}
"""


def test_a_listed_moving_tag_is_handed_over_pinned_and_again_once_it_moves(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.registry.push("nightly")
    argv = world.argv()
    matrix = write(world.tmp, "listed.yaml", LISTED.format(host=world.registry.host))
    argv[argv.index("--matrix") + 1] = str(matrix)
    assert main(argv) == 0
    nightly = world.api.got[-1].json()["inputs"]
    lock_text = nightly["lock"]
    assert json.loads(lock_text)["lanes"]["gpu"]["images"] == [
        {"tag": "nightly", "digest": world.registry.tags["nightly"]}
    ]
    # The fleet's plan reads that lock: its cells pull the digest watch found.
    (world.tmp / "handed.lock.json").write_text(lock_text)
    capsys.readouterr()
    fleet = ["run", "--dry-run", "--backend", "docker", "--matrix", str(matrix), "--scenarios",
             str(world.tmp / "scenarios"), "--lock", str(world.tmp / "handed.lock.json"),
             "--only", nightly["only"], "--results", str(world.tmp / "fleet")]  # fmt: skip
    assert main(fleet) == 0
    [image] = json.loads(capsys.readouterr().out)["images"]
    [pull] = [c for c in image["calls"] if c["call"] == "images.pull"]
    registry = f"{world.registry.host}/vllm/vllm-openai"
    assert pull["ref"] == f"{registry}@{world.registry.tags['nightly']}"
    moved = world.registry.push("nightly", stamp="2")
    assert main(argv) == 0
    again = json.loads(world.api.got[-1].json()["inputs"]["lock"])
    assert again["lanes"]["gpu"]["images"][0]["digest"] == moved

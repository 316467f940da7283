"""A hostile registry on the loopback: its answers never lead the tool off its host.

The registry (``support.registry``) sends a next page, a bearer realm or a redirect to a
``file:`` URL or to a bystander on another loopback address (127.0.0.2), which counts
every request it gets; answers too big are cut off, and error text is redacted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.errors import InfraError, UsageError
from repromatrix.upstream import registry
from repromatrix.upstream.registry import list_tags
from support.matrix import BASELINE, write
from support.registry import StandIn, stand_in_registry

NAME = "vllm/vllm-openai"
SECRET = "hf_loopbacksecret0123456789abcdef"


@pytest.fixture
def hostile(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[StandIn, StandIn]]:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    with stand_in_registry() as asked, stand_in_registry("127.0.0.2") as bystander:
        asked.push("v0.31.0")
        asked.push("v0.32.0")
        yield asked, bystander


def _elsewhere(bystander: StandIn) -> str:
    return f"http://{bystander.host}/v2/{NAME}/tags/list"


LEADS = {
    "next page to a file": ("link", lambda b: "file:///proc/self/environ"),
    "next page to another host": ("link", _elsewhere),
    "next page to ftp": ("link", lambda b: f"ftp://{b.host}/x"),
    "realm a file": ("realm", lambda b: "file:///proc/self/environ"),
    "realm on another host": ("realm", lambda b: f"http://{b.host}/token"),
    "redirect to another host": ("redirect", _elsewhere),
    "redirect to a file": ("redirect", lambda b: "file:///proc/self/environ"),
}


@pytest.mark.parametrize("name", list(LEADS))
def test_an_answer_leading_off_the_host_is_not_followed(
    hostile: tuple[StandIn, StandIn], name: str
) -> None:
    asked, bystander = hostile
    field, target = LEADS[name]
    setattr(asked, field, target(bystander))
    with pytest.raises(InfraError, match=r"not (followed|asked)") as caught:
        list_tags(f"{asked.host}/{NAME}")
    assert "not" in str(caught.value) and SECRET not in str(caught.value)
    assert bystander.asked == []


def test_a_host_the_user_names_may_serve_the_token(
    hostile: tuple[StandIn, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked, bystander = hostile
    asked.realm = f"http://{bystander.host}/token"
    monkeypatch.setenv(registry.HOSTS_ENV, "127.0.0.2")
    with pytest.raises(InfraError, match="token service"):  # it answers no token: asked
        list_tags(f"{asked.host}/{NAME}")
    assert bystander.asked and bystander.asked[0].startswith("/token")


def test_an_answer_past_the_bound_is_refused_unread(
    hostile: tuple[StandIn, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked, _ = hostile
    monkeypatch.setattr(registry, "MAX_BODY", 1000)
    asked.body = b'{"tags": [' + b'"v0.1.0",' * 1000 + b'"v0.2.0"]}'
    with pytest.raises(InfraError, match="more than 1000 bytes"):
        list_tags(f"{asked.host}/{NAME}")


def test_an_error_answer_is_redacted(hostile: tuple[StandIn, StandIn]) -> None:
    asked, _ = hostile
    asked.body = f"not json {SECRET}".encode()
    with pytest.raises(InfraError) as caught:
        list_tags(f"{asked.host}/{NAME}")
    assert SECRET not in str(caught.value)


def test_a_tag_with_a_space_is_refused_before_any_url_is_made(
    hostile: tuple[StandIn, StandIn],
) -> None:
    asked, _ = hostile
    with pytest.raises(UsageError, match="holds a space"):
        registry.tag_digest(f"{asked.host}/{NAME}", "v0.32.0 x")


def test_tags_with_spaces_or_trailing_whitespace_never_reach_the_lock(
    hostile: tuple[StandIn, StandIn], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asked, _ = hostile
    for tag in ("v0.33.0 x", "v0.34.0 ", "v0.35.0\t"):
        asked.push(tag)
    write(tmp_path / "scenarios", "healthy.yaml", BASELINE)
    matrix = write(tmp_path, "matrix.yaml", MATRIX.format(host=asked.host))
    assert main(["plan", "--matrix", str(matrix), "--scenarios", str(tmp_path / "scenarios")]) == 0
    lock = json.loads((tmp_path / "matrix.lock.json").read_text())["lanes"]["gpu"]
    assert [i["tag"] for i in lock["images"]] == ["v0.31.0", "v0.32.0"]
    assert {o["tag"] for o in lock["left_out"]} == {"v0.33.0\\x20x", "v0.34.0\\x20", "v0.35.0\\t"}
    assert not any("manifests/v0.3" in path and " " in path for path in asked.asked)
    assert "Traceback" not in capsys.readouterr().err


MATRIX = """
lanes:
  gpu:
    registry: {host}/vllm/vllm-openai
    images: {{follow: ">=0.31"}}
    gpus: {{h100: {{runner: gpu-h100, count: 1, compute_capability: "9.0", memory_gib: 80}}}}
    models: {{dense: {{source: org/dense}}}}
"""


@pytest.mark.parametrize("name", list(LEADS))
def test_a_round_of_watch_reads_no_file_and_contacts_no_other_host(
    hostile: tuple[StandIn, StandIn],
    tmp_path: Path,
    name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    asked, bystander = hostile
    field, target = LEADS[name]
    setattr(asked, field, target(bystander))
    write(tmp_path / "scenarios", "healthy.yaml", BASELINE)
    matrix = write(tmp_path, "matrix.yaml", MATRIX.format(host=asked.host))
    argv = ["watch", "--matrix", str(matrix), "--scenarios", str(tmp_path / "scenarios"),
            "--results", str(tmp_path / "results"), "--site", str(tmp_path / "site"),
            "--baseline", "v0.31.0", "--backend", "docker", "--fleet", "none"]  # fmt: skip
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "not followed" in err or "not asked" in err
    assert SECRET not in err and "Traceback" not in err
    assert bystander.asked == []
    assert not (tmp_path / "site").exists()

"""The GPU lane's versions read from a real local registry over its HTTP API."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.upstream.registry import list_tags
from support import paths

ROOT = paths.ROOT

NAME = "vllm/vllm-openai"

TAGS = ["v0.31.0", "v0.31.1rc0", "v0.32.0", "nightly", "v0.30.0", "latest"]

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def request(
    url: str, method: str = "GET", body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(url, data=body or None, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as response:
        status: int = response.status
        return status, dict(response.headers.items())


def push_tag(base: str, tag: str, config: bytes) -> None:
    """Upload a config blob and a manifest naming it under ``tag`` (the API docker push uses)."""
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    _, headers = request(f"{base}/v2/{NAME}/blobs/uploads/", "POST")
    location = headers["Location"]
    joiner = "&" if "?" in location else "?"
    request(
        f"{location}{joiner}digest={digest}",
        "PUT",
        config,
        {"Content-Type": "application/octet-stream"},
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": len(config),
            "digest": digest,
        },
        "layers": [],
    }
    body = json.dumps(manifest).encode()
    request(f"{base}/v2/{NAME}/manifests/{tag}", "PUT", body, {"Content-Type": MANIFEST})


@pytest.fixture(scope="module")
def local_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real registry on 127.0.0.1 holding ``TAGS`` of vllm/vllm-openai; yields host:port."""
    folder = tmp_path_factory.mktemp("registry")
    host = f"127.0.0.1:{free_port()}"
    config = folder / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: error}\n"
        f"storage: {{filesystem: {{rootdirectory: {folder / 'storage'}}}}}\n"
        f"http: {{addr: '{host}'}}\n",
        encoding="utf-8",
    )
    server = subprocess.Popen(
        ["docker-registry", "serve", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(100):
            try:
                request(f"http://{host}/v2/")
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the registry did not answer")
        for tag in TAGS:
            push_tag(f"http://{host}", tag, json.dumps({"tag": tag}).encode())
        yield host
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.program("docker-registry")
def test_the_tag_list_of_a_real_registry_is_read(local_registry: str) -> None:
    # distribution 2.8 answers tags/list in one page whatever `n` asks (the stdlib server
    # below checks the paging); asking for pages of two must still give every tag.
    tags = list_tags(f"{local_registry}/{NAME}", page=2)
    assert sorted(tags) == sorted(TAGS)


@pytest.mark.program("docker-registry")
def test_a_gpu_bisect_searches_the_version_tags_of_the_lanes_registry(
    local_registry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (ROOT / "matrix.yaml").read_text(encoding="utf-8")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text.replace(f"registry: {NAME}", f"registry: {local_registry}/{NAME}"))
    argv = ["bisect", "moe-lora-rank-over-128", "--lane", "gpu", "--level", "probe", "--plan"]
    argv += ["--matrix", str(matrix), "--scenarios", str(ROOT / "scenarios")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines()[1:] if line.startswith("  v")]
    assert listed == ["v0.30.0", "v0.31.0", "v0.31.1rc0", "v0.32.0"]
    assert "4 versions" in out
    assert "gpu/v0.30.0/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger@probe" in out

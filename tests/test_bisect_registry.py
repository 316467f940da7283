"""The GPU lane's versions: the tag list of a registry, read over the registry's HTTP API.

The first tests run a REAL registry (Debian's ``docker-registry``, the
distribution project's server) on 127.0.0.1 with a storage folder of the
test's own, push manifests to it over its API, and read the tag list back, directly
and through ``repromatrix bisect --plan``. The last ones serve the
same JSON from a tiny stdlib server to check the bearer-token challenge
Docker Hub answers with and the ``Link`` paging, which a local registry never sends.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from repromatrix.bisect.registry import Repository, list_tags, parse_repository
from repromatrix.cli import main
from repromatrix.errors import InfraError

ROOT = Path(__file__).resolve().parents[1]
NAME = "vllm/vllm-openai"
TAGS = ["v0.31.0", "v0.31.1rc0", "v0.32.0", "nightly", "v0.30.0", "latest"]
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"

needs_registry = pytest.mark.skipif(
    shutil.which("docker-registry") is None,
    reason="docker-registry is not installed (apt-get install -y docker-registry)",
)


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


@needs_registry
def test_the_tag_list_of_a_real_registry_is_read(local_registry: str) -> None:
    # distribution 2.8 answers tags/list in one page whatever `n` asks (the stdlib server
    # below checks the paging); asking for pages of two must still give every tag.
    tags = list_tags(f"{local_registry}/{NAME}", page=2)
    assert sorted(tags) == sorted(TAGS)


@needs_registry
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


def test_parse_repository_tells_the_registry_host_from_the_name() -> None:
    assert parse_repository("vllm/vllm-openai") == Repository("registry-1.docker.io", NAME)
    assert parse_repository("ubuntu") == Repository("registry-1.docker.io", "library/ubuntu")
    assert parse_repository(f"127.0.0.1:5000/{NAME}") == Repository("127.0.0.1:5000", NAME)
    assert parse_repository(f"localhost/{NAME}").base == "http://localhost"
    assert parse_repository(f"127.0.0.1:5000/{NAME}").base == "http://127.0.0.1:5000"
    assert parse_repository(f"ghcr.io/{NAME}").base == "https://ghcr.io"


class HubLike(BaseHTTPRequestHandler):
    """Serves tags behind a bearer challenge, two per page, as Docker Hub's API does."""

    def do_GET(self) -> None:
        port = self.server.server_address[1]  # type: ignore[index]
        if self.path.startswith("/token"):
            assert "scope=repository%3Avllm%2Fvllm-openai%3Apull" in self.path
            return self._json(200, {"token": "anonymous"})
        if self.headers.get("Authorization") != "Bearer anonymous":
            challenge = (
                f'Bearer realm="http://127.0.0.1:{port}/token",service="hub",'
                f'scope="repository:{NAME}:pull"'
            )
            return self._json(401, {"errors": []}, {"WWW-Authenticate": challenge})
        last = self.path.partition("last=")[2].partition("&")[0]
        start = TAGS.index(last) + 1 if last else 0
        page = TAGS[start : start + 2]
        extra = {}
        if start + 2 < len(TAGS):
            extra["Link"] = f'</v2/{NAME}/tags/list?n=2&last={page[-1]}>; rel="next"'
        return self._json(200, {"name": NAME, "tags": page}, extra)

    def _json(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def hub_like() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubLike)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_bearer_challenge_is_answered_and_every_page_read(hub_like: str) -> None:
    assert list_tags(f"{hub_like}/{NAME}", page=2) == tuple(TAGS)


def test_a_registry_that_is_not_there_is_an_infra_error() -> None:
    with pytest.raises(InfraError, match="registry"):
        list_tags(f"127.0.0.1:{free_port()}/{NAME}")

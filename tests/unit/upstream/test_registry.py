"""A GPU lane's registry over its HTTP API: the tag list, and the digest each tag points at.

The first tests run a REAL registry (Debian's ``docker-registry``, the
distribution project's server) on 127.0.0.1 with a storage folder of the
test's own, push manifests to it over its API, and read the tag list back, directly
and through ``repromatrix bisect --plan``. The last ones serve the
same JSON from a tiny stdlib server to check the bearer-token challenge
Docker Hub answers with and the ``Link`` paging, which a local registry never sends.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from repromatrix.errors import InfraError
from repromatrix.upstream.registry import Repository, list_tags, parse_repository, tag_digest

NAME = "vllm/vllm-openai"
TAGS = ["v0.31.0", "v0.31.1rc0", "v0.32.0", "nightly", "v0.30.0", "latest"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_parse_repository_tells_the_registry_host_from_the_name() -> None:
    assert parse_repository("vllm/vllm-openai") == Repository("registry-1.docker.io", NAME)
    assert parse_repository("ubuntu") == Repository("registry-1.docker.io", "library/ubuntu")
    assert parse_repository(f"127.0.0.1:5000/{NAME}") == Repository("127.0.0.1:5000", NAME)
    assert parse_repository(f"localhost/{NAME}").base == "http://localhost"
    assert parse_repository(f"127.0.0.1:5000/{NAME}").base == "http://127.0.0.1:5000"
    assert parse_repository(f"ghcr.io/{NAME}").base == "https://ghcr.io"


DIGESTS = {tag: "sha256:" + format(i, "x") * 64 for i, tag in enumerate(TAGS, start=1)}


class HubLike(BaseHTTPRequestHandler):
    """Serves tags behind a bearer challenge, two per page, as Docker Hub's API does, and
    each tag's manifest digest to a HEAD (as ``Docker-Content-Digest``)."""

    def do_HEAD(self) -> None:
        tag = self.path.rpartition("/manifests/")[2]
        if self.headers.get("Authorization") != "Bearer anonymous":
            return self.do_GET()
        assert "application/vnd.oci.image.index.v1+json" in self.headers["Accept"]
        if tag not in DIGESTS:
            self.send_response(404)
            self.end_headers()
            return None
        self.send_response(200)
        self.send_header("Docker-Content-Digest", DIGESTS[tag])
        self.end_headers()
        return None

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


def test_each_tag_s_digest_is_asked_with_a_head_behind_the_challenge(hub_like: str) -> None:
    assert tag_digest(f"{hub_like}/{NAME}", "v0.32.0") == DIGESTS["v0.32.0"]
    with pytest.raises(InfraError, match="HTTP 404"):
        tag_digest(f"{hub_like}/{NAME}", "v9.9.9")

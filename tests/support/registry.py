"""A stand-in OCI registry on the loopback: the tag list and each tag's manifest digest, over
the distribution API's real HTTP, for tests that need no image (the real registry, Debian's
docker-registry, is in the integration tests)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def digest_of(tag: str, stamp: str = "1") -> str:
    """A manifest digest for ``tag`` as pushed with ``stamp`` (a new stamp: a moved tag)."""
    return "sha256:" + hashlib.sha256(f"{tag}:{stamp}".encode()).hexdigest()


@dataclass
class StandIn:
    """The registry's host, and its tags (tag -> digest), changed by the test as it goes."""

    host: str
    tags: dict[str, str] = field(default_factory=dict)

    def push(self, tag: str, stamp: str = "1") -> str:
        """Point ``tag`` at a (new) digest; return it."""
        self.tags[tag] = digest_of(tag, stamp)
        return self.tags[tag]


@contextmanager
def stand_in_registry() -> Iterator[StandIn]:
    """A registry on 127.0.0.1 serving ``/v2/<name>/tags/list`` and manifest HEADs."""
    holder: list[StandIn] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if "/tags/list" not in self.path:
                return self._status(404)
            body = json.dumps({"tags": sorted(holder[0].tags)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None

        def do_HEAD(self) -> None:
            tag = self.path.rpartition("/manifests/")[2]
            digest = holder[0].tags.get(tag)
            if digest is None:
                return self._status(404)
            self.send_response(200)
            self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            return None

        def _status(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(StandIn(f"127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()

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
    # A hostile registry's answers to the tag list (None: a well-behaved one).
    link: str | None = None  # a `Link: <...>; rel="next"` on every page
    realm: str | None = None  # a bearer challenge to this realm before any answer
    redirect: str | None = None  # a 302 to this URL instead of the list
    body: bytes | None = None  # this body instead of the list
    asked: list[str] = field(default_factory=list)  # each request's path

    def push(self, tag: str, stamp: str = "1") -> str:
        """Point ``tag`` at a (new) digest; return it."""
        self.tags[tag] = digest_of(tag, stamp)
        return self.tags[tag]


@contextmanager
def stand_in_registry(address: str = "127.0.0.1") -> Iterator[StandIn]:
    """A registry on ``address`` (a loopback one) serving ``/v2/<name>/tags/list`` and
    manifest HEADs, as hostile as the test makes it (``StandIn``'s fields)."""
    holder: list[StandIn] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            me = holder[0]
            me.asked.append(self.path)
            if "/tags/list" not in self.path:
                return self._status(404)
            if me.realm is not None and "Authorization" not in self.headers:
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="{me.realm}",service="x"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            if me.redirect is not None:
                self.send_response(302)
                self.send_header("Location", me.redirect)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            body = (
                me.body if me.body is not None else json.dumps({"tags": sorted(me.tags)}).encode()
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if me.link is not None:
                self.send_header("Link", f'<{me.link}>; rel="next"')
            self.end_headers()
            self.wfile.write(body)
            return None

        def do_HEAD(self) -> None:
            holder[0].asked.append(self.path)
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

    server = ThreadingHTTPServer((address, 0), Handler)
    holder.append(StandIn(f"{address}:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()

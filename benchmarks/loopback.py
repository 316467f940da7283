"""Servers on 127.0.0.1 for bench_watch.py: a webhook (or API) that records when each request
arrives, and a stand-in registry serving a tag list and each tag's digest."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Recorder:
    """A server's URL, and each request it got: (monotonic time, path, JSON body)."""

    url: str
    status: int
    got: list[tuple[float, str, object]] = field(default_factory=list)


@contextmanager
def recorder(status: int = 200) -> Iterator[Recorder]:
    """A server on the loopback answering every POST with ``status``."""
    holder: list[Recorder] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            holder[0].got.append((time.monotonic(), self.path, json.loads(body or b"null")))
            self.send_response(holder[0].status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with _serving(Handler) as port:
        holder.append(Recorder(f"http://127.0.0.1:{port}", status))
        yield holder[0]


@dataclass
class Registry:
    """A stand-in registry's host and tags (tag -> digest)."""

    host: str
    tags: dict[str, str] = field(default_factory=dict)

    def push(self, tag: str, stamp: str = "1") -> None:
        """Point ``tag`` at the digest of ``stamp``."""
        self.tags[tag] = "sha256:" + hashlib.sha256(f"{tag}:{stamp}".encode()).hexdigest()


@contextmanager
def registry() -> Iterator[Registry]:
    """A registry on the loopback: ``/v2/<name>/tags/list`` and manifest HEADs."""
    holder: list[Registry] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"tags": sorted(holder[0].tags)}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self) -> None:
            digest = holder[0].tags.get(self.path.rpartition("/manifests/")[2])
            self.send_response(200 if digest else 404)
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with _serving(Handler) as port:
        holder.append(Registry(f"127.0.0.1:{port}"))
        yield holder[0]


@contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()

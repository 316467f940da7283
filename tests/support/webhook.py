"""HTTP receivers on the loopback: a webhook that records what it gets, refuses or hangs, and
a stand-in for the GitHub and Buildkite APIs. Real sockets, real HTTP: nothing leaves
127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    """One request as the receiver got it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when it arrived

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """What a loopback server got, and how it answers (status, body, or never)."""

    url: str
    got: list[Received] = field(default_factory=list)
    status: int = 200
    answer: dict[str, Any] | None = None
    hang: bool = False
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


def free_port() -> int:
    """A port nothing listens on (a webhook that refuses)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def receiver(
    status: int = 200, answer: dict[str, Any] | None = None, hang: bool = False
) -> Iterator[Receiver]:
    """A server on 127.0.0.1 that records every request and answers ``status`` (with
    ``answer`` as JSON), or with ``hang`` never answers until the test ends."""
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            me = holder[0]
            me.got.append(Received(self.command, self.path, dict(self.headers.items()), body,
                                   time.monotonic()))  # fmt: skip
            me.arrived.set()
            if me.hang:
                me.release.wait(30)
                return
            data = json.dumps(me.answer).encode() if me.answer is not None else b""
            self.send_response(me.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = _record
        do_GET = _record

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}", status=status,
                           answer=answer, hang=hang))  # fmt: skip
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        holder[0].release.set()
        server.shutdown()
        server.server_close()

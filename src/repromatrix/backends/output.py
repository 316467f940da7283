"""A cell's output kept in bounded memory: its head and its tail, and how much was dropped.

A process can print gigabytes (a loop of warnings, a runaway debug flag). The
live triage reads every byte as it streams, so nothing is lost for the
verdict; what is kept for ``log.txt`` is the first ``head`` bytes and the last
``tail`` bytes, with one line saying how much lies between them. Secret values
are redacted on the joined stream before anything is kept, so no part of one
survives at a chunk boundary or at the edge of the dropped middle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from repromatrix.secret_env import StreamRedactor

HEAD_BYTES = 1 << 20  # the start: versions, arguments, the first warnings
TAIL_BYTES = 15 << 20  # the end: the root cause and the consequence are here


@dataclass
class BoundedLog:
    """Collects chunks; ``bytes()`` gives head + a marker + tail, never more than the limits."""

    head_limit: int = HEAD_BYTES
    tail_limit: int = TAIL_BYTES
    secrets: Mapping[str, str] = field(default_factory=dict)
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    dropped: int = 0
    _redactor: StreamRedactor = field(init=False)

    def __post_init__(self) -> None:
        self._redactor = StreamRedactor(self.secrets)

    def add(self, chunk: bytes) -> None:
        """Keep ``chunk`` (redacted), dropping the oldest bytes past the tail's limit."""
        self._keep(self._redactor.feed(chunk))

    def finish(self) -> None:
        """The stream has ended: keep what the redactor held back."""
        self._keep(self._redactor.flush())

    def _keep(self, chunk: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        extra = len(self.tail) - self.tail_limit
        if extra > 0:
            del self.tail[:extra]
            self.dropped += extra

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def __bytes__(self) -> bytes:
        if not self.dropped:
            return bytes(self.head + self.tail)
        marker = f"\n[repromatrix: {self.dropped} bytes of output dropped here]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)

"""The host's secrets (``HF_TOKEN``, for ``prepare`` alone: no cell is given one), those of
the services ``watch`` answers through (a webhook's shared secret, GitHub and Buildkite
tokens), and how all of them are kept out of everything written.

``repromatrix prepare`` is the one step that needs a secret: the hub client
reads ``HF_TOKEN`` from its environment to fetch gated models. No cell is given
one (its network is off): not a container, a local harness, a spec, a
Dockerfile, a layer, a log, a result or the dry-run output. What the host has is
still redacted wherever output goes, should a program print one.

A process may print a token in two writes, so redaction works on the joined
stream, never chunk by chunk: ``StreamRedactor`` holds back the end of what it
has seen for as long as that end could still be the start of a secret, and
``redacting_watcher`` puts it in front of a backend's watcher (and so of
triage, whose root cause and reason go into ``result.json``). ``redact_text``
is the one rule every writer of results and reports, and the progress lines,
pass their text through.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping

SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN")
# The secrets of the services ``watch`` talks to: never handed to a cell, redacted like the
# cells' own wherever output is written.
SERVICE_SECRET_ENV = (
    "REPROMATRIX_WEBHOOK_SECRET",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "BUILDKITE_API_TOKEN",
)
REDACTED_ENV = (*SECRET_ENV, *SERVICE_SECRET_ENV)
REDACTED = "<redacted>"


def secrets_from(environ: Mapping[str, str], names: Iterable[str] = SECRET_ENV) -> dict[str, str]:
    """The secret variables among ``names`` that ``environ`` sets to a non-empty value."""
    return {name: environ[name] for name in names if environ.get(name)}


def _values(secrets: Mapping[str, str]) -> list[bytes]:
    # Longest first, so a secret that contains another is replaced whole.
    return sorted({v.encode() for v in secrets.values() if v}, key=len, reverse=True)


def _pattern(values: list[bytes]) -> re.Pattern[bytes] | None:
    return re.compile(b"|".join(re.escape(v) for v in values)) if values else None


def redact(data: bytes, secrets: Mapping[str, str]) -> bytes:
    """Replace every secret value in ``data`` (a whole text, not a chunk of one) with a marker."""
    pattern = _pattern(_values(secrets))
    return data if pattern is None else pattern.sub(REDACTED.encode(), data)


def redacted_from(environ: Mapping[str, str]) -> dict[str, str]:
    """Every secret ``environ`` sets that output must never show: the cells' and the
    services' (``REDACTED_ENV``)."""
    return secrets_from(environ, REDACTED_ENV)


def redact_text(text: str, secrets: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret value replaced; the secrets default to this process's own
    (``redacted_from``).

    Every writer of results and reports, and the progress lines, pass their
    text through this, so a token that slipped past the stream is still caught.
    """
    values = secrets if secrets is not None else redacted_from(os.environ)
    for value in sorted((v for v in values.values() if v), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


class StreamRedactor:
    """Redacts a stream given in chunks, whatever the chunk boundaries.

    ``feed`` returns the redacted bytes that are safe to pass on; it keeps back
    only the longest end of the stream that is a proper prefix of a secret (at
    most ``len(longest secret) - 1`` bytes), and ``flush`` returns that at the end.
    """

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self._values = _values(secrets)
        self._pattern = _pattern(self._values)
        self._held = b""

    @property
    def held(self) -> int:
        """How many bytes are kept back, waiting for the next chunk."""
        return len(self._held)

    def feed(self, chunk: bytes) -> bytes:
        """Take the next chunk; return what can be passed on now, redacted."""
        if self._pattern is None:
            return chunk
        data = self._held + chunk
        out: list[bytes] = []
        start = 0
        keep = None
        for match in self._pattern.finditer(data):
            if self._may_grow(data[match.start() :]):
                keep = len(data) - match.start()  # a longer secret may begin here: wait
                break
            out += [data[start : match.start()], REDACTED.encode()]
            start = match.end()
        if keep is None:
            keep = self._partial_secret_at_end(data, start)
        out.append(data[start : len(data) - keep])
        self._held = data[len(data) - keep :]
        return b"".join(out)

    def flush(self) -> bytes:
        """The end of the stream: return what was kept back (it was no secret after all)."""
        held, self._held = self._held, b""
        return held

    def _may_grow(self, rest: bytes) -> bool:
        """Whether ``rest``, the stream from a match on, may still become a longer secret."""
        return any(len(v) > len(rest) and v.startswith(rest) for v in self._values)

    def _partial_secret_at_end(self, data: bytes, start: int) -> int:
        """The length of the longest end of ``data[start:]`` that begins some secret."""
        longest = max(len(v) for v in self._values) - 1
        for size in range(min(longest, len(data) - start), 0, -1):
            end = data[len(data) - size :]
            if any(v.startswith(end) for v in self._values):
                return size
        return 0


Watcher = Callable[[bytes], bool]


class RedactingWatcher:
    """A watcher that passes the joined stream on redacted (see ``StreamRedactor``).

    A backend calls it with each chunk, as it would the watcher it wraps, and
    calls ``flush`` once the stream has ended so the last bytes kept back
    reach the watcher too.
    """

    def __init__(self, watch: Watcher, secrets: Mapping[str, str]) -> None:
        self._watch = watch
        self._redactor = StreamRedactor(secrets)

    def __call__(self, chunk: bytes) -> bool:
        """Pass the redacted part of ``chunk`` that is safe now; return the watcher's answer."""
        return self._pass(self._redactor.feed(chunk))

    def flush(self) -> bool:
        """Pass what was kept back at the end of the stream."""
        return self._pass(self._redactor.flush())

    def _pass(self, data: bytes) -> bool:
        return self._watch(data) if data else False


def redacting_watcher(watch: Watcher, secrets: Mapping[str, str]) -> RedactingWatcher:
    """``watch``, given the stream with every secret value replaced, across chunk boundaries.

    Call ``flush()`` on the result once the stream has ended (without secrets it
    passes every chunk on at once and ``flush`` has nothing to give).
    """
    return RedactingWatcher(watch, secrets)

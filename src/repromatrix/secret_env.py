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
``redacting_listener`` puts it in front of a backend's listener (and so of
triage, whose root cause and reason go into ``result.json``). ``redact_text``
is the one rule every writer of results and reports, and the progress lines,
pass their text through.

What is a secret: the whole value of each secret variable (``REDACTED_ENV``) this
process has, never a value inside a longer word (a value shorter than
``MIN_SECRET_LEN`` would be found in ordinary words and numbers: it is refused, with a
warning, once); and, whatever the environment holds, every token of a well-known shape
(``SHAPES``): a log or an answer may quote a token this host never had.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

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


# A variable's name that says it holds a secret (AWS_SECRET_ACCESS_KEY, NPM_TOKEN, DB_PASSWORD).
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|(?:^|_)KEY(?:_|$)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether the variable ``name`` holds a secret: one of ``REDACTED_ENV``, or a name that
    says token, secret, password, credential or key."""
    return name in REDACTED_ENV or _SECRET_NAME.search(name) is not None


def secrets_from(environ: Mapping[str, str], names: Iterable[str] = SECRET_ENV) -> dict[str, str]:
    """The secret variables among ``names`` that ``environ`` sets to a non-empty value."""
    return {name: environ[name] for name in names if environ.get(name)}


MIN_SECRET_LEN = 8  # a shorter value would be found inside ordinary words and numbers
# A line longer than this with no line break yet is passed on all but its end.
LINE_LIMIT = 64 << 10
TOKEN_TAIL = 4 << 10  # longer than any match of a shape that stays on one line
_WORD_BEFORE = rb"(?<![A-Za-z0-9_])"
_WORD_AFTER = rb"(?![A-Za-z0-9])"
_B64 = rb"[A-Za-z0-9/+]"
_CREDENTIAL = rb"(?=[A-Za-z._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{8,2048}"  # holds a digit
_warned: set[str] = set()
_KEY_HEADER = re.compile(rb"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----")
_KEY_FOOTER = re.compile(rb"-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----")
KEY_WINDOW = 16384 + 256  # past this a header's block is decided (its pattern's bound)


@dataclass(frozen=True)
class TokenShape:
    """A well-known token shape: the literal bytes one of which every match holds, ``offset``
    bytes after the match's start (the pattern is tried only there: a search for a literal is
    far faster than a pattern's), and the pattern; its groups ``secret`` and ``secret2``,
    where it has them, are what is replaced (the rest is context such as a header's name)."""

    name: str
    markers: tuple[bytes, ...]
    pattern: re.Pattern[bytes]
    offset: int = 0

    def spans(self, data: bytes) -> list[tuple[int, int]]:
        """Where in ``data`` a token of this shape lies (may overlap)."""
        groups = [name for name in ("secret", "secret2") if name in self.pattern.groupindex]
        spans: list[tuple[int, int]] = []
        for marker in self.markers:
            at = data.find(marker, self.offset)
            while at >= 0:
                match = self.pattern.match(data, at - self.offset)
                if match is not None:
                    inner = [match.span(name) for name in groups if match.start(name) >= 0]
                    spans += inner or [match.span()]
                at = data.find(marker, at + 1)
        return spans


SHAPES = (
    TokenShape(
        "Hugging Face token",
        (b"hf_",),
        re.compile(_WORD_BEFORE + rb"hf_[A-Za-z0-9]{30,250}" + _WORD_AFTER),
    ),
    TokenShape(
        "GitHub token",
        (b"gh",),
        re.compile(_WORD_BEFORE + rb"gh[pousr]_[A-Za-z0-9]{30,250}" + _WORD_AFTER),
    ),
    TokenShape(
        "GitHub fine-grained token",
        (b"github_pat_",),
        re.compile(_WORD_BEFORE + rb"github_pat_[A-Za-z0-9_]{20,250}" + _WORD_AFTER),
    ),
    TokenShape(
        "AWS access key and the secret key on its line",
        (b"IA",),
        re.compile(
            rb"(?P<secret>(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9]))"
            rb"(?:[^\r\n]{0,200}?(?<![A-Za-z0-9/+=])"
            rb"(?P<secret2>" + _B64 + rb"{40})(?![A-Za-z0-9/+=]))?"
        ),
        offset=2,
    ),
    TokenShape(
        "AWS secret key by its name",
        (b"ecret", b"ECRET"),
        re.compile(
            rb"(?i:secret(?:_?access)?(?:_?key)?)[\"']?[ \t]*[:=][ \t]*[\"']?"
            rb"(?P<secret>" + _B64 + rb"{40})(?![A-Za-z0-9/+=])"
        ),
        offset=1,
    ),
    TokenShape(
        "bearer credential",
        (b"earer",),
        re.compile(rb"(?i:bearer)[ \t]+(?P<secret>" + _CREDENTIAL + rb")"),
        offset=1,
    ),
    TokenShape(
        "authorization header",
        (b"uthorization",),
        re.compile(
            rb"(?i:authorization)[\"']?[ \t]*[:=][ \t]*[\"']?(?:(?i:basic|token|bearer)[ \t]+)?"
            rb"(?P<secret>" + _CREDENTIAL + rb")"
        ),
        offset=1,
    ),
    TokenShape(
        "GitLab token",
        (b"glpat-",),
        re.compile(_WORD_BEFORE + rb"glpat-[A-Za-z0-9_-]{20,250}" + _WORD_AFTER),
    ),
    TokenShape(
        "Buildkite token",
        (b"bkua_", b"bkct_"),
        re.compile(_WORD_BEFORE + rb"bk(?:ua|ct)_[A-Za-z0-9]{30,250}" + _WORD_AFTER),
    ),
    TokenShape(
        "API key",
        (b"sk-",),
        re.compile(_WORD_BEFORE + rb"sk-[A-Za-z0-9_-]{20,250}" + _WORD_AFTER),
    ),
    TokenShape("URL userinfo", (b"://",), re.compile(rb"://(?P<secret>[^\s/?#@\"'<>]{1,512})@")),
    TokenShape(
        "private key",
        (b"-----BEGIN",),
        re.compile(
            rb"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----"
            rb"(?:[\s\S]{0,16384}?-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----"
            rb"|(?:\s*[A-Za-z0-9+/=:,-]{16,100})*)"  # its lines, where the end is not there
        ),
    ),
)


def shape_of(text: str) -> str | None:
    """The name of the first well-known token shape ``text`` holds, or None."""
    data = text.encode()
    return next((shape.name for shape in SHAPES if shape.spans(data)), None)


def _warn_short(name: str) -> None:
    """Say once per name that its value is too short to redact."""
    if name in _warned:
        return
    _warned.add(name)
    print(
        f"repromatrix: warning: {name} is shorter than {MIN_SECRET_LEN} characters, so it is"
        " not redacted from output (a value that short would be replaced inside ordinary"
        " words and numbers); set a real token",
        file=sys.stderr,
    )


def _values(secrets: Mapping[str, str]) -> tuple[bytes, ...]:
    """The values to redact, longest first (a secret that holds another goes whole); one
    shorter than ``MIN_SECRET_LEN`` is refused, with a warning."""
    kept: set[bytes] = set()
    for name, value in secrets.items():
        if value and len(value) < MIN_SECRET_LEN:
            _warn_short(name)
        elif value:
            kept.add(value.encode("utf-8", "surrogatepass"))
    return tuple(sorted(kept, key=len, reverse=True))


@dataclass(frozen=True)
class Rules:
    """What is redacted: the whole values of ``values`` (never one inside a longer word)
    and every ``SHAPES`` match."""

    values: tuple[bytes, ...]

    @classmethod
    def of(cls, secrets: Mapping[str, str]) -> Rules:
        """The rules for the secret values of ``secrets`` (and the shapes)."""
        return cls(_values(secrets))

    def spans(self, data: bytes) -> list[tuple[int, int]]:
        """Where in ``data`` a secret lies, as sorted, disjoint ``(start, end)`` pairs."""
        found = [span for value in self.values for span in _whole(value, data)]
        for shape in SHAPES:
            found += shape.spans(data)
        return _merged(found)


def _whole(value: bytes, data: bytes) -> list[tuple[int, int]]:
    """Where ``value`` stands whole in ``data``: no letter or digit just before or after it."""
    spans: list[tuple[int, int]] = []
    at = data.find(value)
    while at >= 0:
        end = at + len(value)
        if not (_word(data[at - 1 : at]) or _word(data[end : end + 1])):
            spans.append((at, end))
        at = data.find(value, at + 1)
    return spans


def _word(byte: bytes) -> bool:
    return byte.isalnum() and byte.isascii()


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _replaced(data: bytes, spans: list[tuple[int, int]]) -> bytes:
    if not spans:
        return data
    out: list[bytes] = []
    at = 0
    for start, end in spans:
        out += [data[at:start], REDACTED.encode()]
        at = end
    out.append(data[at:])
    return b"".join(out)


def redact(data: bytes, secrets: Mapping[str, str]) -> bytes:
    """``data`` (a whole text, not a chunk of one) with every secret replaced by a marker:
    each whole value of ``secrets`` and every token of a well-known shape (``SHAPES``).

    The one rule of redaction: ``redact_text``, ``StreamRedactor`` and every file write
    apply it.
    """
    return _replaced(data, Rules.of(secrets).spans(data))


def redacted_from(environ: Mapping[str, str]) -> dict[str, str]:
    """Every secret ``environ`` sets that output must never show: the cells' and the
    services' (``REDACTED_ENV``)."""
    return secrets_from(environ, REDACTED_ENV)


def redact_text(text: str, secrets: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret replaced (``redact``); the secret values default to this
    process's own (``redacted_from``).

    Every writer of results and reports, and the progress lines, pass their
    text through this, so a token that slipped past the stream is still caught.
    """
    values = secrets if secrets is not None else redacted_from(os.environ)
    data = text.encode("utf-8", "surrogatepass")
    return redact(data, values).decode("utf-8", "surrogatepass")


def _before_open_key(data: bytes) -> int:
    """Where the line of a private key's header begins whose end may still come (its block
    is redacted whole once it has: ``SHAPES``), else the end of ``data``."""
    start = max(0, len(data) - KEY_WINDOW)
    if data.find(b"-----BEGIN", start) < 0:
        return len(data)
    for footer in _KEY_FOOTER.finditer(data, start):
        start = footer.end()
    header = _KEY_HEADER.search(data, start)  # the first with no end after it
    if header is None:
        return len(data)
    return max(data.rfind(b"\n", 0, header.start()), data.rfind(b"\r", 0, header.start())) + 1


class StreamRedactor:
    """Redacts a stream given in chunks, whatever the chunk boundaries, as ``redact`` would
    the joined stream.

    ``feed`` returns the redacted bytes that are safe to pass on: every whole line
    (a match of a shape stays on its line, but a private key's block), and of a line
    longer than ``LINE_LIMIT`` with no break yet all but its last ``TOKEN_TAIL`` bytes.
    It keeps back the line not yet ended, the line of a secret with nothing but space after
    it (it may still grow), a private key's block from its header's line until its end has
    come, and the start of a secret value holding a line break; ``flush`` returns that,
    redacted, at the end.
    """

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self._rules = Rules.of(secrets)
        self._multiline = [v for v in self._rules.values if b"\n" in v or b"\r" in v]
        self._tail = max([TOKEN_TAIL, *(len(v) for v in self._rules.values)])
        self._held = b""

    @property
    def held(self) -> int:
        """How many bytes are kept back, waiting for the next chunk."""
        return len(self._held)

    def feed(self, chunk: bytes) -> bytes:
        """Take the next chunk; return what can be passed on now, redacted."""
        data = self._held + chunk if self._held else chunk
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if len(data) - cut > LINE_LIMIT:
            cut = len(data) - self._tail
        lines = cut
        cut = min(self._before_split_value(data, cut), _before_open_key(data))
        if cut <= 0:
            self._held = data
            return b""
        spans = self._rules.spans(data)
        for start, end in reversed(spans):
            if start < cut and (end > cut or not data[end:lines].strip()):
                # This secret crosses the cut, or may still grow: keep back its line whole,
                # with the context that made it one (a header's name before a credential).
                cut = max(data.rfind(b"\n", 0, start), data.rfind(b"\r", 0, start)) + 1
        self._held = data[cut:]
        return _replaced(data[:cut], [span for span in spans if span[1] <= cut])

    def flush(self) -> bytes:
        """The end of the stream: return what was kept back, redacted."""
        held, self._held = self._held, b""
        return _replaced(held, self._rules.spans(held))

    def _before_split_value(self, data: bytes, cut: int) -> int:
        """``cut``, moved back to where a secret value holding a line break may begin."""
        for value in self._multiline:
            for size in range(min(len(value) - 1, len(data)), 0, -1):
                if value.startswith(data[len(data) - size :]):
                    cut = min(cut, len(data) - size)
                    break
        return cut


# Called with each chunk of a cell's output as it arrives; returns True to stop the cell now
# (triage has seen a terminal root cause, so waiting for vLLM to exit or hang gains nothing).
# Backends take one (``backends.base``); the redaction below wraps one.
OutputListener = Callable[[bytes], bool]


class RedactingListener:
    """A listener that passes the joined stream on redacted (see ``StreamRedactor``).

    A backend calls it with each chunk, as it would the listener it wraps, and
    calls ``flush`` once the stream has ended so the last bytes kept back
    reach the listener too.
    """

    def __init__(self, listener: OutputListener, secrets: Mapping[str, str]) -> None:
        self._listener = listener
        self._redactor = StreamRedactor(secrets)

    def __call__(self, chunk: bytes) -> bool:
        """Pass the redacted part of ``chunk`` that is safe now; return the listener's answer."""
        return self._pass(self._redactor.feed(chunk))

    def flush(self) -> bool:
        """Pass what was kept back at the end of the stream."""
        return self._pass(self._redactor.flush())

    def _pass(self, data: bytes) -> bool:
        return self._listener(data) if data else False


def redacting_listener(listener: OutputListener, secrets: Mapping[str, str]) -> RedactingListener:
    """``watch``, given the stream with every secret replaced, across chunk boundaries:
    line by line (``StreamRedactor``), so a token's shape is seen whole.

    Call ``flush()`` on the result once the stream has ended: it passes on the last
    line, where the stream did not end with a line break.
    """
    return RedactingListener(listener, secrets)

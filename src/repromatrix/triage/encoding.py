"""A log's raw bytes as UTF-8 text: byte order marks, UTF-16, NUL runs, and binary input.

Logs reach triage in odd encodings: PowerShell's ``>`` writes UTF-16 with a
byte order mark, some tools write it without one, ``logrotate copytruncate``
leaves a run of NUL bytes where the old log was, and a user may pass a binary
file by mistake. ``ByteSource`` looks at the first bytes, decides, and from
then on hands on plain UTF-8 bytes (or nothing, for binary input).
"""

from __future__ import annotations

import codecs

SNIFF_BYTES = 512  # enough to tell; little held back from a live stream
BINARY_SHARE = 0.10  # of control bytes among the first bytes: more means not a text log
# Control bytes that text logs do not contain (tab, newlines, form feed and ESC they do).
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r\x0b\x0c\x1b") + b"\x7f"


class ByteSource:
    """Turns a byte stream, chunk by chunk, into UTF-8 bytes fit for the line splitter."""

    def __init__(self) -> None:
        self._head = b""
        self._started = False
        self._decoder: codecs.IncrementalDecoder | None = None
        self.binary = False

    def push(self, data: bytes) -> bytes:
        """The text of ``data`` as UTF-8 (nothing until the first bytes have been seen)."""
        if not self._started:
            self._head += data
            return self._start() if len(self._head) >= SNIFF_BYTES else b""
        return self._convert(data)

    def finish(self) -> bytes:
        """End of input: whatever is still held back."""
        out = b"" if self._started else self._start()
        if self._decoder is not None and not self.binary:
            out += self._decoder.decode(b"", final=True).encode("utf-8")
        return out

    def _start(self) -> bytes:
        head, self._head, self._started = self._head, b"", True
        encoding = _utf16(head)
        if encoding is not None:
            self._decoder = codecs.getincrementaldecoder(encoding)("replace")
        else:
            head = head.removeprefix(codecs.BOM_UTF8)
            self.binary = looks_binary(head)
        return self._convert(head)

    def _convert(self, data: bytes) -> bytes:
        if self.binary:
            return b""
        if self._decoder is not None:
            return self._decoder.decode(data).encode("utf-8")
        return data.replace(b"\x00", b"") if b"\x00" in data else data


def looks_binary(sample: bytes) -> bool:
    """Whether ``sample`` holds too many control bytes to be text (NUL runs aside)."""
    text = sample.replace(b"\x00", b"")
    if not text:
        return False
    control = len(text) - len(text.translate(None, _CONTROL))
    return control > BINARY_SHARE * len(text)


def _utf16(head: bytes) -> str | None:
    """``utf-16`` for a byte order mark, ``utf-16-le``/``-be`` for NULs in every other byte."""
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return "utf-16"
    pairs = len(head) // 2
    if pairs < 32:
        return None
    even, odd = head[0 : pairs * 2 : 2].count(0), head[1 : pairs * 2 : 2].count(0)
    if odd > 0.4 * pairs and even < 0.05 * pairs:
        return "utf-16-le"
    if even > 0.4 * pairs and odd < 0.05 * pairs:
        return "utf-16-be"
    return None

"""Whole logs from files and streams: plain, gzip-compressed, read in bounded chunks."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from repromatrix.model import Scenario
from repromatrix.triage.diagnosis import Diagnosis
from repromatrix.triage.triager import Triager

READ_CHUNK = 1 << 20


def triage_stream(stream: BinaryIO, scenarios: Sequence[Scenario] = ()) -> Diagnosis:
    """Diagnose a whole log read from a binary stream (gzip-compressed or not)."""
    triager = Triager(scenarios)
    for chunk in _chunks(stream):
        triager.feed(chunk)
    return triager.diagnose()


def triage_path(path: Path | str, scenarios: Sequence[Scenario] = ()) -> Diagnosis:
    """Diagnose the log in a file; raises ``OSError`` when it cannot be read."""
    with open(path, "rb") as handle:
        return triage_stream(handle, scenarios)


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    first = stream.read(READ_CHUNK)
    if first[:2] != b"\x1f\x8b":
        yield first
        yield from iter(lambda: stream.read(READ_CHUNK), b"")
        return
    yield from _gunzip(first, stream)


def _gunzip(first: bytes, stream: BinaryIO) -> Iterator[bytes]:
    """Decompress gzip members as they arrive, never more than a chunk at a time."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data, started = first, False
    while data:
        while data:
            started = True
            yield inflater.decompress(data, READ_CHUNK)
            data = inflater.unconsumed_tail
            if inflater.eof:
                data, started = inflater.unused_data, False
                inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        data = stream.read(READ_CHUNK)
    if started and not inflater.eof:
        raise EOFError("the gzip data ends before its end-of-stream marker (a truncated file?)")

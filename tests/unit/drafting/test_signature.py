"""A root cause generalised into a signature: other numbers, paths and addresses match,
other words do not, and the pattern is one the project accepts (no nested repeat)."""

from __future__ import annotations

import re

import pytest

from repromatrix.drafting.signature import cause_text, generalise, signature_pattern
from repromatrix.patterns import regex_problem
from repromatrix.results.store import RootCause

KV = (
    "(EngineCore pid=19651) ERROR 11-29 18:28:58 [core.py:1510] ValueError: To serve at least "
    "one request with the model's max seq len (2048), (0.0 GiB KV cache is needed"
)


def kv(line: str = KV) -> RootCause:
    return RootCause(line, "EngineCore", "ValueError", "To serve at least one request")


def test_the_signature_starts_at_the_exception_and_keeps_the_words():
    assert cause_text(kv()).startswith("ValueError: To serve at least one request")
    assert signature_pattern(kv()).startswith(r"ValueError: To serve at least one request")


def test_other_numbers_pids_and_sizes_match():
    other = KV.replace("19651", "7").replace("2048", "131072").replace("0.0 GiB", "20.00 GiB")
    assert re.search(signature_pattern(kv()), other)


def test_other_words_do_not_match():
    other = KV.replace("max seq len", "max batch len")
    assert not re.search(signature_pattern(kv()), other)
    assert not re.search(signature_pattern(kv()), KV.replace("ValueError", "KeyError"))


@pytest.mark.parametrize(
    ("text", "other"),
    [
        ("ImportError: /usr/lib/a.so: undefined", "ImportError: /opt/x/b.so: undefined"),
        ("illegal access at 0x7f3a2c00 in kernel", "illegal access at 0xdeadbeef in kernel"),
        ("model tiny-6134d4c86cfd missing", "model tiny-2798dbf5f05c missing"),
    ],
)
def test_paths_addresses_and_hex_ids_are_generalised(text: str, other: str):
    assert re.search(generalise(text), other)


def test_special_characters_are_literal_and_the_pattern_is_safe():
    text = "assert x.size(0) == M [a|b] {c} $d ^e *f +g ?h \\i"
    pattern = generalise(text)
    assert re.fullmatch(pattern, text)
    assert regex_problem(pattern) is None  # RE2, the engine of every data pattern, takes it
    assert not re.search(pattern, "assert xXsize(0) == M [a|b] {c} $d ^e *f +g ?h \\i")


def test_a_long_line_is_cut_at_a_word():
    long = "RuntimeError: " + "word " * 60
    assert len(cause_text(RootCause(long, None, "RuntimeError", "word"))) <= 120

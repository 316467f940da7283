"""Required literals: the prefilter never hides a match of the catalogue's patterns."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repromatrix.triage import builtin_catalogue
from repromatrix.triage.literals import required_literal, required_literals
from support.triage import catalogue_examples


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        ("abc", "abc"),
        ("foo\\.bar", "foo.bar"),
        ("a(b|c)d", "a"),
        ("ab?c", "a"),
        ("x{2,3}yz", "yz"),
        ("[abc]def", "def"),
        ("(foo[)]bar)baz", "baz"),
        ("\\bMemoryError", "MemoryError"),
        ("^Killed$", "Killed"),
        ("exit(ed with)? code:? -9", " code"),
        ("custom_all_reduce\\.cuh?:[0-9]+", "custom_all_reduce.cu"),
        ("a|b", ""),
        ("(a)|b", ""),
        ("\\d+ items", " items"),
    ],
)
def test_the_longest_run_every_match_contains(pattern: str, literal: str) -> None:
    assert required_literal(pattern) == literal


def test_every_catalogue_pattern_has_a_useful_literal() -> None:
    # The WARNING fast path (fastpath.py) needs one for every entry that applies to warnings.
    short = [p for p in builtin_catalogue().patterns() if len(required_literal(p)) < 3]
    assert short == []


@pytest.mark.parametrize(
    ("pattern", "literals"),
    [
        ("no attribute .init_cpu_memory_env.", ("init_cpu_memory_env", "no attribute ")),
        ("Process [^ ]+ \\(PID: [0-9]+\\) died", ("Process ", " (PID: ", ") died")),
        ("a|b", ()),
        ("x?yz", ("yz",)),
    ],
)
def test_every_run_every_match_contains(pattern: str, literals: tuple[str, ...]) -> None:
    assert required_literals(pattern) == literals


def test_no_example_message_is_hidden_by_the_prefilter() -> None:
    for pattern in builtin_catalogue().patterns():
        literal = required_literal(pattern)
        for message in catalogue_examples().values():
            if re.search(pattern, message):
                assert literal in message, (pattern, message)


PIECES = st.sampled_from(
    ["a", "b", "ab", "x", ".", "\\.", "(a|b)", "[ab]", "b?", "a*", "a+", "^", "$"]
)


@given(st.lists(PIECES, min_size=1, max_size=6), st.text(alphabet="abx.", max_size=12))
def test_any_match_contains_the_literal(pieces: list[str], text: str) -> None:
    pattern = "".join(pieces)
    try:
        found = re.search(pattern, text)
    except re.error:
        return
    if found is not None:
        assert required_literal(pattern) in found.group(0)

"""The in-image regex search: ``re.search``'s answers on real data and made-up patterns, in
time linear in the text where ``re`` backtracks for minutes; refused shapes; the harness's
interrupt and the probe's signature use it; the harness's and the probes' copies are one."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repromatrix.harness import linear_regex
from repromatrix.harness.linear_regex import Regex, Unsupported
from repromatrix.matrix.scenarios import load_catalogue
from repromatrix.model import FactTest, Signature
from repromatrix.triage import builtin_catalogue
from support import paths

HARNESS_DIR = paths.PACKAGE / "harness"
PROBES_DIR = paths.PACKAGE / "probes"
FOLDERS = (paths.SCENARIOS, paths.SCENARIOS / "zoo", paths.PACKAGE / "rehearsal" / "scenarios")
# Shapes RE2 takes on which ``re`` backtracks exponentially, and lines that make it do so.
PATHOLOGICAL = (
    ("(a|a)*$", "a" * 4999 + "!", True),
    (r"ValueError:(.|\s)*too small$", "ValueError:" + " x" * 2500, False),
    ("(x+x+)+y", "x" * 5000, False),
)
SUBPROCESS_TIMEOUT_S = 20  # a regression fails here instead of hanging the suite


def test_the_harness_and_the_probes_keep_the_same_file() -> None:
    # Each folder may import only itself inside an image, so each has a copy.
    harness = (HARNESS_DIR / "linear_regex.py").read_bytes()
    assert (PROBES_DIR / "linear_regex.py").read_bytes() == harness


CASES = [
    ("abc", ["xabcx", "ab", ""]),
    ("a.c", ["abc", "a\nc", "ac"]),
    ("(?s)a.c", ["a\nc"]),
    ("a[b-d]e|x[^y]z", ["ace", "aee", "xaz", "xyz", "x\nz"]),
    (r"\d+\s\w", ["12 _", "\u0663 x", "1\u00a0x", "1  x"]),
    (r"[\D][\S][\W]", ["a!1", "1 !", "ab!"]),
    ("(?a)\\d\\w", ["\u06631", "1_", "1\u00e9"]),
    ("^ab|c$", ["abx", "xab", "xc", "xc\n", "c\nd"]),
    ("(?m)^b$", ["a\nb\nc", "ab"]),
    (r"\Aa|b\Z", ["a", "xa", "b\n", "xb"]),
    (r"\bfoo\b", ["a foo.", "foobar", "foo"]),
    (r"\Bo\B", ["foo", "o", ""]),
    (r"\b|\B", ["", "a"]),
    ("colou?r", ["color", "colour", "colouur"]),
    ("a{2,3}b", ["ab", "aab", "aaaab"]),
    ("a{2,3}?b|c{3}", ["aab", "cc", "ccc"]),
    ("x{0}y{,2}z{2,}", ["z", "zz", "yyyzz"]),
    ("a*?b+?c??d", ["bd", "aabbd", "aad"]),
    ("(?:ab)+(c|d)*e", ["abe", "ababcde", "ae"]),
    ("(?i)value ?error", ["ValueError", "VALUE ERROR", "valueerrors"]),
    ("(?i:a)B", ["AB", "ab"]),
    ("(?i)[a-c]x[^q]", ["BXQ", "bxr", "dxr"]),
    ("(?i)\u017f|k", ["s", "S", "\u212a"]),
    ("(a|)*b|()*c", ["b", "c", "aaab"]),
    ("", ["", "a"]),
    ("(?x) a b  # a comment", ["ab", "a b"]),
    ("Warming up multi-modal processing\\.\\.\\.", ["INFO Warming up multi-modal processing..."]),
]


@pytest.mark.parametrize(("pattern", "texts"), CASES)
def test_made_up_patterns_answer_as_re_does(pattern: str, texts: list[str]) -> None:
    regex = Regex(pattern)
    for text in texts:
        assert regex.search(text) is (re.search(pattern, text) is not None), text


def test_re2_s_very_end_is_read_as_re_s() -> None:
    # RE2 refuses `\Z` and writes it `\z`, which `re` before 3.14 refuses.
    assert Regex(r"small\z").search("too small")
    assert not Regex(r"small\z").search("too small\n")
    assert Regex(r"a\\z").search("a\\z") and not Regex(r"a\\z").search("a")


def test_flags_given_to_the_constructor_count() -> None:
    assert Regex("abc", re.IGNORECASE).search("xABC")
    assert not Regex("^b").search("a\nb")
    assert Regex("^b", re.MULTILINE).search("a\nb")
    assert linear_regex.search("a.b", "a\nb", re.DOTALL)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a)\1", "backreference"),
        ("a(?=b)", "look-around"),
        ("(?<!a)b", "look-around"),
        ("(a)?(?(1)b|c)", "conditional"),
        ("(?>ab)", "atomic group"),
        ("a++", "possessive repeat"),
        ("(a{100}){300}", "more than"),
    ],
)
def test_what_it_cannot_take_is_refused_as_an_re_error(pattern: str, why: str) -> None:
    with pytest.raises(Unsupported, match=why):
        Regex(pattern)
    assert issubclass(Unsupported, re.error)


def test_what_re_cannot_parse_is_refused_with_re_s_reason() -> None:
    with pytest.raises(re.error, match="missing \\)"):
        Regex("(unclosed")


def test_the_step_cache_stays_within_its_bound_and_answers_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(linear_regex, "CACHE_LIMIT", 40)
    pattern, texts = r"a.{0,12}b|\d\s+x", ["a" + "xy" * 40 + "b", "zzaqqqqb", "9 \t x", "a" * 90]
    regex = Regex(pattern)
    for text in texts * 2:
        assert regex.search(text) is (re.search(pattern, text) is not None), text
        assert sum(map(len, regex._steps.values())) <= 40


def _data_patterns() -> list[str]:
    catalogue = builtin_catalogue()
    found = [p for cause in catalogue.causes for p in (*cause.patterns, *cause.frames)]
    for scenario in load_catalogue(list(FOLDERS)):
        lines = (*scenario.signatures, *scenario.reached)
        found += [s.pattern for s in lines if isinstance(s, Signature)]
        found += [s.matches for s in scenario.reached if isinstance(s, FactTest) and s.matches]
        if scenario.launch is not None and scenario.launch.interrupt_on:
            found.append(scenario.launch.interrupt_on)
    return sorted(set(found))


def _log_lines() -> list[str]:
    lines: set[str] = set()
    for path in paths.DATA.joinpath("logs").rglob("*.log*"):
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        lines.update(data.decode(errors="replace").splitlines())
    return sorted(lines)


def test_every_real_pattern_answers_as_re_does_on_real_log_lines() -> None:
    patterns, lines = _data_patterns(), _log_lines()
    assert len(patterns) > 250 and len(lines) > 5000
    sample = lines[:: len(lines) // 150]  # every pattern meets these, and the lines it matches
    compared = matched = 0
    for pattern in patterns:
        backtracking, linear = re.compile(pattern), Regex(pattern)
        hits = [line for line in lines if backtracking.search(line)][:20]
        for line in (*sample, *hits):
            assert linear.search(line) is (backtracking.search(line) is not None), (pattern, line)
        compared, matched = compared + len(sample) + len(hits), matched + len(hits)
    assert matched > 500 and compared > 40_000


def _patterns(alphabet: str) -> st.SearchStrategy[str]:
    atoms = st.sampled_from([*alphabet, ".", "[ab]", "[^a]", "[a-c]", r"\d", r"\s", r"\w", r"\W"])
    anchors = st.sampled_from(["^", "$", r"\b", r"\B", r"\A", r"\Z"])
    suffixes = st.sampled_from(["", "*", "+", "?", "*?", "+?", "{2}", "{1,3}", "{0,2}?", "{2,}"])

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        group = st.tuples(st.sampled_from(["(", "(?:", "(?i:"]), inner).map(
            lambda t: f"{t[0]}{t[1]})"
        )
        repeated = st.tuples(group, suffixes).map("".join)
        joined = st.lists(inner, min_size=2, max_size=3).map("".join)
        either = st.lists(inner, min_size=2, max_size=3).map("|".join)
        return repeated | joined | either

    leaves = st.tuples(atoms, suffixes).map("".join) | anchors
    return st.recursive(leaves, extend, max_leaves=6)


@settings(max_examples=400, deadline=None)
@given(_patterns("abA1"), st.lists(st.text("abA1 _\n!", max_size=12), min_size=1, max_size=4))
def test_generated_patterns_answer_as_re_does(pattern: str, texts: list[str]) -> None:
    regex = Regex(pattern)
    for text in texts:
        assert regex.search(text) is (re.search(pattern, text) is not None), (pattern, text)


def _run(program: str) -> str:
    """``program`` run by a fresh python inside a time limit, its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=True,
    )
    return done.stdout


def test_patterns_that_make_re_backtrack_finish_on_5000_character_lines() -> None:
    program = f"""
        import sys
        sys.path.insert(0, {str(HARNESS_DIR)!r})
        import linear_regex
        for pattern, line, _ in {PATHOLOGICAL!r}:
            print(linear_regex.search(pattern, line))
    """
    assert _run(program).split() == [str(expected) for _, _, expected in PATHOLOGICAL]


def test_the_harness_interrupt_finishes_on_a_line_that_makes_re_backtrack() -> None:
    # As the harness runs in an image: a script, its folder on sys.path.
    program = f"""
        import signal, sys
        sys.path.insert(0, {str(HARNESS_DIR)!r})
        import harness

        class Out:
            def write_line(self, line): print(line.decode()[:40])

        class Proc:
            def send_signal(self, sent): print("signal", sent == signal.SIGTERM)

        class Child:
            proc = Proc()

        for pattern, line, expected in {PATHOLOGICAL!r}:
            interrupt = harness.Interrupt(pattern, Out())
            interrupt(Child(), line.encode() + b"\\n")
            print("interrupted", interrupt.line == line)
    """
    said = _run(program).splitlines()
    assert said.count("signal True") == 1 and said.count("interrupted True") == 1
    assert said.count("interrupted False") == 2


def test_the_probe_matches_its_signature_in_linear_time() -> None:
    program = f"""
        import sys
        sys.path.insert(0, {str(PROBES_DIR)!r})
        import moe_lora_rank

        raised = ValueError("x" * 580)  # kept whole by describe (600 characters)
        report = moe_lora_rank._raised("call", raised, "(x+x+)+y", {{}})
        print(report.outcome)
        report = moe_lora_rank._raised("call", raised, "(x+x+)+$", {{}})
        print(report.outcome)
    """
    assert _run(program).split() == ["other_failure", "hit"]

"""The catalogue of causes: every entry names a real message; bad catalogues are refused;
the required literals of its prefilter never hide a match of its patterns."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repromatrix.errors import ConfigError
from repromatrix.triage import Role, builtin_catalogue, load_catalogue
from repromatrix.triage.catalogue import parse_catalogue, required_literal, required_literals
from support.triage import catalogue_examples

# One message per category, as vLLM, PyTorch, NCCL, Docker or the kernel print it.
EXAMPLES = catalogue_examples()
# Entries recognised by where they happened rather than by their message.
BY_FRAMES = {
    "lora_kernel_assert": (
        "assert token_lora_mapping.size(0) == M",
        "AssertionError",
        ('File "/v/vllm/lora/ops/triton_ops/lora_shrink_op.py", line 149, in _lora_shrink',),
    ),
}


def test_every_category_has_an_example_here() -> None:
    categories = [cause.category for cause in builtin_catalogue().causes]
    assert len(categories) == len(set(categories))
    assert set(categories) == set(EXAMPLES) | set(BY_FRAMES)


@pytest.mark.parametrize("category", sorted(EXAMPLES))
def test_each_example_is_named_by_its_category(category: str) -> None:
    cause = builtin_catalogue().match(EXAMPLES[category])
    assert cause is not None
    assert cause.category == category


@pytest.mark.parametrize("category", sorted(BY_FRAMES))
def test_entries_by_frames_need_the_frames(category: str) -> None:
    text, exception, frames = BY_FRAMES[category]
    catalogue = builtin_catalogue()
    cause = catalogue.match(text, exception, frames)
    assert cause is not None
    assert cause.category == category
    assert catalogue.match(text, exception, ()) is None
    assert catalogue.match(text, "ValueError", frames) is None


def test_a_warning_names_only_causes_marked_as_warnings() -> None:
    catalogue = builtin_catalogue()
    nccl_warn = "NCCL WARN Cuda failure 'out of memory'"
    assert catalogue.match(nccl_warn).category == "gpu_oom"  # type: ignore[union-attr]
    assert catalogue.match(nccl_warn, warning=True).category == "nccl_error"  # type: ignore[union-attr]
    assert catalogue.match("CUDA out of memory", warning=True) is None
    assert catalogue.match(EXAMPLES["libnuma_missing"], warning=True) is not None
    # Consequences and weak evidence keep their role at any level.
    interrupted = catalogue.match("KeyboardInterrupt", warning=True)
    assert interrupted is not None
    assert interrupted.role is Role.WEAK


def test_a_consequence_that_quotes_its_cause_stays_a_consequence() -> None:
    quoted = (
        "RuntimeError: Worker failed with error 'CUDA out of memory', please check the stack "
        "trace above for the root cause"
    )
    cause = builtin_catalogue().match(quoted)
    assert cause is not None
    assert cause.role is Role.CONSEQUENCE


@pytest.mark.program("grep")
def test_python_and_grep_read_every_pattern_alike(tmp_path: Path) -> None:
    sample = tmp_path / "examples.txt"
    lines = [*EXAMPLES.values(), *(text for text, _, _ in BY_FRAMES.values())]
    sample.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for pattern in builtin_catalogue().patterns():
        run = subprocess.run(
            ["grep", "-E", "-e", pattern, str(sample)],
            capture_output=True,
            text=True,
            env={"LC_ALL": "C.UTF-8"},
            check=False,
        )
        assert run.returncode in (0, 1), f"grep -E refuses {pattern!r}: {run.stderr}"
        by_grep = set(run.stdout.splitlines())
        by_python = {line for line in lines if re.search(pattern, line)}
        assert by_grep == by_python, pattern


def test_a_bad_catalogue_reports_every_problem_at_once() -> None:
    body = """
causes:
  - category: a
    title: A
    role: cause
    explanation: x
    fix: y
  - category: b
    title: B
    role: sometimes
    explanation: x
    fix: y
    layer: upstairs
    patterns: ['(unclosed']
    colour: red
  - just a string
"""
    with pytest.raises(ConfigError) as raised:
        parse_catalogue(body, "bad.yaml")
    messages = [p.message for p in raised.value.problems]
    assert "needs `patterns` or `frames`" in messages
    assert any(m.startswith("`role` must be one of") for m in messages)
    assert any(m.startswith("`layer` must be one of") for m in messages)
    assert any(m.startswith("bad pattern '(unclosed'") for m in messages)
    assert "unknown key `colour`" in messages
    assert "expected a mapping" in messages
    assert all(p.file.startswith("bad.yaml") for p in raised.value.problems)


@pytest.mark.parametrize("body", ["causes: [", "- a list", "causes: {}"])
def test_a_catalogue_that_is_not_a_list_of_causes_is_refused(body: str) -> None:
    with pytest.raises(ConfigError):
        parse_catalogue(body, "x.yaml")


def test_a_catalogue_file_can_replace_the_builtin_one(tmp_path: Path) -> None:
    path = tmp_path / "causes.yaml"
    path.write_text(
        "causes:\n"
        "  - {category: c, title: C, role: cause, explanation: e, fix: f, patterns: [boom]}\n",
        encoding="utf-8",
    )
    catalogue = load_catalogue(path)
    assert [c.category for c in catalogue.causes] == ["c"]
    with pytest.raises(ConfigError, match="cannot read"):
        load_catalogue(tmp_path / "missing.yaml")


# -- the prefilter: required literals -----------------------------------------------------


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
    # The WARNING fast path (triager.py) needs one for every entry that applies to warnings.
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

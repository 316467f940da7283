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
from repromatrix.triage.fixes import Direction, FlagChange, FlagFix
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


def test_every_problem_names_the_file_and_its_line() -> None:
    body = """causes:
  - category: a
    title: A
    role: cause
    explanation: x
    fix: y
    patterns: [boom]
    fix_flag: {}
"""
    with pytest.raises(ConfigError) as raised:
        parse_catalogue(body, "bad.yaml")
    (problem,) = raised.value.problems
    assert (problem.file, problem.line) == ("bad.yaml", 8)
    assert problem.message == "unknown key `fix_flag`. Perhaps you meant `fix_flags`?"


# -- fix_flags: the fix as flag and environment changes -----------------------------------

ENTRY = """causes:
  - category: a
    title: A
    role: cause
    explanation: x
    fix: y
    patterns: [boom]
    fix_flags:
"""


def test_fix_flags_are_read_as_values_and_directions() -> None:
    body = ENTRY + (
        "      - flags: {max_model_len: lower}\n"
        "      - flags: {enforce_eager: true, dtype: float16, max_num_seqs: 8}\n"
        "      - flags: {disable_custom_all_reduce: true}\n"
        "        env: {NCCL_P2P_DISABLE: 1, VLLM_CPU_KVCACHE_SPACE: raise}\n"
    )
    (cause,) = parse_catalogue(body, "x.yaml").causes
    lower, values, both = cause.fix_flags
    assert lower == FlagFix(flags=(FlagChange("max_model_len", direction=Direction.LOWER),))
    assert [(c.name, c.value) for c in values.flags] == [
        ("enforce_eager", True),
        ("dtype", "float16"),
        ("max_num_seqs", 8),
    ]
    assert both.env == (
        FlagChange("NCCL_P2P_DISABLE", value="1"),
        FlagChange("VLLM_CPU_KVCACHE_SPACE", direction=Direction.RAISE),
    )
    assert both.describe() == (
        "disable_custom_all_reduce=true, env NCCL_P2P_DISABLE=1, raise env VLLM_CPU_KVCACHE_SPACE"
    )
    assert lower.to_json() == {
        "flags": [{"name": "max_model_len", "direction": "lower"}],
        "env": [],
    }


@pytest.mark.parametrize(
    ("fixes", "message"),
    [
        ("{flags: [max_model_len]}", "`flags` must map names to a value, `lower` or `raise`"),
        (
            "{flag: {max_model_len: lower}}",
            "unknown key `flag` in a fix. Perhaps you meant `flags`?",
        ),
        (
            "{flags: {--max-model-len: lower}}",
            "`--max-model-len` is not the name of an engine argument (snake_case)",
        ),
        (
            "{env: {nccl_p2p_disable: '1'}}",
            "`nccl_p2p_disable` is not the name of an environment variable (UPPER_CASE)",
        ),
        (
            "{flags: {max_model_len: [1, 2]}}",
            "`max_model_len`: expected true, false, a number, a string, `lower` or `raise`, "
            "not [1, 2]",
        ),
        (
            "{env: {NCCL_P2P_DISABLE: true}}",
            "`NCCL_P2P_DISABLE`: expected a string, a number, `lower` or `raise`, not True",
        ),
        ("{}", "a fix must be a mapping with `flags` and/or `env`"),
    ],
)
def test_a_bad_fix_is_refused_at_its_line(fixes: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_catalogue(
            ENTRY + f"      - flags: {{enforce_eager: true}}\n      - {fixes}\n", "x.yaml"
        )
    (problem,) = raised.value.problems
    assert (problem.file, problem.line, problem.message) == ("x.yaml", 10, message)


def test_a_bad_name_in_a_block_mapping_is_refused_at_its_own_line() -> None:
    body = ENTRY + "      - flags:\n          max_model_len: lower\n          Max-Seqs: 8\n"
    with pytest.raises(ConfigError) as raised:
        parse_catalogue(body, "x.yaml")
    (problem,) = raised.value.problems
    assert (problem.line, problem.column) == (11, 11)


def test_fix_flags_must_be_a_list() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_catalogue(ENTRY.replace("fix_flags:", "fix_flags: {max_model_len: lower}"), "x.yaml")
    (problem,) = raised.value.problems
    assert (problem.line, problem.message) == (
        8,
        "`fix_flags` must be a list of fixes, each with `flags` or `env`",
    )


def test_the_builtin_fixes_say_what_their_prose_says() -> None:
    # Every flag or variable a fix changes is named in that cause's prose fix.
    catalogue = builtin_catalogue()
    assert catalogue.category("kv_cache_too_small").fix_flags[0].describe() == (  # type: ignore[union-attr]
        "lower max_model_len"
    )
    for cause in catalogue.causes:
        for fix in cause.fix_flags:
            for change in (*fix.flags, *fix.env):
                forms = (change.name, "--" + change.name.replace("_", "-"))
                assert any(form in cause.fix for form in forms), (cause.category, change.name)


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

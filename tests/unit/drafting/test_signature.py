"""A root cause generalised into a signature: other numbers, paths and addresses match,
other words do not, and the pattern is one the project accepts (no nested repeat)."""

from __future__ import annotations

import re

import pytest

from repromatrix.drafting.signature import cause_text, generalise, signature_pattern
from repromatrix.patterns import regex_problem
from repromatrix.triage.diagnosis import RootCause

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
        ("ImportError: /usr/lib/a.so: undefined", "ImportError: /opt/x/a.so: undefined"),
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


# Issue 32, class 7: a signature keeps what names the failing thing and drops volatile text.
SYMBOL = (
    "ImportError: /usr/local/lib/python3.10/dist-packages/flash_attn_2_cuda.cpython-310-x86_64-"
    "linux-gnu.so: undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_"
    "stringIcSt11char_traitsIcESaIcEEE"
)  # tests/data/logs/real/19-flash-attn-undefined-symbol-masked-as-unsupported-arch.log


def test_a_long_path_never_pushes_out_the_symbol():
    pattern = signature_pattern(RootCause(SYMBOL, None, "ImportError", None))
    assert pattern.endswith("undefined symbol: " + SYMBOL.rsplit(" ", 1)[1])
    assert re.search(pattern, SYMBOL.replace("/usr/local/lib/python3.10", "/opt/conda/lib/py"))
    assert not re.search(pattern, SYMBOL.replace("_ZN3c105Error", "_ZN3c104cuda9SetDeviceEi"))


def test_a_code_file_keeps_its_name_other_paths_do_not():
    line = "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:455 'invalid argument'"
    pattern = generalise(line)
    assert re.search(pattern, line.replace("/workspace", "/build/vllm").replace("455", "460"))
    assert not re.search(pattern, line.replace("custom_all_reduce.cuh", "moe_align.cu"))
    model = generalise("OSError: Can't load tokenizer for '/models/llama-3'.")
    assert re.search(model, "OSError: Can't load tokenizer for '/root/tiny'.")


def test_object_reprs_sizes_and_counts_are_generalised():
    line = "RuntimeError: got <vllm.x.Bar object at 0x7f3a2c00> after 2.00 GiB of 1024 tries"
    other = "RuntimeError: got <vllm.x.Baz object at 0x55aa> after 512 MiB of 3 tries"
    assert re.search(generalise(line), other)


def test_pydantic_echo_of_the_input_is_dropped():
    line = (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig "
        "Value error, bad [type=value_error, input_value=ArgsKwargs((), {'model_config': "
        "ModelConfig(model='/m', seed=0)}), input_type=ArgsKwargs]"
    )
    text = cause_text(RootCause(line, None, "pydantic_core._pydantic_core.ValidationError", None))
    assert "input_value" not in text
    assert "ArgsKwargs" not in text
    assert text.endswith("Value error, bad [type=value_error")


def test_a_digit_inside_a_word_stays_literal():
    pattern = generalise("ValueError: Bfloat16 is only supported on sm_80 and c10d")
    assert "Bfloat16" in pattern
    assert "sm_80" in pattern
    assert "c10d" in pattern

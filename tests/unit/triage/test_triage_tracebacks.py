"""The traceback reader: chains, asserts, truncated and flattened tracebacks, interleaving."""

from __future__ import annotations

from repromatrix.triage.evidence import Kind, Relation
from repromatrix.triage.logmodel import parse_line
from repromatrix.triage.tracebacks import Raised, TracebackReader


def read(text: str) -> tuple[list[Raised], TracebackReader]:
    reader = TracebackReader()
    raised: list[Raised] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        raised.extend(reader.read(parse_line(number, raw)).raised)
    return raised, reader


CHAINED = """\
Traceback (most recent call last):
  File "/x/transformers/dynamic_module_utils.py", line 639, in resolve_trust_remote_code
    raise ValueError(
ValueError: needs trust_remote_code

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/vllm/entrypoints/openai/api_server.py", line 186, in <module>
    engine = AsyncLLMEngine.from_engine_args(
RuntimeError: wrapped

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/vllm/y.py", line 1, in f
    g()
OSError: third
"""


def test_chained_exceptions_share_a_chain_and_say_how_they_follow() -> None:
    raised, _ = read(CHAINED)
    assert [(r.exception, r.relation) for r in raised] == [
        ("ValueError", None),
        ("RuntimeError", Relation.CAUSE),
        ("OSError", Relation.CONTEXT),
    ]
    assert len({r.chain for r in raised}) == 1
    assert raised[0].line.number == 4
    assert [f.function for f in raised[0].frames] == ["resolve_trust_remote_code"]
    assert raised[0].frames[0].source is not None
    assert raised[0].frames[0].source.text.strip() == "raise ValueError("


def test_a_new_traceback_without_chain_marker_starts_a_new_chain() -> None:
    raised, _ = read(
        'Traceback (most recent call last):\n  File "a.py", line 1, in f\n    f()\nValueError: a\n'
        "Traceback (most recent call last):\n"
        "  File \"b.py\", line 2, in g\n    g()\nKeyError: 'b'\n"
    )
    assert raised[0].chain != raised[1].chain


def test_a_bare_assertion_error_is_reported_at_its_assert_line() -> None:
    head = "(Worker_TP0 pid=5) ERROR 11-03 05:52:16 [m.py:1] "
    raised, _ = read(
        f'{head}  File "/v/s.py", line 149, in shrink\n'
        f"{head}    assert token_lora_mapping.size(0) == M\n"
        f"{head}           ^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        f"{head}AssertionError\n"
    )
    assert len(raised) == 1
    assert raised[0].kind is Kind.ASSERT
    assert raised[0].line.number == 2
    assert raised[0].message == "assert token_lora_mapping.size(0) == M"
    assert raised[0].process == "Worker_TP0"


def test_an_assertion_error_with_a_message_is_reported_at_its_own_line() -> None:
    raised, _ = read(
        "Traceback (most recent call last):\n"
        '  File "/v/fused_moe_lora_op.py", line 80, in _fused_moe_lora\n'
        '    assert max_lora_rank <= 128, "fused_moe_lora_one_shot supports max_lora_rank<=128"\n'
        "AssertionError: fused_moe_lora_one_shot supports max_lora_rank<=128\n"
    )
    assert raised[0].kind is Kind.EXCEPTION
    assert raised[0].line.number == 4


def test_a_traceback_cut_off_after_an_assert_still_names_it() -> None:
    raised, reader = read(
        '...\nFile "/w/vllm/lora/layers/fused_moe.py", line 164, in _inject_lora_into_fused_moe\n'
        "assert isinstance(m_fused_moe_fn.impl.fused_experts, TritonExperts)\n"
    )
    assert raised == []
    (pending,) = reader.pending()
    assert pending.kind is Kind.ASSERT
    assert pending.line.number == 3


def test_a_traceback_cut_off_elsewhere_names_nothing() -> None:
    _, reader = read('Traceback (most recent call last):\n  File "a.py", line 1, in f\n    f()\n')
    assert reader.pending() == ()


def test_a_flattened_paste_keeps_source_lines_apart_from_the_exception() -> None:
    raised, _ = read(
        "(APIServer pid=3720) Traceback (most recent call last):\n"
        "(APIServer pid=3720) File “/venv/bin/vllm”, line 8, in\n"
        "(APIServer pid=3720) sys.exit(main())\n"
        "(APIServer pid=3720) ~~~~^^\n"
        "(APIServer pid=3720) ……\n"
        "(APIServer pid=3720) )\n"
        "(APIServer pid=3720) Foo\n"
        "(APIServer pid=3720) File “/v/api_server.py”, line 673, in _interrupt_init\n"
        "(APIServer pid=3720) raise KeyboardInterrupt(“terminated”)\n"
        "(APIServer pid=3720) KeyboardInterrupt: terminated\n"
    )
    assert [(r.exception, r.message, r.line.number) for r in raised] == [
        ("KeyboardInterrupt", "terminated", 10)
    ]


def test_any_class_name_ends_an_indented_traceback() -> None:
    raised, _ = read(
        "Traceback (most recent call last):\n"
        '  File "/t/cpp_builder.py", line 184, in get_cpp_compiler\n'
        "    raise exc.InvalidCxxCompiler\n"
        "InvalidCxxCompiler: No working C++ compiler found\n"
    )
    assert raised[0].exception == "InvalidCxxCompiler"


def test_what_is_printed_alone_is_an_exception_only_when_named_like_one() -> None:
    texts = [
        "ValueError: alone",
        "torch.OutOfMemoryError: CUDA out of memory",
        "ray.exceptions.RayTaskError(DistBackendError): ray::RayWorkerWrapper.execute_method()",
        "KeyboardInterrupt",
        "Exception: WorkerProc initialization failed",
        "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:455 'invalid argument'",
        "Error: not a Python exception",
        "UserWarning: only a warning",
        "Loading: 50%",
        "Killed",
        "    ValueError: indented",
    ]
    raised, _ = read("\n".join(texts))
    assert [r.exception for r in raised] == [
        "ValueError",
        "torch.OutOfMemoryError",
        "ray.exceptions.RayTaskError(DistBackendError)",
        "KeyboardInterrupt",
        "Exception",
    ]


def test_interleaved_processes_keep_their_own_tracebacks() -> None:
    lines = []
    for step in (
        "Traceback (most recent call last):",
        '  File "/v/w.py", line {n}, in load_{n}',
        "    load()",
        "RuntimeError: failed in worker {n}",
    ):
        for n in (0, 1):
            lines.append(
                f"(Worker_TP{n} pid={100 + n}) ERROR 01-01 00:00:00 [m.py:1] " + step.format(n=n)
            )
    raised, _ = read("\n".join(lines))
    assert [(r.process, r.message, r.frames[0].function) for r in raised] == [
        ("Worker_TP0", "failed in worker 0", "load_0"),
        ("Worker_TP1", "failed in worker 1", "load_1"),
    ]


def test_a_multiprocessing_child_names_its_unprefixed_traceback() -> None:
    raised, _ = read(
        "Process EngineCore_0:\nTraceback (most recent call last):\n"
        '  File "/v/core.py", line 623, in run_engine_core\n    raise e\nValueError: x\n'
    )
    assert raised[0].process == "EngineCore_0"


def test_logged_and_raw_tracebacks_of_one_process_do_not_mix() -> None:
    raised, _ = read(
        "(EngineCore pid=7) ERROR 01-01 00:00:00 [core.py:1] Traceback (most recent call last):\n"
        '(EngineCore pid=7)   File "/raw.py", line 1, in raw\n'
        '(EngineCore pid=7) ERROR 01-01 00:00:00 [core.py:1]   File "/l.py", line 2, in logged\n'
        "(EngineCore pid=7)     raw()\n"
        "(EngineCore pid=7) ERROR 01-01 00:00:00 [core.py:1]     logged()\n"
        "(EngineCore pid=7) ERROR 01-01 00:00:00 [core.py:1] ValueError: logged\n"
        "(EngineCore pid=7) OSError: raw\n"
    )
    assert [(r.exception, r.frames[-1].function) for r in raised] == [
        ("ValueError", "logged"),
        ("OSError", "raw"),
    ]


def test_a_traceback_indented_as_a_whole_still_ends_on_its_exception() -> None:
    raised, _ = read(
        "    Traceback (most recent call last):\n"
        '      File "/v/s.py", line 149, in shrink\n'
        "        assert token_lora_mapping.size(0) == M\n"
        "    AssertionError\n"
        '      File "/v/t.py", line 3, in load\n'
        "        load()\n"
        "    OSError: headerless and indented\n"
    )
    assert [(r.kind, r.message) for r in raised] == [
        (Kind.ASSERT, "assert token_lora_mapping.size(0) == M"),
        (Kind.EXCEPTION, "headerless and indented"),
    ]


def test_an_uncaught_cpp_exception_is_named_by_its_what_line() -> None:
    raised, _ = read(
        "terminate called after throwing an instance of 'c10::Error'\n"
        "  what():  CUDA error: an illegal memory access was encountered\n"
        "  what():  a what() without its terminate line\n"
    )
    assert [(r.exception, r.message, r.line.number) for r in raised] == [
        ("c10::Error", "CUDA error: an illegal memory access was encountered", 2),
        ("std::exception", "a what() without its terminate line", 3),
    ]

